"""The canvas: a QGraphicsView over NodeScene with zoom, pan, rubber band,
grid, a minimap, palette drops and Tab search-to-add.

The whole diagram is fitted again after every change of its layout (a new direction
and its undo: the scene's layout_changed); the minimap sits in a corner of the canvas
that no card covers, and is hidden while every corner holds one."""
from __future__ import annotations

import math

from PySide6.QtCore import QEvent, QLineF, QPointF, QRect, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QFrame, QGraphicsView

from widgets.minimap import Minimap
from widgets.node_scene import GRID, NodeScene
from widgets.palette import LAYER_MIME
from widgets.search_popup import SearchPopup

MIN_ZOOM, MAX_ZOOM = 0.05, 3.0


class NodeView(QGraphicsView):
    add_requested = Signal(str, QPointF)  # layer type, scene position
    viewport_moved = Signal()

    def __init__(self, scene: NodeScene, parent=None):
        super().__init__(scene, parent)
        self.setRenderHints(QPainter.Antialiasing | QPainter.TextAntialiasing)
        self.setDragMode(QGraphicsView.RubberBandDrag)
        self.setRubberBandSelectionMode(Qt.IntersectsItemShape)
        self.setTransformationAnchor(QGraphicsView.AnchorUnderMouse)
        self.setViewportUpdateMode(QGraphicsView.SmartViewportUpdate)
        # every item sets the pen/brush/hints it uses, so Qt need not save and restore them
        self.setOptimizationFlags(QGraphicsView.DontSavePainterState)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setFrameShape(QFrame.NoFrame)
        self.setAcceptDrops(True)
        self.setFocusPolicy(Qt.StrongFocus)
        self._pan_from: QPointF | None = None
        self._space = False
        self.search = SearchPopup(self)
        self.search.chosen.connect(self._search_chosen)
        self._search_pos = QPointF()
        self.pending_port: tuple[str, str, bool] | None = None  # a port dragged onto empty canvas
        scene.port_released_on_empty.connect(self._port_dropped)
        self.minimap = Minimap(self)
        self.horizontalScrollBar().valueChanged.connect(self.viewport_moved)
        self.verticalScrollBar().valueChanged.connect(self.viewport_moved)
        self.viewport_moved.connect(self.place_minimap)
        scene.changed.connect(self._minimap_due)
        self._refit_due = False
        scene.layout_changed.connect(self._layout_changed)

    # ----- after a new layout -----------------------------------------------------
    def _layout_changed(self) -> None:
        """The diagram was laid out again (a new direction, or its undo): fit it, once
        the events of the change are through (the edges and blocks follow at its end)."""
        if not self._refit_due:
            self._refit_due = True
            QTimer.singleShot(0, self, self._refit)

    def _refit(self) -> None:
        self._refit_due = False
        if self.scene() is not None:
            self.frame_readable()

    # ----- the minimap: clear of the nodes ------------------------------------------
    MINIMAP_MARGIN = 12

    def minimap_corners(self) -> list[QRect]:
        """Where the minimap may sit, in the order tried: bottom right, top right,
        bottom left, top left (viewport pixels)."""
        w, h, m = self.viewport().width(), self.viewport().height(), self.MINIMAP_MARGIN
        mw, mh = self.minimap.width(), self.minimap.height()
        return [QRect(x, y, mw, mh) for x, y in ((w - mw - m, h - mh - m), (w - mw - m, m), (m, h - mh - m), (m, m))]

    def cards_under(self, rect: QRect) -> list:
        """The cards (nodes, collapsed blocks) shown under a rectangle of the viewport."""
        from widgets.node_scene import GroupItem, NodeItem

        area = self.mapToScene(rect.adjusted(-4, -4, 4, 4)).boundingRect()
        out = []
        for it in self.scene().items(area, Qt.IntersectsItemBoundingRect):
            if not it.isVisible():
                continue
            card = it.body() if isinstance(it, NodeItem) else \
                it.mapRectToScene(it._rect) if isinstance(it, GroupItem) and it.collapsed else None
            if card is not None and card.intersects(area):
                out.append(it)
        return out

    def _minimap_due(self, *_) -> None:
        if not getattr(self, "_minimap_pending", False):
            self._minimap_pending = True
            QTimer.singleShot(0, self, self.place_minimap)

    def place_minimap(self) -> None:
        """The minimap in the first corner no card is under; hidden while there is none."""
        self._minimap_pending = False
        if self.scene() is None:
            return
        for corner in self.minimap_corners():
            if not self.cards_under(corner):
                if self.minimap.pos() != corner.topLeft():
                    self.minimap.move(corner.topLeft())
                self.minimap.set_covering(False)
                return
        self.minimap.set_covering(True)

    # ----- geometry -----------------------------------------------------------
    def zoom(self) -> float:
        return self.transform().m11()

    def set_zoom(self, z: float, anchor: QPointF | None = None) -> None:
        z = max(MIN_ZOOM, min(MAX_ZOOM, z))
        f = z / self.zoom()
        if anchor is None:
            self.setTransformationAnchor(QGraphicsView.AnchorViewCenter)
        self.scale(f, f)
        self.setTransformationAnchor(QGraphicsView.AnchorUnderMouse)
        self.scene().set_detail_for_zoom(self.zoom())
        self.viewport_moved.emit()

    def visible_scene_rect(self) -> QRectF:
        return self.mapToScene(self.viewport().rect()).boundingRect()

    READABLE = 0.6  # the zoom where node names can be read at their own size
    FIT_READABLE = 0.2  # down to here names are drawn at a fixed screen size over their cards

    def frame_readable(self, zoom: float | None = None) -> None:
        """Fit the diagram, names readable (drawn at a fixed size when far out); a diagram
        too long for that is shown from its start (its left end, or its top when it flows
        top down) at a readable zoom instead (the minimap still shows the whole)."""
        self.fit()
        if zoom is None and self.zoom() >= self.FIT_READABLE:
            return
        self.set_zoom(zoom or self.READABLE)
        items = self.scene().itemsBoundingRect()
        vis = self.visible_scene_rect()
        if self.scene().top_down:
            self.centerOn(QPointF(items.center().x(), items.top() - 30 + vis.height() / 2))
        else:
            self.centerOn(QPointF(items.left() - 30 + vis.width() / 2, items.center().y()))
        self.viewport_moved.emit()

    def fit(self, rect: QRectF | None = None) -> None:
        """Fit the whole diagram (or rect), never zooming in past 100%."""
        r = rect if rect is not None else self.scene().itemsBoundingRect()
        if r.isNull():
            r = QRectF(-200, -150, 400, 300)
        r = r.adjusted(-40, -40, 40, 40)
        self.fitInView(r, Qt.KeepAspectRatio)
        if self.zoom() > 1.0:
            self.set_zoom(1.0)
            self.centerOn(r.center())
        elif self.zoom() < MIN_ZOOM:
            self.set_zoom(MIN_ZOOM)
            self.centerOn(r.center())
        self.scene().set_detail_for_zoom(self.zoom())
        self.viewport_moved.emit()

    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        self.place_minimap()

    # ----- painting -----------------------------------------------------------
    def drawBackground(self, p: QPainter, rect: QRectF) -> None:
        t = self.scene().theme
        p.fillRect(rect, QColor(t.background))
        step = GRID
        while step * self.zoom() < 12:  # keep the grid from turning into a grey fill
            step *= 5
        left = math.floor(rect.left() / step) * step
        top = math.floor(rect.top() / step) * step
        minor, major = [], []  # one drawLines call per pen, not one call per line
        x = left
        while x < rect.right():
            (major if round(x / step) % 5 == 0 else minor).append(QLineF(x, rect.top(), x, rect.bottom()))
            x += step
        y = top
        while y < rect.bottom():
            (major if round(y / step) % 5 == 0 else minor).append(QLineF(rect.left(), y, rect.right(), y))
            y += step
        p.setRenderHint(QPainter.Antialiasing, False)
        p.setPen(QPen(QColor(t.grid_minor), 0))
        p.drawLines(minor)
        p.setPen(QPen(QColor(t.grid_major), 0))
        p.drawLines(major)

    # ----- zoom and pan -------------------------------------------------------
    def wheelEvent(self, e) -> None:
        steps = e.angleDelta().y() / 120.0
        if steps:
            self.set_zoom(self.zoom() * (1.15 ** steps), anchor=e.position())
        e.accept()

    def mousePressEvent(self, e) -> None:
        if e.button() == Qt.MiddleButton or (e.button() == Qt.LeftButton and self._space):
            self._pan_from = e.position()
            self.viewport().setCursor(Qt.ClosedHandCursor)
            e.accept()
            return
        self.search.hide()
        super().mousePressEvent(e)

    def mouseMoveEvent(self, e) -> None:
        if self._pan_from is not None:
            d = e.position() - self._pan_from
            self._pan_from = e.position()
            self.horizontalScrollBar().setValue(self.horizontalScrollBar().value() - round(d.x()))
            self.verticalScrollBar().setValue(self.verticalScrollBar().value() - round(d.y()))
            e.accept()
            return
        super().mouseMoveEvent(e)

    def mouseReleaseEvent(self, e) -> None:
        if self._pan_from is not None:
            self._pan_from = None
            self.viewport().unsetCursor()
            e.accept()
            return
        super().mouseReleaseEvent(e)

    # ----- keys ---------------------------------------------------------------
    def event(self, e) -> bool:
        # Tab would move the focus to the next widget; on the canvas it opens search
        if e.type() == QEvent.KeyPress and e.key() == Qt.Key_Tab:
            self.open_search()
            return True
        return super().event(e)

    def _port_dropped(self, node: str, port: str, is_input: bool, pos: QPointF) -> None:
        """A wire dropped on empty canvas: pick the layer to put there, connected."""
        from widgets.node_scene import BODY_TOP, NODE_W, ROW_H

        self.pending_port = (node, port, is_input)
        self._search_pos = QPointF(pos.x() - (NODE_W if is_input else 0), pos.y() - BODY_TOP - ROW_H / 2)
        self.search.open_at(self.viewport().mapTo(self, self.mapFromScene(pos)))

    def open_search(self) -> None:
        self.pending_port = None
        vp = self.viewport().mapFromGlobal(self.cursor().pos())
        if not self.viewport().rect().contains(vp):
            vp = self.viewport().rect().center()
        self._search_pos = self.mapToScene(vp)
        self.search.open_at(self.viewport().mapTo(self, vp))

    def _search_chosen(self, layer_type: str) -> None:
        self.add_requested.emit(layer_type, self._search_pos)

    def keyPressEvent(self, e) -> None:
        if e.key() == Qt.Key_Space and not e.isAutoRepeat():
            self._space = True
            self.setDragMode(QGraphicsView.NoDrag)
            self.viewport().setCursor(Qt.OpenHandCursor)
            e.accept()
            return
        super().keyPressEvent(e)

    def keyReleaseEvent(self, e) -> None:
        if e.key() == Qt.Key_Space and not e.isAutoRepeat():
            self._space = False
            self.setDragMode(QGraphicsView.RubberBandDrag)
            self.viewport().unsetCursor()
            e.accept()
            return
        super().keyReleaseEvent(e)

    # ----- palette drops ------------------------------------------------------
    def dragEnterEvent(self, e) -> None:
        if e.mimeData().hasFormat(LAYER_MIME):
            e.acceptProposedAction()
        else:
            super().dragEnterEvent(e)

    def dragMoveEvent(self, e) -> None:
        if e.mimeData().hasFormat(LAYER_MIME):
            e.acceptProposedAction()
        else:
            super().dragMoveEvent(e)

    def dropEvent(self, e) -> None:
        if e.mimeData().hasFormat(LAYER_MIME):
            t = bytes(e.mimeData().data(LAYER_MIME)).decode()
            self.add_requested.emit(t, self.mapToScene(e.position().toPoint()))
            e.acceptProposedAction()
        else:
            super().dropEvent(e)
