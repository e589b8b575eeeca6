"""The layer palette: the catalog by category, a search box, drag onto the canvas.

Dragging carries the layer type in LAYER_MIME; the canvas (NodeView) accepts it.
Double-click or Enter asks to add the layer at the centre of the canvas.
"""
from __future__ import annotations

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtWidgets import QAbstractItemView, QLineEdit, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from engine.diagram.catalog import CATALOG

LAYER_MIME = "application/x-layerflow-layer"


def layer_mime(layer_type: str) -> QMimeData:
    m = QMimeData()
    m.setData(LAYER_MIME, layer_type.encode())
    m.setText(layer_type)
    return m


def matches(layer_type: str, text: str) -> bool:
    spec = CATALOG[layer_type]
    text = text.strip().lower()
    return not text or text in layer_type.lower() or text in spec.category.lower() or text in spec.doc.lower()


def ranked(text: str) -> list[str]:
    """Layer types matching `text`, best first: name prefix, name, category/doc."""
    t = text.strip().lower()
    hits = [k for k in CATALOG if matches(k, t)]
    return sorted(hits, key=lambda k: (not k.lower().startswith(t), t not in k.lower(), k.lower()))


class _Tree(QTreeWidget):
    def mimeData(self, items):  # noqa: N802 (Qt override)
        types = [i.data(0, Qt.UserRole) for i in items if i.data(0, Qt.UserRole)]
        return layer_mime(types[0]) if types else QMimeData()

    def mimeTypes(self):  # noqa: N802
        return [LAYER_MIME]


class LayerPalette(QWidget):
    add_requested = Signal(str)  # layer type

    def __init__(self, parent=None):
        super().__init__(parent)
        self.search = QLineEdit(placeholderText="Search layers…")
        self.search.setClearButtonEnabled(True)
        self.tree = _Tree()
        self.tree.setHeaderHidden(True)
        self.tree.setDragEnabled(True)
        self.tree.setDragDropMode(QAbstractItemView.DragOnly)
        self.tree.setRootIsDecorated(True)
        self.tree.setIndentation(12)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.search)
        lay.addWidget(self.tree)
        self.items: dict[str, QTreeWidgetItem] = {}
        cats: dict[str, QTreeWidgetItem] = {}
        for t, spec in CATALOG.items():
            cat = cats.get(spec.category)
            if cat is None:
                cat = cats[spec.category] = QTreeWidgetItem(self.tree, [spec.category])
                cat.setFlags(Qt.ItemIsEnabled)
                f = cat.font(0)
                f.setBold(True)
                cat.setFont(0, f)
            item = QTreeWidgetItem(cat, [t])
            item.setData(0, Qt.UserRole, t)
            item.setToolTip(0, f"<b>{t}</b><br>{spec.doc}")
            item.setFlags(Qt.ItemIsEnabled | Qt.ItemIsSelectable | Qt.ItemIsDragEnabled)
            self.items[t] = item
        self.tree.expandAll()
        self.search.textChanged.connect(self.filter)
        self.search.returnPressed.connect(self._add_first)
        self.tree.itemActivated.connect(lambda it, col: it.data(0, Qt.UserRole) and self.add_requested.emit(it.data(0, Qt.UserRole)))

    def filter(self, text: str) -> None:
        for i in range(self.tree.topLevelItemCount()):
            cat = self.tree.topLevelItem(i)
            shown = 0
            for j in range(cat.childCount()):
                ch = cat.child(j)
                ok = matches(ch.data(0, Qt.UserRole), text)
                ch.setHidden(not ok)
                shown += ok
            cat.setHidden(shown == 0)

    def visible_types(self) -> list[str]:
        return [t for t, it in self.items.items() if not it.isHidden() and not it.parent().isHidden()]

    def _add_first(self) -> None:
        vis = ranked(self.search.text())
        if vis:
            self.add_requested.emit(vis[0])
