"""What the dashboard marks on its plots beside the curves: a compiled run's first compile
(a dashed line on the throughput plot, its seconds in the bar) and each rank's peak
memory at the run's end (a marker per rank). A part of Dashboard (widget.py), which it
is mixed into.
"""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt

from widgets.dashboard.fit import fit_legend


class Marks:
    """Dashboard's marks (a mixin)."""

    def _show_compiles(self) -> None:
        """Each run's first compile: its seconds in the bar's label and a dashed line on
        the throughput plot where the steps began (the compile is not a step's time)."""
        pi = self.plots["throughput"].getPlotItem()
        for run in self._runs.values():
            if not run.compile_dirty or run.compiled is None:
                continue
            run.compile_dirty = False
            seconds, step, t = run.compiled
            if run.compile_line is None:
                run.compile_line = pg.InfiniteLine(angle=90, movable=False,
                                                   pen=pg.mkPen(run.color, width=1, style=Qt.DashLine),
                                                   label=f"compiled {seconds:.1f} s",
                                                   labelOpts={"position": 0.9, "color": run.color})
                run.compile_line.setToolTip(f"{run.label}: the first compile took {seconds:.2f} s")
                pi.addItem(run.compile_line, ignoreBounds=True)
            run.compile_line.setPos(step if self._x_mode == "step" else t)
            run.compile_line.setVisible(run.visible)
        self._compile_text()

    def _compile_text(self) -> None:
        runs = [r for r in self._runs.values() if r.compiled is not None and r.visible]
        if not runs:
            self.compile_label.setVisible(False)
            return
        many = len(self._runs) > 1
        self.compile_label.setText("compile " + ", ".join(
            (f"{r.short} " if many else "") + f"{r.compiled[0]:.1f} s" for r in runs))
        self.compile_label.setVisible(True)

    def compile_seconds(self, key: str) -> float | None:
        """The run's first compile time, as shown (None: it compiled nothing)."""
        c = self._runs[key].compiled
        return c[0] if c else None

    def set_peak_memory(self, key: str, peaks: list[float]) -> None:
        """The peak memory each rank reached over the whole run (a multi-process run
        writes it at the end): one marker per rank at the run's last step."""
        run = self._runs[key]
        pi = self.plots["memory"].getPlotItem()
        if run.peaks is not None:
            pi.removeItem(run.peaks)
        x_end = run.t_last if self._x_mode == "time" else max(
            (s.step.a[s.step.n - 1] for s in run.series.values() if s.step.n), default=0.0)
        symbols = ["o", "s", "t", "d", "+", "x", "star", "p"]
        spots = [{"pos": (x_end, float(v)), "symbol": symbols[r % len(symbols)], "data": r,
                  "brush": pg.mkBrush(run.color), "pen": pg.mkPen(run.color), "size": 9}
                 for r, v in enumerate(peaks)]
        run.peaks = pg.ScatterPlotItem(spots=spots, name=f"{run.short}: peak per rank" if len(self._runs) > 1
                                       else "peak per rank (o rank 0, □ rank 1, …)")
        run.peaks.setToolTip("\n".join(f"rank {r}: {v:.1f} MB" for r, v in enumerate(peaks)))
        run.peaks.setVisible(run.visible)
        pi.addItem(run.peaks)
        fit_legend(pi)
        run.peak_values = [float(v) for v in peaks]
        self._fit(["memory"])
