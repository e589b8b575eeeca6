"""Edit ▸ Compare in the real window: marks on the canvas, ghosts of removed nodes, the
Changes dock with next/previous, a git revision, and merge conflicts settled per item."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from app.window import MainWindow
from engine.diff import merge_projects
from engine.project import Project, load_project, save_project

pytestmark = pytest.mark.gui
ROOT = Path(__file__).resolve().parents[2]
RESNET = ROOT / "resources" / "examples" / "resnet_synthetic.lflow"


def window(qtbot, project) -> MainWindow:
    w = MainWindow(project, recover=False)
    qtbot.addWidget(w)
    w.show()
    w.controller.flush()
    return w


def test_compare_with_a_file_marks_the_canvas_and_steps_through(qtbot, tmp_path):
    old = tmp_path / "old.lflow"
    shutil.copy(RESNET, old)
    p = load_project(RESNET)
    p.graph.set_param("head", "out_features", 8)
    p.graph.remove_node("b1_act2")
    p.graph.connect("b1_add", "out", "b2_conv1", "in")
    p.graph.connect("b1_add", "out", "b2_add", "b")
    p.graph.add_node("ReLU", pos=(100, 600), id="extra")
    p.graph.disconnect(p.graph.incoming("head")["in"])
    p.graph.connect("flat", "out", "extra", "in")
    p.graph.connect("extra", "out", "head", "in")
    for n in ("b2_conv1", "b2_act1"):  # inside a block, collapsed
        p.graph.set_group(n, "block2")
    p.graph.collapsed = {"block2"}
    p.graph.set_param("b2_conv1", "out_channels", 32)
    w = window(qtbot, p)
    ui = w.compare_ui
    assert ui.compare_with_file(str(old))
    scene = w.scene
    assert scene.diff_marks["extra"][0] == "added" and scene.diff_marks["head"][0] == "changed"
    assert "head.out_features 4 -> 8" in scene.diff_marks["head"][1]
    assert "head.out_features 4 -> 8" in scene.node_items["head"].toolTip()  # the old value on hover
    assert list(scene.ghost_items) == ["b1_act2"]  # the removed node, drawn where it was
    ghost = scene.ghost_items["b1_act2"]
    assert ghost.pos().x() == load_project(old).graph.nodes["b1_act2"].pos[0]
    assert not ghost.flags() & ghost.GraphicsItemFlag.ItemIsSelectable
    texts = ui.panel.texts()
    assert "~ head.out_features 4 -> 8" in texts and any(t.startswith("parameters ") for t in texts)
    card = scene.group_items["block2"]  # the collapsed block shows that something inside changed
    assert card.diff_mark() == "changed" and "b2_conv1.out_channels 16 -> 32" in card.toolTip()
    # F8 steps through the changes; a change inside a collapsed block reveals it
    seen = []
    for _ in range(len(ui.panel.entries)):
        ui.actions["next"].trigger()
        seen.append(ui.panel.entries[ui.panel.current_entry()])
    assert "b2_conv1" in seen and "extra" in seen
    i = ui.panel.entries.index("b2_conv1")
    ui.panel.select_entry(i - 1)
    ui.step(1)
    assert "block2" not in w.scene.collapsed and scene.node_items["b2_conv1"].isSelected()
    ui.actions["prev"].trigger()
    assert ui.panel.current_entry() == i - 1
    # the comparison follows edits
    w.controller.set_param("head", "out_features", 4)
    w.controller.flush()
    ui.refresh()
    assert "out_features" not in scene.diff_marks["head"][1]  # its input still changed
    assert "~ head.out_features 4 -> 8" not in ui.panel.texts()
    ui.clear()
    assert scene.diff_marks == {} and scene.ghost_items == {} and ui.panel.entries == []


def test_compare_with_a_git_revision(qtbot, tmp_path):
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    f = tmp_path / "m.lflow"
    shutil.copy(RESNET, f)
    for args in (["init", "-q"], ["add", "m.lflow"], ["commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=tmp_path, env=env, check=True, capture_output=True)
    p = load_project(f)
    p.graph.rename_node("stem", "conv0")
    save_project(p, f)
    w = window(qtbot, load_project(f))
    ui = w.compare_ui
    assert ui.compare_with_revision("HEAD")
    assert "~ stem renamed to conv0" in ui.panel.texts()
    assert ui.diff.renames == {"stem": "conv0"}
    asked = []
    w.ask = lambda *a: asked.append(a[2])
    assert not ui.compare_with_revision("nosuchbranch")
    assert asked and "nosuchbranch" in asked[0]


def test_merge_conflicts_are_listed_and_settled_one_by_one(qtbot, tmp_path):
    base, ours, theirs = (load_project(RESNET) for _ in range(3))
    ours.graph.set_param("head", "out_features", 6)
    theirs.graph.set_param("head", "out_features", 10)
    ours.training.optimizer.lr = 0.1
    theirs.training.optimizer.lr = 0.2
    merged = Project.from_dict(merge_projects(base, ours, theirs).project)
    save_project(merged, tmp_path / "m.lflow")
    w = window(qtbot, load_project(tmp_path / "m.lflow"))
    panel = w.compare_ui.panel
    assert w.compare_ui.dock.isVisible() and panel.conflict_box.isVisibleTo(w)
    assert panel.conflicts.topLevelItemCount() == 2
    assert panel.conflicts.topLevelItem(0).text(1) == "6" and panel.conflicts.topLevelItem(0).text(2) == "10"
    panel.conflicts.setCurrentItem(panel.conflicts.topLevelItem(1))
    panel.take_theirs.click()
    assert w.project.training.optimizer.lr == 0.2 and len(w.project.conflicts) == 1
    assert panel.conflicts.topLevelItemCount() == 1
    panel.take_theirs.click()
    assert w.project.graph.nodes["head"].params["out_features"] == 10 and w.project.conflicts == []
    assert not panel.conflict_box.isVisibleTo(w)
    w.controller.stack.undo()  # one undo step each
    assert len(w.project.conflicts) == 1 and w.project.graph.nodes["head"].params["out_features"] == 6
    w.controller.stack.redo()
    assert w.save_as(tmp_path / "done.lflow")
    assert load_project(tmp_path / "done.lflow").conflicts == []
