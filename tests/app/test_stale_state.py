"""Nothing of the last project is left on show (issue 42, item 9), driven through the real
window: the title and status bar name the project after New and Open, the find text is
cleared, the Problems count counts every problem, the first Save starts in the user's
folders (not the install folder), and Tab-add wires the selected node to the new one."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

import app.main_window as mw
from app.window import MainWindow
from engine.diagram.graph import Edge, Graph
from engine.project import Project, save_project
from engine.data.sources import SyntheticClassification

pytestmark = pytest.mark.gui
ROOT = Path(__file__).resolve().parents[2]


def small_project(name="small") -> Project:
    g = Graph()
    g.add_node("Input", {"shape": [8]}, pos=(0, 0), id="x")
    g.add_node("Linear", {"out_features": 3}, pos=(240, 0), id="fc")
    g.add_node("Output", {}, pos=(480, 0), id="y")
    g.connect("x", "out", "fc", "in")
    g.connect("fc", "out", "y", "in")
    p = Project(g, name=name)
    p.training.dataset = SyntheticClassification(kind="synthetic_classification", n_features=8, n_classes=3)  # it fits
    return p


@pytest.fixture
def win(qtbot, asked, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERFLOW_PROJECTS_DIR", str(tmp_path / "projects"))
    w = MainWindow(small_project(), recover=False)
    qtbot.addWidget(w)
    w.resize(1440, 900)
    w.show()
    qtbot.waitExposed(w)
    w.controller.flush()
    yield w
    w.run_ui.shutdown()


def saved(tmp_path, name: str) -> Path:
    path = tmp_path / name / f"{name}.lflow"
    path.parent.mkdir(parents=True)
    save_project(small_project(name), path)
    return path


def test_title_status_bar_and_find_box_follow_new_and_open(win, qtbot, tmp_path):
    w = win
    a, b = saved(tmp_path, "alpha"), saved(tmp_path, "beta")
    assert w.open_project(a)
    assert w.windowTitle().startswith("alpha.lflow")
    w.scene.select_nodes(["fc"])
    assert w.crumbs.text().startswith("alpha")  # the status bar's place of the selection
    w.actions["find"].trigger()
    qtbot.keyClicks(w.find_box, "fc")
    assert w.find_box.text() == "fc" and "fc" in w._find_model.stringList()

    assert w.open_project(b)
    assert w.windowTitle().startswith("beta.lflow")
    assert w.crumbs.text() == "beta"  # not "alpha  ›  fc"
    assert str(b) in w.statusBar().currentMessage()
    assert w.find_box.text() == "" and w._find_model.stringList() == []  # alpha's search is gone

    w.actions["new"].trigger()
    assert "untitled" in w.windowTitle() and "beta" not in w.windowTitle()
    assert w.crumbs.text() == "untitled"
    assert "New project" in w.statusBar().currentMessage()
    assert w.find_box.text() == ""


def test_problems_title_counts_every_problem(win):
    w = win
    g = w.project.graph
    for i in range(3):  # three dead ends: 3 warnings ("does not reach an Output")
        w.controller.add_node("ReLU", (240, 200 + 80 * i))
    relus = sorted(n for n in g.nodes if n.startswith("relu") or g.nodes[n].type == "ReLU")
    for r in relus:
        w.controller.connect_ports("x", "out", r, "in")
    w.controller.set_param("fc", "out_features", 0)  # 1 error
    w.controller.flush()
    errors, warnings = w.controller.problems()
    assert (len(errors), len(warnings)) == (1, 3), (errors, warnings)
    assert w.problems_dock.windowTitle() == "Problems (4)"
    assert w.problems.headerItem().text(2) == "problem: 1 error, 3 warnings"
    assert w.problems_dock.toolTip() == "1 error, 3 warnings"
    w.controller.stack.undo()  # out_features back: warnings only, still counted
    w.controller.flush()
    assert w.problems_dock.windowTitle() == "Problems (3)"
    assert w.problems.headerItem().text(2) == "problem: 3 warnings"


def test_first_save_starts_in_the_users_folders_not_the_install_folder(win, tmp_path, monkeypatch):
    w = win
    monkeypatch.chdir(ROOT)  # started from its source/install folder
    starts = []
    monkeypatch.setattr(mw.QFileDialog, "getSaveFileName",
                        staticmethod(lambda parent, title, start, *a, **k: starts.append(Path(start)) or ("", "")))
    monkeypatch.setattr(mw.QFileDialog, "getOpenFileName",
                        staticmethod(lambda parent, title, start, *a, **k: starts.append(Path(start)) or ("", "")))
    assert w.project.path is None
    assert not w.save()  # no projects folder yet: home
    assert starts[-1] == Path.home() / "small.lflow"
    (tmp_path / "projects").mkdir()
    assert not w.save()  # ~/Layerflow (here $LAYERFLOW_PROJECTS_DIR) once there is one
    assert starts[-1] == tmp_path / "projects" / "small.lflow"
    assert not w.open_project()
    assert starts[-1] == tmp_path / "projects"
    assert all(ROOT not in s.parents and s != ROOT for s in starts)
    # after a project was saved somewhere, a new one starts there
    there = tmp_path / "work" / "a.lflow"
    there.parent.mkdir()
    assert w.save_as(there)
    w.new_project()
    assert not w.save()
    assert starts[-1] == there.parent / "untitled.lflow"


def test_tab_add_wires_the_selected_node(win, qtbot):
    w = win
    g = w.project.graph
    w.scene.select_nodes(["fc"])
    w.view.setFocus()
    qtbot.keyClick(w.view, Qt.Key_Tab)  # opens the search at the cursor
    assert w.view.search.isVisible()
    qtbot.keyClicks(w.view.search.edit, "ReLU")
    qtbot.keyClick(w.view.search.edit, Qt.Key_Return)
    QApplication.processEvents()
    new = [n for n in g.nodes if g.nodes[n].type == "ReLU"]
    assert len(new) == 1
    assert Edge("fc", "out", new[0], "in") in g.edges
    assert w.controller.stack.undoText().startswith("Add ReLU and connect")
    w.controller.stack.undo()  # one step: node and wire
    assert not [n for n in g.nodes if g.nodes[n].type == "ReLU"]
    assert Edge("fc", "out", "y", "in") in g.edges

    # nothing selected: the layer is added on its own
    w.scene.clearSelection()
    qtbot.keyClick(w.view, Qt.Key_Tab)
    qtbot.keyClicks(w.view.search.edit, "ReLU")
    qtbot.keyClick(w.view.search.edit, Qt.Key_Return)
    new = [n for n in g.nodes if g.nodes[n].type == "ReLU"]
    assert len(new) == 1 and not [e for e in g.edges if new[0] in (e.src, e.dst)]

    # a palette add with a node selected is no Tab-add: not wired
    w.scene.select_nodes(["x"])
    w.palette.add_requested.emit("Tanh")
    tanh = [n for n in g.nodes if g.nodes[n].type == "Tanh"]
    assert len(tanh) == 1 and not [e for e in g.edges if tanh[0] in (e.src, e.dst)]
