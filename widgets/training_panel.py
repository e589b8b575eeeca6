"""The Training panel: a project's training settings (engine.project.Training) and the
precision/sync part of its placement, as a form built from the pydantic models.

Editors come from the fields' declarations: int -> spin box, float -> FloatSpin (any
magnitude: 3e-4 stays 3e-4), Literal -> combo box, bool -> check box, Optional -> a check
box that enables the editor, tuple[float, float] -> two spin boxes, str -> text field (a
data file's path gets Browse…). Bounds come from Field(ge/gt/le/lt); tooltips from a
field's description, else HELP. The data set's kind chooses which fields are shown.

The form edits a draft (the models as dicts). After each edit the draft is validated with
pydantic: a valid one is reported (training_edited / placement_edited), an invalid one is
shown above the form with pydantic's field path and message and reported nowhere, so the
project keeps its last valid settings. The panel never changes the project itself.

Under checkpoint_interval, the interval the project's runs suggest (given by the caller,
show_checkpoint_suggestion: app/training_ui.py, from engine/runs/checkpoint_interval.py)
and a button that sets it, an edit like any other.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QValidator
from PySide6.QtWidgets import (QAbstractSpinBox, QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout, QGroupBox,
                               QHBoxLayout, QLabel, QLineEdit, QPushButton, QScrollArea, QSpinBox, QVBoxLayout,
                               QWidget)

from engine.project import Placement, Training
from engine.data.sources import Dataset

_BIG = 2**31 - 1
KINDS = {get_args(m.model_fields["kind"].annotation)[0]: m for m in get_args(Dataset)}
KIND = ("training", "dataset", "kind")
INTERVAL = ("training", "checkpoint_interval")
PRECISION = ("mixed_precision", "sync_batchnorm", "reshard_after_forward")  # the placement fields shown here
FILE_FILTERS = {"npz": "NumPy arrays (*.npz)", "csv": "CSV files (*.csv *.txt)"}

LABELS = {"optimizer.name": "algorithm", "schedule.name": "schedule", "optimizer.lr": "learning rate",
          "grad_clip": "clip gradient norm", "val_fraction": "validation fraction", "n_samples": "samples",
          "kind": "source", "mixed_precision": "mixed precision", "sync_batchnorm": "sync BatchNorm",
          "reshard_after_forward": "reshard after forward", "steps": "train for"}
HELP = {
    "dataset.kind": "where the samples come from: generated, scikit-learn's digits, or a file",
    "dataset.n_samples": "samples generated (training and validation together)",
    "dataset.val_fraction": "share of the samples held out for validation",
    "dataset.seed": "seed of the generator and of the training/validation split",
    "dataset.noise": "standard deviation of the noise added to each sample",
    "dataset.path": "the data file, relative to the project file's folder (or absolute)",
    "dataset.target": "the target column: its name, or its index (-1: the last column)",
    "dataset.header": "the first line holds column names",
    "dataset.image": "on: (1, 8, 8) images; off: 64 features per sample",
    "optimizer.lr": "learning rate (the peak, reached after warm-up)",
    "optimizer.weight_decay": "L2 penalty on the weights (decoupled for AdamW)",
    "optimizer.momentum": "SGD momentum",
    "optimizer.betas": "Adam/AdamW averaging coefficients (beta1, beta2)",
    "schedule.name": "constant; cosine decay to min_lr_ratio × lr at the last step; step: × gamma every step_size steps",
    "schedule.warmup_steps": "steps of linear warm-up from 0 to the learning rate",
    "schedule.step_size": "step schedule: steps between two decays",
    "schedule.gamma": "step schedule: factor applied at each decay",
    "schedule.min_lr_ratio": "cosine schedule: the final learning rate as a fraction of lr",
    "restarts.max_restarts": "several processes: how often the run starts again by itself from its latest\n"
                             "checkpoint after a rank fails or hangs (0: never)",
    "restarts.backoff_s": "the wait before the first restart; twice as long before each next one (at most 60 s)",
    "restarts.hang_timeout_s": "a rank with no step for this long is treated as failed; off: 30 times the\n"
                               "measured step time, at least 120 s",
    "checkpoint_async": "write checkpoints behind the training steps (the steps wait only while the state is\n"
                        "copied to host memory)",
    "batch_size": "samples per optimizer step, over all data-parallel replicas (FLOPs per step scale with it)",
    "steps": "training length: optimizer steps, or epochs (passes over the training set)",
    "eval_interval": "optimizer steps between two evaluations on the validation set",
    "log_interval": "optimizer steps between two metrics records (their mean loss); off: chosen so that\n"
                    "records come about 4 times a second and cost under 1% of the training time",
    "checkpoint_interval": "optimizer steps between two checkpoints (the suggestion under it: Young/Daly's\n"
                           "sqrt(2 x C x M) from a run's measured saves, C, and the time between failures, M)",
    "seed": "seed of the weights' initialisation and the batch order",
    "grad_clip": "clip the gradients' global norm to this value",
    "grad_accumulation": "micro-batches per optimizer step in one process: batch_size must be a multiple",
    "compile": "torch.compile of the model: off; blocks: one compile per block (regional, as torchtitan\n"
               "compiles each transformer block); whole: the model at once. The first compile's time is in the\n"
               "run log and the metrics, not in the step time; a block that fails to compile runs eagerly",
    "mixed_precision": "bf16: compute in bfloat16, keep float32 weights (FSDP casts, otherwise autocast)",
    "sync_batchnorm": "BatchNorm statistics over all data-parallel replicas",
    "reshard_after_forward": "FSDP only (data parallel: fsdp in Devices): free gathered parameters after the forward",
}
KIND_HELP = {"synthetic_classification": "one random centre per class, samples scattered around it with noise",
             "synthetic_regression": "random features; targets from a random tanh network, plus noise",
             "synthetic_sequence": "token sequences, each class preferring its own slice of the vocabulary",
             "synthetic_images": "one smooth random template per class, plus noise",
             "csv": "a CSV file: feature columns and one target column"}
# field -> (the field it depends on, the values where it applies); training rows hide, placement rows grey out
RELEVANT = {
    ("training", "optimizer", "momentum"): (("training", "optimizer", "name"), {"sgd"}),
    ("training", "optimizer", "betas"): (("training", "optimizer", "name"), {"adam", "adamw"}),
    ("training", "schedule", "step_size"): (("training", "schedule", "name"), {"step"}),
    ("training", "schedule", "gamma"): (("training", "schedule", "name"), {"step"}),
    ("training", "schedule", "min_lr_ratio"): (("training", "schedule", "name"), {"cosine"}),
    ("placement", "reshard_after_forward"): (("placement", "data_parallel"), {"fsdp"}),
}
BETAS = (0.0, 1 - 1e-9)  # torch wants 0 <= beta < 1; the model does not say
WHERE_DELAY_MS = 300  # typing pause before the path's "(not found)" is checked
OPTIONAL_START = {"grad_clip": 1.0}  # the value an Optional field gets when switched on


def _dig(d: dict, path: tuple) -> Any:
    for k in path:
        d = d[k]
    return d


def _key(path: tuple) -> str:
    return ".".join(path[1:])


def _help(path: tuple, info) -> str:
    key = _key(path)
    return (getattr(info, "description", None) or HELP.get(key)
            or HELP.get(f"dataset.{path[-1]}" if path[1:2] == ("dataset",) else path[-1], ""))


def _kind_doc(kind: str) -> str:
    return (KINDS[kind].__doc__ or KIND_HELP.get(kind, "")).strip()


def _label(path: tuple) -> str:
    return LABELS.get(_key(path)) or LABELS.get(path[-1]) or path[-1].replace("_", " ")


def _bounds(info, integer: bool) -> tuple[float, float]:
    """Spin-box range from Field(ge/gt/le/lt). Exclusive bounds stay reachable so that
    pydantic, not the spin box, says what is wrong with them."""
    lo, hi = (0, _BIG) if integer else (0.0, 1e12)
    for m in info.metadata:
        for name in ("ge", "gt"):
            if getattr(m, name, None) is not None:
                lo = getattr(m, name) + (1 if integer and name == "gt" else 0)
        for name in ("le", "lt"):
            if getattr(m, name, None) is not None:
                hi = getattr(m, name) - (1 if integer and name == "lt" else 0)
    return lo, hi


def messages(part: str, exc: ValidationError) -> list[tuple[tuple, str]]:
    """(field path, 'training.optimizer.lr: must be greater than 0') per pydantic error."""
    out = []
    for err in exc.errors(include_url=False):
        loc = tuple(str(p) for p in err["loc"] if p not in KINDS)  # the union's tag is not a field
        msg = err["msg"].removeprefix("Value error, ")
        msg = msg[:1].lower() + msg[1:]
        msg = msg.replace("input should be", "must be")
        if loc:
            out.append(((part, *loc), f"{'.'.join((part, *loc))}: {msg}"))
        else:  # a whole-model check: its message names the fields
            names = re.findall(rf"{part}\.(\w+)", msg)
            out += [((part, n), "") for n in names[1:]]
            out.append(((part, names[0]) if names else (part,), msg if names else f"{part}: {msg}"))
    return out


class FloatSpin(QDoubleSpinBox):
    """A float of any magnitude, shown as %g (3e-4, 0.999); the arrows change the
    leading digit (1e-3 -> 2e-3 up, -> 9e-4 down)."""

    _PARTIAL = re.compile(r"[-+]?\d*\.?\d*(e[-+]?\d*)?", re.I)

    def __init__(self, lo: float, hi: float):
        super().__init__()
        self.setDecimals(323)  # Qt rounds values to `decimals`: keep 1e-8 a 1e-8
        self.setRange(lo, hi)
        self.setKeyboardTracking(False)  # valueChanged on Enter / focus out / arrows, not per key

    def textFromValue(self, v: float) -> str:  # noqa: N802 (Qt API)
        return f"{v:.10g}"

    def valueFromText(self, text: str) -> float:  # noqa: N802
        try:
            return float(text)
        except ValueError:
            return self.value()

    def validate(self, text: str, pos: int):
        t = text.strip()
        try:
            float(t)
            state = QValidator.Acceptable
        except ValueError:
            state = QValidator.Intermediate if self._PARTIAL.fullmatch(t) else QValidator.Invalid
        return state, text, pos

    def stepBy(self, steps: int) -> None:  # noqa: N802
        v = self.value()
        for _ in range(abs(steps)):
            below = v * (1 - 1e-9) if steps < 0 else v  # 1e-3 down steps by 1e-4
            step = 10 ** math.floor(math.log10(abs(below))) if below else 0.01
            v = float(f"{v + math.copysign(step, steps):.10g}")
        self.setValue(v)


@dataclass
class _Editor:
    path: tuple
    widget: QWidget
    load: Callable[[dict], None]
    store: Callable[[dict], None]
    label: QLabel | None = None
    form: QFormLayout | None = None


class TrainingPanel(QWidget):
    training_edited = Signal(object, str)  # a validated Training, the field edited ("optimizer.lr")
    placement_edited = Signal(str, object)  # placement field, value (already validated)
    path_entered = Signal()  # Enter in the path field, changed or not: the file may be there now

    def __init__(self, parent=None):
        super().__init__(parent)
        self.directory: Callable[[], Path] = Path.cwd  # where relative data paths start: the project file's folder
        self.saved: Callable[[], bool] = lambda: True  # has the project a file (else chosen paths stay absolute)
        self.known = {"training": Training(), "placement": Placement()}  # the project's values as last seen
        self.draft = {p: m.model_dump() for p, m in self.known.items()}
        self.errors: dict[str, list[tuple[tuple, str]]] = {"training": [], "placement": []}
        self.untouched: set[tuple] = set()  # required fields a new kind left empty, not typed into yet
        self.pending: list[tuple] = []  # of those, the ones that keep the draft from being applied
        self.editors: dict[tuple, _Editor] = {}
        self._updating = False
        self._length = {"steps": 200, "epochs": 10}  # each unit's last value, for switching back

        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        self.error_label = QLabel()
        self.error_label.setObjectName("error")
        self.error_label.setWordWrap(True)
        self.error_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.error_label.setContentsMargins(10, 6, 10, 0)
        self.error_label.hide()
        outer.addWidget(self.error_label)
        # what the run would refuse about the data set against the diagram (engine.runs.build.check_data)
        self.data_label = QLabel()
        self.data_label.setObjectName("error")
        self.data_label.setWordWrap(True)
        self.data_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.data_label.setContentsMargins(10, 6, 10, 0)
        self.data_label.hide()
        outer.addWidget(self.data_label)
        self._where_timer = QTimer(self, singleShot=True, interval=WHERE_DELAY_MS, timeout=self.refresh_where)
        scroll = QScrollArea(widgetResizable=True)
        scroll.setFrameShape(QScrollArea.NoFrame)
        outer.addWidget(scroll, 1)
        page = QWidget()
        lay = QVBoxLayout(page)
        lay.setContentsMargins(8, 6, 8, 8)
        scroll.setWidget(page)

        self.data_form = self._group(lay, "Data")
        self._row(self.data_form, KIND, Training.model_fields["dataset"])
        combo = self.editors[KIND].widget
        for i, kind in enumerate(KINDS):
            combo.setItemData(i, _kind_doc(kind), Qt.ToolTipRole)
        self.kind_doc = QLabel()
        self.kind_doc.setObjectName("hint")
        self.kind_doc.setWordWrap(True)
        self.data_form.addRow(self.kind_doc)
        self._dataset_rows()
        for title, model in (("Optimizer", "optimizer"), ("Schedule", "schedule"), ("Restarts", "restarts")):
            form = self._group(lay, title)
            for name, info in Training.model_fields[model].annotation.model_fields.items():
                self._row(form, ("training", model, name), info)
        form = self._group(lay, "Loop")
        for name, info in Training.model_fields.items():
            if name == "steps":
                self._length_row(form)
            elif name not in ("dataset", "optimizer", "schedule", "restarts", "epochs"):
                self._row(form, ("training", name), info)
        self._interval_hint(form)
        form = self._group(lay, "Precision && sync")
        for name in PRECISION:
            self._row(form, ("placement", name), Placement.model_fields[name])
        lay.addStretch(1)
        self.setStyleSheet("QDoubleSpinBox { padding: 2px 4px; }")  # as tall as the theme's QSpinBox
        self._align()
        self._load_all()

    # ----- building -----------------------------------------------------------
    @staticmethod
    def _group(lay: QVBoxLayout, title: str) -> QFormLayout:
        box = QGroupBox(title)
        form = QFormLayout(box)
        form.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
        lay.addWidget(box)
        return form

    def _row(self, form: QFormLayout, path: tuple, info) -> _Editor:
        ed = self._editor(path, info)
        ed.label, ed.form = self._label_for(path, ed.widget), form
        tip = _help(path, info)
        for w in (ed.label, ed.widget):
            w.setToolTip(tip)
        ed.widget.setObjectName(_key(path))
        self._compact(ed.widget)
        form.addRow(ed.label, ed.widget)
        self.editors[path] = ed
        return ed

    @staticmethod
    def _label_for(path: tuple, field: QWidget) -> QLabel:
        """The row's label, centred on its field (QFormLayout puts labels at the top)."""
        lab = QLabel(_label(path))
        lab.setAlignment(Qt.AlignLeft | Qt.AlignVCenter)
        lab.setMinimumHeight(field.sizeHint().height())
        return lab

    @staticmethod
    def _compact(widget: QWidget) -> None:
        """Spin boxes and combos may be narrower than their widest value: the dock is narrow."""
        for w in [widget, *widget.findChildren(QWidget)]:
            if isinstance(w, QAbstractSpinBox):
                w.setMinimumWidth(60)
            elif isinstance(w, QComboBox):
                w.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
                w.setMinimumContentsLength(6)

    def _dataset_rows(self) -> None:
        """The chosen kind's fields below the kind combo (rows 0 and 1)."""
        for path in [p for p in self.editors if p[:2] == KIND[:2] and p != KIND]:
            del self.editors[path]
        while self.data_form.rowCount() > 2:
            self.data_form.removeRow(2)
        kind = self._rows_kind = self.draft["training"]["dataset"]["kind"]
        for name, info in KINDS[kind].model_fields.items():
            if name != "kind":
                self._row(self.data_form, ("training", "dataset", name), info)
        self.kind_doc.setText(_kind_doc(kind))
        self._align()

    def _align(self) -> None:
        """One label column for all groups (each group has its own form)."""
        labels = [ed.label for ed in self.editors.values() if ed.label is not None]
        width = max(lab.sizeHint().width() for lab in labels)
        for lab in labels:
            lab.setMinimumWidth(width)

    def _editor(self, path: tuple, info) -> _Editor:
        ann, name = info.annotation, path[-1]
        if path == KIND:  # each member of the union has its own one-value Literal
            ann = Literal[tuple(KINDS)]
        args = get_args(ann)
        commit = lambda *_: self._edited(path)  # noqa: E731
        if get_origin(ann) is Union and type(None) in args:  # Optional[X]: a check box switches it on
            box = QWidget()
            row = QHBoxLayout(box)
            row.setContentsMargins(0, 0, 0, 0)
            on = QCheckBox()
            w, get, put = self._value(args[0], info, commit)
            row.addWidget(on)
            row.addWidget(w, 1)
            on.toggled.connect(lambda checked: (w.setEnabled(checked), commit()))
            start = OPTIONAL_START.get(name, _bounds(info, args[0] is int)[0] or 1)

            def put_opt(v):
                on.setChecked(v is not None)
                w.setEnabled(v is not None)
                put(start if v is None else v)
            return self._simple(path, box, lambda: get() if on.isChecked() else None, put_opt)
        w, get, put = self._value(ann, info, commit)
        if name == "path":
            return self._path_editor(path, w, get, put)
        return self._simple(path, w, get, put)

    @staticmethod
    def _simple(path, widget, get, put) -> _Editor:
        def store(d):
            _dig(d, path[:-1])[path[-1]] = get()
        return _Editor(path, widget, lambda d: put(_dig(d, path)), store)

    def _value(self, ann, info, commit):
        """(widget, get, put) for one value of type `ann`."""
        if get_origin(ann) is Literal:
            w = QComboBox()
            w.addItems([str(a) for a in get_args(ann)])
            w.currentTextChanged.connect(commit)
            return w, w.currentText, w.setCurrentText
        if ann is bool:
            w = QCheckBox()
            w.toggled.connect(commit)
            return w, w.isChecked, w.setChecked
        if ann is int:
            w = QSpinBox()
            w.setRange(*_bounds(info, True))
            w.setKeyboardTracking(False)
            w.valueChanged.connect(commit)
            return w, w.value, w.setValue
        if ann is float:
            w = FloatSpin(*_bounds(info, False))
            w.valueChanged.connect(commit)
            return w, w.value, w.setValue
        if get_origin(ann) is tuple:  # betas: one spin box per element
            w = QWidget()
            row = QHBoxLayout(w)
            row.setContentsMargins(0, 0, 0, 0)
            spins = [FloatSpin(*BETAS) for _ in get_args(ann)]
            for s in spins:
                s.valueChanged.connect(commit)
                row.addWidget(s)
            return w, lambda: tuple(s.value() for s in spins), lambda v: [s.setValue(x) for s, x in zip(spins, v)]
        w = QLineEdit()  # str, or str | int (a csv target: a column name or index)
        w.editingFinished.connect(commit)
        numeric = int in get_args(ann)

        def get():
            t = w.text().strip()
            return int(t) if numeric and re.fullmatch(r"[-+]?\d+", t) else t
        return w, get, lambda v: w.setText(str(v))

    def _path_editor(self, path, edit: QLineEdit, get, put) -> _Editor:
        box = QWidget()
        col = QVBoxLayout(box)
        col.setContentsMargins(0, 0, 0, 0)
        col.setSpacing(2)
        row = QHBoxLayout()
        browse = QPushButton("Browse…")
        browse.setObjectName("browse")
        browse.clicked.connect(self.browse)
        row.addWidget(edit, 1)
        row.addWidget(browse)
        col.addLayout(row)
        where = QLabel()
        where.setObjectName("hint")
        where.setWordWrap(True)
        col.addWidget(where)
        self.path_edit, self.path_where = edit, where
        edit.setPlaceholderText("a data file")
        edit.editingFinished.connect(self._show_where)
        edit.editingFinished.connect(self.path_entered)
        edit.textEdited.connect(lambda *_: self._where_timer.start())  # is it there? shown as one types (debounced)
        ed = self._simple(path, box, get, put)
        load = ed.load
        ed.load = lambda d: (load(d), self._show_where())
        return ed

    def _show_where(self) -> None:
        text = self.path_edit.text().strip()
        if not text:
            self.path_where.setText(self._waiting() + f"relative paths start at {self.directory().absolute()}")
            return
        p = Path(text).expanduser()
        p = p if p.is_absolute() else self.directory().absolute() / p
        self.path_where.setText(f"{os.path.normpath(p)}" + ("" if p.is_file() else " (not found)"))

    def _waiting(self) -> str:
        """What the form waits for before it applies a new kind of data set, or ''."""
        if not self.pending:
            return ""
        names = " and ".join(_label(p) for p in self.pending)
        kept = self.known["training"].dataset.kind.replace("_", " ")
        return f"Type or browse to the {names} to use this data set; until then the project keeps its {kept} data.\n"

    def _length_row(self, form: QFormLayout) -> None:
        """steps or epochs: exactly one is set, so one number and its unit."""
        box = QWidget()
        row = QHBoxLayout(box)
        row.setContentsMargins(0, 0, 0, 0)
        spin = QSpinBox()
        spin.setRange(1, _BIG)
        spin.setKeyboardTracking(False)
        unit = QComboBox()
        unit.setObjectName("length_unit")
        unit.addItems(["steps", "epochs"])
        row.addWidget(spin, 1)
        row.addWidget(unit)
        self.length_spin, self.length_unit = spin, unit
        path = ("training", "steps")

        def switch(u):
            if not self._updating:
                spin.blockSignals(True)
                spin.setValue(self._length[u])
                spin.blockSignals(False)
                self._edited(path)
        spin.valueChanged.connect(lambda *_: self._edited(path))
        unit.currentTextChanged.connect(switch)

        def load(d):
            t = d["training"]
            u = "steps" if t["steps"] is not None else "epochs"
            self._length[u] = t[u] or self._length[u]
            unit.setCurrentText(u)
            spin.setValue(self._length[u])

        def store(d):
            u = unit.currentText()
            self._length[u] = spin.value()
            d["training"]["steps"] = spin.value() if u == "steps" else None
            d["training"]["epochs"] = spin.value() if u == "epochs" else None
        ed = _Editor(path, box, load, store)
        ed.label, ed.form = self._label_for(path, box), form
        for w in (ed.label, box):
            w.setToolTip(HELP["steps"])
        self._compact(box)
        form.addRow(ed.label, box)
        self.editors[path] = ed

    def _interval_hint(self, form: QFormLayout) -> None:
        """Under checkpoint_interval: the interval the project's runs suggest (Young/Daly,
        engine/runs/checkpoint_interval.py; the caller gives it, show_checkpoint_suggestion)
        and a button that sets it."""
        field = self.editors[INTERVAL].widget
        row, _ = form.getWidgetPosition(field)
        box = QWidget()
        col = QVBoxLayout(box)
        col.setContentsMargins(0, 0, 0, 4)
        col.setSpacing(2)
        self.interval_hint = QLabel()
        self.interval_hint.setObjectName("hint")
        self.interval_hint.setWordWrap(True)
        self.interval_hint.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.interval_apply = QPushButton()
        self.interval_apply.setObjectName("apply_interval")
        self.interval_apply.clicked.connect(self.apply_suggested_interval)
        col.addWidget(self.interval_hint)
        col.addWidget(self.interval_apply, 0, Qt.AlignLeft)
        form.insertRow(row + 1, box)  # (the whole width: the dock is narrow)
        self.suggestion = None
        self.show_checkpoint_suggestion(None)

    def show_checkpoint_suggestion(self, suggestion, needs: str | None = None) -> None:
        """The suggested checkpoint_interval (an engine.runs.checkpoint_interval.Suggestion),
        or, with None, what a suggestion needs (`needs`)."""
        self.suggestion = suggestion
        if suggestion is None:
            self.interval_hint.setText("Suggested interval: " + (needs or "none yet: it needs a run of this "
                                                                 "project that wrote a checkpoint"))
            self.interval_hint.setToolTip("Young/Daly: tau = sqrt(2 x C x M), C the time a checkpoint blocks the "
                                          "steps, M the time between failures of the run's devices")
            self.interval_apply.hide()
            return
        where = f", measured in {suggestion.run}" if suggestion.run else ""
        self.interval_hint.setText(f"Suggested: every {suggestion.steps:,} steps (Young/Daly)\n"
                                   f"{suggestion.formula}{where}")
        self.interval_hint.setToolTip(suggestion.line)
        self.interval_apply.setText(f"Use {suggestion.steps:,}")
        self.interval_apply.setToolTip(f"checkpoint_interval = {suggestion.steps} (one undo step)")
        self.interval_apply.show()
        self._interval_state()

    def apply_suggested_interval(self) -> None:
        """checkpoint_interval = the suggestion (an edit like typing it: one undo step)."""
        if self.suggestion is not None:
            self.editors[INTERVAL].widget.setValue(int(min(self.suggestion.steps, _BIG)))

    def _interval_state(self) -> None:
        if getattr(self, "suggestion", None) is not None:
            self.interval_apply.setEnabled(self.draft["training"]["checkpoint_interval"] != self.suggestion.steps)

    # ----- state in -------------------------------------------------------------
    def set_project(self, training: Training, placement: Placement) -> None:
        """Another project: show its settings, whatever the form held."""
        self._load("training", training)
        self._load("placement", placement)

    def set_training(self, training: Training) -> None:
        """The project's training settings changed (undo, redo, an edit): show them
        unless they are what the form last reported (then an edit in progress stays)."""
        if training != self.known["training"]:
            self._load("training", training)

    def set_placement(self, placement: Placement) -> None:
        if placement != self.known["placement"]:
            self._load("placement", placement)

    def _load(self, part: str, model: BaseModel) -> None:
        self.known[part], self.draft[part], self.errors[part] = model, model.model_dump(), []
        if part == "training":
            self.untouched, self.pending = set(), []
        if part == "training" and self._rows_kind != self.draft["training"]["dataset"]["kind"]:
            self._dataset_rows()
        self._load_all()

    def _load_all(self) -> None:
        self._updating = True
        try:
            for ed in self.editors.values():
                ed.load(self.draft)
        finally:
            self._updating = False
        self._refresh()

    # ----- edits out ------------------------------------------------------------
    def _edited(self, path: tuple) -> None:
        if self._updating or path not in self.editors:  # a row being removed
            return
        self.editors[path].store(self.draft)
        self.untouched.discard(path)
        if path == KIND:
            self._switch_kind()
        self._validate(path[0], _key(path))

    def _switch_kind(self) -> None:
        """Another kind of data set: fields of the same name keep their values."""
        old = self.draft["training"]["dataset"]
        model = KINDS[old["kind"]]
        new = {"kind": old["kind"]}
        self.untouched = set()
        for name, info in model.model_fields.items():
            if name != "kind":
                new[name] = old[name] if name in old else "" if info.is_required() else info.get_default(call_default_factory=True)
                if info.is_required() and not new[name]:
                    self.untouched.add(("training", "dataset", name))
        self.draft["training"]["dataset"] = new
        self._dataset_rows()
        self._updating = True
        try:
            for path, ed in self.editors.items():
                if path[:2] == KIND[:2]:
                    ed.load(self.draft)
        finally:
            self._updating = False

    def _validate(self, part: str, what: str) -> None:
        try:
            model = (Training if part == "training" else Placement).model_validate(self.draft[part])
        except ValidationError as exc:
            errors = messages(part, exc)
            # a field the new kind needs and the user has not filled in yet is a question, not an error
            self.pending = [p for p, _ in errors if p in self.untouched] if part == "training" else self.pending
            self.errors[part] = [(p, m) for p, m in errors if p not in self.untouched]
            self._refresh()
            return
        self.errors[part] = []
        if part == "training":
            self.pending = []
        self._refresh()
        old, self.known[part] = self.known[part], model
        if model == old:
            return
        if part == "training":
            self.training_edited.emit(model, what)
        else:
            for name in Placement.model_fields:
                if getattr(model, name) != getattr(old, name):
                    self.placement_edited.emit(name, getattr(model, name))

    def browse(self) -> None:
        kind = self.draft["training"]["dataset"]["kind"]
        start = self.path_edit.text().strip() or "."
        start = start if Path(start).is_absolute() else str(self.directory() / start)
        chosen, _ = QFileDialog.getOpenFileName(self, "Data set file", start,
                                                f"{FILE_FILTERS.get(kind, 'Data files (*)')};;All files (*)")
        if chosen:
            self.set_path(chosen)

    def set_path(self, chosen: str) -> None:
        """A chosen file: relative to the project's folder when it lies inside it."""
        p = Path(chosen)
        try:
            if not self.saved():
                raise ValueError  # no folder of its own yet: relative to where would move with the first Save
            text = p.resolve().relative_to(self.directory().resolve()).as_posix()
        except ValueError:
            text = str(p)
        self.path_edit.setText(text)
        self._show_where()
        self._edited(("training", "dataset", "path"))

    # ----- showing ----------------------------------------------------------------
    def refresh_where(self) -> None:
        """Say again where the typed path leads (the project was saved elsewhere, a key typed)."""
        from shiboken6 import isValid

        if ("training", "dataset", "path") in self.editors and isValid(self.path_edit):  # (not while closing)
            self._show_where()

    def show_data_problems(self, messages: list[str]) -> None:
        """The data set's problems against the diagram (also on the nodes and in Problems)."""
        text = "\n".join(messages)
        self.data_label.setText(f"Run would refuse the data set (also in Problems):\n{text}" if text else "")
        self.data_label.setToolTip(text)
        self.data_label.setVisible(bool(text))

    def _refresh(self) -> None:
        """Which rows apply, and the errors: listed above the form, their labels in red."""
        self._interval_state()
        for path, (dep, values) in RELEVANT.items():
            ed, ok = self.editors[path], _dig(self.draft, dep) in values
            if path[0] == "placement":
                ed.widget.setEnabled(ok)
                ed.label.setEnabled(ok)
            else:
                ed.form.setRowVisible(ed.widget, ok)
        errors = self.errors["training"] + self.errors["placement"]
        bad = {p for p, _ in errors}
        for path, ed in self.editors.items():
            name = "error" if path in bad else ""
            if ed.label is not None and ed.label.objectName() != name:
                ed.label.setObjectName(name)
                ed.label.style().unpolish(ed.label)
                ed.label.style().polish(ed.label)
        if ("training", "dataset", "path") in self.editors:
            self._show_where()  # (it says what a new kind of data set waits for)
        text = "\n".join(m for _, m in errors if m)
        self.error_label.setText(f"{text}\nNot applied: the project keeps its last valid settings." if text else "")
        self.error_label.setVisible(bool(text))
