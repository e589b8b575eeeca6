"""The Training dock driven like a person would: typed values, combo choices, check
boxes on a real (offscreen) main window; every edit one undo step that the summary,
the plan, the saved file and the form all follow."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QCheckBox, QPushButton

from app.main_window import RESOURCES
from app.window import MainWindow
from engine.data.describe import load_arrays
from engine.project import load_project
from engine.data.sources import NpzFile

pytestmark = pytest.mark.gui
EXAMPLES = RESOURCES / "examples"


@pytest.fixture
def win(qtbot, asked, tmp_path):
    """The digits MLP, copied beside the test so that saving and relative paths stay here."""
    path = tmp_path / "mlp.lflow"
    shutil.copy(EXAMPLES / "mlp_digits.lflow", path)
    w = MainWindow(load_project(path), recover=False)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    w.show_workspace("Train")  # the Training form's workspace (app/workspaces.py)
    w.training_dock.raise_()
    QApplication.processEvents()
    return w


def editor(w: MainWindow, *path):
    return w.training_panel.editors[("training", *path) if path[0] != "placement" else path].widget


def type_into(qtbot, spin, text: str) -> None:
    """Select the spin box's text, type, press Enter: what a user does."""
    spin.setFocus()
    spin.selectAll()
    qtbot.keyClicks(spin, text)
    qtbot.keyClick(spin, Qt.Key_Return)


def flops(w: MainWindow) -> str:
    w.controller.flush()
    return w.summary.fields["flops_step"].text()


def test_lr_and_batch_size_are_undo_steps_the_summary_and_plan_follow(qtbot, win):
    w, panel = win, win.training_panel
    before, flops0, plan0 = w.project.training, flops(w), w.controller.plan_info[2]
    assert before.optimizer.lr == pytest.approx(0.003) and before.batch_size == 64
    assert "batch 64" in flops0 and plan0
    assert editor(w, "optimizer", "lr").text() == "0.003"

    type_into(qtbot, editor(w, "optimizer", "lr"), "3e-4")
    type_into(qtbot, editor(w, "batch_size"), "128")
    tr = w.project.training
    assert tr.optimizer.lr == pytest.approx(3e-4) and tr.batch_size == 128
    assert tr.optimizer.name == before.optimizer.name and tr.dataset == before.dataset  # nothing else moved
    assert w.controller.stack.count() == 2 and w.is_dirty() and w.isWindowModified()
    assert editor(w, "optimizer", "lr").text() == "0.0003"  # shown as typed, not rounded to 0.000
    flops1 = flops(w)
    assert "batch 128" in flops1 and flops1 != flops0
    assert w.controller.plan_info[2] != plan0  # activations and FLOPs per step in the plan doubled

    w.actions["undo"].trigger()
    w.actions["undo"].trigger()
    assert w.project.training == before
    assert flops(w) == flops0 and w.controller.plan_info[2] == plan0
    assert editor(w, "batch_size").value() == 64 and editor(w, "optimizer", "lr").value() == pytest.approx(0.003)
    assert not w.is_dirty()

    w.actions["redo"].trigger()
    w.actions["redo"].trigger()
    assert w.project.training == tr and flops(w) == flops1
    assert editor(w, "batch_size").value() == 128 and editor(w, "optimizer", "lr").text() == "0.0003"
    assert not panel.error_label.isVisible()


def test_arrow_steps_on_one_field_are_one_undo_step(qtbot, win):
    w = win
    lr = editor(w, "optimizer", "lr")
    lr.stepUp()
    lr.stepUp()  # the leading digit: 0.003 -> 0.004 -> 0.005
    assert w.project.training.optimizer.lr == pytest.approx(0.005)
    lr.stepDown()
    lr.stepDown()
    lr.stepDown()  # 0.002; at a power of ten the step shrinks: 0.001 -> 0.0009
    assert w.project.training.optimizer.lr == pytest.approx(0.002)
    assert w.controller.stack.count() == 1
    w.actions["undo"].trigger()
    assert w.project.training.optimizer.lr == pytest.approx(0.003)


def test_dataset_kind_switches_fields_and_a_file_gets_a_path_relative_to_the_project(qtbot, win, tmp_path):
    w, panel = win, win.training_panel
    kind = editor(w, "dataset", "kind")
    assert ("training", "dataset", "image") in panel.editors
    editor(w, "dataset", "val_fraction").setValue(0.25)
    kind.setCurrentText("synthetic_regression")
    d = w.project.training.dataset
    assert d.kind == "synthetic_regression" and d.val_fraction == 0.25  # a field of the same name keeps its value
    qtbot.waitUntil(lambda: editor(w, "dataset", "n_targets").isVisibleTo(panel))  # new rows show on the next event
    assert ("training", "dataset", "image") not in panel.editors

    # a file data set needs its path: nothing is written until there is one, and nothing typed is no error
    kind.setCurrentText("npz")
    assert w.project.training.dataset.kind == "synthetic_regression"
    assert not panel.error_label.isVisibleTo(panel) and "Type or browse to the path" in panel.path_where.text()
    box = editor(w, "dataset", "path")
    qtbot.waitUntil(lambda: box.findChild(QPushButton, "browse").isVisibleTo(panel))
    steps = w.controller.stack.count()

    data = tmp_path / "data" / "xy.npz"
    data.parent.mkdir()
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.normal(size=(40, 64)).astype(np.float32), y=rng.integers(0, 10, 40))
    panel.set_path(str(data))  # what Browse… does with the chosen file
    d = w.project.training.dataset
    assert d == NpzFile(kind="npz", path="data/xy.npz", val_fraction=0.25)
    assert w.project.resolve_path(d.path) == data
    assert len(load_arrays(w.project).x_train) == 30  # the engine finds it there: 40 rows, a quarter held out
    assert panel.path_where.text() == str(data)
    assert not panel.error_label.isVisible()
    assert w.controller.stack.count() == steps + 1

    w.actions["undo"].trigger()
    assert w.project.training.dataset.kind == "synthetic_regression"
    assert kind.currentText() == "synthetic_regression" and ("training", "dataset", "n_targets") in panel.editors


def test_an_invalid_combination_is_shown_and_not_written(qtbot, win):
    w, panel = win, win.training_panel
    before, steps = w.project.training, w.controller.stack.count()
    type_into(qtbot, editor(w, "grad_accumulation"), "3")
    assert w.project.training == before and w.controller.stack.count() == steps
    text = panel.error_label.text()
    assert "training.batch_size 64 is not divisible by training.grad_accumulation 3" in text
    assert panel.editors[("training", "batch_size")].label.objectName() == "error"
    assert panel.editors[("training", "grad_accumulation")].label.objectName() == "error"

    type_into(qtbot, editor(w, "optimizer", "lr"), "0")
    assert "training.optimizer.lr: must be greater than 0" in panel.error_label.text()
    assert w.project.training == before
    type_into(qtbot, editor(w, "optimizer", "lr"), "0.01")

    type_into(qtbot, editor(w, "batch_size"), "96")  # now all of it is valid: written in one step
    tr = w.project.training
    assert (tr.batch_size, tr.grad_accumulation, tr.optimizer.lr) == (96, 3, 0.01)
    assert w.controller.stack.count() == steps + 1
    assert not panel.error_label.isVisible()
    assert panel.editors[("training", "batch_size")].label.objectName() == ""
    w.actions["undo"].trigger()
    assert w.project.training == before


def test_steps_or_epochs_and_optional_grad_clip(qtbot, win):
    w, panel = win, win.training_panel
    panel.length_unit.setCurrentText("epochs")
    assert (w.project.training.steps, w.project.training.epochs) == (None, 10)
    type_into(qtbot, panel.length_spin, "3")
    assert w.project.training.epochs == 3
    panel.length_unit.setCurrentText("steps")  # back to the steps it had
    assert (w.project.training.steps, w.project.training.epochs) == (300, None)

    clip = editor(w, "grad_clip")
    spin = clip.findChild(type(editor(w, "optimizer", "lr")))
    assert not spin.isEnabled()
    clip.findChild(QCheckBox).setChecked(True)
    assert w.project.training.grad_clip == 1.0 and spin.isEnabled()
    type_into(qtbot, spin, "0.5")
    assert w.project.training.grad_clip == 0.5
    clip.findChild(QCheckBox).setChecked(False)
    assert w.project.training.grad_clip is None

    # rows that do not apply to the chosen optimizer / schedule are hidden
    assert not editor(w, "optimizer", "momentum").isVisibleTo(panel)
    editor(w, "optimizer", "name").setCurrentText("sgd")
    assert editor(w, "optimizer", "momentum").isVisibleTo(panel)
    assert not editor(w, "optimizer", "betas").isVisibleTo(panel)


def test_precision_and_sync_edit_the_placement(qtbot, win):
    w, panel = win, win.training_panel
    reshard = editor(w, "placement", "reshard_after_forward")
    assert not reshard.isEnabled()  # FSDP only
    w.devices.dpmode.setCurrentText("fsdp")  # the Devices panel's choice enables it
    assert reshard.isEnabled()
    editor(w, "placement", "mixed_precision").setCurrentText("bf16")
    editor(w, "placement", "sync_batchnorm").setChecked(True)
    p = w.project.placement
    assert (p.mixed_precision, p.sync_batchnorm, p.data_parallel) == ("bf16", True, "fsdp")
    w.actions["undo"].trigger()
    assert not w.project.placement.sync_batchnorm and not editor(w, "placement", "sync_batchnorm").isChecked()
    w.actions["redo"].trigger()
    assert editor(w, "placement", "sync_batchnorm").isChecked()


def test_saving_writes_the_values_and_another_project_reloads_the_form(qtbot, win, tmp_path):
    w, panel = win, win.training_panel
    type_into(qtbot, editor(w, "optimizer", "lr"), "0.02")
    editor(w, "schedule", "name").setCurrentText("cosine")
    type_into(qtbot, editor(w, "schedule", "min_lr_ratio"), "0.1")
    editor(w, "placement", "sync_batchnorm").setChecked(True)
    out = tmp_path / "saved.lflow"
    assert w.save_as(out) and not w.is_dirty()
    back = load_project(out)
    assert back.training == w.project.training and back.placement == w.project.placement
    assert (back.training.optimizer.lr, back.training.schedule.name, back.training.schedule.min_lr_ratio) == (0.02, "cosine", 0.1)
    assert back.placement.sync_batchnorm

    type_into(qtbot, editor(w, "grad_accumulation"), "5")  # left invalid: reloading clears it
    assert panel.error_label.isVisible()
    other = load_project(EXAMPLES / "transformer_synthetic.lflow")
    assert w.open_project(EXAMPLES / "transformer_synthetic.lflow")
    assert editor(w, "dataset", "kind").currentText() == other.training.dataset.kind
    assert editor(w, "optimizer", "lr").value() == pytest.approx(other.training.optimizer.lr)
    assert editor(w, "batch_size").value() == other.training.batch_size
    assert editor(w, "grad_accumulation").value() == 1 and not panel.error_label.isVisible()
    assert not editor(w, "placement", "sync_batchnorm").isChecked()

    w.new_project()
    assert editor(w, "optimizer", "lr").value() == pytest.approx(1e-3)
    assert editor(w, "dataset", "kind").currentText() == "synthetic_classification"
    assert Path(w.training_panel.directory()) == Path.cwd()


def test_the_restart_policy_is_a_group_of_the_form_and_each_change_one_undo_step(qtbot, win, tmp_path):
    """training.restarts in the Training dock: max restarts typed is one undo step, saved in
    the project; the asynchronous-checkpoint switch sits in the loop's settings."""
    w = win
    assert editor(w, "restarts", "max_restarts").value() == 3
    type_into(qtbot, editor(w, "restarts", "max_restarts"), "0")
    assert w.project.training.restarts.max_restarts == 0 and w.controller.stack.count() == 1
    assert ("training", "checkpoint_async") in w.training_panel.editors
    w.actions["undo"].trigger()
    assert w.project.training.restarts.max_restarts == 3
