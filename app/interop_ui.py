"""File menu: import an ONNX file or a PyTorch module, export ONNX or a PyTorch
script; an .onnx file dropped on the canvas is imported too. A run's model (the Runs
panel's Model menu, and File > Export, which asks which weights when the project has
runs): export it, use its weights as the project's, fine-tune from it.

The work is engine/interop's (the same calls as `python main.py import/export`);
this module only asks where, runs the slow ONNX export off the GUI thread, and
reports in the status bar. File > Import (both entries, and an .onnx dropped on the
canvas) opens the import dialog (app/import_dialog.py), which imports on a worker
thread with its progress and errors shown inline. An import is written (weights file
+ project, each atomically) before it is opened, so the weights travel with the diagram.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

from engine.interop import InteropError, export_onnx, export_script
from engine.runs import weights as run_weights


def _onnx_paths(mime) -> list[str]:
    if not mime.hasUrls():
        return []
    return [u.toLocalFile() for u in mime.urls() if u.isLocalFile() and u.toLocalFile().lower().endswith(".onnx")]


class InteropUI(QObject):
    def __init__(self, window):
        super().__init__(window)
        self.window = window
        from engine.interop.common import settle_torch_trace

        settle_torch_trace()  # (before any export runs on the pool's thread)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="export")
        self._pending: list[tuple[concurrent.futures.Future, Callable]] = []
        self._timer = QTimer(self, interval=100, timeout=self._poll)
        self.actions: dict[str, QAction] = {}
        menu = next(a.menu() for a in window.menuBar().actions() if a.menu() and a.text() == "&File")
        quit_action = window.actions["quit"]
        self.dialog = None  # the import dialog while it is open
        for key, text, slot in (("import_onnx", "Import &ONNX…", lambda: self.import_dialog(browse=True)),
                                ("import_module", "Import PyTorch &Module…", lambda: self.import_dialog()),
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

    def import_dialog(self, source: str | Path | None = None, project_path: str | Path | None = None,
                      *, browse: bool = False):
        """File > Import: the import dialog (app/import_dialog.py), prefilled with `source`
        (an .onnx path or 'pkg.mod:Class') and the project file; the import runs on a worker
        thread and the project it writes is opened here. Returns the dialog (shown)."""
        from app.import_dialog import ImportDialog

        if self.dialog is not None:
            self.dialog.close()
        folder = self.window.settings.value("import_folder") or ""
        folder = Path(folder) if folder and Path(folder).is_dir() else self.window.file_folder()
        dlg = ImportDialog(self.window, folder=folder, direction=self.window.preferred_direction(),
                           source=str(source or ""), output=project_path)
        dlg.setAttribute(Qt.WA_DeleteOnClose)
        dlg.imported.connect(lambda path, notes: self._open_imported(dlg, path, notes))
        dlg.destroyed.connect(lambda *_: setattr(self, "dialog", None) if self.dialog is dlg else None)
        self.dialog = dlg
        dlg.open()  # window-modal; the window's event loop goes on (it repaints while importing)
        if browse:
            QTimer.singleShot(0, dlg.choose_source)
        return dlg

    def _open_imported(self, dlg, path: Path, notes) -> None:
        self.window.settings.set_value("import_folder", str(Path(path).parent))
        if not self.window.open_project(path):  # the user kept the project they have (unsaved changes)
            dlg.show_error(f"{Path(path).name} was written but not opened: File > Open opens it")
            return
        self._say(f"Imported {Path(path).name}" + (f" ({'; '.join(notes)})" if notes else ""), 15000)
        dlg.accept()

    def _import_now(self, req, title: str) -> Path | None:
        """An import with everything given (scripts, tests): run here, written, opened."""
        from app.import_dialog import run_import

        if not self.window.maybe_save():
            return None
        try:
            path, notes = run_import(req)
        except (InteropError, OSError, ValueError) as exc:
            self._refuse(title, exc)
            return None
        self.window.open_project(path)
        self._say(f"Imported {path.name}" + (f" ({'; '.join(notes)})" if notes else ""), 15000)
        return path

    def import_onnx_file(self, onnx_path: str | Path | None = None, project_path: str | Path | None = None):
        """With both paths: import at once (returns the project path, None when refused).
        Else the import dialog, prefilled (returns it)."""
        if onnx_path is None or project_path is None:
            return self.import_dialog(onnx_path, project_path, browse=onnx_path is None)
        from app.import_dialog import Request

        req = Request("onnx", str(onnx_path), Path(project_path), direction=self.window.preferred_direction())
        return self._import_now(req, "Cannot import ONNX")

    def import_module_path(self, spec: str | None = None, kwargs: dict | None = None,
                           input_shape: list[int] | None = None, project_path: str | Path | None = None):
        """spec 'pkg.mod:Class': with the shape and project path, imported at once (returns
        the project path); else the import dialog, prefilled (returns it)."""
        if spec is None or input_shape is None or project_path is None:
            dlg = self.import_dialog(spec, project_path)
            if kwargs:
                dlg.kwargs.setPlainText(json.dumps(kwargs))
            if input_shape:
                dlg.set_inputs([(",".join(map(str, input_shape)), "float32")])
            return dlg
        from app.import_dialog import Request

        req = Request("module", spec.strip(), Path(project_path), dict(kwargs or {}), [list(input_shape)],
                      ["float32"], self.window.preferred_direction())
        return self._import_now(req, "Cannot import module")

    # ----- export ---------------------------------------------------------------
    def _which_weights(self, title: str, run, checkpoint):
        """(run, checkpoint) to export: asked for whichever is not given (no run: the
        project's own weights or a run's; a run: which of its checkpoints); None: cancelled."""
        if run is None:
            return self.ask_weights_source(title)
        if checkpoint is None:
            checkpoint = self.ask_checkpoint(run, title)
            if checkpoint is None:
                return None
        return run, checkpoint

    def _ask_target(self, title: str, suffix: str, filt: str) -> str | None:
        p = self.window.project
        default = (p.path.with_suffix(suffix) if p.path else p.directory / (p.name + suffix))
        path, _ = QFileDialog.getSaveFileName(self.window, title, str(default), filt)
        return path or None

    def export_onnx_to(self, path: str | Path | None = None, run: str | Path | None = None,
                       checkpoint: str | None = None) -> concurrent.futures.Future | None:
        """Runs on a worker thread (torch's ONNX export takes seconds); returns its future.
        `run`: carry that run's weights at `checkpoint` (asked for when path is not given:
        File > Export offers the project's own weights or a run's)."""
        if path is None:  # File > Export or a run's menu: which weights
            chosen = self._which_weights("Export ONNX", run, checkpoint)
            if chosen is None:
                return None
            run, checkpoint = chosen
        path = path or self._ask_target("Export ONNX", ".onnx", "ONNX models (*.onnx)")
        if not path:
            return None
        try:
            what = f" (weights of {Path(run).name}, {run_weights.checkpoint_path(run, checkpoint)[0]})" if run else ""
        except InteropError as exc:
            self._refuse("Cannot export ONNX", exc)
            return None
        project = self.window.project.copy()  # the user may go on editing meanwhile
        self._say(f"Exporting {Path(path).name}…", 0)
        fut = self._pool.submit(export_onnx, project, path, run=run, checkpoint=checkpoint)
        self._pending.append((fut, lambda f: self._say(f"Wrote {f.result()}{what}")))
        self._timer.start()
        return fut

    def export_script_to(self, path: str | Path | None = None, run: str | Path | None = None,
                         checkpoint: str | None = None) -> Path | None:
        """A PyTorch script; with `run`, it starts from that run's weights (asked for as
        export_onnx_to asks)."""
        if path is None:  # File > Export or a run's menu: which weights
            chosen = self._which_weights("Export PyTorch script", run, checkpoint)
            if chosen is None:
                return None
            run, checkpoint = chosen
        path = path or self._ask_target("Export PyTorch script", ".py", "Python scripts (*.py)")
        if not path:
            return None
        try:
            out = export_script(self.window.project, path, run=run, checkpoint=checkpoint)
        except (InteropError, OSError, ValueError) as exc:
            self._refuse("Cannot export script", exc)
            return None
        self._say(f"Wrote {out}" + (f" (weights of {Path(run).name})" if run else ""))
        return Path(out)

    # ----- which weights ----------------------------------------------------------
    INITIAL = "The project's own weights"

    def _runs_with_weights(self) -> list[Path]:
        from engine.runs.history import list_runs, runs_dir

        p = self.window.project
        return [r.path for r in list_runs(runs_dir(p.directory))
                if r.name == p.name and run_weights.available_checkpoints(r.path)]

    def weights_choices(self) -> list[tuple[str, Path | None, str | None]]:
        """(label, run folder, checkpoint) for File > Export: the project's own weights
        (its weights file, else the initial ones), then each run's final, best and latest."""
        own = self.INITIAL + (f" ({self.window.project.weights})" if self.window.project.weights else " (initial)")
        out: list[tuple[str, Path | None, str | None]] = [(own, None, None)]
        for run in self._runs_with_weights():
            for ck in run_weights.available_checkpoints(run):
                if ck in ("final", "best", "latest"):
                    name, _ = run_weights.checkpoint_path(run, ck)
                    out.append((f"{run.name}: {ck}" + ("" if name == ck else f" ({name})"), run, ck))
        return out

    def ask_weights_source(self, title: str) -> tuple[Path | None, str | None] | None:
        """Which weights an export carries: (None, None) for the project's own, (run, checkpoint)
        for a run's; None when the user cancels. Not asked when the project has no run."""
        choices = self.weights_choices()
        if len(choices) == 1:
            return None, None
        labels = [c[0] for c in choices]
        # a trained run first (the newest run's final, else its best): exporting untrained weights is rarely meant
        label, ok = QInputDialog.getItem(self.window, title, "Weights to export:", labels, 1, False)
        if not ok:
            return None
        _, run, ck = choices[labels.index(label)]
        return run, ck

    def ask_checkpoint(self, run, title: str) -> str | None:
        """One of a run's checkpoints (final, best, latest, step_N); None when cancelled."""
        have = run_weights.available_checkpoints(run)
        if not have:
            self._refuse(title, InteropError(f"{Path(run).name}: has no weights yet (no checkpoint, no model.pt)"))
            return None
        if len(have) == 1:
            return have[0]
        ck, ok = QInputDialog.getItem(self.window, title, f"Weights of {Path(run).name}:", have, 0, False)
        return ck if ok else None

    # ----- a run's weights as the project's; fine-tuning ----------------------------
    def use_run_weights(self, run, checkpoint: str | None = None, *, ask: bool = True) -> Path | None:
        """The run's weights become the project's: NAME.weights.pt beside the project
        file. A project without unsaved edits is changed on disk at once (under its edit
        lock, as `weights use` does); one with edits is changed here, saved with them."""
        w = self.window
        if w.project.path is None:
            self._refuse("Use these weights", InteropError("save the project first: its weights file goes beside it"))
            return None
        if checkpoint is None and ask:
            checkpoint = self.ask_checkpoint(run, "Use these weights")
            if checkpoint is None:
                return None
        try:
            if not w.is_dirty():
                from engine.project import _digest

                wpath, name = run_weights.use_run_weights(w.project.path, run, checkpoint)
                w.project.weights = wpath.name
                raw = Path(w.project.path).read_bytes()
                if raw == w.project.dumps().encode("utf-8"):  # this window holds the file as it is now
                    import os

                    w.project._read_digest = (os.path.realpath(w.project.path), _digest(raw))
            else:
                from engine.project import weights_name
                from engine.project import atomic_write

                name, _ = run_weights.checkpoint_path(run, checkpoint)
                state = run_weights.run_state(w.project, run, name)
                wpath = Path(w.project.path).parent / weights_name(w.project.path)
                atomic_write(wpath, run_weights.state_bytes(state))
                w.project.weights = wpath.name
                mark = getattr(w, "_mark_modified", None)
                if mark is not None:
                    mark()  # saved with the window's other edits
        except (InteropError, OSError, ValueError) as exc:
            self._refuse("Cannot use these weights", exc)
            return None
        self._say(f"The project's weights are now {Path(run).name}'s ({name}): {wpath.name}")
        return wpath

    def fine_tune(self, run, checkpoint: str | None = None, *, ask: bool = True, nproc: int = 1,
                  steps: int | None = None) -> Path | None:
        """A new run of the project as it is on screen, starting from the run's weights
        (as `train --init-from RUN`); prepared in the background, followed like Run's."""
        run_ui = getattr(self.window, "run_ui", None)
        if run_ui is None or run_ui.controller.running:
            self._say("A run is going on: stop it before starting another", 10000)
            return None
        if checkpoint is None and ask:
            checkpoint = self.ask_checkpoint(run, "Fine-tune from here")
            if checkpoint is None:
                return None
        editor = getattr(self.window, "controller", None)
        if editor is not None:
            editor.flush()
            blocker = editor.run_blocker()
            if blocker:
                self._say(f"Cannot run: {blocker}", 15000)
                return None
        project = self.window.project.copy()  # edits made while it is prepared are not this run's
        try:
            run_weights.run_state(project, run, checkpoint)  # refused at once, in one line, when it does not fit
        except (InteropError, OSError) as exc:
            self._refuse("Cannot fine-tune", exc)
            return None
        try:
            out = run_ui.controller.start(project, nproc=nproc, steps=steps, init_from=(str(run), checkpoint))
        except (OSError, RuntimeError, ValueError) as exc:
            self._refuse("Cannot fine-tune", exc)
            return None
        which = checkpoint or "final"
        with contextlib.suppress(InteropError):
            which = run_weights.checkpoint_path(run, checkpoint)[0]
        self._say(f"Fine-tuning from {Path(run).name} ({which}) in {out.name}", 10000)
        return out

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
                QTimer.singleShot(0, lambda: self.import_dialog(paths[0]))  # not inside the drop handler
                return True
        return False


def install(window) -> InteropUI:
    """File menu: ONNX / PyTorch import and export (app/window.py calls this)."""
    return InteropUI(window)
