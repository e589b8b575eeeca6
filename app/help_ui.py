"""Help ▸ Keyboard Shortcuts and Help ▸ Getting Started.

The shortcuts table is read from the window's own QActions (its menus, toolbars and
window-level actions) each time it opens, so it lists what the keys do now: an action
that gains, loses or changes a shortcut shows so with no list to keep up to date.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLineEdit,
    QMenu,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QToolBar,
    QVBoxLayout,
    QWidget,
    QWidgetAction,
)


def _plain(text: str) -> str:
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&")


def _menu_actions(menu: QMenu, path: str):
    for a in menu.actions():
        if a.isSeparator():
            continue
        if a.menu() is not None and a.menu().property("lf_file_list"):
            continue
        if a.menu() is not None:
            yield from _menu_actions(a.menu(), f"{path} ▸ {_plain(a.text())}")
        else:
            yield path, a


def shortcut_rows(window) -> list[tuple[str, str, str]]:
    """(where, action, keys): every command of `window`'s menus, in menu order ("Run ▸ Run";
    keys "" where it has none, so the list is also where a command is found), then the
    toolbar and window actions no menu shows that have a shortcut. Lists of files (Open
    Recent, Examples: menus with the property lf_file_list) are not commands."""
    from shiboken6 import getCppPointer

    rows: list[tuple[str, str, str]] = []
    seen: set[int] = set()

    def add(where: str, a: QAction, always: bool = False) -> None:
        key = getCppPointer(a)[0]  # (two Python wrappers of one action may differ)
        if key in seen or isinstance(a, QWidgetAction) or a.isSeparator():
            return
        keys = [k.toString(QKeySequence.NativeText) for k in a.shortcuts() if not k.isEmpty()]
        if keys or always:
            seen.add(key)
            rows.append((where, _plain(a.text()), ", ".join(keys)))

    for top in window.menuBar().actions():
        if top.menu() is not None and top.isVisible():
            for where, a in _menu_actions(top.menu(), _plain(top.text())):
                add(where, a, always=a.isVisible())
    for tb in window.findChildren(QToolBar):
        for a in tb.actions():
            add(f"{tb.windowTitle()} toolbar", a)
    for a in QWidget.actions(window):  # (the editor's `actions` is its dict of named actions)
        add("window", a)
    return rows


class ShortcutsDialog(QDialog):
    def __init__(self, window):
        super().__init__(window)
        self.setWindowTitle("Keyboard shortcuts")
        self.resize(560, 620)
        lay = QVBoxLayout(self)
        self.filter = QLineEdit(placeholderText="Filter (action, menu or key)…")
        self.filter.setClearButtonEnabled(True)
        self.filter.textChanged.connect(self._filter)
        lay.addWidget(self.filter)
        rows = shortcut_rows(window)
        self.table = QTableWidget(len(rows), 3)
        self.table.setHorizontalHeaderLabels(["Action", "Keys", "Where"])
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 8)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setAlternatingRowColors(True)
        for r, (where, text, keys) in enumerate(rows):
            for c, v in enumerate((text, keys, where)):
                self.table.setItem(r, c, QTableWidgetItem(v))
        h = self.table.horizontalHeader()
        h.setSectionResizeMode(0, QHeaderView.Stretch)
        h.setSectionResizeMode(1, QHeaderView.ResizeToContents)
        h.setSectionResizeMode(2, QHeaderView.ResizeToContents)
        lay.addWidget(self.table, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)

    def rows(self) -> list[tuple[str, str, str]]:
        """(action, keys, where) of the rows shown (the filter applied)."""
        return [tuple(self.table.item(r, c).text() for c in range(3)) for r in range(self.table.rowCount())
                if not self.table.isRowHidden(r)]

    def _filter(self, text: str) -> None:
        t = text.strip().lower()
        for r in range(self.table.rowCount()):
            row = " ".join(self.table.item(r, c).text().lower() for c in range(3))
            self.table.setRowHidden(r, bool(t) and t not in row)


def _keys_of(action) -> str:
    """" (F5)": the action's shortcut as the page shows it; "" when it has none."""
    if action is None or action.shortcut().isEmpty():
        return ""
    return f" ({action.shortcut().toString(QKeySequence.NativeText)})"


def getting_started_html(window) -> str:
    """Five steps from an empty diagram to a deployed model, in the window's own words
    (menu paths and the shortcuts the actions have now)."""
    named = window.actions if isinstance(getattr(window, "actions", None), dict) else {}

    def k(name: str) -> str:
        return _keys_of(named.get(name))

    run = getattr(getattr(window, "run_ui", None), "toolbar", None)
    f5 = _keys_of(getattr(run, "run_action", None))
    logs = _keys_of(getattr(run, "logs_action", None))
    return f"""
<h2>Getting started with Layerflow</h2>
<p>Layerflow turns a diagram into a trained model: draw it, give it data, train it here or
on a cluster, export it.</p>
<h3>1. Design</h3>
<p>Drag layers from the <b>Layers</b> panel onto the canvas, or press <b>Tab</b> on the canvas and
type a name (with a node selected, the new layer is wired to it). Drag from an output port to an
input port to connect them. Select a node to edit its parameters in the <b>Inspector</b>.
<b>Problems</b> lists what does not compile yet; click a row to go to its node.
Useful: <b>View ▸ Auto-Layout</b>{k('layout')}, <b>View ▸ Find Node or Block</b>{k('find')},
<b>Edit ▸ Group into Block</b>{k('group')}.</p>
<h3>2. Data</h3>
<p>In the <b>Data</b> panel pick a folder or file (images, tokens, arrays) or a synthetic set.
It shows what the data holds and checks it against the diagram's Input and Output; the
<b>Training</b> panel sets the batch size, steps and optimizer.</p>
<h3>3. Train</h3>
<p>Choose how many processes on the Run toolbar (the <b>Devices</b> panel shows the same
layout: pipeline × data × tensor parallel), then <b>Run ▸ Run</b>{f5}. The <b>Dashboard</b>
plots the loss and metrics while it trains; <b>Run ▸ Stop</b> saves a checkpoint,
<b>Run ▸ Resume</b> continues from it, <b>Run ▸ Logs</b>{logs} shows every rank's log. Past runs are
in the <b>Runs</b> panel.</p>
<h3>4. Export</h3>
<p><b>File ▸ Export ONNX…</b> and <b>File ▸ Export PyTorch Script…</b> write the model; the command line
does the same (<code>python main.py export PROJECT</code>).</p>
<h3>5. Deploy</h3>
<p>Add a GPU cluster in <b>Run ▸ Clusters…</b> (SSH or Slurm), then <b>Run ▸ Deploy…</b> sends the
project there; the <b>Remote jobs</b> panel follows it and fetches the results.</p>
<p>Every key: <b>Help ▸ Keyboard Shortcuts</b>{k('shortcuts')}.</p>
"""


class GettingStartedDialog(QDialog):
    def __init__(self, window):
        super().__init__(window)
        self.setWindowTitle("Getting started")
        self.resize(620, 640)
        lay = QVBoxLayout(self)
        self.text = QTextBrowser()
        self.text.setOpenExternalLinks(True)
        self.text.setHtml(getting_started_html(window))
        lay.addWidget(self.text, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        self.setAttribute(Qt.WA_DeleteOnClose, False)
