"""Workspaces: the window arranged for one task at a time, the canvas always in the middle.

Design (layers palette, inspector, problems), Place (devices, the plan's summary),
Train (training settings, data, runs, the dashboard large) and Compare (the runs
table, runs, changes). What was taken from others:

- Blender's workspaces: a row of tabs at the top, each a saved arrangement of the same
  editors around the same data; switching never changes the data, and each tab keeps the
  arrangement the user made in it (here QMainWindow.saveState per workspace, kept in the
  user's settings with the one that was open last).
- Qt Creator's modes: a key for each (Ctrl+1..4 here, as its Ctrl+1..6), and the task
  itself switches mode: starting a run shows Train, as starting the debugger shows Debug.
- ComfyUI: the graph owns the window; side panels are narrow, and open when asked for.

A panel with nothing to show yet (Remote jobs with no cluster, Runs and the Dashboard
before the first run, Changes with no comparison, the Runs Table with no runs) stays
closed when a workspace opens; once it has something it opens in its place there again.
"""
from __future__ import annotations

from PySide6.QtCore import QByteArray, QObject, Qt, QTimer
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget, QTabBar

# Each workspace: per dock area, groups of panels; a group's panels are tabs of one place,
# the groups of an area are stacked (left/right: one over the other; bottom: side by side).
# The first panel of a group is the tab in front. Sizes: the side areas' widths and the
# bottom area's height (as a share of the window when below 1).
WORKSPACES: dict[str, dict] = {
    "Design": {"tip": "draw the diagram: layers, inspector, problems",
               "left": [["Layers"]], "right": [["Inspector"], ["Problems", "Summary", "Changes"]],
               "width": {"left": 172, "right": 288}, "split": 0.62},  # (Changes: a comparison or a merge's conflicts)
    "Place": {"tip": "place it on devices: pipeline, data and tensor parallel, the plan per device",
              "right": [["Devices", "Remote jobs"], ["Summary", "Problems"]],
              "width": {"right": 330}, "split": 0.55},
    "Train": {"tip": "train it: settings, data, runs, the dashboard",
              "right": [["Training", "Data", "Runs", "Remote jobs"]], "bottom": [["Dashboard"]],
              "width": {"right": 330}, "height": 0.56},
    "Compare": {"tip": "compare runs and versions: the runs table, changes",
                "right": [["Runs"]], "bottom": [["Runs Table", "Dashboard", "Changes"]],
                "width": {"right": 330}, "height": 0.5},
}
NAMES = tuple(WORKSPACES)
_AREAS = {"left": Qt.LeftDockWidgetArea, "right": Qt.RightDockWidgetArea, "bottom": Qt.BottomDockWidgetArea}


class Workspaces(QObject):
    """The tab bar (at the right of the menu bar), View ▸ Workspace with Ctrl+1..4, and the
    saved arrangement of each workspace."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.settings = window.settings
        self.current: str | None = None
        self.arranged = False  # the current workspace has its default arrangement (no saved one)
        self._closed_empty: dict[str, set[str]] = {}  # per workspace: panels closed because empty
        self.bar = QTabBar()
        self.bar.setObjectName("workspace_tabs")
        self.bar.setDrawBase(False)
        self.bar.setExpanding(False)
        self.actions: dict[str, QAction] = {}
        menu = window.view_menu.addMenu("&Workspace")
        for i, name in enumerate(NAMES):
            self.bar.addTab(name)
            a = QAction(name, window, checkable=True)
            a.setShortcut(QKeySequence(f"Ctrl+{i + 1}"))
            keys = a.shortcut().toString(QKeySequence.NativeText)
            a.setToolTip(f"{name} workspace ({keys}): {WORKSPACES[name]['tip']}")
            self.bar.setTabToolTip(i, a.toolTip())
            a.triggered.connect(lambda _on=False, name=name: self.show(name))
            window.addAction(a)
            menu.addAction(a)
            self.actions[name] = a
        window.menuBar().setCornerWidget(self.bar, Qt.TopRightCorner)
        self.bar.currentChanged.connect(lambda i: self.show(NAMES[i]) if 0 <= i < len(NAMES) else None)
        menu.addSeparator()
        menu.addAction("&Reset Workspace", self.reset)
        window.project_changed.connect(self.follow)
        ui = getattr(window, "run_ui", None)
        if ui is not None:  # a run's start and end fill the Runs list and the dashboard
            for sig in (ui.controller.started, ui.controller.finished, ui.controller.failed):
                sig.connect(lambda *_: QTimer.singleShot(0, self.follow))

    # ----- the panels ----------------------------------------------------------------
    def docks(self) -> dict[str, QDockWidget]:
        return {d.windowTitle().split(" (")[0]: d for d in self.window.findChildren(QDockWidget)
                if d.parent() is self.window}

    def is_empty(self, title: str) -> bool:
        """True for a panel with nothing to show yet."""
        w = self.window
        if title == "Remote jobs":
            panel = getattr(w, "jobs_panel", None)
            if panel is not None and panel.table.rowCount():
                return False
            try:
                from remote.cluster import ClusterStore

                return not ClusterStore().names()
            except Exception:  # noqa: BLE001 (an unreadable cluster file: the panel says why)
                return False
        ui = getattr(w, "run_ui", None)
        if title == "Runs":
            return ui is None or not ui.runs_panel.run_paths()
        if title == "Dashboard":
            return ui is None or ui._dashboard is None or not ui._dashboard.run_keys()
        if title == "Changes":
            compare = getattr(w, "compare_ui", None)  # a comparison, or a merge's conflicts to settle
            return compare is None or (getattr(compare, "other", None) is None and not w.project.conflicts)
        if title == "Runs Table":
            return ui is None or not ui.runs_panel.run_paths()
        return False

    def panels(self, name: str) -> list[str]:
        spec = WORKSPACES[name]
        return [t for area in _AREAS for group in spec.get(area, []) for t in group]

    # ----- switching -----------------------------------------------------------------
    def _key(self, name: str) -> str:
        return f"workspaces/{name}"

    def save(self) -> None:
        if self.current is not None:
            self.settings.set_value(self._key(self.current), self.window.saveState())
            self.settings.set_value("workspace", self.current)

    def restore(self) -> None:
        """The workspace the user had open last (Design the first time)."""
        name = self.settings.value("workspace", "Design")
        self.show(name if name in WORKSPACES else "Design", save=False)

    def show(self, name: str, save: bool = True) -> None:
        """Switch to `name`: its saved arrangement, or its default one."""
        if name not in WORKSPACES:
            raise ValueError(f"no workspace '{name}' (one of {', '.join(NAMES)})")
        if name == self.current:
            self._mark(name)
            return
        if save:
            self.save()
        self.current = name
        state = self.settings.value(self._key(name))
        self.arranged = False
        if not (isinstance(state, QByteArray) and self.window.restoreState(state)):
            self.arrange(name)
        self._follow_contents(name)
        self.settings.set_value("workspace", name)
        self._mark(name)

    def _mark(self, name: str) -> None:
        i = NAMES.index(name)
        if self.bar.currentIndex() != i:
            self.bar.blockSignals(True)
            self.bar.setCurrentIndex(i)
            self.bar.blockSignals(False)
        for n, a in self.actions.items():
            a.setChecked(n == name)

    def _follow_contents(self, name: str) -> None:
        """Panels of this workspace that are empty close; those closed for being empty
        that have something now open again (where the workspace keeps them)."""
        closed = self._closed(name)
        docks = self.docks()
        for title in self.panels(name):
            d = docks.get(title)
            if d is None:
                continue
            if self.is_empty(title):
                if d.isVisibleTo(self.window):
                    d.hide()
                    closed.add(title)
            elif title in closed:
                d.show()
                d.raise_()
                closed.discard(title)
        self.settings.set_value(f"{self._key(name)}_closed_empty", sorted(closed))

    def _closed(self, name: str) -> set[str]:
        if name not in self._closed_empty:
            v = self.settings.value(f"{self._key(name)}_closed_empty", [])
            self._closed_empty[name] = set([v] if isinstance(v, str) else (v or []))
        return self._closed_empty[name]

    def follow(self) -> None:
        """The current workspace's panels after their contents changed (a run started or
        ended, a project opened): empty ones close, filled ones open."""
        if self.current is not None:
            self._follow_contents(self.current)

    def reset(self) -> None:
        """The current workspace's default arrangement (View ▸ Workspace ▸ Reset)."""
        if self.current is not None:
            self.arrange(self.current)
            self._follow_contents(self.current)

    def arrange(self, name: str) -> None:
        """The default arrangement of `name`: its panels where it puts them, at its sizes;
        every other panel closed (Panels opens any of them)."""
        spec = WORKSPACES[name]
        w = self.window
        docks = self.docks()
        wanted = set(self.panels(name))
        for title, d in docks.items():
            if title not in wanted:
                d.hide()
        heads: dict[str, list[QDockWidget]] = {}
        for area, groups in ((a, spec.get(a, [])) for a in _AREAS):
            prev = None
            for group in groups:
                present = [docks[t] for t in group if t in docks]
                if not present:
                    continue
                head = present[0]
                if prev is None:
                    w.addDockWidget(_AREAS[area], head)
                else:
                    w.splitDockWidget(prev, head, Qt.Horizontal if area == "bottom" else Qt.Vertical)
                head.show()
                for d in present[1:]:
                    w.tabifyDockWidget(head, d)
                    d.show()
                head.raise_()
                heads.setdefault(area, []).append(head)
                prev = head
        self._closed_empty[name] = set()
        self.arranged = True  # (sized again when the window is first shown: app/main_window.py)
        self.size(name, heads)

    def size(self, name: str, heads: dict | None = None) -> None:
        """The workspace's side widths and bottom height on the window's present size."""
        spec = WORKSPACES[name]
        w = self.window
        if heads is None:
            docks = self.docks()
            heads = {area: [docks[g[0]] for g in spec.get(area, []) if g and g[0] in docks] for area in _AREAS}
        for area, px in spec.get("width", {}).items():
            if heads.get(area):
                w.resizeDocks([heads[area][0]], [px], Qt.Horizontal)
        if heads.get("bottom") and "height" in spec:
            w.resizeDocks([heads["bottom"][0]], [int(w.height() * spec["height"])], Qt.Vertical)
        right = heads.get("right") or []
        if len(right) == 2 and "split" in spec:
            usable = max(200, w.centralWidget().height())
            top = int(usable * spec["split"])
            w.resizeDocks(right, [top, usable - top], Qt.Vertical)


def install(window) -> Workspaces:
    """The workspaces, once every panel exists (app/main_window.py calls this last)."""
    ws = Workspaces(window)
    ws.restore()
    return ws
