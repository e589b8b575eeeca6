"""The composition root: the main window as Layerflow ships it, put together here.

app/main_window.py is the editor (canvas, palette, inspector, devices, problems,
summary; files, undo, views). Each other part of the window lives in its own module
and has an `install(window)` that builds it on the window's public API (add_dock,
run_toolbar, project, project_changed, run_openers) and returns what it made.
`MainWindow.install_parts` calls them, in this order, at the point of the editor's
__init__ where docks may still be added (before the saved window state is
applied). Nothing registers itself by being imported, and no part sets attributes on
the window: the window keeps what each install returns, under the names below. A part
that fails to install raises: a bug shows as an error, not as a missing menu.
"""
from __future__ import annotations

from PySide6.QtGui import QKeySequence

from app import compare_ui, interop_ui, jobs_panel, run_ui, training_ui
from app.main_window import EditorWindow

# Shortcuts of run toolbar actions that their parts leave without one (Run F5, Stop
# Shift+F5, Resume Ctrl+F5 and Logs Ctrl+Shift+J come with the toolbar itself).
RUN_SHORTCUTS = {"Clusters…": "Ctrl+Shift+K", "Deploy…": "Ctrl+Shift+D"}


class MainWindow(EditorWindow):
    """The editor with every part installed (what `python main.py` opens)."""

    def install_parts(self) -> None:
        self.run_ui = run_ui.install(self)  # Run toolbar, Dashboard and Runs docks, progress
        self.jobs_controller, self.jobs_panel, self.jobs_dock = jobs_panel.install(self)  # remote jobs, Deploy…
        self.interop_ui = interop_ui.install(self)  # File menu: ONNX / PyTorch import and export
        self.training_panel, self.training_dock = training_ui.install(self)  # the Training dock
        self.compare_ui = compare_ui.install(self)  # Edit ▸ Compare, the Changes dock, merge conflicts
        self._wire_run_toolbar()

    def _wire_run_toolbar(self) -> None:
        """The run toolbar's actions as the Run menu shows them (shortcuts, a separator
        before the cluster actions), Logs, and its process count tied to the placement."""
        tb = self.run_ui.toolbar
        first_remote = None
        for a in self.run_toolbar.actions():
            keys = RUN_SHORTCUTS.get(a.text())
            if keys and a.shortcut().isEmpty():
                a.setShortcut(QKeySequence(keys))
                a.setToolTip(f"{a.text().rstrip('…')} ({a.shortcut().toString(QKeySequence.NativeText)})")
            if keys and first_remote is None:
                first_remote = a
        if first_remote is not None:  # Logs after Resume, then the cluster actions
            self.run_toolbar.insertAction(self.run_toolbar.insertSeparator(first_remote), tb.logs_action)
        else:
            self.run_toolbar.addAction(tb.logs_action)
        tb.logs_requested.connect(self.show_run_logs)
        tb.processes_changed.connect(self.set_processes)

    def set_processes(self, n: int) -> bool:
        """The toolbar's process count, made the project's placement as the run will use it
        (app/run_controller.placement_for_processes): one undo step; the Devices panel and
        the plan follow. A count the placement cannot take is refused with the reason."""
        from app.run_controller import placement_for_processes
        from engine.errors import LayerflowError

        pl = self.project.placement
        try:
            new = placement_for_processes(pl, n)
        except LayerflowError as exc:
            self.statusBar().showMessage(f"Not {n} processes: {exc}", 15000)
            self.run_ui.toolbar.set_processes(pl.world)
            return False
        if new.dp != pl.dp:
            self.controller.set_mesh("dp", new.dp)
        return True

    def show_run_logs(self):
        """Run ▸ Logs: the live run's, else the run selected in Runs, else the latest run's."""
        from engine.runs.history import list_runs

        ui = self.run_ui
        active = ui.controller.active
        run = str(active.run_dir) if active is not None else next(iter(ui.runs_panel.selected_runs()), None)
        if run is None:
            runs = [r for r in list_runs(ui.runs_dir) if r.name == self.project.name]
            run = str(runs[0].path) if runs else None
        if run is None:
            self.statusBar().showMessage(f"No run of {self.project.name} yet: Run ▸ Run trains it", 8000)
            return None
        return ui.show_logs(run)
