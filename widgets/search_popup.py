"""Tab on the canvas: a small search box at the cursor; Enter adds the layer there."""
from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import QFrame, QLineEdit, QListWidget, QListWidgetItem, QVBoxLayout

from engine.diagram.catalog import CATALOG
from widgets.palette import ranked


class SearchPopup(QFrame):
    chosen = Signal(str)  # layer type
    picking = False  # True while `chosen` is emitted: the layer being added comes from this search

    def __init__(self, parent):
        super().__init__(parent)
        self.setObjectName("SearchPopup")
        self.setFrameShape(QFrame.StyledPanel)
        self.edit = QLineEdit(placeholderText="Add layer…")
        self.list = QListWidget()
        self.list.setMaximumHeight(220)
        self.list.setFocusPolicy(Qt.NoFocus)  # clicks keep the focus in the search box
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.setSpacing(2)
        lay.addWidget(self.edit)
        lay.addWidget(self.list)
        self.resize(240, 260)
        self.edit.textChanged.connect(self._fill)
        self.edit.installEventFilter(self)
        self.list.itemActivated.connect(self._pick)
        self.list.itemClicked.connect(self._pick)
        self.hide()

    def open_at(self, pos) -> None:
        self.edit.clear()
        self._fill("")
        x = min(max(0, pos.x()), max(0, self.parent().width() - self.width()))
        y = min(max(0, pos.y()), max(0, self.parent().height() - self.height()))
        self.move(x, y)
        self.show()
        self.raise_()
        self.edit.setFocus()

    def _fill(self, text: str) -> None:
        self.list.clear()
        for t in ranked(text):
            it = QListWidgetItem(f"{t}  ·  {CATALOG[t].category}")
            it.setData(Qt.UserRole, t)
            it.setToolTip(CATALOG[t].doc)
            self.list.addItem(it)
        self.list.setCurrentRow(0)

    def _pick(self, item) -> None:
        t = item.data(Qt.UserRole)
        self.hide()
        self.parent().setFocus()
        self.picking = True
        try:
            self.chosen.emit(t)
        finally:
            self.picking = False

    def eventFilter(self, obj, ev):  # keys typed in the line edit steer the list
        if ev.type() == QEvent.KeyPress:
            k = ev.key()
            if k in (Qt.Key_Down, Qt.Key_Up):
                row = self.list.currentRow() + (1 if k == Qt.Key_Down else -1)
                self.list.setCurrentRow(max(0, min(self.list.count() - 1, row)))
                return True
            if k in (Qt.Key_Return, Qt.Key_Enter):
                if self.list.currentItem() is not None:
                    self._pick(self.list.currentItem())
                return True
            if k == Qt.Key_Escape:
                self.hide()
                self.parent().setFocus()
                return True
        if ev.type() == QEvent.FocusOut and not self.list.hasFocus():
            self.hide()
        return False
