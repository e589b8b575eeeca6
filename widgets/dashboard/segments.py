"""`Segments`: the lean graphics item that draws a curve while it is an envelope.

What buffers.py's `envelope_parts` computes (one segment per pixel column, in view
coordinates) goes straight into a QLineF array here and is drawn with one
QPainter.drawLines; a wide pen is drawn as copies of 1-pixel lines (`set_columns`).
The dashboard (widget.py) gives each series one, shown while the plots follow
their data.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui

from widgets.dashboard.buffers import pairs as _pairs


class Segments(pg.GraphicsObject):
    """Line segments in view coordinates, drawn with one QPainter.drawLines: what a
    curve shows while it is an envelope. A PlotDataItem costs pyqtgraph about 0.5 ms
    per curve and update for the same picture (its setData, its bounds computed twice
    more over the data, its path bookkeeping); this holds the segments and their
    bounds and nothing else."""

    def __init__(self, pen: QtGui.QPen):
        super().__init__()
        self.pen = pen
        self._lines = pg.Qt.internals.PrimitiveArray(QtCore.QLineF, 4)
        self._rect = QtCore.QRectF()
        self._n = 0

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """The lines drawn, as x, y in pairs of points."""
        m = self._lines.ndarray()[:self._n]
        return _pairs(m[:, 0], m[:, 1], m[:, 2], m[:, 3])

    def clear(self) -> None:
        empty = np.empty(0)
        self.set_columns(empty, empty, empty, empty)

    def set_columns(self, x0: np.ndarray, y0: np.ndarray, x1: np.ndarray, y1: np.ndarray,
                    width: int = 1, px: float = 0.0, py: float = 0.0) -> None:
        """The segments from (x0, y0) to (x1, y1). With `width` > 1, drawn by a
        1-pixel pen as a `width`-pixel pen draws them (px, py: a pixel's size in
        view units): `width` copies, each one pixel to the right of
        the one before, made longer by (width - 1) / 2 pixels at both ends. Written
        straight into the QLineF array that is drawn."""
        k = len(x0)
        if width > 1 and k:
            half = (width - 1) / 2 * py
            grow = np.where(y1 >= y0, half, -half)
            y0, y1 = y0 - grow, y1 + grow
        else:
            width = 1
        self._n = k * width
        self._lines.resize(self._n)
        m = self._lines.ndarray()
        for i in range(width):
            block = m[i * k:(i + 1) * k]
            if i:
                np.add(x0, i * px, out=block[:, 0])
                np.add(x1, i * px, out=block[:, 2])
            else:
                block[:, 0], block[:, 2] = x0, x1
            block[:, 1], block[:, 3] = y0, y1
        self.prepareGeometryChange()
        if k:
            xs, ys = m[:self._n, 0::2], m[:self._n, 1::2]
            left, top = float(xs.min()), float(ys.min())
            self._rect = QtCore.QRectF(left, top, float(xs.max()) - left, float(ys.max()) - top)
        else:
            self._rect = QtCore.QRectF()
        self.informViewBoundsChanged()
        self.update()

    def count(self) -> int:
        """How many lines it draws."""
        return self._n

    def boundingRect(self) -> QtCore.QRectF:
        return self._rect

    def dataBounds(self, ax: int, frac: float = 1.0, orthoRange=None):
        if not self._n:
            return None, None
        r = self._rect
        return (r.left(), r.right()) if ax == 0 else (r.top(), r.bottom())

    def paint(self, p, *args) -> None:
        if self._n:
            p.setPen(self.pen)
            p.drawLines(*self._lines.drawargs())
