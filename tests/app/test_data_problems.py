"""Data problems before Run (issue 42, item 4), driven through the real Training form of a
real (offscreen) main window: the checks the run does (classes against outputs, sample
shape against the Input, the batch against the training set, the path) run as the form
changes, off the GUI thread, and show on the node, in Problems and above the form; a new
kind of data set asks for its path without an error; a folder that is there is never
"(not found)", for a saved project (relative to its folder) or an unsaved one."""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.main_window import RESOURCES
from app.window import MainWindow
from engine.project import load_project

pytestmark = pytest.mark.gui


def open_window(qtbot, path: Path | None, tmp_path: Path) -> MainWindow:
    """The digits MLP (Input [64], head of 10 outputs), saved at `path` or unsaved."""
    project = load_project(RESOURCES / "examples" / "mlp_digits.lflow")
    if path is not None:
        shutil.copy(RESOURCES / "examples" / "mlp_digits.lflow", path)
        project = load_project(path)
    else:
        project.path = None
    w = MainWindow(project, recover=False)
    qtbot.addWidget(w)
    w.resize(1440, 900)
    w.show()
    qtbot.waitExposed(w)
    w.training_dock.raise_()
    settle(w)
    return w


@pytest.fixture
def win(qtbot, asked, tmp_path):
    return open_window(qtbot, tmp_path / "mlp.lflow", tmp_path)


def settle(w: MainWindow) -> None:
    for _ in range(3):
        QApplication.processEvents()
        w.controller.wait_for_data()
    w.controller.flush()
    w.controller.wait_for_data()
    QApplication.processEvents()


def editor(w, *path):
    return w.training_panel.editors[("training", *path)].widget


def type_into(qtbot, widget, text: str) -> None:
    """Select the field's text, type, press Enter: what a user does."""
    widget.setFocus()
    widget.selectAll()
    qtbot.keyClicks(widget, text)
    qtbot.keyClick(widget, Qt.Key_Return)


def problems(w) -> list[tuple[str | None, str]]:
    return [(e.node, e.message) for e in w.controller.problems()[0]]


def badge(w, node: str) -> str:
    b = w.scene.node_items[node].badge
    return b.toolTip() if b is not None and b.isVisible() else ""


def test_generated_classes_and_features_against_the_diagram_as_the_form_changes(qtbot, win):
    w, panel = win, win.training_panel
    assert problems(w) == []  # digits: 64 features, 10 classes, as the diagram
    editor(w, "dataset", "kind").setCurrentText("synthetic_classification")  # 32 features, 4 classes
    settle(w)
    errs = problems(w)
    assert [n for n, _ in errs] == ["x", "head"], errs
    assert "[32]" in errs[0][1] and "4 classes" in errs[1][1]
    assert "4 classes" in badge(w, "head") and "[32]" in badge(w, "x")
    assert w.problems_dock.windowTitle() == "Problems (2)"
    assert w.controller.run_blocker() and "'x'" in w.controller.run_blocker()
    assert panel.data_label.isVisibleTo(panel) and "4 classes" in panel.data_label.text()
    assert not panel.error_label.isVisibleTo(panel)  # the settings are valid: they were applied

    type_into(qtbot, editor(w, "dataset", "n_features"), "64")
    settle(w)
    assert [n for n, _ in problems(w)] == ["head"] and badge(w, "x") == ""
    type_into(qtbot, editor(w, "dataset", "n_classes"), "10")
    settle(w)
    assert problems(w) == [] and badge(w, "head") == ""
    assert not panel.data_label.isVisibleTo(panel)

    w.actions["undo"].trigger()  # the undo step brings the problem back
    settle(w)
    assert [n for n, _ in problems(w)] == ["head"]


def test_npz_asks_for_its_path_without_an_error_then_checks_the_file_off_the_gui_thread(qtbot, win, tmp_path,
                                                                                        monkeypatch):
    import engine.data.describe

    threads = []
    describe = engine.data.describe.describe  # what build_run checks the diagram against
    monkeypatch.setattr(engine.data.describe, "describe",
                        lambda *a, **k: threads.append(threading.current_thread()) or describe(*a, **k))
    w, panel = win, win.training_panel
    kind = editor(w, "dataset", "kind")
    kind.setCurrentText("npz")
    settle(w)
    assert not panel.error_label.isVisibleTo(panel), panel.error_label.text()  # nothing typed yet: no error
    assert "at least 1 character" not in panel.error_label.text()
    assert "Type or browse to the path" in panel.path_where.text() and "digits" in panel.path_where.text()
    assert w.project.training.dataset.kind == "digits" and problems(w) == []

    type_into(qtbot, panel.path_edit, "data/xy.npz")  # not there yet
    settle(w)
    assert w.project.training.dataset.kind == "npz"
    assert panel.path_where.text().endswith("(not found)")
    assert [n for n, _ in problems(w)] == ["x"] and "xy.npz" in problems(w)[0][1]
    assert "xy.npz" in badge(w, "x")

    rng = np.random.default_rng(0)
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "xy.npz", x=rng.normal(size=(200, 64)).astype(np.float32),
             y=rng.integers(0, 2, 200))  # 2 classes against 10 outputs
    type_into(qtbot, panel.path_edit, "data/xy.npz")  # Enter again: it is there now
    qtbot.waitUntil(lambda: not any("xy.npz" in m for _, m in problems(w)), timeout=5000)
    settle(w)
    assert panel.path_where.text() == str(tmp_path / "data" / "xy.npz")
    errs = problems(w)
    assert [n for n, _ in errs] == ["head"] and "2 classes" in errs[0][1], errs
    assert threads and all(t is not threading.main_thread() for t in threads)  # read on the worker

    # batch against the training set: what build_run refuses, before Run
    type_into(qtbot, editor(w, "batch_size"), "500")
    settle(w)
    assert any("batch_size 500" in m and "160 samples" in m for _, m in problems(w)), problems(w)


def test_an_existing_folder_is_never_not_found(qtbot, asked, tmp_path, monkeypatch):
    (tmp_path / "proj" / "images" / "cat").mkdir(parents=True)
    w = open_window(qtbot, tmp_path / "proj" / "mlp.lflow", tmp_path)
    panel = w.training_panel
    editor(w, "dataset", "kind").setCurrentText("image_folder")
    type_into(qtbot, panel.path_edit, "images")  # relative to the project's folder, not the cwd
    settle(w)
    assert panel.path_where.text() == str(tmp_path / "proj" / "images")
    assert w.project.training.dataset.path == "images"
    # a file kind given a folder: said to be a folder, never "not found"
    editor(w, "dataset", "kind").setCurrentText("npz")
    assert w.project.training.dataset.kind == "npz"  # the path carried over
    assert "(a folder: npz reads one file)" in panel.path_where.text()
    # while typing: checked after a pause, without Enter
    panel.path_edit.setFocus()
    panel.path_edit.selectAll()
    qtbot.keyClicks(panel.path_edit, "nowhere")
    qtbot.waitUntil(lambda: panel.path_where.text().endswith("(not found)"), timeout=3000)


def test_an_unsaved_projects_paths(qtbot, asked, tmp_path, monkeypatch):
    """An unsaved project reads relative paths from the folder Layerflow runs in, and a
    browsed-to file stays absolute (it must not move with the first Save)."""
    (tmp_path / "work" / "images" / "cat").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work")
    w = open_window(qtbot, None, tmp_path)
    panel = w.training_panel
    editor(w, "dataset", "kind").setCurrentText("image_folder")
    type_into(qtbot, panel.path_edit, "images")
    settle(w)
    assert panel.path_where.text() == str(tmp_path / "work" / "images")
    panel.set_path(str(tmp_path / "work" / "images"))  # what Browse… does with the chosen folder
    assert w.project.training.dataset.path == str(tmp_path / "work" / "images")
    assert not panel.path_where.text().endswith("(not found)")
    w.save_as(tmp_path / "elsewhere.lflow")
    settle(w)
    assert not panel.path_where.text().endswith("(not found)")


def test_a_big_generated_set_is_checked_from_a_sample(qtbot, win):
    """Millions of generated samples are not made on every edit: a few thousand tell the
    shapes and classes; the split sizes are those of the whole set."""
    w = win
    editor(w, "dataset", "kind").setCurrentText("synthetic_classification")
    type_into(qtbot, editor(w, "dataset", "n_features"), "64")
    type_into(qtbot, editor(w, "dataset", "n_samples"), "2000000")  # 530 MB if made whole
    settle(w)
    assert w.project.training.dataset.n_samples == 2_000_000
    assert [n for n, _ in problems(w)] == ["head"] and "4 classes" in problems(w)[0][1]
    info = next(v for v in w.controller._data_cache.values() if getattr(v, "n_train", 0) > 10_000)
    assert (info.n_train, info.n_val, info.sample_shape) == (1_600_000, 400_000, (64,))
    type_into(qtbot, editor(w, "dataset", "n_samples"), "1000")
    type_into(qtbot, editor(w, "batch_size"), "801")  # 800 training samples
    settle(w)
    assert any("801 is larger than the training set (800 samples)" in m for _, m in problems(w)), problems(w)


def test_an_npz_over_the_whole_file_limit_is_read_in_place_as_the_run_does(qtbot, win, tmp_path, monkeypatch):
    """The form checks an .npz the way build_run does (in place, a chunk at a time), so a
    file too big to load whole is no problem of its own."""
    monkeypatch.setenv("LAYERFLOW_MAX_INPUT_MB", "1")
    rng = np.random.default_rng(0)
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "big.npz", x=rng.normal(size=(8000, 64)).astype(np.float32),
             y=rng.integers(0, 10, 8000))  # 2 MB
    w, panel = win, win.training_panel
    editor(w, "dataset", "kind").setCurrentText("npz")
    type_into(qtbot, panel.path_edit, "data/big.npz")
    settle(w)
    assert w.project.training.dataset.kind == "npz" and problems(w) == []


def test_one_positions_logits_against_a_token_files_targets_show_on_the_output_node(qtbot, asked, tmp_path):
    """nanoGPT imported by module import (its forward keeps the last position) with a token
    file of per-position targets: the window shows the mismatch on the Output node and in
    Problems before Run, with both shapes, as build_run says it."""
    from reference_models import gpt_last_logits_on_tokens

    path, _ = gpt_last_logits_on_tokens(tmp_path)
    w = MainWindow(load_project(path), recover=False)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    settle(w)
    said = "node 'output' (Output): the model's logits are [1, 40] per sample but the data set's targets are [16]"
    qtbot.waitUntil(lambda: any(n == "output" and said in m for n, m in problems(w)), timeout=60_000)
    assert said in badge(w, "output")
    w.run_ui.shutdown()
