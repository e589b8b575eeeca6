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

    def set_rows(self, rows: list[dict], settings: list[str], metric: str) -> None:
        pi = self.plotItem
        for item in [*self.lines.values(), *self.labels]:
            pi.removeItem(item)
        self.lines, self.labels, self.best_path = {}, [], None
        rows = [r for r in rows if r.get("path")]
        self.columns = [*settings, metric]
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
            for p, text in ticks[:12]:
                t = pg.TextItem(text, color=(120, 120, 120), anchor=(0, 0.5))
                t.setPos(x + 0.03, p)
                pi.addItem(t)
                self.labels.append(t)
        ax = pi.getAxis("bottom")
        ax.setTicks([[(i, c) for i, c in enumerate(self.columns)]])
        pi.setXRange(-0.2, len(self.columns) - 0.5, padding=0)
        pi.setYRange(-0.08, 1.08, padding=0)
