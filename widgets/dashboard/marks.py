"""What the dashboard marks on its plots beside the curves: a compiled run's first compile
(a dashed line on the throughput plot, its seconds in the bar), each rank's peak memory
at the run's end (a marker per rank), and what the run's recovery did: each restart, a
preemption, a failed checkpoint, as a vertical line on the loss plot at its step,
labelled ("restart 2"), with why, the time lost and the world after it as its tooltip
and in the crosshair's readout (events.py says them). The lines live in the plot's view
coordinates, so they hold through zooming and panning; they come with the records
(live, or a run opened again) and move with the x axis (step or wall time). A part of
Dashboard (widget.py), which it is mixed into.
"""
from __future__ import annotations

import pyqtgraph as pg
from PySide6 import QtGui
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

    # ----- what recovery did -------------------------------------------------------
    MARKER_STYLES = {"restart": Qt.DashDotLine, "preempted": Qt.DashLine, "checkpoint_failed": Qt.DotLine}
    MARKER_PLOT = "loss"

    def _show_markers(self) -> None:
        """Each run's new markers drawn, and all of them placed at the x axis's x (the
        step, or the wall time)."""
        pi = self.plots[self.MARKER_PLOT].getPlotItem()
        for run in self._runs.values():
            if not run.markers_dirty:
                continue
            run.markers_dirty = False
            for i in range(len(run.marker_lines), len(run.markers)):
                run.marker_lines.append(self._marker_line(pi, run, run.markers[i], i))
            for m, line in zip(run.markers, run.marker_lines):
                line.setPos(m.step if self._x_mode == "step" else m.time)
                line.setVisible(run.visible)

    def _marker_line(self, pi, run, m, i: int) -> pg.InfiniteLine:
        """One marker: a vertical line at its x, its label near the top (staggered: markers
        close together stay readable), its text as the tooltip of both."""
        bg = QtGui.QColor(self.palette().color(QtGui.QPalette.Base))
        bg.setAlpha(200)
        line = pg.InfiniteLine(angle=90, movable=False,
                               pen=pg.mkPen(run.color, width=1.5, style=self.MARKER_STYLES.get(m.kind, Qt.DashLine)),
                               label=m.label, labelOpts={"position": 0.92 - 0.12 * (i % 3), "color": run.color,
                                                         "fill": bg, "anchors": [(0, 0.5), (0, 0.5)]})
        line.marker = m
        self._marker_tip(run, line)
        pi.addItem(line, ignoreBounds=True)  # (the ranges follow the curves, not the markers)
        return line

    def _marker_tip(self, run, line) -> None:
        """The marker's text as its tooltip, beginning with its run's name beside other runs
        (Dashboard._relabel says it again when runs come or go)."""
        tip = f"{run.label}: {line.marker.text}" if len(self._runs) > 1 else line.marker.text
        line.setToolTip(tip)
        line.label.setToolTip(tip)

    def markers(self, key: str) -> list[dict]:
        """A run's markers as drawn: {kind, label, text, step, x (where its line is), visible}."""
        run = self._runs[key]
        return [{"kind": m.kind, "label": m.label, "text": m.text, "step": m.step,
                 "x": line.value(), "visible": line.isVisible()}
                for m, line in zip(run.markers, run.marker_lines)]

    def _markers_near(self, x: float) -> list[tuple]:
        """(run, marker) of the visible runs whose line is within a few pixels of x."""
        vb = self.plots[self.MARKER_PLOT].getPlotItem().vb
        tol = 4 * abs(vb.viewPixelSize()[0]) or 0.5
        out = []
        for run in self._runs.values():
            if run.visible:
                out += [(run, line.marker) for line in run.marker_lines if abs(line.value() - x) <= tol]
        return out

    def _drop_marks(self, run) -> None:
        """The run's marks off the plots (the run removed, or replaced by its records read again)."""
        if run.peaks is not None:
            self.plots["memory"].getPlotItem().removeItem(run.peaks)
        if run.compile_line is not None:
            self.plots["throughput"].getPlotItem().removeItem(run.compile_line)
        for line in run.marker_lines:
            self.plots[self.MARKER_PLOT].getPlotItem().removeItem(line)
        run.marker_lines = []

    def _show_marks(self, run) -> None:
        """The run's marks shown or hidden with it."""
        for item in (run.peaks, run.compile_line, *run.marker_lines):
            if item is not None:
                item.setVisible(run.visible)
