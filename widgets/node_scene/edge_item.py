"""An edge on the canvas (EdgeItem): a curve from an output port to an input port,
labelled with the tensor's shape and the communication the plan puts on it.

Its ends come from the scene (scene.edge_ends: a port, or the card of a collapsed
block that holds the port), and so do the cards it must not run under
(scene.cards_between).

`self.scene()` is always the NodeScene of scene.py, which imports this module; it
is not imported back (the package has no import cycle), so the scene is typed here
as a plain QGraphicsScene.
"""
from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QFontMetricsF, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QGraphicsItem, QGraphicsPathItem, QGraphicsScene

from engine.diagram.graph import Edge
from widgets.node_scene.geometry import LOD_DETAIL, wire_path
from widgets.node_scene.painting import NO_BRUSH, SMALL_FONT


class EdgeItem(QGraphicsPathItem):
    """A curve from an output port to an input port with the tensor shape as label."""

    def __init__(self, edge: Edge, scene: QGraphicsScene):
        super().__init__()
        self.edge = edge
        self.setFlags(QGraphicsItem.ItemIsSelectable)
        self.setZValue(0)
        self.label = ""
        self.note = ""  # communication inserted by the plan
        self._label_rect = QRectF()
        self._brect = QRectF()
        self._hover = False
        self.setAcceptHoverEvents(True)
        scene.addItem(self)
        self.update_path()

    def hoverEnterEvent(self, e) -> None:
        self._hover = True
        self.setZValue(1.5)  # the label above the nodes while pointed at
        self.update()

    def hoverLeaveEvent(self, e) -> None:
        self._hover = False
        self.setZValue(1.5 if self.note else 0)
        self.update()

    def update_path(self) -> None:
        scene = self.scene()
        a, b = scene.edge_ends(self.edge)
        self.setPath(wire_path(a, b, scene.top_down, scene.cards_between(self.edge, a, b)))
        self._update_label_rect()

    def set_label(self, label: str, note: str = "") -> None:
        if (label, note) != (self.label, self.note):
            self.label, self.note = label, note
            self.setToolTip("\n".join(t for t in (label, note) if t))
            self.setZValue(1.5 if note else 0)
            self._update_label_rect()
            self.update()

    def label_fits(self) -> bool:
        """A shape label wider than the gap between two close nodes would sit on
        them: then it shows only on hover/selection (and always as the tooltip).
        Communication notes always show, above the nodes."""
        a, b = self.path().elementAt(0), self.path().elementAt(self.path().elementCount() - 1)
        if self.scene() is not None and self.scene().top_down:
            return bool(self.note) or b.y - a.y >= self._label_rect.height() + 16
        return bool(self.note) or b.x - a.x >= self._label_rect.width() + 16

    def _update_label_rect(self) -> None:
        self.prepareGeometryChange()
        text = self.label if not self.note else f"{self.label}\n{self.note}"
        if not text:
            self._label_rect = QRectF()
            self._brect = self.path().controlPointRect().adjusted(-3, -3, 3, 3)
            return
        fm = QFontMetricsF(SMALL_FONT)
        lines = text.split("\n")
        w = max(fm.horizontalAdvance(s) for s in lines) + 10
        h = fm.height() * len(lines) + 4
        mid = self.path().pointAtPercent(0.5)
        self._label_rect = QRectF(mid.x() - w / 2, mid.y() - h / 2, w, h)
        self._brect = self.path().controlPointRect().adjusted(-3, -3, 3, 3).united(self._label_rect)

    def boundingRect(self) -> QRectF:
        return self._brect

    def setPath(self, path: QPainterPath) -> None:  # (Qt API)
        super().setPath(path)
        self._brect = path.controlPointRect().adjusted(-3, -3, 3, 3).united(self._label_rect)

    def shape(self) -> QPainterPath:
        from PySide6.QtGui import QPainterPathStroker

        s = QPainterPathStroker()
        s.setWidth(10)
        return s.createStroke(self.path())

    def paint(self, p: QPainter, opt, widget=None) -> None:
        t = self.scene().theme
        lod = opt.levelOfDetailFromTransform(p.worldTransform())
        p.setRenderHint(QPainter.Antialiasing, lod >= LOD_DETAIL)
        sel = self.isSelected()
        color = QColor(t.edge_selected if sel else (t.comm_text if self.note else t.edge))
        p.setPen(QPen(color, 2.4 if sel else 1.6))
        p.setBrush(NO_BRUSH)
        p.drawPath(self.path())
        if self._label_rect.isNull() or lod < 0.5 or not (sel or self._hover or self.label_fits()):
            return
        p.setPen(QPen(QColor(t.node_border), 0.8))
        p.setBrush(QColor(t.label_bg))
        p.drawRoundedRect(self._label_rect, 4, 4)
        p.setFont(SMALL_FONT)
        fm = QFontMetricsF(SMALL_FONT)
        r = QRectF(self._label_rect.x(), self._label_rect.y() + 2, self._label_rect.width(), fm.height())
        p.setPen(QColor(t.label_text))
        p.drawText(r, Qt.AlignCenter, self.label)
        if self.note:
            p.setPen(QColor(t.comm_text))
            p.drawText(r.translated(0, fm.height()), Qt.AlignCenter, self.note)
