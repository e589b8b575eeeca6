"""File menu: import an ONNX file or a PyTorch module, export ONNX or a PyTorch
script; an .onnx file dropped on the canvas is imported too.

The work is engine/interop's (the same calls as `python main.py import/export`);
this module only asks where, runs the slow ONNX export off the GUI thread, and
reports in the status bar. An import is written (weights file + project, each
atomically) before it is opened, so the weights travel with the diagram.
"""
from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

from engine.interop import InteropError, export_onnx, export_script, import_module, import_onnx, save_imported
from engine.project import SUFFIX


def _onnx_paths(mime) -> list[str]:
    if not mime.hasUrls():
        return []
    return [u.toLocalFile() for u in mime.urls() if u.isLocalFile() and u.toLocalFile().lower().endswith(".onnx")]


class InteropUI(QObject):
    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="export")
        self._pending: list[tuple[concurrent.futures.Future, Callable]] = []
        self._timer = QTimer(self, interval=100, timeout=self._poll)
        self.actions: dict[str, QAction] = {}
        menu = next(a.menu() for a in window.menuBar().actions() if a.menu() and a.text() == "&File")
        quit_action = window.actions["quit"]
        for key, text, slot in (("import_onnx", "Import &ONNX…", lambda: self.import_onnx_file()),
                                ("import_module", "Import PyTorch &Module…", lambda: self.import_module_path()),
                                ("export_onnx", "&Export ONNX…", lambda: self.export_onnx_to()),
                                ("export_script", "Export PyTorch &Script…", lambda: self.export_script_to())):
            act = QAction(text, window)
            act.triggered.connect(slot)
            self.actions[key] = act
            menu.insertAction(quit_action, act)
        menu.insertSeparator(quit_action)
        window.view.setAcceptDrops(True)
        window.view.viewport().installEventFilter(self)
        window.destroyed.connect(lambda *_: self._pool.shutdown(wait=False, cancel_futures=True))

    # ----- import ---------------------------------------------------------------
    def _say(self, text: str, ms: int = 10000) -> None:
        self.window.statusBar().showMessage(text, ms)

    def _refuse(self, title: str, exc: Exception) -> None:
        self._say(str(exc).splitlines()[0], 15000)
        B = QMessageBox.StandardButton
        self.window.ask("warning", title, str(exc), B.Ok, B.Ok)

    def _save_and_open(self, imported, project_path: str | Path | None, default: Path) -> Path | None:
        if project_path is None:
            project_path, _ = QFileDialog.getSaveFileName(self.window, "Save the imported project", str(default),
                                                          f"Layerflow projects (*{SUFFIX})")
            if not project_path:
                return None
        direction = self.window.preferred_direction()  # an import is laid out the way the user reads
        if direction != imported.project.graph.direction and not imported.drawn:
            from engine.layout import set_direction

            set_direction(imported.project.graph, direction)
        path = save_imported(imported, project_path)
        self.window.open_project(path)
        notes = "; ".join(getattr(imported, "notes", []) or [])
        self._say(f"Imported {path.name}" + (f" ({notes})" if notes else ""), 15000)
        return path

    def import_onnx_file(self, onnx_path: str | Path | None = None, project_path: str | Path | None = None) -> Path | None:
        if not self.window.maybe_save():
            return None
        if onnx_path is None:
            onnx_path, _ = QFileDialog.getOpenFileName(self.window, "Import ONNX", str(self.window.project.directory),
                                                       "ONNX models (*.onnx)")
            if not onnx_path:
                return None
        try:
            imported = import_onnx(onnx_path)
            return self._save_and_open(imported, project_path, Path(onnx_path).with_suffix(SUFFIX))
        except (InteropError, OSError) as exc:
            self._refuse("Cannot import ONNX", exc)
            return None

    def import_module_path(self, spec: str | None = None, kwargs: dict | None = None,
                           input_shape: list[int] | None = None, project_path: str | Path | None = None) -> Path | None:
        """spec 'pkg.mod:Class'; asked for (with kwargs JSON and the input shape) when not given."""
        if not self.window.maybe_save():
            return None
        if spec is None:
            spec, ok = QInputDialog.getText(self.window, "Import PyTorch module", "Import path (package.module:Class):")
            if not ok or not spec.strip():
                return None
            text, ok = QInputDialog.getText(self.window, "Import PyTorch module", "Keyword arguments (JSON):", text="{}")
            if not ok:
                return None
            shape, ok = QInputDialog.getText(self.window, "Import PyTorch module", "Input shape per sample (e.g. 16,64):")
            if not ok:
                return None
            try:
                kwargs = json.loads(text or "{}")
                input_shape = [int(s) for s in shape.replace(" ", "").split(",") if s]
            except ValueError as exc:
                self._refuse("Cannot import module", ValueError(f"keyword arguments or shape: {exc}"))
                return None
        try:
            imported = import_module(spec.strip(), kwargs or {}, input_shapes=[input_shape] if input_shape else None)
            default = self.window.project.directory / (spec.rsplit(":", 1)[-1] + SUFFIX)
            return self._save_and_open(imported, project_path, default)
        except (InteropError, OSError, ValueError) as exc:
            self._refuse("Cannot import module", exc)
            return None

    # ----- export ---------------------------------------------------------------
    def _ask_target(self, title: str, suffix: str, filt: str) -> str | None:
        p = self.window.project
        default = (p.path.with_suffix(suffix) if p.path else p.directory / (p.name + suffix))
        path, _ = QFileDialog.getSaveFileName(self.window, title, str(default), filt)
        return path or None

    def export_onnx_to(self, path: str | Path | None = None) -> concurrent.futures.Future | None:
        """Runs on a worker thread (torch's ONNX export takes seconds); returns its future."""
        path = path or self._ask_target("Export ONNX", ".onnx", "ONNX models (*.onnx)")
        if not path:
            return None
        project = self.window.project.copy()  # the user may go on editing meanwhile
        self._say(f"Exporting {Path(path).name}…", 0)
        fut = self._pool.submit(export_onnx, project, path)
        self._pending.append((fut, lambda f: self._say(f"Wrote {f.result()}")))
        self._timer.start()
        return fut

    def export_script_to(self, path: str | Path | None = None) -> Path | None:
        path = path or self._ask_target("Export PyTorch script", ".py", "Python scripts (*.py)")
        if not path:
            return None
        try:
            out = export_script(self.window.project, path)
        except (InteropError, OSError, ValueError) as exc:
            self._refuse("Cannot export script", exc)
            return None
        self._say(f"Wrote {out}")
        return Path(out)

    def _poll(self) -> None:
        for item in list(self._pending):
            fut, done = item
            if not fut.done():
                continue
            self._pending.remove(item)
            if fut.exception() is not None:
                self._refuse("Cannot export ONNX", fut.exception())
            else:
                done(fut)
        if not self._pending:
            self._timer.stop()

    # ----- .onnx dropped on the canvas -------------------------------------------
    def eventFilter(self, obj, event) -> bool:
        t = event.type()
        if t in (QEvent.DragEnter, QEvent.DragMove) and _onnx_paths(event.mimeData()):
            event.acceptProposedAction()
            return True
        if t == QEvent.Drop:
            paths = _onnx_paths(event.mimeData())
            if paths:
                event.acceptProposedAction()
                QTimer.singleShot(0, lambda: self.import_onnx_file(paths[0]))  # not inside the drop handler
                return True
        return False


def install(window) -> InteropUI:
    """File menu: ONNX / PyTorch import and export (app/window.py calls this)."""
    return InteropUI(window)
