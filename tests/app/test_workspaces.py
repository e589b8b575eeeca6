"""Workspaces (app/workspaces.py): at 1440x900 the canvas owns the window in Design, the
bundled example opens whole and readable, Ctrl+1..4 switch, each workspace keeps its own
arrangement per user, empty panels stay closed, and a run brings Train."""
from __future__ import annotations

import json
import math

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

pytestmark = pytest.mark.gui


def settle(n=5):
    for _ in range(n):
        QApplication.processEvents()


def share(w) -> float:
    v = w.view.geometry()
    return v.width() * v.height() / (w.width() * w.height())


@pytest.fixture
def make(qtbot, asked):
    from app.window import MainWindow

    def make(path=None):
        w = MainWindow(recover=False)
        qtbot.addWidget(w)
        w.resize(1440, 900)
        w.show()
        qtbot.waitExposed(w)
        if path is not None:
            assert w.open_project(path)
        settle()
        w.controller.flush()
        settle()
        return w

    return make


def visible(w, title) -> bool:
    return w.workspaces.docks()[title].isVisible()


def test_design_gives_the_canvas_most_of_the_window_and_the_example_reads_whole(make):
    from app.main_window import EXAMPLE
    from widgets.node_scene.geometry import LOD_DETAIL

    w = make(EXAMPLE)
    assert w.workspaces.current == "Design"
    assert share(w) >= 0.60, f"the canvas has {share(w):.0%} of the window"
    assert visible(w, "Layers") and visible(w, "Inspector") and visible(w, "Problems")
    for empty in ("Remote jobs", "Runs", "Dashboard", "Changes", "Runs Table", "Devices", "Training"):
        assert not visible(w, empty), empty  # no cluster, no run yet; other tasks' panels closed
    # every panel inside the window
    for title, d in w.workspaces.docks().items():
        if d.isVisible() and not d.visibleRegion().isEmpty():  # (a tab behind another is not on show)
            assert w.rect().contains(d.geometry()), title
    # the bundled example: every node in view, drawn as a card with its ports, its name whole
    view = w.view
    assert view.zoom() >= LOD_DETAIL, f"opened at {view.zoom():.0%}: nodes are name chips"
    seen = view.visible_scene_rect()
    view.viewport().grab()  # (paints: the names drawn are recorded)
    for nid, item in w.scene.node_items.items():
        assert seen.contains(item.sceneBoundingRect()), f"{nid} is outside the view"
        assert item.far_label in (None, nid), f"{nid} drawn as {item.far_label!r}"
        assert item.far_label == nid or view.zoom() >= 0.6


def test_keys_switch_and_each_workspace_keeps_its_arrangement(make):
    from app.main_window import EXAMPLE

    w = make(EXAMPLE)
    QTest.keyClick(w, Qt.Key_2, Qt.ControlModifier)
    settle()
    assert w.workspaces.current == "Place" and w.workspaces.bar.currentIndex() == 1
    assert visible(w, "Devices") and visible(w, "Summary") and not visible(w, "Layers")
    assert not visible(w, "Remote jobs")  # no cluster yet
    assert share(w) >= 0.6
    QTest.keyClick(w, Qt.Key_1, Qt.ControlModifier)
    settle()
    assert w.workspaces.current == "Design" and visible(w, "Layers")
    w.palette_dock.close()  # the user's own arrangement of Design
    settle()
    w.workspaces.bar.setCurrentIndex(2)  # the tab bar: Train
    settle()
    assert w.workspaces.current == "Train" and visible(w, "Training") and not visible(w, "Dashboard")
    assert w.workspaces.actions["Train"].isChecked() and not w.workspaces.actions["Design"].isChecked()
    w.show_workspace("Design")
    settle()
    assert not visible(w, "Layers") and visible(w, "Inspector")  # as the user left it
    w.show_workspace("Compare")
    settle()
    w.controller.stack.setClean()
    w.close()
    again = make()  # remembered per user: the last workspace opens, with its arrangement
    assert again.workspaces.current == "Compare"
    again.show_workspace("Design")
    settle()
    assert not visible(again, "Layers")
    again.workspaces.reset()
    settle()
    assert visible(again, "Layers")


def test_a_run_brings_train_with_the_dashboard_large_and_its_runs(make, tmp_path):
    from app.main_window import EXAMPLE

    w = make(EXAMPLE)
    run = tmp_path / "runs" / "transformer_synthetic-20261206-031500"
    run.mkdir(parents=True)
    with open(run / "metrics.jsonl", "w") as f:
        for s in range(1, 41):
            f.write(json.dumps({"step": s, "time": 10 + s / 4, "loss": 2 * math.exp(-s / 15)}) + "\n")
    w.open_run(run)
    settle()
    assert w.workspaces.current == "Train"
    assert visible(w, "Dashboard")
    assert w.run_ui.dashboard_dock.height() >= 0.45 * w.height()
    for title, d in w.workspaces.docks().items():
        if d.isVisible() and not d.visibleRegion().isEmpty():  # (a tab behind another is not on show)
            assert w.rect().contains(d.geometry()), title


def test_compare_shows_the_projects_runs_without_a_refresh(make, tmp_path, monkeypatch):
    """The Runs Table reads the runs again whenever it comes into view: Compare lists the
    project's runs without a press of Refresh."""
    import shutil

    from app.main_window import EXAMPLE
    from engine.project import load_project
    from engine.runs.build import prepare_run
    from engine.runs.history import runs_dir
    from engine.runtime.train import run as train

    monkeypatch.setenv("LAYERFLOW_PROJECTS_DIR", str(tmp_path / "mine"))
    w = make(EXAMPLE)  # (the user's copy of the example, where its runs go)
    d = prepare_run(load_project(w.project.path), runs_dir(w.project.directory) / "r1", steps=3)
    assert train(d).state == "succeeded"
    w2 = make(w.project.path)
    assert w2.sweep_ui.compare.table.model.rowCount() == 0  # (not read while out of view)
    w2.show_workspace("Compare")
    settle()
    assert visible(w2, "Runs Table") and w2.sweep_ui.compare.table.model.rowCount() == 1
    for name in ("Design", "Place", "Train", "Compare"):  # no panel makes the window wider than it is
        w2.show_workspace(name)
        settle()
        assert w2.width() == 1440 and w2.minimumSizeHint().width() <= 1440, (name, w2.minimumSizeHint())
    shutil.rmtree(d)
