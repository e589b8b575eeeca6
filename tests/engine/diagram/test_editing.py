"""engine/diagram/editing.py: the editor's multi-node edits as model operations (no Qt), and the
Python API calling them."""
from __future__ import annotations

import pytest

import layerflow as lf
from engine.diagram.editing import (EditError, apply, check_rename, fresh_id, plan_group, plan_paste, plan_repeat,
                            plan_ungroup)
from engine.diagram.graph import Graph


def chain() -> Graph:
    """x -> fc -> act -> out, with fc and act in block 'layer' inside 'net'."""
    g = Graph()
    g.add_node("Input", id="x", params={"shape": [8]}, pos=(0, 0))
    g.add_node("Linear", id="fc", params={"out_features": 8}, pos=(200, 0))
    g.add_node("ReLU", id="act", pos=(400, 0))
    g.add_node("Output", id="out", pos=(600, 0))
    g.connect("x", "out", "fc", "in")
    g.connect("fc", "out", "act", "in")
    g.connect("act", "out", "out", "in")
    return g


def test_fresh_ids_and_the_rename_rule():
    assert fresh_id("relu", {"x"}) == "relu"
    assert fresh_id("relu", {"relu"}) == "relu_2"
    assert fresh_id("relu_2", {"relu", "relu_2", "relu_3"}) == "relu_4"
    g = chain()
    check_rename(g, "fc", "proj")
    for bad, why in (("act", "taken"), ("2fc", "letters, digits"), ("class", "Python keyword"), ("a b", "letters")):
        with pytest.raises(EditError, match=why):
            check_rename(g, "fc", bad)
    with pytest.raises(EditError, match="no node 'nope'"):
        check_rename(g, "nope", "x2")


def test_group_nests_and_ungroup_moves_up_one_level():
    g = chain()
    outer = plan_group(g, ["fc", "act"], "net")
    apply(g, outer)
    assert outer.block == "net" and g.nodes["fc"].group == g.nodes["act"].group == "net"
    inner = plan_group(g, ["fc"], "layer")  # inside the innermost block holding the selection
    apply(g, inner)
    assert inner.block == "net/layer" and g.nodes["fc"].group == "net/layer" and g.nodes["act"].group == "net"
    g.collapsed = {"net/layer"}
    wrap = plan_group(g, ["fc", "act"], "wrap")  # net/layer moves inside the new block, collapsed still
    apply(g, wrap)
    assert g.nodes["fc"].group == "net/wrap/layer" and g.collapsed == {"net/wrap/layer"}
    apply(g, plan_ungroup(g, {"net/wrap"}))
    assert g.nodes["fc"].group == "net/layer" and g.nodes["act"].group == "net" and g.collapsed == {"net/layer"}
    with pytest.raises(EditError, match="name of a node"):
        plan_group(g, ["fc"], "act")
    with pytest.raises(EditError, match="not a usable block name"):
        plan_group(g, ["fc"], "a/b")
    with pytest.raises(EditError, match="select the nodes"):
        plan_group(g, [], "x")
    with pytest.raises(EditError, match="no block 'zzz'"):
        plan_ungroup(g, {"zzz"})


def test_paste_gives_fresh_names_and_a_whole_block_becomes_a_new_block():
    g = chain()
    apply(g, plan_group(g, ["fc", "act"], "layer"))
    g.collapsed = {"layer"}
    p = plan_paste(g, g.subgraph_dict(["fc", "act"]))
    assert p.rename == {"fc": "fc_2", "act": "act_2"} and p.blocks == {"layer": "layer_2"}
    assert p.collapsed == {"layer_2"} and [d["pos"] for d in p.nodes] == [[240.0, 40.0], [440.0, 40.0]]
    apply(g, p)
    assert g.nodes["fc_2"].group == "layer_2" and ("fc_2", "out", "act_2", "in") in [
        (e.src, e.src_port, e.dst, e.dst_port) for e in g.edges]
    part = plan_paste(g, g.subgraph_dict(["fc"]), at=(0.0, 500.0))  # part of a block joins it
    assert part.nodes[0]["group"] == "layer" and part.nodes[0]["pos"] == [0.0, 500.0] and part.ids == ["fc_3"]
    with pytest.raises(EditError, match="not a node"):
        plan_paste(g, {"nodes": [{"id": "bad id"}], "edges": []})


def test_repeat_chains_copies_and_refuses_a_block_with_two_inputs():
    g = chain()
    apply(g, plan_group(g, ["fc", "act"], "layer"))
    rep = plan_repeat(g, "layer", 3)
    apply(g, rep)
    assert [p.blocks for p in rep.copies] == [{"layer": "layer_2"}, {"layer": "layer_3"}]
    edges = {(e.src, e.dst) for e in g.edges}
    assert {("x", "fc"), ("act", "fc_2"), ("act_2", "fc_3"), ("act_3", "out")} <= edges
    assert ("act", "out") not in edges and g.topo_order()[-1] == "out"
    g.add_node("Input", id="y", params={"shape": [8]})
    g.add_node("Add", id="add", group="pair")
    g.connect("x", "out", "add", "a")
    g.connect("y", "out", "add", "b")
    with pytest.raises(EditError, match="2 input value"):
        plan_repeat(g, "pair", 2)
    with pytest.raises(EditError, match="at least 2"):
        plan_repeat(g, "layer", 1)


def test_the_python_api_edits_through_the_same_operations(tmp_path):
    p = lf.Project.new("stack", dataset={"kind": "synthetic_classification", "n_features": 8, "n_classes": 4})
    x = p.add("Input", shape=[8])
    fc = p.add("Linear", x, id="fc", out_features=8)
    act = p.add("ReLU", fc, id="act")
    head = p.add("Linear", act, id="head", out_features=4)
    p.add("Output", head)
    one = p.summary().total_params
    assert p.group([fc, act], "layer") == "layer"
    new = p.repeat("layer", 3)
    assert new == ["fc_2", "act_2", "fc_3", "act_3"]
    assert p.summary().total_params == one + 2 * (8 * 8 + 8)  # two more Linear(8, 8)
    p.rename("fc_3", "fc_last")
    assert "fc_last" in p.nodes and "fc_3" not in p.nodes
    with pytest.raises(EditError, match="taken"):
        p.rename("fc", "act")
    copies = p.duplicate(["head"])
    assert copies == ["head_2"] and p.graph.nodes["head_2"].params["out_features"] == 4
    p.ungroup("layer_2")
    assert p.graph.nodes["fc_2"].group is None
    saved = p.save(tmp_path / "stack.lflow")
    back = lf.Project.load(saved)
    assert back.nodes == p.nodes and back.summary().total_params == p.summary().total_params


def test_replacing_training_or_placement_is_an_event():
    from engine.project import Project

    p, seen = Project(), []
    default_batch = p.training.batch_size
    p.subscribe(seen.append)
    p.placement = p.placement.derive(dp=2)
    p.placement = p.placement.derive(dp=2)  # the same value: no event
    p.training = p.training.model_copy(update={"batch_size": 16})
    assert [(e.what, e.old.dp if e.what == "placement" else e.old.batch_size) for e in seen] == [
        ("placement", 1), ("training", default_batch)]
    p.unsubscribe(seen.append)
    p.training = p.training.model_copy(update={"batch_size": 8})
    assert len(seen) == 2


def test_collapsing_a_block_is_an_event_and_not_a_structure_change():
    from engine.diagram.graph import Graph

    g = Graph()
    g.add_node("Linear", id="a", params={"in_features": 4, "out_features": 4})
    g.set_group("a", "blk")
    seen = []
    g.subscribe(seen.append)
    version = g.structure_version
    g.set_collapsed({"blk"})
    g.set_collapsed({"blk"})  # no change: no event
    assert [(e.kind, set(e.old), set(e.new)) for e in seen] == [("collapsed_changed", set(), {"blk"})]
    assert g.collapsed == {"blk"} and g.structure_version == version  # caches of what it computes stay
    g.set_collapsed(set())
    assert seen[-1].kind == "collapsed_changed" and set(seen[-1].old) == {"blk"} and g.collapsed == set()
