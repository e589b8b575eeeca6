"""The main window: canvas in the middle, palette left, inspector and devices
right, problems and summary below; menus, shortcuts, files, autosave, themes.

This is the editor itself. The window as the app ships it, with its other parts
(training settings, runs and dashboard, remote jobs, ONNX/PyTorch import and
export), is put together in one place: app/window.py, the composition root, whose
`install_parts` calls each part's install function. Parts use the public `add_dock`,
`run_toolbar`, `project`, `project_changed` and `run_openers`.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from PySide6.QtCore import QByteArray, QEvent, QObject, QPointF, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QColor, QIcon, QKeySequence, QPalette
from PySide6.QtWidgets import (QApplication, QDockWidget, QFileDialog, QInputDialog, QLabel, QMainWindow,
                               QMessageBox, QToolBar, QWidget, QWidgetAction)

from app.controller import EditorController
from app.settings import Settings
from engine.project import SUFFIX, Project, ProjectError, load_project, save_project
from engine.runtime.records import pid_alive
from widgets.devices import DevicesPanel
from widgets.inspector import Inspector
from widgets.node_view import NodeView
from widgets.palette import LayerPalette
from widgets.problems import ProblemsList
from widgets.style import theme as scene_theme
from widgets.summary import SummaryPanel

ROOT = Path(__file__).resolve().parents[1]
RESOURCES = ROOT / "resources"
EXAMPLE = RESOURCES / "examples" / "transformer_synthetic.lflow"
CHANGED_ON_DISK = "changed on disk since it was read"  # save_project's refusal (engine/project.py)

class _PanelUndo(QObject):
    """Ctrl+Z / Ctrl+Shift+Z in a field of the side panels undoes the project's last edit,
    as everywhere else in the window: a spin box or line edit would otherwise take the
    keys for its own (already committed) text and do nothing."""

    def __init__(self, window: "EditorWindow"):
        super().__init__(window)
        self.window = window

    def eventFilter(self, obj, e) -> bool:  # noqa: N802
        if e.type() != QEvent.ShortcutOverride or not isinstance(obj, QWidget):
            return False
        if not (e.matches(QKeySequence.Undo) or e.matches(QKeySequence.Redo)
                or QKeySequence(e.keyCombination()) == QKeySequence("Ctrl+Shift+Z")):
            return False
        docks = [d for d in (getattr(self.window, n, None) for n in ("inspector_dock", "devices_dock", "training_dock", "data_dock"))
                 if d is not None]
        if not any(d.isAncestorOf(obj) for d in docks):
            return False
        e.ignore()  # not the field's: the window's Undo/Redo shortcut takes it
        return True


def _slug(title: str) -> str:
    return "dock_" + "".join(c if c.isalnum() else "_" for c in title.lower())


class EditorWindow(QMainWindow):
    project_changed = Signal()

    def __init__(self, project: Project | None = None, settings: Settings | None = None, recover: bool = True):
        super().__init__()
        from engine import trust

        trust.interactive()  # the user's own edits here may run; a project file's code asks first (ask_trust)
        self.settings = settings or Settings()
        self.run_openers: list = []  # callables (window, run_dir) from the run dashboard
        self._autosave_key = f"{os.getpid()}-{id(self)}"
        self.controller = EditorController(project)
        self.controller.setParent(self)
        self.scene = self.controller.scene
        self.view = NodeView(self.scene)
        self.setCentralWidget(self.view)
        self.setWindowIcon(QIcon(str(RESOURCES / "icons" / "layerflow.svg")))
        self.resize(1440, 900)
        self.setCorner(Qt.BottomLeftCorner, Qt.LeftDockWidgetArea)
        self.setCorner(Qt.BottomRightCorner, Qt.RightDockWidgetArea)
        self.setDockOptions(QMainWindow.AnimatedDocks | QMainWindow.AllowTabbedDocks)

        self.palette = LayerPalette()
        self.inspector = Inspector()
        self.devices = DevicesPanel()
        self.problems = ProblemsList()
        self.summary = SummaryPanel()
        self.actions: dict[str, QAction] = {}
        self._panels_menu = None
        self._build_actions()
        self._build_menus()
        self._build_toolbars()
        self.palette_dock = self.add_dock("Layers", self.palette, Qt.LeftDockWidgetArea)
        self.inspector_dock = self.add_dock("Inspector", self.inspector, Qt.RightDockWidgetArea)
        self.devices_dock = self.add_dock("Devices", self.devices, Qt.RightDockWidgetArea)
        self.tabifyDockWidget(self.inspector_dock, self.devices_dock)
        self.inspector_dock.raise_()
        self.problems_dock = self.add_dock("Problems", self.problems, Qt.BottomDockWidgetArea)
        self.summary_dock = self.add_dock("Summary", self.summary, Qt.BottomDockWidgetArea)
        self.tabifyDockWidget(self.problems_dock, self.summary_dock)
        self.problems_dock.raise_()
        self.zoom_label = QLabel()
        self.statusBar().addPermanentWidget(self.zoom_label)
        self._wire()
        from app.devices_source import attach  # here: paramiko loads with the window, not with the CLI
        self.device_source = attach(self)  # the devices panel's source: this machine or a cluster
        self.apply_theme(self.settings.theme())
        geo = self.settings.value("geometry")
        if isinstance(geo, QByteArray):
            self.restoreGeometry(geo)
        self._autosave_timer = QTimer(self, interval=1000 * self.settings.autosave_seconds(), timeout=self.autosave_now)
        self._autosave_timer.start()
        self._after_project_set()
        if recover:
            self.offer_recovery()
        from app import data_ui  # the Data dock: what the data set holds, checked against the diagram

        self.data_ui, self.data_panel, self.data_dock = data_ui.install(self)
        self.install_parts()
        from app import sweep_ui  # the Sweep dock (a queue of runs) and the Runs Table dock (engine/runs/sweep.py)

        self.sweep_ui = sweep_ui.install(self)
        self.run_toolbar.setVisible(bool(self.run_toolbar.actions()))
        self._fill_run_menu()
        from app import workspaces  # Design, Place, Train, Compare: each a saved arrangement of the panels

        self.workspaces = workspaces.install(self)
        self._panel_undo = _PanelUndo(self)
        QApplication.instance().installEventFilter(self._panel_undo)  # shortcut overrides go to the focus widget

    def install_parts(self) -> None:
        """The other parts of the window (app/window.py installs them); the editor alone has none."""

    def default_dock_sizes(self) -> None:
        """The current workspace's panels at its sizes for the window's present size (the
        canvas gets most of it: app/workspaces.py)."""
        ws = getattr(self, "workspaces", None)
        if ws is not None and ws.current is not None:
            ws.size(ws.current)

    def show_workspace(self, name: str) -> None:
        """Design, Place, Train or Compare (app/workspaces.py); the editor alone has none."""
        ws = getattr(self, "workspaces", None)
        if ws is not None:
            ws.show(name)

    def showEvent(self, e) -> None:  # noqa: N802
        super().showEvent(e)
        ws = getattr(self, "workspaces", None)
        if ws is not None and ws.arranged and not getattr(self, "_shown_once", False):
            self._shown_once = True  # a default arrangement's sizes, now that the window has its size
            QTimer.singleShot(0, self.default_dock_sizes)

    # ----- public API for other areas ------------------------------------------
    @property
    def project(self) -> Project:
        return self.controller.project

    def add_dock(self, title: str, widget, area=Qt.RightDockWidgetArea) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(_slug(title))
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        if self._panels_menu is not None:
            self._panels_menu.addAction(dock.toggleViewAction())
        return dock

    def open_run(self, run_dir) -> None:
        if not self.run_openers:
            raise RuntimeError("no run dashboard is installed in this window")
        for opener in self.run_openers:
            opener(self, run_dir)

    # ----- actions and menus --------------------------------------------------
    def _act(self, key: str, text: str, slot, shortcut=None, icon=None, checkable=False, tip="") -> QAction:
        a = QAction(text, self)
        if shortcut is not None:
            a.setShortcuts(shortcut if isinstance(shortcut, list) else [QKeySequence(shortcut)])
        if isinstance(icon, str):
            a.setIcon(QIcon(str(RESOURCES / "icons" / f"{icon}.svg")))
        elif icon is not None:
            a.setIcon(self.style().standardIcon(icon))
        a.setCheckable(checkable)
        a.setStatusTip(tip)
        a.setToolTip(f"{text.replace('&', '')} ({a.shortcut().toString()})" if shortcut else text.replace("&", ""))
        a.triggered.connect(slot)
        self.addAction(a)
        self.actions[key] = a
        return a

    def _build_actions(self) -> None:
        c = self.controller
        self._act("new", "&New", self.new_project, QKeySequence.New, "new")
        self._act("open", "&Open…", lambda: self.open_project(), QKeySequence.Open, "open")
        self._act("save", "&Save", self.save, QKeySequence.Save, "save")
        self._act("save_as", "Save &As…", lambda: self.save_as(), QKeySequence.SaveAs)
        self._act("quit", "&Quit", self.close, QKeySequence.Quit)
        undo = c.stack.createUndoAction(self, "&Undo")
        undo.setShortcut(QKeySequence.Undo)
        undo.setIcon(QIcon(str(RESOURCES / "icons" / "undo.svg")))
        redo = c.stack.createRedoAction(self, "&Redo")
        redo.setShortcuts([QKeySequence("Ctrl+Shift+Z"), QKeySequence("Ctrl+Y")])
        redo.setIcon(QIcon(str(RESOURCES / "icons" / "redo.svg")))
        self.addAction(undo)
        self.addAction(redo)
        self.actions["undo"], self.actions["redo"] = undo, redo
        self._act("cut", "Cu&t", c.cut, QKeySequence.Cut)
        self._act("copy", "&Copy", c.copy, QKeySequence.Copy)
        self._act("paste", "&Paste", lambda: c.paste(self._paste_pos()), QKeySequence.Paste)
        self._act("duplicate", "&Duplicate", c.duplicate, "Ctrl+D")
        self._act("delete", "&Delete", c.delete_selected, [QKeySequence(QKeySequence.Delete), QKeySequence("Backspace")])
        self._act("select_all", "Select &All", c.select_all, QKeySequence.SelectAll)
        self._act("rename", "Re&name…", self.rename_selected, "F2")
        self._act("group", "&Group into Block…", self.group_selected, "Ctrl+G", "group")
        self._act("ungroup", "&Ungroup", c.ungroup_selected, "Ctrl+Shift+G")
        self._act("repeat", "&Repeat Block…", self.repeat_selected, "Ctrl+R")
        self._act("collapse", "Collapse/&Expand Block", self.toggle_collapse, "Ctrl+E")
        self._act("fold", "&Fold/Unfold Repeats", self.toggle_fold, "Ctrl+Shift+E")
        self._act("fit", "&Fit View", lambda: self.view.fit(), "F", "fit")
        self._act("zoom_in", "Zoom &In", lambda: self.view.set_zoom(self.view.zoom() * 1.25), QKeySequence.ZoomIn)
        self._act("zoom_out", "Zoom &Out", lambda: self.view.set_zoom(self.view.zoom() / 1.25), QKeySequence.ZoomOut)
        self._act("zoom_reset", "&Actual Size", lambda: self.view.set_zoom(1.0), "Ctrl+0")
        self._act("layout", "Auto-&Layout", self.auto_layout, "Ctrl+L", "layout")
        self._act("layout_sel", "Auto-Layout &Selection", lambda: c.auto_layout(True), "Ctrl+Shift+L")
        self._act("top_down", "&Top-Down Flow", self.set_top_down, "Ctrl+Shift+T", checkable=True)
        snap = self._act("snap", "Snap to &Grid", self._toggle_snap, checkable=True)
        snap.setChecked(True)
        mm = self._act("minimap", "&Minimap", lambda on: self.view.minimap.setVisible(on), checkable=True)
        mm.setChecked(True)
        self._act("search", "Add Layer by &Name…", lambda: (self.view.setFocus(), self.view.open_search()))
        self._act("find", "&Find Node or Block…", self.find, QKeySequence.Find)
        group = QActionGroup(self)
        for name in ("light", "dark"):
            a = self._act(f"theme_{name}", name.capitalize(), lambda on, name=name: on and self.apply_theme(name), checkable=True)
            group.addAction(a)
        self._act("shortcuts", "&Keyboard Shortcuts", self.show_shortcuts, "Ctrl+/")
        self._act("getting_started", "&Getting Started", self.show_getting_started, QKeySequence.HelpContents)
        self._act("about", "&About Layerflow", self.about)

    def _build_menus(self) -> None:
        a = self.actions
        m = self.menuBar().addMenu("&File")
        for k in ("new", "open"):
            m.addAction(a[k])
        self.recent_menu = m.addMenu("Open &Recent")
        self.recent_menu.setProperty("lf_file_list", True)  # (files, not commands: not in the shortcuts list)
        self.recent_menu.aboutToShow.connect(self._fill_recent)
        self._fill_recent()
        self.examples_menu = m.addMenu("&Examples")
        self.examples_menu.setProperty("lf_file_list", True)
        self._fill_examples()
        m.addSeparator()
        for k in ("save", "save_as"):
            m.addAction(a[k])
        m.addSeparator()
        m.addAction(a["quit"])
        m = self.menuBar().addMenu("&Edit")
        for k in ("undo", "redo", None, "cut", "copy", "paste", "duplicate", "delete", None, "select_all", "rename",
                  None, "group", "ungroup", "repeat", "collapse", "fold"):
            m.addSeparator() if k is None else m.addAction(a[k])
        self.edit_menu = m
        m = self.menuBar().addMenu("&View")
        self.view_menu = m
        for k in ("fit", "zoom_in", "zoom_out", "zoom_reset", None, "layout", "layout_sel", "top_down", None, "snap", "minimap", "search",
                  "find"):
            m.addSeparator() if k is None else m.addAction(a[k])
        tm = m.addMenu("&Theme")
        tm.addAction(a["theme_light"])
        tm.addAction(a["theme_dark"])
        self._panels_menu = m.addMenu("&Panels")
        # Run: the run toolbar's own QActions (filled once the parts have put them there)
        self.run_menu = self.menuBar().addMenu("&Run")
        self.run_menu.aboutToShow.connect(self._fill_run_menu)
        m = self.menuBar().addMenu("&Help")
        for k in ("getting_started", "shortcuts", None, "about"):
            m.addSeparator() if k is None else m.addAction(a[k])
        self.help_menu = m

    def _build_toolbars(self) -> None:
        tb = QToolBar("Main", self)
        tb.setObjectName("main_toolbar")
        tb.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        for k in ("new", "open", "save", None, "undo", "redo", None, "fit", "layout", "group"):
            tb.addSeparator() if k is None else tb.addAction(self.actions[k])
        for k in ("undo", "redo"):  # their text names the command ("Undo Add Linear"): icon only, so the
            button = tb.widgetForAction(self.actions[k])  # toolbar never changes width; the text is the tooltip
            button.setToolButtonStyle(Qt.ToolButtonIconOnly)
        from PySide6.QtCore import QStringListModel
        from PySide6.QtWidgets import QCompleter, QLabel, QLineEdit

        tb.addSeparator()
        self.find_box = QLineEdit(tb)
        self.find_box.setPlaceholderText("Find node or block (Ctrl+F)")
        self.find_box.setClearButtonEnabled(True)
        self.find_box.setMaximumWidth(220)
        self._find_model = QStringListModel(self)
        completer = QCompleter(self._find_model, self.find_box)
        completer.setFilterMode(Qt.MatchContains)
        completer.setCaseSensitivity(Qt.CaseInsensitive)
        completer.activated.connect(self._found)
        self.find_box.setCompleter(completer)
        self.find_box.returnPressed.connect(self._found)
        tb.addWidget(self.find_box)
        self.addToolBar(tb)
        self.main_toolbar = tb
        self.crumbs = QLabel(self)  # the selection's place in the nested blocks
        self.crumbs.setObjectName("breadcrumbs")
        self.statusBar().addPermanentWidget(self.crumbs)
        self.run_toolbar = QToolBar("Run", self)
        self.run_toolbar.setObjectName("run_toolbar")
        self.run_toolbar.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.addToolBar(self.run_toolbar)
        for bar in (tb, self.run_toolbar):
            # What does not fit goes behind the toolbar's extension arrow (») rather than off
            # the edge; the theme's tool button padding would leave that 12 px button no room
            # for its arrow, so it gets none.
            bar.setStyleSheet("QToolButton#qt_toolbar_ext_button { padding: 0px; margin: 0px; }")

    def _fill_run_menu(self) -> None:
        """Run ▸ the run toolbar's actions (Run, Stop, Resume, Logs, Clusters…, Deploy…): the
        same QActions, so a menu item is enabled exactly when its button is and has its
        shortcut. Filled again as the menu opens, so an action a part adds later shows."""
        self.run_menu.clear()
        acts = [a for a in self.run_toolbar.actions() if not isinstance(a, QWidgetAction)]
        for a in acts:
            self.run_menu.addSeparator() if a.isSeparator() else self.run_menu.addAction(a)
        sweep = getattr(self, "sweep_ui", None)  # Sweep…, Runs Table
        if sweep is not None:
            self.run_menu.addSeparator()
            for a in sweep.actions:
                self.run_menu.addAction(a)
        self.run_menu.menuAction().setVisible(any(not a.isSeparator() for a in self.run_menu.actions()))

    def _fill_recent(self) -> None:
        """Filled again whenever the list changes (a disabled menu never shows, so never
        gets aboutToShow): after every open and save."""
        self.recent_menu.clear()
        files = self.settings.recent_files()
        for path in files:
            act = self.recent_menu.addAction(Path(path).name, lambda p=path: self.open_project(p))
            act.setToolTip(path)
            act.setStatusTip(path)
            act.setEnabled(Path(path).exists())
        if files:
            self.recent_menu.addSeparator()
            self.recent_menu.addAction("Clear List", self._clear_recent)
        self.recent_menu.setEnabled(bool(files))

    def _clear_recent(self) -> None:
        self.settings.clear_recent()
        self._fill_recent()

    def _fill_examples(self) -> None:
        """File ▸ Examples: every bundled example, by its project's name and what it shows;
        each opens as the user's own copy (_example_copy)."""
        from engine.runs.history import INSTALLED_EXAMPLES

        self.examples_menu.clear()
        for path in sorted(INSTALLED_EXAMPLES.glob(f"*{SUFFIX}")):
            try:
                p = load_project(path)
                title, tip = p.name or path.stem, (p.description or "").strip().splitlines()
            except (ProjectError, OSError):
                continue
            act = self.examples_menu.addAction(f"{title}  ({path.name})", lambda p=path: self.open_project(p))
            act.setToolTip(tip[0] if tip else str(path))
            act.setStatusTip(tip[0] if tip else str(path))
        self.examples_menu.setEnabled(not self.examples_menu.isEmpty())

    # ----- wiring -------------------------------------------------------------
    def _wire(self) -> None:
        c = self.controller
        c.status.connect(lambda msg: self.statusBar().showMessage(msg, 10000))
        c.compiled.connect(self._on_compiled)
        c.plan_changed.connect(lambda _info: self.scene.set_plan(c.plan))  # the automatic pipeline cut, coloured
        c.placement_changed.connect(self._update_devices)
        c.stack.cleanChanged.connect(self._update_title)
        c.stack.indexChanged.connect(self._update_title)
        self.scene.selectionChanged.connect(self._on_selection)
        self.scene.selectionChanged.connect(self._update_crumbs)
        self.scene.collapsed_changed.connect(self._mark_modified)  # saved with the diagram, not an undo step
        self.view.add_requested.connect(self._add_from_view)
        self.view.viewport_moved.connect(lambda: self.zoom_label.setText(f"{self.view.zoom() * 100:.0f}%"))
        self.palette.add_requested.connect(lambda t: c.add_node(t, self.view.visible_scene_rect().center()))
        self.inspector.param_edited.connect(c.set_param)
        self.inspector.placement_edited.connect(lambda n, k, v: c.set_placement([n], k, v))
        self.inspector.rename_requested.connect(c.rename)
        self.problems.node_clicked.connect(self.select_and_show)
        self.devices.mesh_edited.connect(c.set_mesh)
        self.devices.assign_requested.connect(lambda s: c.set_placement(self.scene.selected_ids(), "stage", s))
        self.devices.tp_requested.connect(self._set_tp)

    def _add_from_view(self, layer_type: str, pos) -> None:
        """A drop, a Tab search, or a wire dropped on empty canvas (then connect it)."""
        c = self.controller
        pending, self.view.pending_port = self.view.pending_port, None
        from engine.diagram.graph import ports_of

        if pending is None:
            selected = self.scene.selected_ids()
            if not (self.view.search.picking and len(selected) == 1):
                c.add_node(layer_type, pos)
                return
            # Tab with one node selected: the new layer follows it, wired to its first output
            src = self.project.graph.nodes[selected[0]]
            outs = ports_of(src.type, src.params)[1]
            if not outs:
                c.add_node(layer_type, pos)
                return
            pending = (selected[0], outs[0], False)
        node, port, is_input = pending
        c.stack.beginMacro(f"Add {layer_type} and connect")
        nid = c.add_node(layer_type, pos)
        if nid is not None:
            ins, outs = ports_of(layer_type, self.project.graph.nodes[nid].params)
            if is_input and outs:
                c.connect_ports(nid, outs[0], node, port)
            elif not is_input and ins:
                c.connect_ports(node, port, nid, ins[0])
        c.stack.endMacro()

    def _set_tp(self, style) -> None:
        """The style for the selected nodes; a selected block passes it on to what it holds."""
        msg = self.controller.set_tp(self.scene.selected_ids(), style)
        if msg:
            self.statusBar().showMessage(msg, 10000)

    def _on_graph_event(self, ev) -> None:
        nid = self.inspector.node_id
        if ev.kind == "reset" or (ev.kind == "node_removed" and ev.node == nid):
            self.inspector.show_node(self.project.graph, None)
        elif ev.kind == "node_renamed" and ev.old == nid:
            self.inspector.show_node(self.project.graph, ev.new, self.controller.result)
        elif ev.node == nid and ev.kind in ("param_changed", "placement_changed"):
            self.inspector.refresh_values()
        if ev.kind in ("placement_changed", "node_added", "node_removed", "node_renamed", "reset"):
            self._update_devices()
        if ev.kind in ("direction_changed", "reset"):  # (undo too)
            self.actions["top_down"].setChecked(self.project.graph.direction == "TB")
        if ev.kind == "collapsed_changed":  # saved with the diagram; an undo step or not
            self._mark_modified()

    def _on_compiled(self, result) -> None:
        errors, warnings = self.controller.problems()  # the compiler's and the placement's
        self.problems.set_problems(errors, warnings)
        self.summary.set_result(self.project.graph, result, self.project.training.batch_size)
        self.summary.set_devices(self.controller.plan_info[1])
        self.inspector.set_result(result)
        self._update_devices()
        # every row counts (a warning is a problem too): "Problems (4)"; the list's header says
        # how many are errors and how many warnings
        self.problems_dock.setWindowTitle(self.problems.title())
        self.problems_dock.setToolTip(self.problems.summary())

    def _on_selection(self) -> None:
        ids = self.scene.selected_ids()
        if len(ids) == 1:
            if self.inspector.node_id != ids[0]:
                self.inspector.show_node(self.project.graph, ids[0], self.controller.result)
        elif self.inspector.node_id is not None:
            self.inspector.show_node(self.project.graph, None)
        self._update_devices()

    def _update_devices(self) -> None:
        self.devices.set_state(self.project.placement, self.project.graph.nodes, self.scene.selected_ids(),
                               self.controller.plan_info[2])

    def select_and_show(self, node_id: str) -> None:
        """Select a node (or a block) and bring it into view, expanding what holds it."""
        if node_id not in self.scene.node_items and node_id not in self.scene.group_items:
            return
        self.controller.reveal(node_id)
        if node_id in self.scene.node_items:
            self.scene.select_nodes([node_id])
            item = self.scene.node_items[node_id]
        else:
            item = self.scene.group_items[node_id]
            self.scene.clearSelection()
            item.setSelected(bool(item.flags() & item.GraphicsItemFlag.ItemIsSelectable))
        if self.view.zoom() < self.view.READABLE:
            self.view.set_zoom(self.view.READABLE)
        self.view.centerOn(item.sceneBoundingRect().center())

    def find(self) -> None:
        """Ctrl+F: the find box, its list filled with every node and block name."""
        from engine.diagram.graph import block_name

        names = sorted(self.project.graph.nodes) + sorted(self.project.graph.blocks(), key=block_name)
        self._find_model.setStringList(names)
        self.find_box.setFocus()
        self.find_box.selectAll()

    def _found(self, text: str = "") -> None:
        from engine.diagram.graph import block_name

        text = (text or self.find_box.text()).strip()
        g = self.project.graph
        blocks = {block_name(b): b for b in g.blocks()} | {b: b for b in g.blocks()}  # a full path wins
        target = text if text in g.nodes else blocks.get(text)
        if target is None:
            hits = [n for n in g.nodes if text.lower() in n.lower()]
            target = hits[0] if len(hits) == 1 else None
        if target is None:
            self.statusBar().showMessage(f"No node or block named '{text}'", 5000)
            return
        self.select_and_show(target)

    def _update_crumbs(self) -> None:
        """Where the selection sits in the nested blocks: model › layer3 › layer3.1."""
        from engine.diagram.graph import block_name, block_path

        ids = self.scene.selected_ids()
        groups = self.scene.selected_groups()
        where = self.project.graph.nodes[ids[0]].group if len(ids) == 1 else (groups[0] if len(groups) == 1 else None)
        parts = [self.project.name or "diagram", *(block_name(b) for b in block_path(where))]
        if len(ids) == 1:
            parts.append(ids[0])
        self.crumbs.setText("  ›  ".join(parts))

    def _paste_pos(self) -> QPointF | None:
        vp = self.view.viewport().mapFromGlobal(self.view.cursor().pos())
        return self.view.mapToScene(vp) if self.view.viewport().rect().contains(vp) else None

    def _toggle_snap(self, on: bool) -> None:
        self.scene.snap = on

    # ----- editing dialogs ----------------------------------------------------
    def rename_selected(self) -> None:
        ids = self.scene.selected_ids()
        if len(ids) != 1:
            self.statusBar().showMessage("Select one node to rename", 5000)
            return
        name, ok = QInputDialog.getText(self, "Rename node", "New name:", text=ids[0])
        if ok and name.strip():
            self.controller.rename(ids[0], name.strip())

    def group_selected(self) -> None:
        if not self.scene.selected_ids():
            self.statusBar().showMessage("Select the nodes to group first", 5000)
            return
        from engine.diagram.editing import fresh_id

        default = fresh_id("block", {n.group for n in self.project.graph.nodes.values() if n.group})
        name, ok = QInputDialog.getText(self, "Group into block", "Block name:", text=default)
        if ok and name.strip():
            self.controller.group_selected(name.strip())

    def _mark_modified(self, *_) -> None:
        """A change that is saved but is no undo step (recovered content, a block shown
        folded or collapsed by a script, the project's cluster). "Modified" has one
        source, the undo stack's clean state: such a change leaves it (resetClean), so
        the title, the close question and is_dirty agree until the next save."""
        self.controller.stack.resetClean()
        self._update_title()

    def toggle_collapse(self) -> None:
        groups = self.scene.selected_groups()
        if not groups:
            self.statusBar().showMessage("Select (a node of) a block to collapse or expand it", 5000)
        for g in groups:
            self.scene.toggle_collapsed(g)

    def toggle_fold(self) -> None:
        groups = self.scene.selected_groups()
        if not any(self.controller.toggle_fold(g) for g in groups[:1]):
            self.statusBar().showMessage("Select a block of a run of identical blocks (layer3.1 … layer3.5) to fold "
                                         "or unfold it", 5000)

    def set_top_down(self, on: bool) -> None:
        """Data flows top down (or left to right): laid out again, one undo step, shown
        whole; the choice is remembered for new projects and imports."""
        direction = "TB" if on else "LR"
        self.settings.set_value("direction", direction)
        if direction != self.project.graph.direction:
            self.controller.set_direction(direction)
            self.controller.flush()
            self.view.frame_readable()

    def auto_layout(self) -> None:
        """Lay the whole diagram out, then show all of it."""
        self.controller.auto_layout()
        self.controller.flush()
        self.view.fit()

    def repeat_selected(self) -> None:
        groups = {self.project.graph.nodes[n].group for n in self.scene.selected_ids()} - {None}
        if len(groups) != 1:
            self.statusBar().showMessage("Select (a node of) one block to repeat", 5000)
            return
        times, ok = QInputDialog.getInt(self, "Repeat block", "Blocks in the stack, this one included:", 2, 2, 128)
        if ok:
            self.controller.repeat_block(groups.pop(), times)

    def show_shortcuts(self):
        """Help ▸ Keyboard Shortcuts: read from the actions themselves (app/help_ui.py)."""
        from app.help_ui import ShortcutsDialog

        self.shortcuts_dialog = ShortcutsDialog(self)
        self.shortcuts_dialog.show()
        return self.shortcuts_dialog

    def show_getting_started(self):
        from app.help_ui import GettingStartedDialog

        self.getting_started_dialog = GettingStartedDialog(self)
        self.getting_started_dialog.show()
        return self.getting_started_dialog

    def about(self) -> None:
        QMessageBox.about(self, "About Layerflow", "<b>Layerflow</b><br>Draw a network, place it on devices, train it.")

    # ----- files --------------------------------------------------------------
    def ask(self, kind: str, title: str, text: str, buttons, default):
        """Every question the window asks goes through here (tests replace it)."""
        box = QMessageBox(QMessageBox.Warning if kind == "warning" else QMessageBox.Question, title, text, buttons, self)
        for which, label in getattr(self, "_button_texts", {}).items():
            if box.button(which) is not None:
                box.button(which).setText(label)
        box.setDefaultButton(default)
        return box.exec()

    def is_dirty(self) -> bool:
        return not self.controller.stack.isClean()

    def _update_title(self, *_) -> None:
        p = self.project
        name = p.path.name if p.path else f"{p.name} (unsaved)"
        self.setWindowTitle(f"{name}[*] — Layerflow")
        self.setWindowModified(self.is_dirty())

    def set_project(self, project: Project) -> None:
        self.project.graph.unsubscribe(self._on_graph_event)
        self.controller.set_project(project)  # (a new, clean undo stack)
        self._after_project_set()
        self.project_changed.emit()

    def _after_project_set(self) -> None:
        self.project.graph.subscribe(self._on_graph_event)
        self.actions["top_down"].setChecked(self.project.graph.direction == "TB")
        self.inspector.show_node(self.project.graph, None)
        self._on_compiled(self.controller.result)
        self._update_title()
        # nothing of the previous project is left on show: its find text, its names, its crumbs
        self.find_box.clear()
        self._find_model.setStringList([])
        self._update_crumbs()
        QTimer.singleShot(0, self.view.frame_readable)  # names readable from the first look

    def maybe_save(self) -> bool:
        """True when it is fine to drop the current project."""
        if not self.is_dirty():
            return True
        B = QMessageBox.StandardButton
        r = self.ask("warning", "Unsaved changes", f"Save the changes to {self.project.name}?",
                     B.Save | B.Discard | B.Cancel, B.Save)
        if r == B.Save:
            return self.save()
        return r == B.Discard

    def new_project(self) -> None:
        if self.maybe_save():
            project = Project()
            project.graph.direction = self.preferred_direction()
            self.set_project(project)
            self.statusBar().showMessage(f"New project: {project.name} (unsaved)", 8000)

    def preferred_direction(self) -> str:
        """The way data flowed in the diagram the user last chose one for ("LR", "TB")."""
        d = self.settings.value("direction", "LR")
        return d if d in ("LR", "TB") else "LR"

    def open_project(self, path: str | os.PathLike | None = None) -> bool:
        if not self.maybe_save():
            return False
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Open project", str(self.file_folder()),
                                                  f"Layerflow projects (*{SUFFIX});;All files (*)")
            if not path:
                return False
        note = ""
        try:
            path, note = self._example_copy(Path(path))
            project = load_project(path)
        except (ProjectError, OSError) as exc:
            self.statusBar().showMessage(str(exc).splitlines()[0], 15000)
            B = QMessageBox.StandardButton
            self.ask("warning", "Cannot open project", str(exc), B.Ok, B.Ok)
            return False
        self.ask_trust(project)
        self.set_project(project)
        self.settings.add_recent(path)
        self._fill_recent()
        self.statusBar().showMessage(note or f"Opened {path}", 8000)
        return True

    @staticmethod
    def _example_copy(path: Path) -> tuple[Path, str]:
        """A bundled example opens as the user's own copy (saves and runs never touch the
        installed package): made in their projects folder the first time, reopened after."""
        from engine.runs.history import INSTALLED_EXAMPLES, user_projects_home

        if path.resolve().parent != INSTALLED_EXAMPLES:
            return path, ""
        copy = user_projects_home() / "examples" / path.name
        if copy.exists():
            return copy, f"Opened your copy of the example {path.name}: {copy}"
        from engine.project import atomic_write

        atomic_write(copy, path.read_bytes())
        return copy, f"The example {path.name} is copied to {copy}: edit, save and run it there"

    def ask_trust(self, project: Project) -> bool:
        """A project that names its own Python code (Custom layers) runs it only if the user
        trusts it; asked once per project and set of imports (engine/trust.py)."""
        from engine import trust

        paths = trust.needs_consent(project)
        if not paths or project.path is None:
            return True
        if not trust.is_trusted(project.path, paths):
            B = QMessageBox.StandardButton
            code, files = trust.split(paths)
            text = ""
            if code:
                text += ("It imports and runs Python code of its own when it is compiled, trained or exported:\n\n"
                         + "\n".join(f"    {p}" for p in code) + "\n\n")
            if files:
                text += ("It reads files outside its folder when it trains:\n\n"
                         + "\n".join(f"    {p}" for p in files) + "\n\n")
            r = self.ask("warning", "Trust this project?",
                         f"{project.path.name} asks for more than a diagram.\n\n{text}Trust it only if you know "
                         "where it comes from. No: it opens with those layers marked 'not checked', and nothing of "
                         "it runs or is read.",
                         B.Yes | B.No, B.No)
            if r != B.Yes:
                trust.refuse(paths)
                self.statusBar().showMessage(f"Opened without trusting it ({len(paths)} item(s) not trusted)", 10000)
                return False
            trust.trust(project.path, paths)
        trust.allow_in_process(paths)
        return True

    def file_folder(self) -> Path:
        """Where the Open and Save dialogs start: the project's folder; for a project with no
        file yet the folder of the last project opened or saved, else the user's projects
        folder (~/Layerflow) when there is one, else their home; never the folder Layerflow
        was started from (its install folder, often)."""
        if self.project.path is not None:
            return self.project.path.parent
        last = self.settings.last_project()
        if last and Path(last).parent.is_dir():
            return Path(last).parent
        from engine.runs.history import user_projects_home

        mine = user_projects_home()
        return mine if mine.is_dir() else Path.home()

    def save(self) -> bool:
        if self.project.path is None:
            return self.save_as()
        return self._write(self.project.path)

    def save_as(self, path: str | os.PathLike | None = None) -> bool:
        if path is None:
            start = str(self.project.path or (self.file_folder() / f"{self.project.name}{SUFFIX}"))
            path, _ = QFileDialog.getSaveFileName(self, "Save project", start, f"Layerflow projects (*{SUFFIX})")
            if not path:
                return False
            if not path.endswith(SUFFIX):
                path += SUFFIX
        path = Path(path)
        old_stem = self.project.path.name[: -len(SUFFIX)] if self.project.path else None
        if self.project.name in ("untitled", "", old_stem):  # the project takes its file's name
            self.project.name = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.stem
        return self._write(path)

    def _write(self, path: Path) -> bool:
        self.controller.flush()
        try:
            save_project(self.project, path)
        except (OSError, ProjectError) as exc:
            if CHANGED_ON_DISK in str(exc):
                return self._changed_on_disk(path)
            B = QMessageBox.StandardButton
            self.ask("warning", "Cannot save", f"{path}: {exc}", B.Ok, B.Ok)
            return False
        self.controller.stack.setClean()
        self.settings.add_recent(path)
        self._fill_recent()
        self._remove_autosave()
        self._update_title()
        self.statusBar().showMessage(f"Saved {path}", 5000)
        return True

    def _changed_on_disk(self, path: Path) -> bool:
        """The file was saved by someone else (a command, another window) since this window
        read it, so writing it would lose their edit: Reload (theirs, dropping this window's
        edits once confirmed), Save As… (this window's, under another name) or Cancel."""
        B = QMessageBox.StandardButton
        with self.button_texts({B.Reset: "Reload", B.Save: "Save As…"}):
            r = self.ask("warning", "Project changed on disk",
                         f"{path.name} changed on disk since it was opened here (another command or window saved "
                         f"it). Saving now would lose that edit.\n\nReload: open the file as it is on disk (the "
                         f"changes made in this window are discarded).\nSave As…: keep this window's version "
                         f"under another name.\nCancel: do nothing now.",
                         B.Reset | B.Save | B.Cancel, B.Cancel)
        if r == B.Save:
            return self.save_as()
        if r == B.Reset:
            if self.is_dirty():
                with self.button_texts({B.Discard: "Discard and Reload"}):
                    sure = self.ask("warning", "Discard changes and reload",
                                    f"Discard the changes made in this window and load {path.name} as it is on disk?",
                                    B.Discard | B.Cancel, B.Cancel)
                if sure != B.Discard:
                    return False
            self.reload(path)
        return False  # nothing of this window was written

    def reload(self, path: Path) -> bool:
        """Load `path` again as it is on disk, in place of what the window shows."""
        try:
            project = load_project(path)
        except (ProjectError, OSError) as exc:
            B = QMessageBox.StandardButton
            self.ask("warning", "Cannot reload", str(exc), B.Ok, B.Ok)
            return False
        self.ask_trust(project)
        self.set_project(project)
        self._remove_autosave()
        self.statusBar().showMessage(f"Reloaded {path} as it is on disk", 8000)
        return True

    @contextlib.contextmanager
    def button_texts(self, texts: dict):
        """The next questions (ask) show these texts on their standard buttons."""
        old, self._button_texts = getattr(self, "_button_texts", {}), texts
        try:
            yield
        finally:
            self._button_texts = old

    # ----- autosave and recovery ----------------------------------------------
    def _autosave_paths(self, key: str | None = None) -> tuple[Path, Path]:
        d = self.settings.autosave_dir
        key = key or self._autosave_key
        return d / f"{key}{SUFFIX}", d / f"{key}.json"

    def autosave_now(self) -> Path | None:
        """Write unsaved work beside the settings (never over the project file)."""
        if not self.is_dirty():
            return None
        from engine.project import atomic_write

        data, meta = self._autosave_paths()
        atomic_write(data, self.project.dumps().encode())
        atomic_write(meta, json.dumps({"pid": os.getpid(), "path": str(self.project.path or ""),
                                       "name": self.project.name, "time": time.time()}).encode())
        return data

    def _remove_autosave(self) -> None:
        for p in self._autosave_paths():
            p.unlink(missing_ok=True)

    def recoverable(self) -> list[tuple[Path, dict]]:
        """Autosaves left by Layerflow processes that are gone (crashed), newest first."""
        found = []
        for meta in self.settings.autosave_dir.glob("*.json"):
            try:
                info = json.loads(meta.read_text())
                pid = int(info["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            data = meta.with_suffix(SUFFIX)
            if data.exists() and not pid_alive(pid):
                found.append((data, info))
        return sorted(found, key=lambda x: -float(x[1].get("time", 0)))

    def offer_recovery(self) -> bool:
        B = QMessageBox.StandardButton
        for data, info in self.recoverable():
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(info.get("time", 0))))
            what = info.get("path") or info.get("name") or "an unsaved project"
            r = self.ask("question", "Recover unsaved work",
                         f"Layerflow did not shut down cleanly. Recover the unsaved changes to {what} from {when}?",
                         B.Yes | B.No, B.Yes)
            if r == B.Yes:
                try:
                    project = load_project(data)
                except ProjectError as exc:
                    self.statusBar().showMessage(f"cannot recover: {exc}", 15000)
                    continue
                project.path = Path(info["path"]) if info.get("path") else None
                self.set_project(project)
                self._mark_modified()
                # The autosave becomes this window's own: kept until the work is saved, so a
                # second crash before that still finds it (and no other window offers it now).
                from engine.project import atomic_write

                mine, mine_meta = self._autosave_paths()
                os.replace(data, mine)
                atomic_write(mine_meta, json.dumps({**info, "pid": os.getpid(), "time": time.time()}).encode())
                data.with_suffix(".json").unlink(missing_ok=True)
                self.statusBar().showMessage(f"Recovered unsaved changes to {what}", 10000)
                return True
            data.unlink(missing_ok=True)
            data.with_suffix(".json").unlink(missing_ok=True)
        return False

    # ----- theme --------------------------------------------------------------
    def apply_theme(self, name: str) -> None:
        name = name if name in ("light", "dark") else "light"
        app = QApplication.instance()
        t = scene_theme(name)
        if app.property("layerflow_theme") != name:  # restyling every widget is slow: once per switch
            self._style_app(app, name)
        # the app's style is shared: every open editor window follows
        for w in [self] + [w for w in app.topLevelWidgets() if isinstance(w, EditorWindow) and w is not self]:
            w.scene.set_theme(t)
            w.devices.set_theme(t)
            w.view.viewport().update()
            w.view.minimap._timer.start()
            w.actions[f"theme_{name}"].setChecked(True)
            w.theme_name = name
        if name != self.settings.theme():
            self.settings.set_theme(name)
        self.theme_name = name

    @staticmethod
    def _style_app(app, name: str) -> None:
        app.setStyle("Fusion")
        pal = QPalette()
        if name == "dark":
            for role, col in ((QPalette.Window, "#23262d"), (QPalette.WindowText, "#e6e9ef"), (QPalette.Base, "#1b1e23"),
                              (QPalette.AlternateBase, "#262a31"), (QPalette.Text, "#e6e9ef"), (QPalette.Button, "#2d3139"),
                              (QPalette.ButtonText, "#e6e9ef"), (QPalette.Highlight, "#3b82c4"),
                              (QPalette.HighlightedText, "#ffffff"), (QPalette.ToolTipBase, "#2b3038"),
                              (QPalette.ToolTipText, "#e6e9ef"), (QPalette.PlaceholderText, "#7d8797"),
                              (QPalette.Mid, "#3a404b"), (QPalette.Dark, "#15171b")):
                pal.setColor(role, QColor(col))
            for role in (QPalette.WindowText, QPalette.Text, QPalette.ButtonText):
                pal.setColor(QPalette.Disabled, role, QColor("#6b7280"))
        else:
            pal = app.style().standardPalette()
            pal.setColor(QPalette.Highlight, QColor("#3b82c4"))
        app.setPalette(pal)
        qss = RESOURCES / "themes" / f"{name}.qss"
        app.setStyleSheet(qss.read_text() if qss.exists() else "")
        app.setProperty("layerflow_theme", name)

    # ----- closing ------------------------------------------------------------
    def closeEvent(self, e) -> None:
        if not self.maybe_save():
            e.ignore()
            return
        self.settings.set_value("geometry", self.saveGeometry())
        self.workspaces.save()  # each workspace keeps its own arrangement
        self._autosave_timer.stop()
        self._remove_autosave()
        self.sweep_ui.shutdown()  # a sweep's runs stop with the window (they would, their parent gone)
        self.project.graph.unsubscribe(self._on_graph_event)
        try:
            self.scene.selectionChanged.disconnect(self._on_selection)
        except (RuntimeError, TypeError):  # closed twice
            pass
        e.accept()
