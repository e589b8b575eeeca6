"""The ranges of the dashboard's plots while they follow their data (until the user pans or
zooms; the bar's Fit follows again): x shared by all plots, y per plot, each moved in
steps (`_limits`) so that axes, ticks and their cached pictures stay valid between
moves, a few plots a tick (`Following._fit`). A part of Dashboard (widget.py), which it
is mixed into.
"""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg

from widgets.dashboard.series import LOG_PLOTS, PLOTS


def _limits(current: tuple[float, float] | None, lo: float, hi: float,
            low_margin: float | None = None) -> tuple[float, float]:
    """Axis limits for data from lo to hi while the plots follow it: `current` while
    it holds the data and the data fills 70% of it or more; else new limits, each end
    2% of the span beyond the data, then out to a multiple of a 1-2-5 step of about a
    tenth of the span (the low end `low_margin` of the span below lo and not rounded,
    if given: x, which starts where the run does). So the axes of a growing series move
    every 10% of growth or so, not at every update, and between those pyqtgraph's ticks,
    labels and their pictures stay valid. Flat data: 5% of its value either side."""
    if current is not None and current[0] <= lo and hi <= current[1] \
            and hi - lo >= 0.7 * (current[1] - current[0]):
        return current
    span = hi - lo
    if span <= 1e-9 * max(abs(hi), abs(lo), 1e-300):
        pad = abs(hi) * 0.05 or 1.0
        return hi - pad, hi + pad
    raw = span / 10
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    a = lo - low_margin * span if low_margin is not None else math.floor((lo - 0.02 * span) / step) * step
    return a, math.ceil((hi + 0.02 * span) / step) * step


# Plots whose first steps are a warm-up (compiling, caches, allocator): a first step of
# 100 ms beside 3 ms ones would flatten the rest to a line. Their y range leaves out the
# first WARM_UP_STEPS values when they lie outside the others' range; those points are
# still drawn (cut at the top), and the crosshair and the tooltip give their value.
WARM_UP_PLOTS = {"step_time", "throughput"}
WARM_UP_STEPS = 2


def _warm_range(yb) -> tuple[float, float]:
    """(lo, hi) of a series without its warm-up values (all of it while it is short)."""
    v = yb.view()
    if len(v) <= 3 * WARM_UP_STEPS:
        return yb.lo, yb.hi
    rest = v[WARM_UP_STEPS:]
    finite = rest[np.isfinite(rest)]
    return (float(finite.min()), float(finite.max())) if len(finite) else (yb.lo, yb.hi)


class Following:
    """Dashboard's ranges: following the data, the log-y toggle, Fit (a mixin)."""

    def set_log_y(self, on: bool) -> None:
        self._log_y = bool(on)
        if self.log_check.isChecked() != self._log_y:
            self.log_check.setChecked(self._log_y)
        for spec in PLOTS:
            if spec.log_able:
                pi = self.plots[spec.id].getPlotItem()
                pi.setLogMode(y=self._log_y)
                self._y_lim.pop(spec.id, None)  # in other units now
                if self._follow:
                    if (move := self._y_move(spec.id)) is not None:
                        move[1]()
                else:
                    pi.vb.enableAutoRange(axis=pg.ViewBox.YAxis)

    def auto_range(self) -> None:
        """Follow the data again (the Fit button): every plot fitted to it now and
        while it grows."""
        self._follow = True
        self._x_lim, self._y_lim = None, {}
        self._refit.clear()
        self._mark_all_dirty()
        self._fit(self._all_plots())

    def _stop_following(self, *_) -> None:
        self._follow = False
        self._mark_all_dirty()

    def _fit(self, plot_ids, moves: int | None = None, x_alone: bool = False) -> bool:
        """While following: x (all plots are linked) to the data of every visible series,
        y of `plot_ids` to theirs; each set only when its _limits move. With `moves`
        (the timer's ticks), at most that many y ranges move in this call, one if x
        moves (none with `x_alone`): the others wait in _refit for the next ticks (a
        tenth of a second each; plots whose data has left the range first). Each range
        that moves lays out its axis again and repaints it, and the plots of a run
        often move together: five at once made the slowest updates. Returns whether
        x moved (a first x range, set where there was none, is not a move)."""
        if not self._follow or not (plot_ids or self._refit):
            return False
        x_moved = False
        lo, hi = math.inf, -math.inf
        for run in self._runs.values():
            if run.visible:
                for s in run.series.values():
                    xb = s.step if self._x_mode == "step" else s.time
                    lo, hi = min(lo, xb.lo), max(hi, xb.hi)
        if math.isfinite(lo) and math.isfinite(hi):
            lim = _limits(self._x_lim, lo, hi, low_margin=0.01)
            if lim != self._x_lim:
                x_moved, x_alone = self._x_lim is not None, x_alone and self._x_lim is not None
                self._x_lim = lim
                self.plots[PLOTS[0].id].getPlotItem().vb.setXRange(*lim, padding=0)
                moves = None if moves is None else min(moves, 0 if x_alone else 1)
        due = []
        for plot_id in dict.fromkeys((*plot_ids, *self._refit)):
            self._refit.discard(plot_id)
            move = self._y_move(plot_id)
            if move is not None:
                due.append((plot_id, *move))
        due.sort(key=lambda m: not m[1])  # the data outside the range first
        for i, (plot_id, _, apply) in enumerate(due):
            if moves is not None and i >= moves:
                self._refit.add(plot_id)
            else:
                apply()
        return x_moved

    def _y_move(self, plot_id: str):
        """None if plot_id's y range holds; else (whether its data has left the range,
        the function that sets the new one)."""
        lo, hi = math.inf, -math.inf
        for run in self._runs.values():
            if run.visible:
                for s in run.series.values():
                    if s.spec.plot == plot_id:
                        a, b = _warm_range(s.y) if plot_id in WARM_UP_PLOTS else (s.y.lo, s.y.hi)
                        lo, hi = min(lo, a), max(hi, b)
                if plot_id == "memory" and run.peak_values:
                    lo, hi = min(lo, *run.peak_values), max(hi, *run.peak_values)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return None
        vb = self._pw(plot_id).getPlotItem().vb
        current = self._y_lim.get(plot_id)
        if self._log_y and plot_id in LOG_PLOTS:
            if lo <= 0:  # no log of it: pyqtgraph's auto-range, over the positive values

                def auto():
                    self._y_lim[plot_id] = None
                    vb.enableAutoRange(axis=pg.ViewBox.YAxis)
                return (True, auto) if current is not None or not vb.autoRangeEnabled()[1] else None
            lo, hi = math.log10(lo), math.log10(hi)
        lim = _limits(current, lo, hi)
        if lim == current:
            return None

        def apply():
            self._y_lim[plot_id] = lim
            vb.setYRange(*lim, padding=0)
        return current is None or lo < current[0] or hi > current[1], apply
