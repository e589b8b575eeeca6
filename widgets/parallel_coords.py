"""Parallel coordinates: each run a line across one vertical axis per setting, the last
axis the chosen metric; lines coloured by the metric (good: green, bad: red), the best
run drawn thick on top. Each axis is scaled to its own range (numbers; log when they
span a factor of 100 or more, as learning rates do), text values spread evenly.
pyqtgraph, one PlotDataItem per run."""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore

from engine.runs.history import LOWER_IS_BETTER, row_value


def _axis(values: list):
    """(position in [0, 1] of each value or nan, tick labels [(pos, text)])."""
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    if nums and len(nums) == len([v for v in values if v is not None]):
        lo, hi = min(nums), max(nums)
        log = lo > 0 and hi / lo >= 100
        f = (lambda x: math.log10(x)) if log else (lambda x: x)
        a, b = f(lo), f(hi)
        span = (b - a) or 1.0
        pos = [(f(v) - a) / span if v is not None else math.nan for v in values]
        pos = [0.5 if a == b and not math.isnan(p) else p for p in pos]
        ticks = sorted({(p, f"{v:.3g}") for p, v in zip(pos, values) if v is not None})
        return pos, ticks
    cats = sorted({str(v) for v in values if v is not None})
    n = max(1, len(cats) - 1)
    where = {c: (i / n if len(cats) > 1 else 0.5) for i, c in enumerate(cats)}
    return [where[str(v)] if v is not None else math.nan for v in values], [(where[c], c) for c in cats]


def varying(rows: list[dict], settings: list[str]) -> list[str]:
    """The settings that take more than one value over `rows` (a setting that never varies
    is no axis), all of them while there are fewer than two runs."""
    if len(rows) < 2:
        return list(settings)
    return [c for c in settings if len({repr(row_value(r, c)) for r in rows}) > 1]


def short_name(column: str) -> str:
    """An axis's name without its section ("training.optimizer.lr" -> "lr")."""
    return column.rsplit(".", 1)[-1]


class ParallelCoords(pg.PlotWidget):
    """`set_rows(rows, settings, metric)`; `best_path` and `lines` (path -> curve) after."""

    run_clicked = QtCore.Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setBackground(None)
        self.plotItem.hideAxis("left")
        self.plotItem.setMouseEnabled(False, False)
        self.plotItem.hideButtons()
        self.lines: dict[str, pg.PlotDataItem] = {}
        self.labels: list[pg.TextItem] = []
        self.best_path: str | None = None
        self.columns: list[str] = []
        self.names: list[str] = []  # the axis names as shown (shortened to their room)
        self.value_labels: list[pg.TextItem] = []
        self._ticks: list[list] = []
        self.plotItem.vb.sigResized.connect(self._fit_names)

    def set_rows(self, rows: list[dict], settings: list[str], metric: str) -> None:
        pi = self.plotItem
        for item in [*self.lines.values(), *self.labels]:
            pi.removeItem(item)
        self.lines, self.labels, self.best_path = {}, [], None
        self.value_labels, self._ticks = [], []
        rows = [r for r in rows if r.get("path")]
        self.columns = [*varying(rows, settings), metric]
        if not rows or not self.columns:
            return
        cols = [[row_value(r, c) for r in rows] for c in self.columns]
        axes = [_axis(c) for c in cols]
        ys = np.array([a[0] for a in axes], dtype=float).T  # (runs, columns)
        xs = np.arange(len(self.columns), dtype=float)
        scores = [row_value(r, metric) for r in rows]
        good = [s for s in scores if isinstance(s, (int, float)) and math.isfinite(s)]
        lower = metric in LOWER_IS_BETTER
        if good:
            best_i = min(range(len(rows)), key=lambda i: (scores[i] if isinstance(scores[i], (int, float))
                                                          and math.isfinite(scores[i]) else math.inf) * (1 if lower else -1))
            self.best_path = rows[best_i]["path"]
        lo, hi = (min(good), max(good)) if good else (0.0, 1.0)
        for i, r in enumerate(rows):
            s = scores[i]
            if isinstance(s, (int, float)) and math.isfinite(s):
                t = (s - lo) / ((hi - lo) or 1.0)
                t = 1 - t if lower else t  # 1: good
                color = (int(220 * (1 - t)), int(180 * t + 40), 60, 200)
            else:
                color = (140, 140, 140, 120)
            best = r["path"] == self.best_path
            pen = pg.mkPen((255, 200, 0) if best else color, width=4 if best else 1.5)
            ok = ~np.isnan(ys[i])
            curve = pg.PlotDataItem(xs[ok], ys[i][ok], pen=pen, symbol="o", symbolSize=7 if best else 4,
                                    symbolBrush=pen.color(), symbolPen=None)
            curve.setZValue(10 if best else 1)
            curve.setToolTip(f"{r.get('run', r['path'])}\n{metric}: {s}")
            curve.setCurveClickable(True)
            curve.sigClicked.connect(lambda _c, _e=None, p=r["path"]: self.run_clicked.emit(p))
            pi.addItem(curve)
            self.lines[r["path"]] = curve
        for x, (name, (_pos, ticks)) in enumerate(zip(self.columns, axes)):
            self.labels.append(pi.addLine(x=x, pen=pg.mkPen((150, 150, 150), width=1)))
            kept = []
            for p, text in ticks:  # values at least a line apart (the nearer ones are on hover)
                if not kept or p - kept[-1][0] >= 0.09:
                    kept.append((p, text))
            for p, text in kept:
                # beside the axis on a band of the background, so lines pass under it, not through it
                t = pg.TextItem(text, color=(90, 90, 90), anchor=(0, 0.5), fill=pg.mkBrush(255, 255, 255, 200))
                t.setPos(x, p)
                t.setZValue(20)
                t.full = text
                pi.addItem(t)
                self.labels.append(t)
                self.value_labels.append((x, t))
        self.setToolTip("\n".join(self.columns))  # the full names
        pi.setXRange(-0.5, len(self.columns) - 0.5, padding=0)  # half a column's room either side: every name
        pi.setYRange(-0.08, 1.08, padding=0)
        self._fit_names()

    def column_px(self) -> float:
        """The width on screen between two axes."""
        return self.plotItem.vb.width() / max(1, len(self.columns))

    def _fit_names(self) -> None:
        """Axis names and values shortened to the room between two axes, so none runs into
        the next (the plot's tooltip has the names whole)."""
        if not self.columns:
            return
        from PySide6.QtGui import QFont, QFontMetricsF

        ax = self.plotItem.getAxis("bottom")
        fm = QFontMetricsF(ax.style.get("tickFont") or QFont())
        room = max(12.0, self.column_px() - 8)
        self.names = [fm.elidedText(short_name(c), QtCore.Qt.ElideRight, room) for c in self.columns]
        ax.setTicks([[(i, n) for i, n in enumerate(self.names)]])
        vfm = QFontMetricsF(QFont())
        for _x, t in self.value_labels:
            text = vfm.elidedText(t.full, QtCore.Qt.ElideRight, max(12.0, room - 6))
            if text != t.toPlainText():
                t.setText(text)
