"""The Changes panel: what changed since a compared version, and the merge conflicts
left in the project, each with Take ours / Take theirs."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.diff import show_value
from widgets.node_scene import DIFF_COLORS

_KIND_COLOR = {"added": "added", "removed": "removed"}


class ChangesPanel(QWidget):
    node_clicked = Signal(str)  # a change's node: select and show it
    resolve_requested = Signal(int, str)  # conflict index, "ours" | "theirs"
    step_requested = Signal(int)  # +1 next change, -1 previous

    def __init__(self, parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        self.conflict_label = QLabel()
        self.conflicts = QTreeWidget()
        self.conflicts.setHeaderLabels(["conflict", "ours", "theirs"])
        self.conflicts.setRootIsDecorated(False)
        self.conflicts.setColumnWidth(0, 360)
        self.conflicts.itemClicked.connect(self._conflict_clicked)
        row = QHBoxLayout()
        self.take_ours = QPushButton("Take &ours")
        self.take_theirs = QPushButton("Take &theirs")
        self.take_ours.clicked.connect(lambda: self._resolve("ours"))
        self.take_theirs.clicked.connect(lambda: self._resolve("theirs"))
        row.addWidget(self.take_ours)
        row.addWidget(self.take_theirs)
        row.addStretch(1)
        self.conflict_box = QWidget()
        cl = QVBoxLayout(self.conflict_box)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.addWidget(self.conflict_label)
        cl.addWidget(self.conflicts)
        cl.addLayout(row)
        lay.addWidget(self.conflict_box)

        self.header = QLabel("No comparison: Edit ▸ Compare with a file or a git revision.")
        self.header.setWordWrap(True)
        lay.addWidget(self.header)
        self.changes = QTreeWidget()
        self.changes.setHeaderLabels(["change", "node"])
        self.changes.setRootIsDecorated(False)
        self.changes.setColumnWidth(0, 520)
        self.changes.itemClicked.connect(self._change_clicked)
        self.changes.itemActivated.connect(self._change_clicked)
        lay.addWidget(self.changes, 1)
        nav = QHBoxLayout()
        self.prev_btn = QPushButton("◀ Previous")
        self.next_btn = QPushButton("Next ▶")
        self.prev_btn.setToolTip("Previous change (Shift+F8)")
        self.next_btn.setToolTip("Next change (F8)")
        self.prev_btn.clicked.connect(lambda: self.step_requested.emit(-1))
        self.next_btn.clicked.connect(lambda: self.step_requested.emit(1))
        nav.addWidget(self.prev_btn)
        nav.addWidget(self.next_btn)
        nav.addStretch(1)
        lay.addLayout(nav)
        self.set_conflicts([])
        self.set_changes(None, None)

    # ----- conflicts ------------------------------------------------------------
    def set_conflicts(self, conflicts: list[dict]) -> None:
        self.conflicts.clear()
        for i, c in enumerate(conflicts):
            it = QTreeWidgetItem(self.conflicts, [c.what, show_value(c.ours, 50), show_value(c.theirs, 50)])
            it.setData(0, Qt.UserRole, i)
            it.setToolTip(0, f"{c.where}\nbase: {show_value(c.base, 50)}")
        self.conflict_box.setVisible(bool(conflicts))
        self.conflict_label.setText(f"<b>{len(conflicts)} merge conflict(s)</b>: the project holds ours; pick a side "
                                    "for each (runs start once none is left)")
        if conflicts:
            self.conflicts.setCurrentItem(self.conflicts.topLevelItem(0))
        self._enable()

    def _enable(self) -> None:
        on = self.conflicts.currentItem() is not None
        self.take_ours.setEnabled(on)
        self.take_theirs.setEnabled(on)

    def _conflict_clicked(self, item, col=0) -> None:
        self._enable()
        where = self._conflict_node(item)
        if where:
            self.node_clicked.emit(where)

    @staticmethod
    def _conflict_node(item) -> str | None:
        tip = item.toolTip(0).split("\n", 1)[0]
        kind, _, rest = tip.partition(":")
        if kind == "node":
            return rest.split(":", 1)[0]
        if kind == "input":
            return rest.rpartition(".")[0]
        return None

    def _resolve(self, side: str) -> None:
        item = self.conflicts.currentItem()
        if item is not None:
            self.resolve_requested.emit(int(item.data(0, Qt.UserRole)), side)

    # ----- changes --------------------------------------------------------------
    def set_changes(self, label: str | None, diff) -> None:
        """`diff`: an engine.diff.ProjectDiff from the compared version to this one."""
        self.changes.clear()
        self.entries: list[str | None] = []
        if diff is None:
            self.header.setText("No comparison: Edit ▸ Compare with a file or a git revision.")
        else:
            n = len([c for c in diff.changes if c.kind != "moved"])
            self.header.setText(f"Compared with <b>{label}</b>: {n} change(s)" if n else
                                f"Compared with <b>{label}</b>: no changes")
            for c in diff.changes:
                if c.kind == "moved":
                    continue
                node = None if c.kind == "setting" else c.where.split(".", 1)[0]
                it = QTreeWidgetItem(self.changes, [c.text(), node or ""])
                color = DIFF_COLORS[_KIND_COLOR.get(c.kind, "changed")] if node else None
                if color is not None:
                    it.setForeground(1, QBrush(color))
                it.setData(0, Qt.UserRole, node)
                it.setToolTip(0, c.text())
                self.entries.append(node)
            for line in diff.consequences:
                it = QTreeWidgetItem(self.changes, [line, ""])
                it.setData(0, Qt.UserRole, None)
        has = bool(diff is not None and self.entries)
        self.prev_btn.setEnabled(has)
        self.next_btn.setEnabled(has)

    def texts(self) -> list[str]:
        return [self.changes.topLevelItem(i).text(0) for i in range(self.changes.topLevelItemCount())]

    def select_entry(self, i: int) -> None:
        self.changes.setCurrentItem(self.changes.topLevelItem(i))

    def current_entry(self) -> int:
        item = self.changes.currentItem()
        return self.changes.indexOfTopLevelItem(item) if item is not None else -1

    def _change_clicked(self, item, col=0) -> None:
        node = item.data(0, Qt.UserRole)
        if node:
            self.node_clicked.emit(node)
