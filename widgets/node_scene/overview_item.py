"""The whole diagram in one item when zoomed far out (OverviewItem): cards and
edges painted from one cached path, so that a big diagram is not a thousand Python
paint calls per frame. The scene invalidates the path when nodes or edges change.

`self.scene()` is always the NodeScene of scene.py, which imports this module; it
is not imported back (the package has no import cycle), so the scene is typed here
as a plain QGraphicsScene.
"""
from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QGraphicsItem, QGraphicsScene

from widgets.node_scene.geometry import NODE_W
from widgets.node_scene.painting import FAR_SPREAD, NO_BRUSH, draw_far_label
from widgets.style import auto_stage_color, stage_color


class OverviewItem(QGraphicsItem):
    """Far out, the whole diagram in one paint call: node cards and edges as one
    cached path. Node items stay (selectable, movable) but paint nothing, edge
    items are hidden; a thousand Python paint calls per frame would be slow."""

    def __init__(self, scene: QGraphicsScene):
        super().__init__()
        self.setZValue(-0.5)
        self.setAcceptedMouseButtons(Qt.NoButton)
        self._path: QPainterPath | None = None
        self._rect = QRectF()
        self.labels: dict[str, str | None] = {}  # node -> the name last drawn on its card (None: none)
        scene.addItem(self)

    def invalidate(self) -> None:
        if self._path is not None or self._rect.isNull():
            self.prepareGeometryChange()
        self._path = None
        self.update()

    def _build(self) -> None:
        scene = self.scene()
        path = QPainterPath()
        for e in scene.edge_items:
            gs, gd = scene._collapsed_group(e.src), scene._collapsed_group(e.dst)
            if gs is not None and gs is gd:
                continue  # inside a collapsed block
            a, b = scene.edge_ends(e)
            path.moveTo(a)
            path.lineTo(b)
        rect = path.boundingRect()
        for item in scene.node_items.values():
            rect = rect.united(item.sceneBoundingRect())
        spread = FAR_SPREAD * NODE_W + 4  # names may reach past their cards' sides (draw_far_label)
        self._path, self._rect = path, rect.adjusted(-spread, -4, spread, 4)

    def boundingRect(self) -> QRectF:
        if self._path is None:
            self._build()
        return self._rect

    def paint(self, p: QPainter, opt, widget=None) -> None:
        scene = self.scene()
        if scene.detail:
            return
        if self._path is None:
            self._build()
        t = scene.theme
        p.setRenderHint(QPainter.Antialiasing, False)
        p.setPen(QPen(QColor(t.edge), 0))  # cosmetic: one pixel at any zoom
        p.setBrush(NO_BRUSH)
        p.drawPath(self._path)
        sel = QColor(t.selected)
        lod = opt.levelOfDetailFromTransform(p.worldTransform())
        exposed = opt.exposedRect if opt.exposedRect.isValid() else self._rect
        text = QColor(t.header_text)
        for item in scene.node_items.values():
            if not item.isVisible():
                continue
            card = item.body()
            stage, auto = scene.stage_of(item.node_id)
            fill = sel if item.isSelected() else auto_stage_color(stage, t) if auto else stage_color(stage, t)
            p.fillRect(card, fill)
            if exposed.intersects(card):
                self.labels[item.node_id] = draw_far_label(p, card, item.node_id, text, lod, bg=fill)
