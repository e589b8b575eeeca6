"""Placement on blocks in the real editor: a collapsed block selected with the mouse
takes a pipeline stage or a tensor-parallel style for everything it holds (Megatron's
pairs inside it, or one style where its layers support it), one undo step each; its
card shows the stage, the styles and the communication it hides, and the plan's
send/recv shows on the edge between two blocks."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from engine.diagram.graph import Edge, Graph
from engine.project import Project

pytestmark = pytest.mark.gui


def two_blocks() -> Project:
    """x -> [mlp: fc1 -> act -> fc2 -> norm] -> [head: fc3 -> act2 -> fc4] -> out."""
    g = Graph()
    g.add_node("Input", id="x", params={"shape": [8, 16]})
    chain = [("fc1", "Linear", {"in_features": 16, "out_features": 32}, "mlp"),
             ("act", "GELU", {}, "mlp"),
             ("fc2", "Linear", {"in_features": 32, "out_features": 16}, "mlp"),
             ("norm", "LayerNorm", {"normalized_shape": 16}, "mlp"),
             ("fc3", "Linear", {"in_features": 16, "out_features": 16}, "head"),
             ("act2", "ReLU", {}, "head"),
             ("fc4", "Linear", {"in_features": 16, "out_features": 4}, "head")]
    prev = "x"
    for nid, t, params, block in chain:
        g.add_node(t, id=nid, params=params)
        g.set_group(nid, block)
        g.connect(prev, "out", nid, "in")
        prev = nid
    g.add_node("Output", id="out")
    g.connect(prev, "out", "out", "in")
    g.collapsed = {"mlp", "head"}
    from engine.diagram.layout import set_direction

    set_direction(g, "LR")
    return Project(g, name="blocks")


@pytest.fixture
def w(asked, editor):
    return editor(two_blocks())


def click_card(qtbot, w, name):
    card = w.scene.group_items[name]
    w.view.set_zoom(1.0)
    w.view.centerOn(card.sceneBoundingRect().center())
    QApplication.processEvents()
    at = w.view.mapFromScene(card.mapToScene(card._rect.center()))
    qtbot.mouseClick(w.view.viewport(), Qt.LeftButton, pos=at)
    assert w.scene.selected_groups() == [name]


def test_tensor_parallel_pairs_on_a_block_and_its_card(qtbot, w):
    g = w.project.graph
    d = w.devices
    d.spins["tp"].setValue(2)
    click_card(qtbot, w, "mlp")
    before = {n: node.tp for n, node in g.nodes.items()}
    d.tp_combo.setCurrentIndex(d.tp_combo.findData("pairs"))
    d.tp_btn.click()
    assert (g.nodes["fc1"].tp, g.nodes["fc2"].tp) == ("colwise", "rowwise")
    assert g.nodes["fc3"].tp is None and g.nodes["act"].tp is None  # outside the block; no style of its own
    w.controller.flush()
    assert w.controller.plan is not None, w.controller.plan_error
    card = w.scene.group_items["mlp"]
    tags, hidden = card.placement_tags()
    assert "tp col/row" in tags and "⇄" in tags
    assert any(h.startswith("fc1 → act: tp Shard") for h in hidden), hidden
    assert "fc1 → act" in card.toolTip()
    # one undo step takes the whole block back
    w.controller.stack.undo()
    assert {n: node.tp for n, node in g.nodes.items()} == before
    # a catalog style goes to the layers that support it; the rest named by type, in one line
    click_card(qtbot, w, "mlp")
    d.tp_combo.setCurrentIndex(d.tp_combo.findData("replicate"))
    d.tp_btn.click()
    assert [g.nodes[n].tp for n in ("fc1", "act", "fc2", "norm")] == ["replicate", None, "replicate", "replicate"]
    assert "GELU act" in w.statusBar().currentMessage()


def test_a_stage_on_each_block_and_send_recv_between_them(qtbot, w):
    g = w.project.graph
    d = w.devices
    d.spins["pp"].setValue(2)
    for block, stage in (("mlp", 0), ("head", 1)):
        click_card(qtbot, w, block)
        d.stage_combo.setCurrentIndex(d.stage_combo.findData(stage))
        d.assign_btn.click()
    assert {n: g.nodes[n].stage for n in g.block_members("head")} == {"fc3": 1, "act2": 1, "fc4": 1}
    assert all(g.nodes[n].stage == 0 for n in g.block_members("mlp"))
    w.controller.flush()
    assert w.controller.plan is not None, w.controller.plan_error
    between = w.scene.edge_items[Edge("norm", "out", "fc3", "in")]
    assert between.isVisible() and "send/recv" in between.note  # drawn from card to card
    a, b = w.scene.edge_ends(between.edge)
    mlp, head = (w.scene.group_items[n] for n in ("mlp", "head"))
    assert mlp.sceneBoundingRect().contains(a) and head.sceneBoundingRect().contains(b)
    assert mlp.placement_tags()[0].startswith("S0") and head.placement_tags()[0].startswith("S1")
    from widgets.style import stage_color

    assert mlp.stage_colour() == stage_color(0, w.scene.theme) and head.stage_colour() == stage_color(1, w.scene.theme)


def test_the_command_line_places_blocks_too(tmp_path):
    """`place` does what the Devices panel does: a block gives its stage and TP style to
    what it holds; a wrong name or stage is named, and the file is left as it was."""
    import subprocess
    import sys
    from pathlib import Path

    from engine.project import load_project, save_project

    root = Path(__file__).resolve().parents[2]
    p = two_blocks()
    p.placement.tp, p.placement.pp = 2, 2
    path = save_project(p, tmp_path / "b.lflow")

    def cli(*args):
        return subprocess.run([sys.executable, str(root / "main.py"), "place", str(path), *args],
                              capture_output=True, text=True, timeout=300, cwd=root)

    r = cli("mlp", "--tp", "pairs", "--stage", "0")
    assert r.returncode == 0, r.stderr
    r = cli("head", "--stage", "1", "--tp", "rowwise")
    assert r.returncode == 0 and "ReLU (1: act2)" in r.stderr
    g = load_project(path).graph
    assert [(g.nodes[n].stage, g.nodes[n].tp) for n in ("fc1", "act", "fc2", "fc3", "act2", "fc4")] == [
        (0, "colwise"), (0, None), (0, "rowwise"), (1, "rowwise"), (1, None), (1, "rowwise")]
    before = path.read_bytes()
    r = cli("hed", "--stage", "1")
    assert r.returncode != 0 and "'hed' is neither a node nor a block" in r.stderr
    r = cli("head", "--stage", "2")
    assert r.returncode != 0 and "2 pipeline stage(s)" in r.stderr
    assert path.read_bytes() == before
