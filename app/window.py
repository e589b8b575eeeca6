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

from app import compare_ui, interop_ui, jobs_panel, run_ui, training_ui
from app.main_window import EditorWindow


class MainWindow(EditorWindow):
    """The editor with every part installed (what `python main.py` opens)."""

    def install_parts(self) -> None:
        self.run_ui = run_ui.install(self)  # Run toolbar, Dashboard and Runs docks, progress
        self.jobs_controller, self.jobs_panel, self.jobs_dock = jobs_panel.install(self)  # remote jobs, Deploy…
        self.interop_ui = interop_ui.install(self)  # File menu: ONNX / PyTorch import and export
        self.training_panel, self.training_dock = training_ui.install(self)  # the Training dock
        self.compare_ui = compare_ui.install(self)  # Edit ▸ Compare, the Changes dock, merge conflicts
