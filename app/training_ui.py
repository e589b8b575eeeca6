"""The Training dock, installed into the main window (app/window.py): the project's
training settings and precision/sync placement as a form (widgets/training_panel.py).

Each valid edit is one undo step (controller.set_training / set_mesh): it marks the
project modified and recompiles, so the summary's FLOPs per step and the plan follow
the batch size. Undo, redo and another project reload the form. The checkpoint interval
the project's latest run with measured checkpoints suggests (Young/Daly,
engine/runs/checkpoint_interval.py) is shown under its field, read again when a project
opens and when a run ends.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, get_args, get_origin

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget, QFileDialog, QSpinBox

from widgets.training_panel import _BIG, TrainingPanel, _bounds

FOLDER_KINDS = ("image_folder", "token_file", "parquet", "array", "shards")  # may be a folder


class _TrainingPanel(TrainingPanel):
    """The form, where a data set read in place may be a folder (an image folder, a folder
    of .bin/.npy/.parquet/.tar files): no "(not found)" for one, and Browse… offers a folder
    for the kinds that are mostly folders. (The Data dock, app/data_ui.py, is the place to
    pick and look at a data set; this keeps the form's path row consistent with it.)"""

    def _value(self, ann, info, commit):
        """A Literal of numbers (image channels: 1 or 3) in a combo box: shown as text,
        read back as the number (the form's own editor passes the int to setCurrentText);
        an int whose bound passes a spin box's (a vocabulary of up to 2**32) is cut to it."""
        if ann is int:
            lo, hi = _bounds(info, True)
            w = QSpinBox()
            w.setRange(max(lo, -_BIG - 1), min(hi, _BIG))
            w.setKeyboardTracking(False)
            w.valueChanged.connect(commit)
            return w, w.value, w.setValue
        w, get, put = super()._value(ann, info, commit)
        values = get_args(ann) if get_origin(ann) is Literal else ()
        if not values:
            return w, get, put
        by_text = {str(v): v for v in values}
        first = str(values[0])  # an Optional Literal switched off starts at its first value, not at 1
        return w, lambda: by_text.get(get(), get()), lambda v: put(str(v) if str(v) in by_text else first)

    def _show_where(self) -> None:
        """The path as the run will read it, and whether it is there: a folder is fine for
        the kinds that take one, and said to be a folder (never "not found") for the others."""
        text = self.path_edit.text().strip()
        if not text:
            return super()._show_where()
        kind = self.draft["training"]["dataset"]["kind"]
        p = Path(text).expanduser()
        p = p if p.is_absolute() else self.directory().absolute() / p
        if p.is_file() or (p.is_dir() and kind in FOLDER_KINDS) or (kind == "shards" and "{" in p.name):
            note = ""
        elif p.is_dir():
            note = f" (a folder: {kind} reads one file)"
        else:
            note = " (not found)"
        self.path_where.setText(f"{os.path.normpath(p)}{note}")

    def browse(self) -> None:
        kind = self.draft["training"]["dataset"]["kind"]
        if kind not in ("image_folder", "shards"):
            return super().browse()
        start = self.path_edit.text().strip() or "."
        start = start if Path(start).is_absolute() else str(self.directory() / start)
        chosen = QFileDialog.getExistingDirectory(self, "Data set folder", start)
        if chosen:
            self.set_path(chosen)


def install(window) -> tuple[TrainingPanel, QDockWidget]:
    """The Training dock of `window`: (its panel, the dock); app/window.py calls this."""
    panel = _TrainingPanel()
    panel.directory = lambda: window.project.directory  # engine/data/describe.py reads relative paths from there
    panel.saved = lambda: window.project.path is not None  # an unsaved project keeps chosen paths absolute
    dock = window.add_dock("Training", panel, Qt.RightDockWidgetArea)
    # a tab beside Inspector / Devices / Runs; the Inspector stays in front
    window.tabifyDockWidget(window.inspector_dock, dock)
    window.inspector_dock.raise_()
    c = window.controller
    panel.training_edited.connect(c.set_training)
    panel.placement_edited.connect(c.set_mesh)
    c.training_changed.connect(lambda: panel.set_training(window.project.training))
    c.placement_changed.connect(lambda: panel.set_placement(window.project.placement))
    panel.path_entered.connect(c.recheck_data)
    c.stack.cleanChanged.connect(lambda *_: panel.refresh_where())  # saved elsewhere: relative paths start there
    c.compiled.connect(lambda *_: panel.show_data_problems([str(e) for e in c.data_errors]))

    def reload() -> None:
        p = window.project
        panel.set_project(p.training, p.placement)
        suggest_interval(panel, window)
    window.project_changed.connect(reload)
    run_ui = getattr(window, "run_ui", None)  # (installed before this dock: app/window.py)
    if run_ui is not None:
        run_ui.controller.finished.connect(lambda *_: suggest_interval(panel, window))
    reload()
    return panel, dock


def suggest_interval(panel: TrainingPanel, window) -> None:
    """The checkpoint interval the project's runs suggest, under its field; what it needs when
    no run measured its saves. (Reads status.json of the runs and the metrics of the newest
    ones until one has checkpoint records.)"""
    from engine.runs.checkpoint_interval import NEEDS, suggest_for_runs
    from engine.runs.history import runs_dir

    try:  # (projects in one folder share runs/: this project's own, by the name each run records)
        got = suggest_for_runs(runs_dir(window.project.directory), name=window.project.name)
    except (OSError, ValueError):
        got = None
    panel.show_checkpoint_suggestion(got, f"none yet: it needs {NEEDS}")
