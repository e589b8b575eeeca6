"""`ConfusionMatrixWidget`: a classification run's confusion matrix as a heat map.

Rows are true classes, columns predicted ones; each cell is coloured by its share of
its row (rare classes read as clearly as common ones) and, up to MAX_LABELLED
classes and while its cells are big enough for the numbers, shows its count. The
matrix is scaled to the widget, every column in view (100 classes too): the axes
label every k-th class, k as small as the labels' width allows. The dashboard
(widget.py) puts one beside its plots.
"""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui

from widgets.dashboard.fit import keep_fitted, set_title


class ConfusionMatrixWidget(pg.PlotWidget):
    """Counts of (true class, predicted class) as a heat map with the numbers on it."""

    MAX_LABELLED = 16  # above this many classes, cell numbers would not fit

    def __init__(self, background=None, foreground=None, parent=None):
        super().__init__(parent, background=background)
        self._fg = foreground if foreground is not None else QtGui.QColor("black")
        pi = self.getPlotItem()
        set_title(pi, "Confusion matrix (validation)", self._fg)
        keep_fitted(pi)
        pi.setLabel("left", "true class")
        pi.setLabel("bottom", "predicted class")
        self._labels: list[str] = []
        pi.vb.sigResized.connect(self._fit_cells)
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
            set_title(pi, title, self._fg)
        if matrix is None:  # the note alone, centred in the whole plot and wrapped to it: no axes
            self.matrix = None
            self.image.clear()
            self.image.setVisible(False)
            self.empty.setVisible(True)
            self.empty.setPos(0.5, 0.5)
            pi.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
            for ax in ("left", "bottom"):
                pi.getAxis(ax).setTicks(None)
                pi.hideAxis(ax)
            self._fit_empty()
            return
        for ax in ("left", "bottom"):
            pi.showAxis(ax)
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
        self._labels = [str(x) for x in (labels if labels is not None else range(n))]
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
        self._fit_cells()

    def cell_size(self) -> tuple[float, float]:
        """A cell's width and height on the screen, in pixels."""
        if self.matrix is None:
            return 0.0, 0.0
        r = self.getPlotItem().vb.viewRect()
        size = self.getPlotItem().vb.size()
        return size.width() / max(r.width(), 1e-9), size.height() / max(r.height(), 1e-9)

    def tick_step(self, axis: str) -> int:
        """Every how many classes an axis has a label, so that the labels do not run together."""
        if self.matrix is None:
            return 1
        n = self.matrix.shape[0]
        cw, ch = self.cell_size()
        fm = QtGui.QFontMetricsF(self.getPlotItem().getAxis(axis).style.get("tickFont") or QtGui.QFont())
        need = (max(fm.horizontalAdvance(lb) for lb in self._labels) + 6) if axis == "bottom" else fm.height() + 2
        cell = cw if axis == "bottom" else ch
        if cell <= 0:
            return max(1, n // 12)
        step = max(1, math.ceil(need / cell))
        for nice in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000):  # labels at round classes
            if nice >= step:
                return nice
        return step

    def _fit_empty(self) -> None:
        """The note wrapped to the data area's width, so none of it is cut off."""
        w = self.getPlotItem().vb.width()
        if w > 0:
            self.empty.setTextWidth(max(40.0, w - 8))
            doc = self.empty.textItem.document()
            doc.setDefaultTextOption(QtGui.QTextOption(QtCore.Qt.AlignCenter))

    def _fit_cells(self) -> None:
        """The axes' labels and the cells' numbers as the matrix's size on screen allows."""
        if self.matrix is None:
            self._fit_empty()
            return
        pi = self.getPlotItem()
        n = self.matrix.shape[0]
        for ax in ("left", "bottom"):
            step = self.tick_step(ax)
            pi.getAxis(ax).setTicks([[(i, self._labels[i]) for i in range(0, n, step)]])
        if self._texts:
            cw, ch = self.cell_size()
            fm = QtGui.QFontMetricsF(self._texts[0].textItem.font())
            widest = max(fm.horizontalAdvance(t.toPlainText()) for t in self._texts)
            fits = cw >= widest + 2 and ch >= fm.height() * 0.9
            for t in self._texts:
                t.setVisible(fits)
