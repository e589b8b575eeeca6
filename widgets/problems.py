"""Every validation error and warning of the diagram; clicking one selects its node."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QStyle, QTreeWidget, QTreeWidgetItem


class ProblemsList(QTreeWidget):
    node_clicked = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setHeaderLabels(["", "node", "problem"])
        self.setRootIsDecorated(False)
        self.setAlternatingRowColors(True)
        self.setColumnWidth(0, 28)
        self.setColumnWidth(1, 130)
        self.setUniformRowHeights(True)
        self.itemClicked.connect(self._clicked)
        self.itemActivated.connect(self._clicked)
        self._icons = {
            "error": self.style().standardIcon(QStyle.SP_MessageBoxCritical),
            "warning": self.style().standardIcon(QStyle.SP_MessageBoxWarning),
        }

    def set_problems(self, errors, warnings) -> None:
        self.clear()
        for p in [*errors, *warnings]:
            where = p.node or ("(placement)" if getattr(p, "field", None) == "placement" else "(diagram)")
            it = QTreeWidgetItem(self, ["", where, p.message])
            it.setIcon(0, self._icons["error" if p.severity == "error" else "warning"])
            it.setData(0, Qt.UserRole, p.node)
            it.setToolTip(2, p.message)
        if not errors and not warnings:
            QTreeWidgetItem(self, ["", "", "No problems: the diagram compiles and its placement can run."])

    def messages(self) -> list[str]:
        items = [self.topLevelItem(i) for i in range(self.topLevelItemCount())]
        return [i.text(2) for i in items if i.text(1)]

    def _clicked(self, item, col=0) -> None:
        node = item.data(0, Qt.UserRole)
        if node:
            self.node_clicked.emit(node)
