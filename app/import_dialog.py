"""File > Import: one dialog for an ONNX file or a PyTorch module (issue 42, item 6).

The form: the source (an .onnx file, `package.module:Class`, or `path/to/file.py:Class`),
one row per input (shape without the batch, dtype), the constructor's keyword arguments
as JSON, and the project file to write. Each field is checked as it is typed and says
what is wrong under itself; Import is enabled only when the form is whole, and the line
beside it says why not.

Import runs on a worker thread (ImportJob): the window keeps repainting, the dialog shows
the phase the engine reports (engine/interop/progress.py: loading, tracing, converting,
laying out, checking, writing) on a progress bar, and Cancel stops waiting at once (the
import stops at its next phase; whatever it wrote is removed and nothing is opened). An
import that fails says why in one line inside the dialog (the whole text on hover and
under Details), which stays open to be corrected. A project written is opened in the
window by the caller (app/interop_ui.py), through `imported`.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import queue
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QComboBox, QDialog, QFileDialog, QFormLayout, QHBoxLayout, QLabel, QLineEdit,
                               QPlainTextEdit, QProgressBar, QPushButton, QToolButton, QVBoxLayout, QWidget)

from engine.interop import progress
from engine.project import SUFFIX

DTYPES = ("float32", "int64")
_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_ATTR = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
ERROR_STYLE = "color: #c62828;"
HINT_STYLE = "color: palette(placeholder-text);"
WARN_STYLE = "color: #a15c00;"


# ----- what is asked for, and checking it ------------------------------------------------
@dataclass
class Request:
    """One import, as the form states it."""

    kind: str  # "onnx" or "module"
    source: str  # the .onnx path, 'pkg.mod:Class' or 'path/file.py:Class'
    output: Path
    kwargs: dict = field(default_factory=dict)
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    direction: str = "LR"


def source_kind(text: str) -> tuple[str | None, str | None, str]:
    """(kind, error, hint) of the source field: kind "onnx" or "module" (None while it is
    neither); an error only once something was typed."""
    text = text.strip()
    if not text:
        return None, None, "an .onnx file, package.module:Class, or path/to/file.py:Class"
    if text.lower().endswith(".onnx"):
        p = Path(text).expanduser()
        if not p.exists():
            return "onnx", f"{p}: no such file", ""
        if not p.is_file():
            return "onnx", f"{p}: not a file", ""
        return "onnx", None, "ONNX file: its inputs and weights come from the file"
    file, colon, attr = text.rpartition(":")
    if colon and file.lower().endswith(".py"):
        p = Path(file).expanduser()
        if not p.is_file():
            return "module", f"{p}: no such file", ""
        if not _ATTR.match(attr):
            return "module", f"'{attr}' is not a class name (path/to/file.py:ClassName)", ""
        return "module", None, f"the class {attr} of {p.name}"
    if text.lower().endswith(".py"):
        return "module", "name the class after the file: path/to/file.py:ClassName", ""
    if ":" not in text:
        return None, "not an .onnx file or package.module:Class (a ':' before the class name)", ""
    if not _SPEC.match(text):
        return "module", "a module path is dotted names, a ':' and the class: package.module:Class", ""
    top = text.split(":")[0].split(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None  # a top-level name: nothing is run
    except (ImportError, ValueError):
        found = False
    if not found:
        return "module", f"no module named '{top}' on the Python path", ""
    return "module", None, f"the class {text.split(':')[1]} of the module {text.split(':')[0]}"


def parse_shape(text: str) -> list[int]:
    """'3,224,224' (or 3x224x224) -> [3, 224, 224]; ValueError saying what is wrong."""
    parts = [s.strip() for s in text.replace("x", ",").replace("×", ",").split(",")]
    if not text.strip():
        raise ValueError("give its shape without the batch, e.g. 3,224,224")
    try:
        dims = [int(s) for s in parts if s]
    except ValueError:
        raise ValueError(f"'{text.strip()}' must be sizes separated by commas, e.g. 3,224,224") from None
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"'{text.strip()}' must list positive sizes")
    return dims


def parse_kwargs(text: str) -> dict:
    """The constructor's keyword arguments; ValueError with the line and column."""
    if not text.strip():
        return {}
    try:
        v = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(v, dict):
        raise ValueError('must be a JSON object of keyword arguments, e.g. {"width": 64}')
    return v


def _file_module(file: Path, attr: str) -> str:
    """Load path/to/file.py fresh (its folder on the path, for its own imports) and give
    the 'module:attr' path import_module reads."""
    from engine.interop import InteropError

    name = "layerflow_import_" + re.sub(r"\W", "_", file.stem)
    folder = str(file.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise InteropError(f"{file}: cannot be read as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's file: its error, in one line
        sys.modules.pop(name, None)
        raise InteropError(f"{file}: {type(exc).__name__}: {exc}") from None
    return f"{name}:{attr}"


def run_import(req: Request) -> tuple[Path, list[str]]:
    """Import, lay out and write (this thread); (project path, notes). Reports its phases
    to the callback of progress.reporting, which may stop it by raising."""
    from engine.interop import import_module, import_onnx, save_imported
    from engine.diagram.layout import set_direction

    name = req.output.name[: -len(SUFFIX)] if req.output.name.endswith(SUFFIX) else req.output.stem
    if req.kind == "onnx":
        imported = import_onnx(req.source, name=name)
    else:
        spec = req.source
        file, _, attr = spec.rpartition(":")
        if file.lower().endswith(".py"):
            progress.phase("loading", f"running {Path(file).name}")
            spec = _file_module(Path(file).expanduser(), attr)
        imported = import_module(spec, req.kwargs, req.shapes, req.dtypes or None, name=name)
        imported.source = req.source
        imported.project.description = f"Imported from {req.source}"
    if req.direction != imported.project.graph.direction and not imported.drawn:
        progress.phase("laying out", "top down" if req.direction == "TB" else "left to right")
        set_direction(imported.project.graph, req.direction)
    progress.phase("writing", req.output.name)
    return save_imported(imported, req.output), list(imported.notes or [])


# ----- the worker -------------------------------------------------------------------------
_ONE_AT_A_TIME = threading.Lock()


class ImportJob:
    """One import on its own thread. Events come back through `events` (polled by the
    dialog on the GUI thread): ("phase", name, detail), ("done", path, notes),
    ("error", exception), ("cancelled",)."""

    def __init__(self, req: Request):
        self.req = req
        self.events: queue.Queue = queue.Queue()
        self.cancelled = threading.Event()
        self.started = time.monotonic()
        out = req.output
        from engine.interop.common import settle_torch_trace
        from engine.project import weights_name

        settle_torch_trace()  # (on the GUI thread, before torch.export runs on the import's)

        # files this import would create (removed again when it is cancelled after writing them)
        self._new = [p for p in (out, out.parent / weights_name(out)) if not p.exists()]
        self.thread = threading.Thread(target=self._run, name="import", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def cancel(self) -> None:
        self.cancelled.set()

    def _phase(self, name: str, detail: str) -> None:
        if self.cancelled.is_set():
            raise progress.Cancelled()
        self.events.put(("phase", name, detail))

    def _run(self) -> None:
        # one import at a time: torch.export is not made to run on two threads at once, and
        # a cancelled import goes on until its next phase
        if not _ONE_AT_A_TIME.acquire(blocking=False):
            self.events.put(("phase", "waiting", "for the cancelled import to stop"))
            _ONE_AT_A_TIME.acquire()
        try:
            self.events.put(self._outcome())
        finally:
            _ONE_AT_A_TIME.release()

    def _outcome(self) -> tuple:
        try:
            with progress.reporting(self._phase):
                path, notes = run_import(self.req)
        except progress.Cancelled:
            return ("cancelled",)
        except BaseException as exc:  # noqa: BLE001 - every failure is shown in the dialog
            return ("error", exc)
        if self.cancelled.is_set():  # too late to stop it: take back what it wrote
            for p in self._new:
                with contextlib.suppress(OSError):
                    p.unlink()
            return ("cancelled",)
        return ("done", path, notes)


def error_line(exc: BaseException) -> str:
    """The one line the dialog shows: an InteropError's first line as it is, any other
    error with its type."""
    from engine.interop import InteropError

    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(exc, InteropError):
        return first or type(exc).__name__
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


# ----- the dialog ------------------------------------------------------------------------
class _InputRow(QWidget):
    def __init__(self, shape: str = "", dtype: str = "float32", parent=None):
        super().__init__(parent)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.label = QLabel()
        self.shape = QLineEdit(shape, placeholderText="shape without the batch, e.g. 3,224,224")
        self.dtype = QComboBox()
        self.dtype.addItems(DTYPES)
        self.dtype.setCurrentText(dtype)
        self.remove = QToolButton(text="−", toolTip="Remove this input")
        lay.addWidget(self.label)
        lay.addWidget(self.shape, 1)
        lay.addWidget(self.dtype)
        lay.addWidget(self.remove)


def _error_label() -> QLabel:
    lab = QLabel()
    lab.setWordWrap(True)
    lab.setTextInteractionFlags(Qt.TextSelectableByMouse)
    lab.hide()
    return lab


class ImportDialog(QDialog):
    """The form, the progress of the running import, and its outcome."""

    imported = Signal(object, object)  # project path, notes: the caller opens it
    phase_changed = Signal(str, str)  # phase, detail (as shown)

    POLL_MS = 50

    def __init__(self, parent=None, *, folder: Path | None = None, direction: str = "LR", source: str = "",
                 output: str | Path | None = None):
        super().__init__(parent)
        self.setWindowTitle("Import a model")
        self.setMinimumWidth(620)
        self.folder = Path(folder) if folder else Path.home()  # where a module's project goes by default
        self.direction = direction
        self.job: ImportJob | None = None
        self.result_path: Path | None = None
        self._output_touched = False
        self._timer = QTimer(self, interval=self.POLL_MS, timeout=self._poll)

        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.ExpandingFieldsGrow)
        # source
        self.source = QLineEdit(placeholderText="model.onnx, package.module:Class or path/to/file.py:Class")
        self.browse = QPushButton("Browse…")
        self.browse.clicked.connect(self.choose_source)
        row = QHBoxLayout()
        row.addWidget(self.source, 1)
        row.addWidget(self.browse)
        self.source_note = _error_label()
        form.addRow("Source:", self._stack(row, self.source_note))
        # inputs
        self.inputs_box = QWidget()
        self.inputs_lay = QVBoxLayout(self.inputs_box)
        self.inputs_lay.setContentsMargins(0, 0, 0, 0)
        self.rows: list[_InputRow] = []
        self.add_input_button = QPushButton("Add input")
        self.add_input_button.clicked.connect(lambda: self.add_input())
        self.inputs_note = _error_label()
        self.inputs_lay.addWidget(self.add_input_button, 0, Qt.AlignLeft)
        self.inputs_lay.addWidget(self.inputs_note)
        form.addRow("Inputs:", self.inputs_box)
        # constructor arguments
        self.kwargs = QPlainTextEdit("{}")
        self.kwargs.setPlaceholderText('{"num_classes": 10}')
        self.kwargs.setFixedHeight(self.fontMetrics().lineSpacing() * 4 + 12)
        self.kwargs_note = _error_label()
        form.addRow("Arguments:", self._stack(self.kwargs, self.kwargs_note))
        # output
        self.output = QLineEdit(placeholderText=f"project file (*{SUFFIX})")
        self.output_button = QPushButton("Choose…")
        self.output_button.clicked.connect(self.choose_output)
        row = QHBoxLayout()
        row.addWidget(self.output, 1)
        row.addWidget(self.output_button)
        self.output_note = _error_label()
        form.addRow("Project:", self._stack(row, self.output_note))
        self.form_box = QWidget()
        self.form_box.setLayout(form)

        # progress and outcome
        self.bar = QProgressBar(minimum=0, maximum=len(progress.PHASES), textVisible=False)
        self.bar.hide()
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.error = _error_label()
        self.error.setStyleSheet(ERROR_STYLE)
        self.details = QPlainTextEdit(readOnly=True)
        self.details.setFixedHeight(self.fontMetrics().lineSpacing() * 6 + 12)
        self.details.hide()
        self.details_button = QToolButton(text="Details", checkable=True)
        self.details_button.toggled.connect(self.details.setVisible)
        self.details_button.hide()

        # buttons
        self.why = QLabel()
        self.why.setStyleSheet(HINT_STYLE)
        self.import_button = QPushButton("Import", default=True)
        self.import_button.clicked.connect(self.start)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        buttons = QHBoxLayout()
        buttons.addWidget(self.why, 1)
        buttons.addWidget(self.import_button)
        buttons.addWidget(self.cancel_button)

        lay = QVBoxLayout(self)
        lay.addWidget(self.form_box)
        lay.addWidget(self.bar)
        lay.addWidget(self.status)
        err = QHBoxLayout()
        err.addWidget(self.error, 1)
        err.addWidget(self.details_button, 0, Qt.AlignTop)
        lay.addLayout(err)
        lay.addWidget(self.details)
        lay.addStretch(1)
        lay.addLayout(buttons)

        self.add_input("3,224,224")
        self.source.textChanged.connect(self._source_changed)
        self.output.textEdited.connect(self._output_edited)
        self.output.textChanged.connect(lambda *_: self.validate())
        self.kwargs.textChanged.connect(self.validate)
        self.source.setText(str(source))
        if output:
            self.output.setText(str(output))
            self._output_touched = True
        self._source_changed()

    @staticmethod
    def _stack(top, note: QLabel) -> QWidget:
        w = QWidget()
        v = QVBoxLayout(w)
        v.setContentsMargins(0, 0, 0, 0)
        v.setSpacing(2)
        (v.addLayout if isinstance(top, QHBoxLayout) else v.addWidget)(top)
        v.addWidget(note)
        return w

    # ----- inputs ---------------------------------------------------------------------
    def add_input(self, shape: str = "", dtype: str = "float32") -> _InputRow:
        r = _InputRow(shape, dtype)
        r.shape.textChanged.connect(self.validate)
        r.dtype.currentTextChanged.connect(self.validate)
        r.remove.clicked.connect(lambda: self.remove_input(r))
        self.inputs_lay.insertWidget(len(self.rows), r)
        self.rows.append(r)
        self._renumber()
        self.validate()
        return r

    def remove_input(self, row: _InputRow) -> None:
        if row in self.rows:
            self.rows.remove(row)
            row.setParent(None)
            row.deleteLater()
        self._renumber()
        self.validate()

    def _renumber(self) -> None:
        for i, r in enumerate(self.rows):
            r.label.setText(f"{i + 1}.")
            r.remove.setEnabled(len(self.rows) > 1)

    def set_inputs(self, rows: list[tuple[str, str]]) -> None:
        for r in list(self.rows):
            self.remove_input(r)
        for shape, dtype in rows:
            self.add_input(shape, dtype)

    # ----- source and output ------------------------------------------------------------
    def choose_source(self) -> None:
        start = str(Path(self.source.text().strip()).expanduser().parent) if self.source.text().strip() else str(self.folder)
        path, _ = QFileDialog.getOpenFileName(self, "Import a model", start,
                                              "Models (*.onnx *.py);;ONNX models (*.onnx);;Python files (*.py)")
        if path:
            self.source.setText(path + (":" if path.lower().endswith(".py") else ""))
            self.source.setFocus()
            self.source.end(False)

    def choose_output(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save the imported project", self.output.text() or str(self.folder),
                                              f"Layerflow projects (*{SUFFIX})")
        if path:
            self.output.setText(path)
            self._output_touched = True

    def _output_edited(self, *_) -> None:
        self._output_touched = True

    def default_output(self) -> str:
        kind, _, _ = source_kind(self.source.text())
        text = self.source.text().strip()
        if kind == "onnx" and text:
            return str(Path(text).expanduser().with_suffix(SUFFIX))  # beside the file
        if kind == "module" and ":" in text:
            cls = text.rpartition(":")[2].rpartition(".")[2]
            if cls and _ATTR.match(cls):
                return str(self.folder / (cls + SUFFIX))
        return ""

    def _source_changed(self, *_) -> None:
        kind, _, _ = source_kind(self.source.text())
        is_module = kind != "onnx"
        self.inputs_box.setEnabled(is_module)
        self.kwargs.setEnabled(is_module)
        if not self._output_touched:
            self.output.setText(self.default_output())
        self.validate()

    # ----- checking the form ------------------------------------------------------------
    @staticmethod
    def _show(label: QLabel, text: str | None, style: str) -> None:
        label.setText(text or "")
        label.setToolTip(text or "")
        label.setStyleSheet(style)
        label.setVisible(bool(text))

    def validate(self) -> Request | None:
        """Check every field, say what is wrong under it, enable Import; the Request when whole."""
        why: list[str] = []
        kind, error, hint = source_kind(self.source.text())
        self._show(self.source_note, error or hint, ERROR_STYLE if error else HINT_STYLE)
        if kind is None or error:
            why.append("choose a source" if not self.source.text().strip() else "the source")
        shapes, dtypes, kwargs = [], [], {}
        if kind != "onnx":
            problems = []
            for i, r in enumerate(self.rows):
                try:
                    shapes.append(parse_shape(r.shape.text()))
                    dtypes.append(r.dtype.currentText())
                    r.shape.setStyleSheet("")
                except ValueError as exc:
                    typed = bool(r.shape.text().strip())
                    r.shape.setStyleSheet("QLineEdit { border: 1px solid #c62828; }" if typed else "")
                    if typed:
                        problems.append(f"input {i + 1}: {exc}")
                    elif "input shapes" not in why:
                        why.append("input shapes")
            if not self.rows:
                problems.append("add an input: the shape of each tensor forward takes")
            self._show(self.inputs_note, "; ".join(problems), ERROR_STYLE)
            if problems and "input shapes" not in why:
                why.append("input shapes")
            try:
                kwargs = parse_kwargs(self.kwargs.toPlainText())
                self._show(self.kwargs_note, None, ERROR_STYLE)
            except ValueError as exc:
                self._show(self.kwargs_note, str(exc), ERROR_STYLE)
                why.append("arguments")
        else:
            self._show(self.inputs_note, None, ERROR_STYLE)
            self._show(self.kwargs_note, None, ERROR_STYLE)
        out_error, out_note = self._check_output()
        replaces = bool(out_note) and out_note.endswith("will be replaced")
        self._show(self.output_note, out_error or out_note,
                   ERROR_STYLE if out_error else WARN_STYLE if replaces else HINT_STYLE)
        if out_error:
            why.append("project file")
        running = self.job is not None
        self.import_button.setEnabled(not why and not running)
        self.why.setText("" if running or not why else "To import, fix: " + ", ".join(why))
        if why:
            return None
        out = self._output_path()
        return Request(kind, self.source.text().strip(), out, kwargs, shapes, dtypes, self.direction)

    def _output_path(self) -> Path:
        p = Path(self.output.text().strip()).expanduser()
        return p if p.name.endswith(SUFFIX) else p.with_name(p.name + SUFFIX)

    def _check_output(self) -> tuple[str | None, str | None]:
        text = self.output.text().strip()
        if not text:
            return ("where to write the project" if self.source.text().strip() else None), None
        p = self._output_path()
        if not p.parent.is_dir():
            return f"{p.parent}: no such folder", None
        if p.is_dir():
            return f"{p}: is a folder", None
        note = f"writes {p.name}" + ("" if text.endswith(SUFFIX) else f" ({SUFFIX} added)")
        if p.exists():
            note = f"{p.name} exists and will be replaced"
        return None, note

    # ----- running -------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.job is not None

    def start(self) -> ImportJob | None:
        req = self.validate()
        if req is None or self.job is not None:
            return None
        self._set_error(None)
        self.job = ImportJob(req)
        self.form_box.setEnabled(False)
        self.import_button.setEnabled(False)
        self.why.setText("")
        self.bar.setValue(0)
        self.bar.show()
        self._phase_index = 0
        self._phase_text = "Starting"
        self.status.setText("Starting…")
        self.job.start()
        self._timer.start()
        return self.job

    def cancel(self) -> None:
        """While importing: stop waiting (the result is discarded) and keep the form; else close."""
        if self.job is None:
            self.reject()
            return
        self.job.cancel()  # the worker stops at its next phase; nothing of it is opened
        self._finish()
        self.status.setText("Cancelled: nothing was imported")

    def _finish(self) -> None:
        self.job = None
        self._timer.stop()
        self.bar.hide()
        self.form_box.setEnabled(True)
        self.validate()

    def _set_error(self, exc: BaseException | None) -> None:
        if exc is None:
            self.error.hide()
            self.details_button.hide()
            self.details_button.setChecked(False)
            return
        line = error_line(exc)
        full = str(exc).strip() or line
        self._show(self.error, line, ERROR_STYLE)
        self.error.setToolTip(full)
        self.details.setPlainText(full)
        self.details_button.setVisible(full != line)

    def _poll(self) -> None:
        job = self.job
        if job is None:
            self._timer.stop()
            return
        while True:
            try:
                ev = job.events.get_nowait()
            except queue.Empty:
                break
            if ev[0] == "phase":
                name, detail = ev[1], ev[2]
                if name in progress.PHASES:
                    self._phase_index = max(self._phase_index, progress.PHASES.index(name) + 1)
                    self.bar.setValue(self._phase_index)
                self._phase_text = name.capitalize() + (f": {detail}" if detail else "")
                self.phase_changed.emit(name, detail)
            elif ev[0] == "error":
                self._finish()
                self.status.setText("")
                self._set_error(ev[1])
                return
            elif ev[0] == "cancelled":
                self._finish()
                self.status.setText("Cancelled: nothing was imported")
                return
            elif ev[0] == "done":
                self._finish()
                self.result_path = Path(ev[1])
                self.status.setText(f"Wrote {self.result_path.name}")
                self.imported.emit(self.result_path, ev[2])
                return
        self.status.setText(f"{self._phase_text}… ({time.monotonic() - job.started:.0f} s)")

    def show_error(self, text: str) -> None:
        """An error found after the import (opening the project): shown as an import's."""
        from engine.interop import InteropError

        self._set_error(InteropError(text))

    def reject(self) -> None:
        if self.job is not None:  # closed while importing (Esc, the title bar): stop it too
            self.job.cancel()
            self._finish()
        super().reject()
