"""Saving over a project file that changed on disk since the window read it (issue 45,
item 2, the editor's side): the save is refused, as save_project refuses it, and the
window offers Reload / Save As… / Cancel instead of an error alone."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtWidgets import QMessageBox

import app.main_window as mw
from app.window import MainWindow
from engine.diagram.graph import Graph
from engine.project import Project, load_project, save_project

pytestmark = pytest.mark.gui
B = QMessageBox.StandardButton
ROOT = Path(__file__).resolve().parents[2]
REAL_ASK = mw.EditorWindow.ask  # (tests/conftest.py answers every question; one test here needs the box)


def small_project() -> Project:
    g = Graph()
    g.add_node("Input", {"shape": [8]}, pos=(0, 0), id="x")
    g.add_node("Linear", {"out_features": 3}, pos=(240, 0), id="fc")
    g.add_node("Output", {}, pos=(480, 0), id="y")
    g.connect("x", "out", "fc", "in")
    g.connect("fc", "out", "y", "in")
    return Project(g, name="small")


@pytest.fixture
def opened(qtbot, tmp_path, monkeypatch):
    """A window with a saved project open, edited here, then changed on disk by another
    process (out_features 3 -> 7) before this window saves."""
    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / "home"))
    path = tmp_path / "proj" / "small.lflow"
    path.parent.mkdir()
    save_project(small_project(), path)
    w = MainWindow(Project(), recover=False)
    qtbot.addWidget(w)
    w.show()
    assert w.open_project(path)
    w.controller.add_node("ReLU", (700, 0))  # this window's edit
    w.controller.flush()
    code = ("import sys; from engine.project import load_project, save_project; p = load_project(sys.argv[1]); "
            "p.graph.nodes['fc'].params['out_features'] = 7; save_project(p, sys.argv[1])")
    subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, check=True, timeout=120)
    yield w, path
    w.run_ui.shutdown()


def disk_out_features(path: Path) -> int:
    return load_project(path).graph.nodes["fc"].params["out_features"]


def relus(project) -> list[str]:
    return [n for n, node in project.graph.nodes.items() if node.type == "ReLU"]


def test_cancel_keeps_both_edits(asked, opened):
    w, path = opened
    asked["answers"] = [B.Cancel]
    assert not w.save()
    title, text = asked["questions"][-1]
    assert title == "Project changed on disk" and "small.lflow" in text and "Reload" in text
    assert disk_out_features(path) == 7  # the other edit is not lost
    assert w.is_dirty() and relus(w.project)  # nor this window's


def test_save_as_keeps_this_windows_version_under_another_name(asked, opened, monkeypatch, tmp_path):
    w, path = opened
    other = tmp_path / "proj" / "small-mine.lflow"
    monkeypatch.setattr(mw.QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(other), "")))
    asked["answers"] = [B.Save]  # "Save As…"
    assert w.save()
    assert not w.is_dirty() and w.project.path == other
    assert relus(load_project(other)) and disk_out_features(other) == 3
    assert disk_out_features(path) == 7 and not relus(load_project(path))


def test_reload_asks_then_shows_the_file_as_it_is_on_disk(asked, opened):
    w, path = opened
    asked["answers"] = [B.Reset, B.Cancel]  # Reload, then "no, keep my changes"
    assert not w.save()
    assert asked["questions"][-1][0] == "Discard changes and reload"
    assert relus(w.project) and w.is_dirty()
    asked["answers"] = [B.Reset, B.Discard]  # Reload, discarding this window's edit
    assert not w.save()
    assert not relus(w.project) and not w.is_dirty()
    assert w.project.graph.nodes["fc"].params["out_features"] == 7
    assert set(w.scene.node_items) == {"x", "fc", "y"}
    assert "Reloaded" in w.statusBar().currentMessage()
    # and the reloaded project saves normally over the file again
    w.controller.set_param("fc", "out_features", 9)
    assert w.save() and disk_out_features(path) == 9


def test_the_question_names_its_buttons(monkeypatch, opened):
    """The real question box (no `asked`): its buttons read Reload, Save As…, Cancel."""
    w, path = opened
    seen = []

    def exec_(box):
        seen.append((box.windowTitle(), sorted(b.text().replace("&", "") for b in box.buttons())))
        return B.Cancel

    monkeypatch.setattr(QMessageBox, "exec", exec_)
    monkeypatch.setattr(mw.EditorWindow, "ask", REAL_ASK)
    assert not w.save()
    assert seen == [("Project changed on disk", ["Cancel", "Reload", "Save As…"])]
    assert disk_out_features(path) == 7
    w.controller.stack.setClean()  # (closing asks nothing)
