"""A small overview of the whole diagram with the visible area as a rectangle.

Click or drag in it to move the view there. It paints the scene itself at a tiny
scale (a far-away scene draws cheap coloured cards, see NodeItem.paint).
"""
from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt, QTimer
from PySide6.QtGui import QColor, QPainter, QPen, QPixmap
from PySide6.QtWidgets import QWidget


class Minimap(QWidget):
    def __init__(self, view):
        super().__init__(view)
        self.view = view
        self.setFixedSize(200, 130)
        self.setCursor(Qt.PointingHandCursor)
        self._pix: QPixmap | None = None
        self._src = QRectF()  # scene rect shown
        self._timer = QTimer(self, singleShot=True, interval=150, timeout=self._render)
        view.scene().changed.connect(lambda *_: self._timer.start())
        view.viewport_moved.connect(self.update)
        view.viewport_moved.connect(self._timer.start)

    wanted = True  # the user's choice (View > Minimap)
    covering = False  # every corner of the canvas holds a card: hidden (NodeView.place_minimap)

    def setVisible(self, on: bool) -> None:
        self.wanted = on
        super().setVisible(on and not self.covering)

    def set_covering(self, covering: bool) -> None:
        """Hidden while it would cover a card, shown again (if the user wants it) once not."""
        self.covering = covering
        shown = self.wanted and not covering
        if shown != self.isVisibleTo(self.parentWidget()):
            super().setVisible(shown)

    def scene_rect(self) -> QRectF:
        r = self.view.scene().itemsBoundingRect()
        vis = self.view.visible_scene_rect()
        r = r.united(vis) if not r.isNull() else vis
        return r.adjusted(-40, -40, 40, 40)

    def _render(self) -> None:
        if self.view.scene() is None:  # the scene went away before the timer fired
            return
        self._src = self.scene_rect()
        pix = QPixmap(self.size())
        pix.fill(QColor(self.view.scene().theme.background))
        p = QPainter(pix)
        self.view.scene().render(p, QRectF(self._target()), self._src, Qt.KeepAspectRatio)
        p.end()
        self._pix = pix
        self.update()

    def _target(self) -> QRectF:
        return QRectF(4, 4, self.width() - 8, self.height() - 8)

    def _scale(self) -> tuple[float, QPointF]:
        t, s = self._target(), self._src
        if s.isNull() or s.width() == 0 or s.height() == 0:
            return 1.0, QPointF()
        k = min(t.width() / s.width(), t.height() / s.height())
        off = QPointF(t.x() + (t.width() - s.width() * k) / 2, t.y() + (t.height() - s.height() * k) / 2)
        return k, off

    def to_scene(self, p: QPointF) -> QPointF:
        k, off = self._scale()
        return QPointF((p.x() - off.x()) / k + self._src.x(), (p.y() - off.y()) / k + self._src.y())

    def paintEvent(self, e) -> None:
        if self.view.scene() is None:
            return
        if self._pix is None or self._src.isNull():
            self._render()
        p = QPainter(self)
        t = self.view.scene().theme
        p.fillRect(self.rect(), QColor(t.background))
        if self._pix is not None:
            p.drawPixmap(0, 0, self._pix)
        k, off = self._scale()
        v = self.view.visible_scene_rect()
        r = QRectF(off.x() + (v.x() - self._src.x()) * k, off.y() + (v.y() - self._src.y()) * k, v.width() * k, v.height() * k)
        p.setPen(QPen(QColor("#3b82c4"), 1.5))
        c = QColor("#3b82c4")
        c.setAlpha(40)
        p.setBrush(c)
        p.drawRect(r.intersected(QRectF(self.rect())))
        p.setPen(QPen(QColor(t.node_border), 1))
        p.setBrush(Qt.NoBrush)
        p.drawRect(QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5))

    def mousePressEvent(self, e) -> None:
        self.view.centerOn(self.to_scene(e.position()))

    def mouseMoveEvent(self, e) -> None:
        if e.buttons() & Qt.LeftButton:
            self.view.centerOn(self.to_scene(e.position()))
