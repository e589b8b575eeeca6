"""The Data dock (widgets/data_panel.py) wired to the project: choosing a folder or file
is one undo step (controller.choose_dataset) in which the Input node takes the data's
shape and dtype; the panel shows the project's data set as it is (undo, redo and the
Training form's edits included).

Nothing is read on the GUI thread: a worker describes the set (engine.data.describe.describe_source:
split sizes, one sample; handed to the controller, which checks it against the diagram,
engine.runs.build.check_data) and then inspects it (engine.data.inspection.inspect_source: classes,
examples, the loader's samples/s). Each request has a generation number: a result for a
selection that is no longer the current one is dropped.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError
from PySide6.QtCore import QObject, QRunnable, Qt, QThreadPool, Signal

from app.analysis import data_key
from engine.data.sources import IN_PLACE_KINDS
from engine.project import ProjectError, Training
from widgets.data_panel import DataPanel, guess_kind

EXAMPLES = 4  # example samples shown
SECONDS = 1.0  # the loader is timed for about this long
TARGETS = ("label", "labels", "target", "targets", "y", "class")


class _Signals(QObject):
    info = Signal(int, object, object)  # generation, settings, DataInfo or the exception
    report = Signal(int, object)  # generation, inspect_source's report or the exception


class _InspectJob(QRunnable):
    def __init__(self, gen: int, settings: dict, signals: _Signals, current):
        super().__init__()
        self.gen, self.settings, self.signals, self.current = gen, settings, signals, current

    def run(self) -> None:
        from engine.data.describe import describe_source
        from engine.data.inspection import inspect_source

        if self.current() != self.gen:
            return  # another selection came before this one started
        try:
            info = describe_source(self.settings, with_fingerprint=False)
        except Exception as exc:  # noqa: BLE001 - shown in the panel, in one line
            info = exc
        self.signals.info.emit(self.gen, self.settings, info)
        if isinstance(info, BaseException) or self.current() != self.gen:
            return
        try:
            report = inspect_source(self.settings, None, examples=EXAMPLES, seconds=SECONDS)
        except Exception as exc:  # noqa: BLE001
            report = exc
        self.signals.report.emit(self.gen, report)


def table_columns(path: Path) -> dict:
    """inputs/target/task for a Parquet or Arrow set, guessed from its columns."""
    from engine.runtime.datasets.tables import Part, table_files

    files, _ = table_files(path, "train")
    names = list(Part(files[0], []).schema.names)
    target = next((n for n in TARGETS if n in names), None)
    if "input_ids" in names:
        inputs = ["input_ids"] + (["attention_mask"] if "attention_mask" in names else [])
    else:
        inputs = [n for n in names if n != target][:1]
    if not inputs:
        raise ProjectError(f"{path}: no column to take as the input (it has {', '.join(names)})")
    out = {"inputs": inputs, "target": target}
    if target is None:
        out["task"] = "language_model"
    return out


def dataset_for(project, path: str, kind: str = ""):
    """The Dataset model for a chosen path: its kind (guessed from the path unless given),
    the path relative to the project's folder when it lies inside a saved project's
    folder, and the fields of the same name the current in-place set has (image size,
    split...). ProjectError in one line when it cannot be one."""
    p = Path(path).expanduser()
    full = p if p.is_absolute() else project.directory / p
    if not full.exists():
        raise ProjectError(f"{full}: no such file or folder")
    kind = kind or guess_kind(full)
    if kind is None:
        raise ProjectError(f"{full}: cannot tell what kind of data set this is (a folder with one subfolder of images "
                           f"per class, .bin tokens, .parquet/.arrow, .npy/.npz or .tar shards); choose the kind")
    text = str(full.resolve())
    if project.path is not None:
        try:
            text = full.resolve().relative_to(project.directory.resolve()).as_posix()
        except ValueError:
            pass
    old = project.training.dataset.model_dump(mode="json")
    fields = _kind_fields(kind)
    d = {k: v for k, v in old.items() if k in fields} if old["kind"] in IN_PLACE_KINDS else {}
    if kind == "parquet" and old["kind"] != "parquet":
        try:
            d.update(table_columns(full))
        except Exception as exc:  # noqa: BLE001 - one line
            raise ProjectError(f"{full}: {exc}") from None
    if kind == "image_folder" and old["kind"] != "image_folder":
        side = _image_side(full)
        if side:  # small pictures (32 px) are not blown up to 224
            d["image_size"] = min(side, 224)
    d.update(kind=kind, path=text)
    try:
        training = Training.model_validate({**project.training.model_dump(mode="json"), "dataset": d})
    except ValidationError as exc:
        e = exc.errors(include_url=False)[0]
        loc = ".".join(str(x) for x in e["loc"] if x not in IN_PLACE_KINDS)
        raise ProjectError(f"{loc}: {e['msg']}") from None
    return training.dataset


def _image_side(root: Path) -> int | None:
    """The shorter side of the first image found in a class folder (its header only)."""
    from widgets.data_panel import IMAGE_EXT, _entries

    top = root / "train" if (root / "train").is_dir() else root
    for d in [e for e in _entries(top) if e.is_dir()][:8]:
        for f in _entries(d, 50):
            if f.suffix.lower() in IMAGE_EXT:
                try:
                    from PIL import Image

                    with Image.open(f) as im:
                        return min(im.size)
                except Exception:  # noqa: BLE001 - the reader names a bad image later
                    continue
    return None


def _kind_fields(kind: str) -> set[str]:
    from widgets.training_panel import KINDS

    return set(KINDS[kind].model_fields)


def mismatch(controller, info) -> str | None:
    """How the diagram's Input node(s) differ from the data, in a few words."""
    if info is None or isinstance(info, BaseException):
        return None
    fixes = controller.input_fixes(info)
    if not fixes:
        return None
    parts = []
    for nid, want in fixes.items():
        have = controller.graph.nodes[nid].params
        what = [f"{list(have.get('shape', []))} → {want['shape']}" if "shape" in want else "",
                f"{have.get('dtype')} → {want['dtype']}" if "dtype" in want else ""]
        parts.append(f"Input '{nid}': " + ", ".join(w for w in what if w))
    return "; ".join(parts)


class DataUI(QObject):
    """The panel, its dock and the worker that reads the data."""

    def __init__(self, window, panel: DataPanel):
        super().__init__(window)
        self.window, self.panel, self.controller = window, panel, window.controller
        self.pool = QThreadPool(self)  # made before the signals: destroyed first, it waits for its job
        self.pool.setMaxThreadCount(1)
        self.signals = _Signals(self)
        self.signals.info.connect(self._on_info)
        self.signals.report.connect(self._on_report)
        self.gen = 0
        self.shown_key: str | None = None  # the settings the panel shows (or is reading)
        self.choice: tuple[int, object] | None = None  # (generation, Dataset) waiting for its description
        self.info = None  # the DataInfo shown
        panel.directory = lambda: window.project.directory
        panel.chosen.connect(self.choose)
        panel.fit_requested.connect(self.fit_input)
        c = self.controller
        c.training_changed.connect(self.refresh)
        c.compiled.connect(lambda *_: self._show_fit())
        window.project_changed.connect(lambda: self.refresh(force=True))

    def _current(self) -> int:
        return self.gen

    # ----- asking -----------------------------------------------------------------
    def choose(self, path: str, kind: str = "") -> bool:
        """Use the data set at `path`: described first (off the GUI thread), then one
        undo step sets it and the Input's shape and dtype. False when it cannot be one."""
        try:
            dataset = dataset_for(self.window.project, path, kind)
        except ProjectError as exc:
            self.gen += 1  # whatever was being read is stale now
            self.shown_key = None
            self.panel.show_error(str(exc))
            return False
        settings = dataset.model_dump(mode="json")
        settings["path"] = str(self.window.project.resolve_path(dataset.path).resolve())
        self._start(settings)
        self.choice = (self.gen, dataset)
        self.panel.set_kind(dataset.kind)
        return True

    def fit_input(self) -> bool:
        info = self.controller.data_info()
        if info is None or isinstance(info, BaseException):
            return False
        return self.controller.fit_inputs(info)

    # ----- the project's data set -----------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        """Show the project's data set: read it again only when its settings changed."""
        if force:
            self.choice = None
        d = self.window.project.training.dataset
        if d.kind not in IN_PLACE_KINDS:
            self.gen += 1
            self.shown_key, self.info = None, None
            self.panel.set_path("", "")
            what = (f"the file {d.path} ({d.kind}; the Training form checks it against the diagram)"
                    if getattr(d, "path", "") else f"generated ({d.kind.replace('_', ' ')})")
            self.panel.show_idle(f"The project's data set is {what}. Pick a folder or a file to train on your own "
                                 f"data.")
            return
        self.panel.set_path(d.path, d.kind)
        try:
            settings = self.controller.data_settings()
        except ProjectError as exc:
            self.gen += 1
            self.shown_key, self.info = None, None
            self.panel.show_error(str(exc))
            return
        if data_key(settings) == self.shown_key and not force:
            return
        self._start(settings)

    def _start(self, settings: dict) -> None:
        self.gen += 1
        self.choice = None
        self.shown_key, self.info = data_key(settings), None
        self.panel.show_busy(f"Opening {Path(settings['path']).name}… (1 of 2)")
        self.pool.start(_InspectJob(self.gen, settings, self.signals, self._current))

    def _on_info(self, gen: int, settings: dict, info) -> None:
        self.controller.remember_data(settings, info)  # a description is good whoever asked
        if gen != self.gen:
            return  # a stale selection
        choice, self.choice = self.choice, None
        if isinstance(info, BaseException):  # (a pick that cannot be read changes nothing)
            self.shown_key = None
            self.panel.show_error(str(info))
            return
        if choice is not None and choice[0] == gen:  # the user's pick: one undo step
            self.controller.choose_dataset(choice[1], info, settings)
        if isinstance(info, BaseException):
            self.panel.show_error(str(info))
            return
        self.info = info
        self.panel.show_info(info)
        self.panel.show_busy("Reading examples and timing the loader… (2 of 2)")
        self._show_fit()

    def _on_report(self, gen: int, report) -> None:
        if gen != self.gen:
            return
        if isinstance(report, BaseException):
            self.panel.show_error(str(report))
            return
        self.panel.show_report(report)
        self._show_fit()

    def _show_fit(self) -> None:
        self.panel.show_fit(mismatch(self.controller, self.info) if self.shown_key else None)

    def wait(self, ms: int = 60000) -> bool:
        """Let the worker finish and deliver (tests, screenshots)."""
        from PySide6.QtWidgets import QApplication

        ok = self.pool.waitForDone(ms)
        QApplication.processEvents()
        return ok


def install(window) -> tuple[DataUI, DataPanel, object]:
    """The Data dock of `window`, a tab beside Inspector / Training: (its controller, the
    panel, the dock)."""
    panel = DataPanel()
    dock = window.add_dock("Data", panel, Qt.RightDockWidgetArea)
    window.tabifyDockWidget(window.inspector_dock, dock)
    window.inspector_dock.raise_()
    ui = DataUI(window, panel)
    ui.refresh(force=True)
    return ui, panel, dock
