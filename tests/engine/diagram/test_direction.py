"""Which way data flows on the canvas: left to right or top down, saved with the
diagram, and the layered layout laid out that way (blocks as units too)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.diagram.graph import Graph, GraphError
from engine.diagram.layout import NODE_W, lay_out, layered_layout, set_direction, view_layout
from engine.project import Project, load_project, save_project


def chain_with_skip() -> Graph:
    g = Graph()
    g.add_node("Input", id="x", params={"shape": [8]})
    prev = "x"
    for i in range(3):
        g.add_node("Linear", id=f"fc{i}", params={"in_features": 8, "out_features": 8})
        g.connect(prev, "out", f"fc{i}", "in")
        prev = f"fc{i}"
    g.add_node("Add", id="add")
    g.connect(prev, "out", "add", "a")
    g.connect("x", "out", "add", "b")  # a skip over the chain
    return g


def test_direction_is_saved_and_a_bad_one_named():
    g = chain_with_skip()
    assert g.direction == "LR" and "direction" not in g.to_dict()  # old files read as before
    g.set_direction("TB")
    d = g.to_dict()
    assert d["direction"] == "TB" and Graph.from_dict(d).direction == "TB"
    with pytest.raises(GraphError, match="direction 'down'"):
        Graph.from_dict({**d, "direction": "down"})
    with pytest.raises(GraphError, match="direction 'XY'"):
        g.set_direction("XY")


def test_top_down_layers_are_rows_and_every_edge_points_down():
    g = chain_with_skip()
    lr = layered_layout(g)
    g.direction = "TB"
    tb = layered_layout(g)
    for e in g.edges:  # left to right: columns; top down: rows
        assert lr[e.dst][0] > lr[e.src][0]
        assert tb[e.dst][1] > tb[e.src][1]
    assert len({p[1] for p in lr.values()}) <= 2 < len({p[0] for p in lr.values()})
    # the chain is one column top down; the skip takes a lane beside it, so the Add sits apart
    assert len({tb[f"fc{i}"][0] for i in range(3)}) == 1
    assert tb["add"][1] > tb["fc2"][1]


def test_blocks_are_units_top_down_and_lay_out_leaves_the_graph_alone():
    g = chain_with_skip()
    for n in ("fc0", "fc1"):
        g.set_group(n, "body")
    g.set_group("fc2", "tail")
    before = g.to_dict()
    pos = lay_out(g, "TB")
    assert g.to_dict() == before  # (the editor makes one undo step of the positions)
    g.direction = "TB"
    assert pos == view_layout(g)
    # the block's members are one unit: nothing else sits between its rows
    body_rows = sorted(pos[n][1] for n in ("fc0", "fc1"))
    others = [pos[n][1] for n in ("x", "fc2", "add")]
    assert not any(body_rows[0] < y < body_rows[1] for y in others)
    assert all(pos[n][0] < pos["fc0"][0] + NODE_W for n in ("fc0", "fc1"))


def test_cli_layout_direction_writes_it_and_lays_out_again(tmp_path):
    path = save_project(Project(chain_with_skip(), name="skip"), tmp_path / "skip.lflow")
    r = subprocess.run([sys.executable, "main.py", "layout", str(path), "--direction", "TB"],
                       capture_output=True, text=True, cwd=str(__import__("pathlib").Path(__file__).parents[3]))
    assert r.returncode == 0, r.stderr
    assert "top down" in r.stdout
    p = load_project(path)
    assert p.graph.direction == "TB" and json.loads(path.read_text())["diagram"]["direction"] == "TB"
    assert all(p.graph.nodes[e.dst].pos[1] > p.graph.nodes[e.src].pos[1] for e in p.graph.edges)
    set_direction(p.graph, "LR")
    assert p.graph.direction == "LR"
    assert all(p.graph.nodes[e.dst].pos[0] > p.graph.nodes[e.src].pos[0] for e in p.graph.edges)
