"""The Training dock's suggested checkpoint interval (widgets/training_panel.py, app/training_ui.py,
engine/runs/checkpoint_interval.py) on a real (offscreen) main window: with no run it says
what it needs; after a real short run of the project that wrote checkpoints, it shows the
Young/Daly interval from that run's measured saves, and its button sets it, one undo step."""
from __future__ import annotations

import shutil

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.main_window import RESOURCES
from app.window import MainWindow
from engine.project import load_project
from engine.runs import checkpoint_interval as ci
from engine.runs.build import build_run
from engine.runs.history import runs_dir
from engine.runtime.train import run

pytestmark = pytest.mark.gui


@pytest.fixture
def win(qtbot, asked, tmp_path):
    path = tmp_path / "mlp.lflow"
    shutil.copy(RESOURCES / "examples" / "mlp_digits.lflow", path)
    w = MainWindow(load_project(path), recover=False)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    w.show_workspace("Train")
    w.training_dock.raise_()
    QApplication.processEvents()
    return w


def test_the_suggested_interval_from_a_real_run_and_its_button(qtbot, win):
    w, panel = win, win.training_panel
    assert "Suggested interval: none yet: it needs" in panel.interval_hint.text()
    assert "checkpoint" in panel.interval_hint.text() and panel.interval_apply.isHidden()
    assert panel.interval_hint.isVisible()  # under the checkpoint_interval field, in the Loop group

    ci.save_device_mtbf_hours(1.0)  # a flaky cluster: an interval of a few steps (the config folder is the test's)
    project = w.project.copy()
    project.training.checkpoint_interval = 5
    rd = build_run(project, runs_dir(w.project.directory) / "r1", steps=20).run_dir
    assert run(rd).state == "succeeded"
    w.run_ui.controller.finished.emit(str(rd), "succeeded")  # a run of this project ended: the dock reads it
    QApplication.processEvents()

    want = ci.suggest_for_runs(runs_dir(w.project.directory))
    assert want.run == "r1" and want.saves == 4
    assert panel.interval_hint.text() == f"Suggested: every {want.steps:,} steps (Young/Daly)\n{want.formula}, measured in r1"
    assert panel.interval_hint.toolTip() == want.line and "1 h per device" in want.line
    button = panel.interval_apply
    assert button.isVisible() and button.text() == f"Use {want.steps:,}" and button.isEnabled()
    assert w.project.training.checkpoint_interval == 100

    qtbot.mouseClick(button, Qt.LeftButton)
    assert w.project.training.checkpoint_interval == want.steps
    assert panel.editors[("training", "checkpoint_interval")].widget.value() == want.steps
    assert w.controller.stack.count() == 1 and not button.isEnabled()  # set: nothing left to apply
    w.actions["undo"].trigger()
    assert w.project.training.checkpoint_interval == 100 and button.isEnabled()


def test_another_projects_runs_suggest_nothing(qtbot, win, tmp_path):
    """Projects in one folder share runs/: a run of another project is not this one's."""
    from app import training_ui

    other = load_project(RESOURCES / "examples" / "mlp_digits.lflow")
    other.name = "someone-else"
    other.training.checkpoint_interval = 5
    rd = build_run(other, runs_dir(win.project.directory) / "theirs", steps=6).run_dir
    assert run(rd).state == "succeeded" and ci.suggest_for_runs(rd.parent) is not None
    training_ui.suggest_interval(win.training_panel, win)
    assert "none yet" in win.training_panel.interval_hint.text()
