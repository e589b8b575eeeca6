"""`ConfusionMatrixWidget`: a classification run's confusion matrix as a heat map.

Rows are true classes, columns predicted ones; each cell is coloured by its share of
its row (rare classes read as clearly as common ones) and, up to MAX_LABELLED
classes, shows its count. The dashboard (widget.py) puts one beside its plots.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui


class ConfusionMatrixWidget(pg.PlotWidget):
    """Counts of (true class, predicted class) as a heat map with the numbers on it."""

    MAX_LABELLED = 16  # above this many classes, cell numbers would not fit

    def __init__(self, background=None, foreground=None, parent=None):
        super().__init__(parent, background=background)
        self._fg = foreground if foreground is not None else QtGui.QColor("black")
        pi = self.getPlotItem()
        pi.setTitle("<span style='font-size:10pt; font-weight:600'>Confusion matrix (validation)</span>", color=self._fg)
        pi.setLabel("left", "true class")
        pi.setLabel("bottom", "predicted class")
        for ax in ("left", "bottom"):
            pi.getAxis(ax).setPen(self._fg)
            pi.getAxis(ax).setTextPen(self._fg)
        pi.setMouseEnabled(False, False)
        pi.hideButtons()
        pi.invertY(True)
        pi.setAspectLocked(False)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.image.setColorMap(pg.colormap.get("CET-L12") if "CET-L12" in pg.colormap.listMaps() else pg.colormap.get("viridis"))
        pi.addItem(self.image)
        self._texts: list[pg.TextItem] = []
        self.empty = pg.TextItem("no confusion matrix yet:\nshown after a classification run", color=self._fg, anchor=(0.5, 0.5))
        pi.addItem(self.empty)
        self.matrix: np.ndarray | None = None
        self.set_matrix(None)

    def set_matrix(self, matrix, labels=None, title: str | None = None) -> None:
        pi = self.getPlotItem()
        for t in self._texts:
            pi.removeItem(t)
        self._texts = []
        if title:
            pi.setTitle(f"<span style='font-size:10pt; font-weight:600'>{title}</span>", color=self._fg)
        if matrix is None:
            self.matrix = None
            self.image.clear()
            self.image.setVisible(False)
            self.empty.setVisible(True)
            self.empty.setPos(0.5, 0.5)
            pi.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
            for ax in ("left", "bottom"):
                pi.getAxis(ax).setTicks(None)
            return
        m = np.asarray(matrix, dtype=np.float64)
        if m.ndim != 2 or m.shape[0] != m.shape[1]:
            raise ValueError(f"a confusion matrix must be square, got shape {m.shape}")
        n = m.shape[0]
        self.matrix = m
        self.empty.setVisible(False)
        # Colour by the row's share so rare classes read as clearly as common ones.
        rows = m.sum(axis=1, keepdims=True)
        share = np.divide(m, rows, out=np.zeros_like(m), where=rows > 0)
        self.image.setImage(share, levels=(0, 1), autoLevels=False)
        self.image.setRect(QtCore.QRectF(-0.5, -0.5, n, n))
        self.image.setVisible(True)
        labels = [str(x) for x in (labels if labels is not None else range(n))]
        step = max(1, n // 12)
        ticks = [[(i, labels[i]) for i in range(0, n, step)]]
        for ax in ("left", "bottom"):
            pi.getAxis(ax).setTicks(ticks)
        if n <= self.MAX_LABELLED:
            font = QtGui.QFont()
            font.setPointSizeF(8 if n <= 6 else 7 if n <= 12 else 6)
            for i in range(n):
                for j in range(n):
                    color = "white" if share[i, j] > 0.5 else self._fg
                    t = pg.TextItem(f"{int(m[i, j])}", color=color, anchor=(0.5, 0.5))
                    t.setFont(font)
                    t.setPos(j, i)
                    pi.addItem(t)
                    self._texts.append(t)
        pi.setRange(xRange=(-0.5, n - 0.5), yRange=(-0.5, n - 0.5), padding=0.02)
