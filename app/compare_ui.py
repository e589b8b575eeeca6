"""Compare the open project with a file or a git revision, and settle merge conflicts.

Edit ▸ Compare: the canvas marks what changed since the compared version (added nodes
green, changed ones amber with the old values in their tooltip, removed ones as red
ghosts where they were) and the Changes dock lists every change; F8 / Shift+F8 step
through them, revealing nodes inside collapsed blocks. The comparison follows edits.
A project with merge conflicts (engine/diff.py) lists them in the same dock with Take
ours / Take theirs (one undo step each).
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Qt, QTimer
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

from engine.diff import at_revision, diff_projects
from engine.project import Project, ProjectError, load_project
from widgets.changes import ChangesPanel


class CompareUI(QObject):
    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.other: Project | None = None
        self.label = ""
        self.diff = None
        self.panel = ChangesPanel()
        self.dock = window.add_dock("Changes", self.panel, Qt.BottomDockWidgetArea)
        window.tabifyDockWidget(window.problems_dock, self.dock)
        window.problems_dock.raise_()
        self.panel.node_clicked.connect(self._show)
        self.panel.resolve_requested.connect(self.resolve)
        self.panel.step_requested.connect(self.step)
        self._timer = QTimer(self, singleShot=True, interval=300, timeout=self.refresh)
        m = window.edit_menu.addMenu("&Compare")
        self.actions = {
            "file": m.addAction("With &File…", self.compare_with_file),
            "git": m.addAction("With &Git Revision…", self.compare_with_revision),
            "next": m.addAction("&Next Change", lambda: self.step(1)),
            "prev": m.addAction("&Previous Change", lambda: self.step(-1)),
            "clear": m.addAction("&Stop Comparing", self.clear),
        }
        self.actions["next"].setShortcut(QKeySequence(Qt.Key_F8))
        self.actions["prev"].setShortcut(QKeySequence(Qt.SHIFT | Qt.Key_F8))
        for a in self.actions.values():
            window.addAction(a)  # shortcuts work wherever the focus is
        window.project_changed.connect(self._project_changed)
        window.controller.compiled.connect(lambda _r: self._timer.start())
        window.controller.training_changed.connect(self._timer.start)
        window.controller.placement_changed.connect(self._timer.start)
        self._project_changed()

    # ----- what to compare with ----------------------------------------------------
    def compare_with_file(self, path: str | None = None) -> bool:
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self.window, "Compare with", str(self.window.project.directory),
                                                  "Layerflow projects (*.lflow)")
            if not path:
                return False
        try:
            other = load_project(path)
        except ProjectError as exc:
            self._error(str(exc))
            return False
        return self.compare_with(other, Path(path).name)

    def compare_with_revision(self, rev: str | None = None) -> bool:
        path = self.window.project.path
        if path is None:
            self._error("Save the project in a git repository first: a revision is of a file.")
            return False
        if rev is None:
            rev, ok = QInputDialog.getText(self.window, "Compare with git revision",
                                           "Revision (a branch, a tag, a commit, HEAD~1):", text="HEAD")
            if not ok or not rev.strip():
                return False
        try:
            other = at_revision(path, rev.strip())
        except ProjectError as exc:
            self._error(str(exc))
            return False
        return self.compare_with(other, f"{path.name} at {rev.strip()}")

    def compare_with(self, other: Project, label: str) -> bool:
        self.other, self.label = other, label
        self.refresh()
        self.dock.show()
        self.dock.raise_()
        return True

    def clear(self) -> None:
        self.other, self.diff = None, None
        self.refresh()

    def _error(self, text: str) -> None:
        self.window.ask("warning", "Compare", text, QMessageBox.Ok, QMessageBox.Ok)

    # ----- showing it ----------------------------------------------------------------
    def refresh(self) -> None:
        project = self.window.project
        self.panel.set_conflicts(project.conflicts)
        scene = self.window.scene
        if self.other is None:
            self.diff = None
            self.panel.set_changes(None, None)
            scene.set_diff({}, [])
            return
        self.diff = diff_projects(self.other, project)
        status = self.diff.node_status()
        old = {n.id: n for n in self.other.graph.nodes.values()}
        ghosts = [(old[n].to_dict(), tip) for n, (s, tip) in status.items() if s == "removed" and n in old]
        marks = {n: v for n, v in status.items() if v[0] != "removed" and n in project.graph.nodes}
        scene.set_diff(marks, ghosts)
        self.panel.set_changes(self.label, self.diff)

    def _project_changed(self) -> None:
        self.refresh()
        if self.window.project.conflicts:
            self.dock.show()
            self.dock.raise_()

    def step(self, direction: int) -> None:
        entries = getattr(self.panel, "entries", [])
        if not entries:
            return
        i = (self.panel.current_entry() + direction) % len(entries)
        self.panel.select_entry(i)
        node = entries[i]
        if node:
            self._show(node)

    def _show(self, node: str) -> None:
        w = self.window
        if node in w.scene.node_items:
            w.select_and_show(node)
        elif node in w.scene.ghost_items:
            w.scene.clearSelection()
            w.view.centerOn(w.scene.ghost_items[node].sceneBoundingRect().center())

    # ----- conflicts -------------------------------------------------------------------
    def resolve(self, index: int, side: str) -> bool:
        ok = self.window.controller.resolve_conflict(index, side)
        self.refresh()
        return ok


def install(window) -> CompareUI:
    """Edit ▸ Compare and the Changes dock (app/window.py calls this)."""
    return CompareUI(window)
