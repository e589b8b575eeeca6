"""Every validation error and warning of the diagram; clicking one selects its node (or
the block a placement problem is told of). Long texts wrap: nothing is cut off."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import QStyle, QStyledItemDelegate, QTreeWidget, QTreeWidgetItem

TEXT = 2  # the problem's column


def _count(problems) -> int:
    """Problems as the user counts them: a block's problem once, however many of its nodes it is on."""
    said = {(p.block, p.message) for p in problems if getattr(p, "block", None)}
    return len(said) + sum(1 for p in problems if not getattr(p, "block", None))


class _Wrapped(QStyledItemDelegate):
    """Rows as tall as their wrapped text (QTreeView's word wrap keeps one line's height)."""

    def sizeHint(self, option, index) -> QSize:
        size = super().sizeHint(option, index)
        if index.column() == TEXT:
            width = max(40, self.parent().header().sectionSize(TEXT) - 10)
            r = option.fontMetrics.boundingRect(0, 0, width, 1 << 20, Qt.TextWordWrap, str(index.data() or ""))
            size.setHeight(max(size.height(), r.height() + 4))
        return size


class ProblemsList(QTreeWidget):
    node_clicked = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setHeaderLabels(["", "node", "problem"])
        self.setRootIsDecorated(False)
        self.setAlternatingRowColors(True)
        self.setColumnWidth(0, 28)
        self.setColumnWidth(1, 130)
        self.setWordWrap(True)  # a long problem takes more lines, never "..." (its full text is the tooltip too)
        self.setUniformRowHeights(False)
        self.setTextElideMode(Qt.ElideNone)
        self.setItemDelegate(_Wrapped(self))
        self.header().sectionResized.connect(lambda i, *_: i == TEXT and self.scheduleDelayedItemsLayout())
        self.itemClicked.connect(self._clicked)
        self.itemActivated.connect(self._clicked)
        self._icons = {
            "error": self.style().standardIcon(QStyle.SP_MessageBoxCritical),
            "warning": self.style().standardIcon(QStyle.SP_MessageBoxWarning),
        }

    def set_problems(self, errors, warnings) -> None:
        """One row per problem; problems that say the same of many nodes are one row
        ("53 BatchNorm2d nodes: ...") whose nodes unfold under it."""
        from engine.planning.planner import grouped

        self.clear()
        self.setRootIsDecorated(False)
        for severity, problems in (("error", errors), ("warning", warnings)):
            by_text = {p.message: p for p in problems}
            blocks = [p for p in problems if getattr(p, "block", None)]  # app/controller.py in_user_terms
            for p in {p.message: p for p in blocks}.values():  # one row per block and text; its nodes under it
                from engine.diagram.graph import block_name

                it = QTreeWidgetItem(self, ["", block_name(p.block), p.message])
                it.setData(0, Qt.UserRole, p.block)
                inner = [q.inner for q in blocks if q.message == p.message and q.inner]
                if len(inner) > 1:
                    for n in inner:
                        child = QTreeWidgetItem(it, ["", n, ""])
                        child.setData(0, Qt.UserRole, n)
                    self.setRootIsDecorated(True)
                it.setToolTip(1, f"block {p.block}" + (f" ({', '.join(inner)})" if inner else ""))
                it.setIcon(0, self._icons[severity])
                it.setToolTip(2, p.message)
            problems = [p for p in problems if not getattr(p, "block", None)]
            for text, nodes in grouped([p.message for p in problems]):
                first = by_text.get(text)  # a problem of one node keeps its own text
                if len(nodes) > 1:
                    it = QTreeWidgetItem(self, ["", f"{len(nodes)} nodes", text])
                    for n in nodes:
                        child = QTreeWidgetItem(it, ["", n, ""])
                        child.setData(0, Qt.UserRole, n)
                    it.setData(0, Qt.UserRole, None)
                    self.setRootIsDecorated(True)  # the arrow that lists them
                else:
                    p = first
                    where = (p.node if p else None) or (
                        "(placement)" if p is not None and getattr(p, "field", None) == "placement" else "(diagram)")
                    it = QTreeWidgetItem(self, ["", where, text])
                    it.setData(0, Qt.UserRole, p.node if p else None)
                it.setIcon(0, self._icons[severity])
                it.setToolTip(2, text)
        if not errors and not warnings:
            QTreeWidgetItem(self, ["", "", "No problems: the diagram compiles and its placement can run."])
        self.counts = (_count(errors), _count(warnings))
        self.setHeaderLabels(["", "node", f"problem: {self.summary()}" if errors or warnings else "problem"])

    counts = (0, 0)  # (errors, warnings) shown

    def summary(self) -> str:
        """"1 error, 3 warnings"; "" when there is none."""
        e, w = self.counts
        parts = [f"{e} error{'s' if e != 1 else ''}" if e else "", f"{w} warning{'s' if w != 1 else ''}" if w else ""]
        return ", ".join(p for p in parts if p)

    def title(self) -> str:
        """The dock's title: every problem counted, errors and warnings alike."""
        n = sum(self.counts)
        return f"Problems ({n})" if n else "Problems"

    def messages(self) -> list[str]:
        items = [self.topLevelItem(i) for i in range(self.topLevelItemCount())]
        return [i.text(2) for i in items if i.text(1)]

    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        self.scheduleDelayedItemsLayout()  # the text column's width changed: rows wrap again

    def _clicked(self, item, col=0) -> None:
        node = item.data(0, Qt.UserRole)
        if node:
            self.node_clicked.emit(node)
