"""Files in the editor: save and reopen, the unsaved-changes prompt, recent files,
themes remembered, and recovery of autosaved work after a real crash (SIGKILL)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PySide6.QtWidgets import QMessageBox

from app.main_window import EXAMPLE
from app.window import MainWindow
from engine.diagram.graph import Graph
from engine.project import Project, load_project

pytestmark = pytest.mark.gui
B = QMessageBox.StandardButton
ROOT = Path(__file__).resolve().parents[2]



def small_project() -> Project:
    g = Graph()
    g.add_node("Input", {"shape": [8]}, pos=(0, 0), id="x")
    g.add_node("Linear", {"out_features": 3}, pos=(240, 0), id="fc")
    g.add_node("Output", {}, pos=(480, 0), id="y")
    g.connect("x", "out", "fc", "in")
    g.connect("fc", "out", "y", "in")
    g.set_placement("fc", stage=0, tp="colwise")
    return Project(g, name="small")


def window(qtbot, project=None, recover=False) -> MainWindow:
    w = MainWindow(project or Project(), recover=recover)
    qtbot.addWidget(w)
    w.show()
    return w


def test_save_reopen_equal_and_recent_files(qtbot, asked, tmp_path):
    w = window(qtbot, small_project())
    w.controller.set_param("fc", "out_features", 5)
    w.scene.select_nodes(["fc"])
    w.controller.group_selected("head")
    assert w.is_dirty() and w.isWindowModified()
    path = tmp_path / "proj" / "small.lflow"
    assert w.save_as(path)
    assert not w.is_dirty() and "small.lflow" in w.windowTitle()
    w2 = window(qtbot)
    assert w2.open_project(path)
    assert w2.project.to_dict() == w.project.to_dict()
    assert w2.project.graph == w.project.graph
    assert w2.project.graph.nodes["fc"].group == "head"
    assert set(w2.scene.node_items) == {"x", "fc", "y"}
    # recent files: newest first, shown in File > Open Recent, which the open itself filled
    # (a menu disabled while the list was empty gets no aboutToShow)
    assert w2.recent_menu.isEnabled()
    assert [a.toolTip() for a in w2.recent_menu.actions()][0] == str(path.resolve())
    assert w2.settings.last_project() == str(path.resolve())
    w2.recent_menu.actions()[-1].trigger()  # Clear List
    assert w2.settings.recent_files() == [] and not w2.recent_menu.isEnabled()


def test_file_examples_lists_every_bundled_example_and_opens_the_users_copy(qtbot, asked, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERFLOW_PROJECTS_DIR", str(tmp_path / "mine"))
    w = window(qtbot)
    bundled = sorted(p.name for p in (ROOT / "resources" / "examples").glob("*.lflow"))
    acts = w.examples_menu.actions()
    assert sorted(a.text().rsplit("(", 1)[1].rstrip(")") for a in acts) == bundled and len(bundled) >= 4
    assert all(a.toolTip() and a.isEnabled() for a in acts)  # what the example shows, from its description
    cnn = next(a for a in acts if "cnn_digits.lflow" in a.text())
    cnn.trigger()
    assert w.project.name == "cnn_digits" and w.project.path == tmp_path / "mine" / "examples" / "cnn_digits.lflow"
    assert w.recent_menu.actions()[0].toolTip() == str(w.project.path.resolve())


def test_open_refuses_a_bad_file_with_a_message(qtbot, asked, tmp_path):
    bad = tmp_path / "bad.lflow"
    bad.write_text('{"format_version": 1, "diagram": {"nodes": [{"id": "1x", "type": "Linear"}]}}')
    w = window(qtbot, small_project())
    before = w.project.to_dict()
    assert not w.open_project(bad)
    assert asked["questions"][-1][0] == "Cannot open project"
    assert "1x" in asked["questions"][-1][1]
    assert w.project.to_dict() == before


def test_unsaved_changes_prompt(qtbot, asked, tmp_path):
    w = window(qtbot, small_project())
    w.controller.add_node("ReLU", (700, 0))
    asked["answers"] = [B.Cancel]
    w.new_project()
    assert "relu1" in w.project.graph.nodes and asked["questions"][-1][0] == "Unsaved changes"
    asked["answers"] = [B.Discard]
    w.new_project()
    assert not w.project.graph.nodes and not w.is_dirty()
    # Save from the prompt writes the file first
    w.set_project(load_project(EXAMPLE)) if EXAMPLE.exists() else w.set_project(small_project())
    w.project.path = tmp_path / "kept.lflow"
    w.controller.add_node("ReLU", (0, 400))
    asked["answers"] = [B.Save]
    w.close()
    assert load_project(tmp_path / "kept.lflow").graph == w.project.graph


def test_theme_switch_is_remembered(qtbot, asked):
    w = window(qtbot, small_project())
    w.actions["theme_dark"].trigger()
    assert w.scene.theme.name == "dark" and w.theme_name == "dark"
    img = w.view.grab().toImage()
    assert img.pixelColor(5, 5).lightness() < 80  # the canvas really is dark
    w2 = window(qtbot)
    assert w2.theme_name == "dark"
    w2.apply_theme("light")
    assert w2.view.grab().toImage().pixelColor(5, 5).lightness() > 200


CRASH = textwrap.dedent("""
    import os, sys
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    from PySide6.QtWidgets import QApplication
    app = QApplication([])
    from app.window import MainWindow
    from engine.project import load_project
    w = MainWindow(load_project(sys.argv[1]), recover=False)
    w.controller.add_node("ReLU", (720, 0))
    w.controller.set_param("fc", "out_features", 7)
    print(w.autosave_now(), flush=True)
    os.kill(os.getpid(), 9)  # crash: no closeEvent, the autosave stays
""")


def test_recovery_after_a_crash(qtbot, asked, tmp_path):
    path = tmp_path / "small.lflow"
    from engine.project import save_project

    save_project(small_project(), path)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", CRASH, str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert Path(r.stdout.strip()).exists()
    asked["answers"] = [B.Yes]
    w = window(qtbot, recover=True)
    assert asked["questions"][0][0] == "Recover unsaved work" and str(path) in asked["questions"][0][1]
    g = w.project.graph
    assert "relu1" in g.nodes and g.nodes["fc"].params["out_features"] == 7
    assert w.project.path == path and w.is_dirty()
    assert load_project(path).graph.nodes["fc"].params["out_features"] == 3  # the file itself is untouched
    # offered once, and kept (as this window's own) until the recovered work is saved
    assert [p.name for p in w.settings.autosave_dir.glob("*.lflow")] == [f"{w._autosave_key}.lflow"]
    import json

    meta = json.loads((w.settings.autosave_dir / f"{w._autosave_key}.json").read_text())
    assert meta["pid"] == os.getpid() and meta["path"] == str(path)  # a second crash leaves it to recover
    # a running window's own autosave is not offered to another window
    w.autosave_now()
    assert window(qtbot, recover=True).project.graph.nodes == {} and len(asked["questions"]) == 1
    assert w.save()
    assert load_project(path).graph == g and not list(w.settings.autosave_dir.glob("*.lflow"))


def test_window_and_dock_layout_are_remembered(qtbot, asked):
    w = window(qtbot, small_project())
    w.problems_dock.hide()
    w.actions["minimap"].trigger()  # not part of the layout: back to the default next time
    w.close()
    w2 = window(qtbot)
    assert w2.problems_dock.isHidden() and not w2.inspector_dock.isHidden()


def test_opening_a_project_with_its_own_code_asks_first_and_runs_nothing_untrusted(qtbot, asked, tmp_path):
    """A shared project whose Custom layer would delete a folder: opened without consent,
    nothing runs and the node shows 'not checked'; trusting it is asked once."""
    from engine import trust
    from engine.project import save_project

    victim = tmp_path / "victim"
    victim.mkdir()
    g = Graph()
    g.add_node("Input", {"shape": [4]}, id="x")
    g.add_node("Custom", {"path": "shutil:rmtree", "kwargs": {"path": str(victim)}}, id="wipe")
    g.add_node("Output", {}, id="y")
    g.connect("x", "out", "wipe", "in")
    g.connect("wipe", "out", "y", "in")
    path = save_project(Project(g, name="hostile"), tmp_path / "hostile.lflow")
    w = window(qtbot)
    asked["answers"] = [B.No]
    assert w.open_project(path)
    title, text = asked["questions"][-1]
    assert title == "Trust this project?" and "shutil:rmtree" in text
    errs = w.controller.result.errors_for("wipe")
    assert errs and "not checked" in str(errs[0])
    assert victim.exists()
    assert not trust.allowed("shutil:rmtree")

    # a harmless layer of the user's own: trusted once, not asked again
    g2 = Graph()
    g2.add_node("Input", {"shape": [4]}, id="x")
    g2.add_node("Custom", {"path": "tests.models.interop_models:Swish"}, id="act")
    g2.add_node("Output", {}, id="y")
    g2.connect("x", "out", "act", "in")
    g2.connect("act", "out", "y", "in")
    mine = save_project(Project(g2, name="mine"), tmp_path / "mine.lflow")
    asked["answers"] = [B.Yes]
    n = len(asked["questions"])
    assert w.open_project(mine)
    assert len(asked["questions"]) == n + 1 and w.controller.result.ok
    assert w.open_project(mine) and len(asked["questions"]) == n + 1  # remembered
    # the refused project's code stays refused when it is opened again, and in any project
    # its node is pasted into; what the user draws themselves is theirs
    assert w.open_project(path) and not trust.allowed("shutil:rmtree")
    assert trust.allowed("tests.models.interop_models:Swish")
