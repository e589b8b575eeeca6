"""Diff by meaning and the three-way merge (engine/diff.py), on the bundled examples."""
import json
from pathlib import Path

import pytest

from engine.diff import (
    UNSET,
    diff_projects,
    match_nodes,
    merge_projects,
    resolve_conflict,
)
from engine.project import Project, ProjectError, load_project

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"


def resnet():
    return load_project(EXAMPLES / "resnet_synthetic.lflow")


def mlp():
    return load_project(EXAMPLES / "mlp_digits.lflow")


def kinds(d):
    return sorted((c.kind, c.where) for c in d.changes)


def test_no_changes():
    assert diff_projects(resnet(), resnet()).empty
    assert diff_projects(resnet(), resnet()).text() == "no changes"


def test_renamed_and_moved_nodes_are_matched_by_structure():
    a, b = resnet(), resnet()
    for old in [n for n in b.graph.nodes if n.startswith("b2_")]:
        b.graph.rename_node(old, "blk2_" + old[3:])
        b.graph.move("blk2_" + old[3:], (b.graph.nodes["blk2_" + old[3:]].pos[0] + 400, 900))
    m = match_nodes(a.graph.to_dict(), b.graph.to_dict())
    # the two convs of block 2 have equal parameters: their wiring tells them apart
    assert {k: v for k, v in m.items() if k != v} == {f"b2_{s}": f"blk2_{s}" for s in
                                                       ("conv1", "act1", "conv2", "add", "act2")}
    d = diff_projects(a, b)
    assert {c.kind for c in d.changes} == {"renamed", "moved"}  # no node added, removed or rewired
    assert "(+0)" in d.text()  # the same parameters


def test_parameters_inputs_settings_and_consequences():
    a, b = resnet(), resnet()
    b.graph.set_param("head", "out_features", 8)
    b.graph.remove_node("b1_act2")  # b2's inputs now come from nothing
    b.graph.connect("b1_add", "out", "b2_conv1", "in")
    b.graph.connect("b1_add", "out", "b2_add", "b")
    b.training.optimizer.lr = 0.5
    b.placement.pp = 2
    d = diff_projects(a, b)
    assert ("removed", "b1_act2") in kinds(d)
    assert ("param", "head.out_features") in kinds(d)
    assert ("input", "b2_conv1.in") in kinds(d) and ("input", "b2_add.b") in kinds(d)
    assert ("setting", "training.optimizer.lr") in kinds(d) and ("setting", "placement.pp") in kinds(d)
    text = d.text()
    assert "~ head.out_features 4 -> 8" in text
    assert "~ b2_conv1.in: input from b1_act2 (removed) -> b1_add" in text
    ra, rb = (p.graph for p in (a, b))
    from engine.diagram.compile import compile_graph

    pa, pb = compile_graph(ra).total_params, compile_graph(rb).total_params
    assert f"parameters {pa:,} -> {pb:,} ({pb - pa:+,})" in text and pb - pa == 4 * 16 + 4
    assert "plan changed: 1 pipeline stage(s) -> 2" in text
    assert any(line.startswith("plan changed: stage 1 now holds") for line in text.splitlines())
    js = d.to_json()
    assert json.dumps(js)  # plain JSON
    assert {"kind": "param", "where": "head.out_features", "old": 4, "new": 8} in js["changes"]


def test_added_node_and_unset_param():
    a, b = mlp(), mlp()
    b.graph.add_node("Dropout", id="drop", params={"p": 0.1})
    b.graph.set_param("head", "bias", False)
    d = diff_projects(a, b)
    assert ("added", "drop") in kinds(d)
    assert "~ head.bias (unset) -> False" in d.text()
    assert d.node_status()["drop"][0] == "added" and d.node_status()["head"][0] == "changed"


def test_clean_merge_of_edits_to_different_nodes_fields_and_settings():
    base = resnet()
    ours, theirs = resnet(), resnet()
    ours.graph.set_param("stem", "out_channels", 32)
    ours.graph.rename_node("head", "classifier")
    ours.training.optimizer.lr = 0.01
    theirs.graph.set_param("head", "out_features", 4)  # unchanged: no conflict with the rename
    theirs.graph.set_param("head", "bias", False)  # a new key on the node ours renamed
    theirs.graph.set_placement("b2_conv1", stage=1)
    theirs.placement.pp = 2
    theirs.training.batch_size = 48
    r = merge_projects(base, ours, theirs)
    assert r.clean, r.conflicts
    p = Project.from_dict(r.project)
    assert p.graph.nodes["stem"].params["out_channels"] == 32
    assert "head" not in p.graph.nodes and p.graph.nodes["classifier"].params == {"out_features": 4, "bias": False}
    assert p.graph.incoming("out")["in"].src == "classifier"  # edges follow the rename
    assert p.graph.nodes["b2_conv1"].stage == 1
    assert (p.training.optimizer.lr, p.training.batch_size, p.placement.pp) == (0.01, 48, 2)
    # both sides' changes are there, and nothing else
    assert {c.where for c in diff_projects(base, p).changes if c.kind != "moved"} == {
        "classifier", "stem.out_channels", "classifier.bias", "b2_conv1.stage", "training.optimizer.lr",
        "training.batch_size", "placement.pp"}


def test_adds_on_both_sides_and_rewiring_merge():
    base, ours, theirs = mlp(), mlp(), mlp()
    ours.graph.add_node("Dropout", id="drop1", params={"p": 0.1})
    e = ours.graph.incoming("fc2")["in"]
    ours.graph.disconnect(e)
    ours.graph.connect("act1", "out", "drop1", "in")
    ours.graph.connect("drop1", "out", "fc2", "in")
    theirs.graph.add_node("Dropout", id="drop2", params={"p": 0.2})
    e = theirs.graph.incoming("head")["in"]
    theirs.graph.disconnect(e)
    theirs.graph.connect("act2", "out", "drop2", "in")
    theirs.graph.connect("drop2", "out", "head", "in")
    r = merge_projects(base, ours, theirs)
    assert r.clean, r.conflicts
    g = Project.from_dict(r.project).graph
    assert g.topo_order() == ["x", "fc1", "act1", "drop1", "fc2", "act2", "drop2", "head", "out"]


def test_same_field_changed_on_both_sides_is_a_conflict_in_a_valid_file(tmp_path):
    base, ours, theirs = mlp(), mlp(), mlp()
    ours.graph.set_param("fc1", "out_features", 256)
    theirs.graph.set_param("fc1", "out_features", 64)
    ours.training.optimizer.lr = 0.1
    theirs.training.optimizer.lr = 0.2
    theirs.training.batch_size = 16  # no conflict: merged
    r = merge_projects(base, ours, theirs)
    assert [c.where for c in r.conflicts] == ["node:fc1:params.out_features", "setting:training.optimizer.lr"]
    p = Project.from_dict(r.project)  # loads
    assert p.graph.nodes["fc1"].params["out_features"] == 256 and p.training.batch_size == 16
    assert p.conflicts[0].ours == 256 and p.conflicts[0].theirs == 64 and p.conflicts[0].base == 128
    # saved and read back, the conflicts are still there
    from engine.project import save_project

    save_project(p, tmp_path / "m.lflow")
    back = load_project(tmp_path / "m.lflow")
    assert len(back.conflicts) == 2
    resolve_conflict(back, 1, "theirs")
    resolve_conflict(back, 0, "ours")
    assert back.training.optimizer.lr == 0.2 and back.graph.nodes["fc1"].params["out_features"] == 256
    assert back.conflicts == [] and "conflicts" not in back.to_dict()
    with pytest.raises(ProjectError, match="does not exist"):
        resolve_conflict(back, 0, "theirs")


def test_running_a_project_with_conflicts_is_refused():
    from engine.runs.build import RunError, prepare_run

    base, ours, theirs = mlp(), mlp(), mlp()
    ours.training.seed, theirs.training.seed = 1, 2
    p = Project.from_dict(merge_projects(base, ours, theirs).project)
    with pytest.raises(RunError, match="merge conflict"):
        prepare_run(p)


def test_removed_on_one_side_changed_on_the_other_keeps_the_node():
    base, ours, theirs = mlp(), mlp(), mlp()
    ours.graph.remove_node("act2")
    ours.graph.connect("fc2", "out", "head", "in")
    theirs.graph.set_param("act2", "inplace", True)
    r = merge_projects(base, ours, theirs)
    assert [c.where for c in r.conflicts] == ["node:act2"]
    p = Project.from_dict(r.project)
    assert p.graph.nodes["act2"].params == {"inplace": True}  # nothing is lost
    assert p.graph.incoming("head")["in"].src == "fc2"  # ours' rewiring holds
    keep = p.copy()
    resolve_conflict(p, 0, "ours")  # ours: removed
    assert "act2" not in p.graph.nodes
    resolve_conflict(keep, 0, "theirs")  # theirs: kept, with the edges that still fit
    assert keep.graph.incoming("act2")["in"].src == "fc2"


def test_both_sides_wire_the_same_input_differently():
    base, ours, theirs = mlp(), mlp(), mlp()
    for side, src in ((ours, "act1"), (theirs, "x")):
        side.graph.disconnect(side.graph.incoming("head")["in"])
        side.graph.connect(src, "out", "head", "in")
    r = merge_projects(base, ours, theirs)
    assert [c.where for c in r.conflicts] == ["input:head.in"]
    p = Project.from_dict(r.project)
    assert p.graph.incoming("head")["in"].src == "act1"
    resolve_conflict(p, 0, "theirs")
    assert p.graph.incoming("head")["in"].src == "x"


def test_both_added_a_node_of_the_same_name():
    base, ours, theirs = mlp(), mlp(), mlp()
    ours.graph.add_node("Dropout", id="drop", params={"p": 0.1})
    theirs.graph.add_node("Dropout", id="drop", params={"p": 0.1})
    assert merge_projects(base, ours, theirs).clean  # the same node twice: one
    theirs.graph.set_param("drop", "p", 0.5)
    r = merge_projects(base, ours, theirs)
    assert [c.where for c in r.conflicts] == ["node:drop"]
    p = Project.from_dict(r.project)
    resolve_conflict(p, 0, "theirs")
    assert p.graph.nodes["drop"].params == {"p": 0.5}


def test_a_merge_that_would_make_a_cycle_still_loads():
    base = mlp()
    base.graph.add_node("Add", id="m")
    base.graph.add_node("Add", id="n")
    ours, theirs = base.copy(), base.copy()
    ours.graph.connect("m", "out", "n", "a")  # each edge alone is fine; together, m -> n -> m
    theirs.graph.connect("n", "out", "m", "a")
    r = merge_projects(base, ours, theirs)
    p = Project.from_dict(r.project)
    assert p.graph.find_cycle() is None
    assert p.graph == ours.graph  # ours, with theirs recorded whole
    assert [c.where for c in r.conflicts] == ["project"] and "cycle" in r.conflicts[0].what
    resolve_conflict(p, 0, "theirs")
    assert p.graph == theirs.graph and p.conflicts == []


def test_no_common_ancestor():
    ours, theirs = mlp(), mlp()
    theirs.training.seed = 3
    r = merge_projects(None, ours, theirs)
    assert [c.where for c in r.conflicts] == ["setting:training.seed"]
    assert Project.from_dict(r.project).graph == ours.graph


def test_unset_value_in_a_conflict():
    base, ours, theirs = mlp(), mlp(), mlp()
    ours.graph.set_param("head", "bias", False)
    theirs.graph.set_param("head", "bias", True)
    r = merge_projects(base, ours, theirs)
    assert r.conflicts[0].base is not None and r.conflicts[0].to_dict()["base"] == UNSET


def test_ties_follow_renames():
    a = mlp()
    a.graph.ties = {"head.weight": "fc1.weight"}
    b = a.copy()
    b.graph.rename_node("fc1", "first")
    assert [c.kind for c in diff_projects(a, b).changes] == ["renamed"]
    b.graph.ties = {}
    assert ("setting", "diagram.ties") in kinds(diff_projects(a, b))
