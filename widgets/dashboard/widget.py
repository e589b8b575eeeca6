"""The live training dashboard: loss, accuracy, learning rate, throughput, peak memory
(the Training tab), and each rank's CPU, memory and GPU over time (the System tab).

Follows pyqtgraph's scrollingPlots example (DESIGN.md): one PlotDataItem per
(run, series), fed from growable float64 buffers (buffers.py), and setData only
from a 10 Hz QTimer for the series that changed, while the dashboard can be seen.
Each buffer keeps min/max levels as values arrive, so while the plots follow their
data a million-point series reaches its curve as one segment per pixel column
(`envelope`, drawn by segments.py's Segments: the picture of the raw series, see
tests/widgets/test_dashboard.py); zoomed in by the user, a curve gets the raw
series and pyqtgraph's clipToView and peak downsampling. A live run's new lines of
metrics.jsonl come in as read (append_data) and are parsed in a process of its own
(engine/runs/parse_worker.py) into float64 columns that the timer takes (ingest.py's
`ingest`): the GUI thread never parses a live run's JSON. Records as dicts (append,
set_records) are read here. This widget only displays.

Several runs can be overlaid: colour per run, line style per series (solid = train,
dashed with dots = validation), a checkable run list to show/hide each. Which plot
a record key feeds is series.py's; the axes and painting caches are axis.py's. The
widgets and their layout are grid.py's, the ranges while the plots follow their data
follow.py's, the compile line and peak markers marks.py's, the crosshair crosshair.py's:
parts of Dashboard, mixed into it.
The System tab's plots take the per-rank keys of engine/runtime/sysmetrics.py's
SystemTail (cpu_pct_rank0, rss_mb_rank1, ...), appended like any other records. A
compiled run's first compile time (its {"event": "compiled"} record) shows in the bar
and as a dashed line on the throughput plot, never as a step time.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui, QtWidgets
from PySide6.QtCore import Qt

from engine.runs.parse_worker import ParseWorker
from engine.runs.tail import columns, parse_jsonl

from widgets.dashboard.axis import cache_painting
from widgets.dashboard.buffers import MinMaxBuffer, ema, envelope_parts
from widgets.dashboard.crosshair import Crosshair
from widgets.dashboard.fit import fit_legend, set_legend_name
from widgets.dashboard.follow import Following
from widgets.dashboard.ingest import Run, Series, ingest
from widgets.dashboard.grid import Layout
from widgets.dashboard.marks import Marks
from widgets.dashboard.segments import Segments
from widgets.dashboard.series import LOG_PLOTS, PER_RANK, PLOTS, short_labels

# Colour per run: a palette that stays readable on light and dark backgrounds.
RUN_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
              "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
RANK_STYLES = [Qt.SolidLine, Qt.DashLine, Qt.DotLine, Qt.DashDotLine, Qt.DashDotDotLine]


class Dashboard(Layout, Following, Marks, Crosshair, QtWidgets.QWidget):
    """Plots of one or more runs' metrics, updated live."""

    UPDATE_MS = 100  # 10 updates a second
    NEW_CURVES_PER_TICK = 1  # at least, a tick; more while NEW_CURVE_BUDGET_S lasts
    NEW_CURVE_BUDGET_S = 0.02
    # More runs than this and the legends go (the run list beside the plots names the runs
    # and their colours): 50 runs made 50 entries a plot, each costing its curve 4 ms more
    # to make, and unreadable. They come back once there are this many again.
    LEGEND_RUNS = 8
    RANGE_MOVES_PER_TICK = 1  # y ranges (see _fit): each laid out again costs a repaint 1.7 ms
    COLUMNS = 4  # at most: 6 plots and the confusion matrix in two rows
    # Each plot at least this big (pixels): the columns follow the width (4 down to 1),
    # and below this height the plots scroll; a title or legend never overflows its plot.
    MIN_PLOT_W, MIN_PLOT_H = 210, 150
    SIDE_W = 130  # the run list beside the plots (shown with two runs or more)
    TITLE_H = 22
    run_visibility_changed = QtCore.Signal(str, bool)

    def __init__(self, parent=None, smoothing: float = 0.0):
        super().__init__(parent)
        self._runs: dict[str, Run] = {}
        self._legends_auto_off = False  # the legends were hidden by add_run (LEGEND_RUNS), not the user
        self._x_mode = "step"
        self._smoothing = 0.0
        self._log_y = False
        # While following (until the user pans or zooms; Fit again), the dashboard sets
        # the ranges itself, in steps (see _limits): x shared by all plots, y per plot.
        self._follow = True
        self._x_lim: tuple[float, float] | None = None
        self._y_lim: dict[str, tuple[float, float] | None] = {}
        self._refit: set[str] = set()  # plots whose y range moves at a next tick (see _fit)
        self._x_was_alone = False  # the last tick moved x and nothing else (see flush)
        self._parser: ParseWorker | None = None  # started by the first append_data
        self._build_ui()
        if smoothing:
            self.set_smoothing(smoothing)
        self._timer = QtCore.QTimer(self)
        self._timer.setInterval(self.UPDATE_MS)
        self._timer.timeout.connect(self._tick)
        self._timer.start()

    def eventFilter(self, obj, event) -> bool:
        if event.type() == QtCore.QEvent.Resize and obj is self.plots_scroll.viewport():
            self._reflow()
        return False

    # ----- runs -----------------------------------------------------------------
    def run_keys(self) -> list[str]:
        return list(self._runs)

    def add_run(self, key: str, label: str | None = None, color: str | None = None) -> None:
        """A run to plot (no-op if already there); `key` is any unique string (its folder)."""
        if key in self._runs:
            return
        used = {r.color for r in self._runs.values()}
        color = color or next((c for c in RUN_COLORS if c not in used), RUN_COLORS[len(self._runs) % len(RUN_COLORS)])
        run = Run(key, label or Path(key).name, color)
        self._runs[key] = run
        item = QtWidgets.QListWidgetItem(run.label)
        item.setData(Qt.UserRole, key)
        item.setToolTip(key)
        item.setFlags(item.flags() | Qt.ItemIsUserCheckable)
        item.setCheckState(Qt.Checked)
        pix = QtGui.QPixmap(12, 12)
        pix.fill(QtGui.QColor(color))
        item.setIcon(QtGui.QIcon(pix))
        self.run_list.addItem(item)
        self._relabel()
        if len(self._runs) > self.LEGEND_RUNS and self.legends_shown():
            self.set_legends_shown(False)
            self._legends_auto_off = True

    def run_label(self, key: str) -> str:
        """What the plots call a run: with several, the shortest tail of its name that tells
        it from the others (031500 for cnn_digits-20261206-031500); its full name on hover."""
        return self._runs[key].short

    def _relabel(self) -> None:
        """Short unique labels for the runs shown (series.short_labels), in the run list, the
        legends and the crosshair; the run list beside the plots with two runs or more."""
        runs = list(self._runs.values())
        many = len(runs) > 1
        for run, short in zip(runs, short_labels([r.label for r in runs]) if many else [r.label for r in runs]):
            run.short = short
        for i in range(self.run_list.count()):
            item = self.run_list.item(i)
            run = self._runs.get(item.data(Qt.UserRole))
            if run is not None:
                item.setText(run.short)
                item.setToolTip(f"{run.label}\n{run.key}" if run.label != run.key else run.key)
        self.side.setVisible(many)
        for pw in self._all_plots().values():
            pi = pw.getPlotItem()
            if pi.legend is None:
                continue
            for sample, label in pi.legend.items:
                s = getattr(sample.item, "series", None)
                run = getattr(sample.item, "run", None)
                if s is None or run is None:
                    continue
                set_legend_name(label, self._series_name(run, s.spec))
                label.setToolTip(f"{run.label}: {s.spec.label}")
            fit_legend(pi)
        for run in runs:  # the markers' tooltips name their run beside others
            for line in run.marker_lines:
                self._marker_tip(run, line)

    def _series_name(self, run: Run, spec) -> str:
        return spec.label if len(self._runs) == 1 else f"{run.short}: {spec.label}"

    def remove_run(self, key: str) -> None:
        run = self._runs.pop(key, None)
        if run is None:
            return
        for s in run.series.values():
            if s.curve is not None:
                self._pw(s.spec.plot).getPlotItem().removeItem(s.curve)
            if s.segments is not None:
                self._pw(s.spec.plot).getPlotItem().vb.removeItem(s.segments)
        self._drop_marks(run)  # (its compile line, peak markers, recovery markers)
        for i in range(self.run_list.count()):
            if self.run_list.item(i).data(Qt.UserRole) == key:
                self.run_list.takeItem(i)
                break
        self._relabel()
        self._compile_text()
        if self._legends_auto_off and len(self._runs) <= self.LEGEND_RUNS:
            self.set_legends_shown(True)
        self._fit(self._all_plots())

    def clear(self) -> None:
        for key in list(self._runs):
            self.remove_run(key)
        self.set_confusion(None)
        self.readout.setText(" ")
        self.system_note.setVisible(True)
        self._x_lim, self._y_lim = None, {}
        self._refit.clear()

    def records(self, key: str) -> list[dict]:
        """Every record of a run, in the order they came."""
        out = []
        for part in self._runs[key].kept:
            out.extend(parse_jsonl(part.split(b"\n")) if isinstance(part, bytes) else part)
        return out

    def has_records(self, key: str) -> bool:
        return key in self._runs and any(self._runs[key].kept)

    def append(self, key: str, records: list[dict], lines: list[bytes] | None = None, keep: bool = True) -> None:
        """New metrics records of a run (plotted at the next timer tick). `lines`: the
        lines of metrics.jsonl they were read from (engine/runs/tail.py), kept instead of the
        dicts: a third of their memory. Three runs of a million records held as dicts
        took 1.5 GB here, and growing that much memory made single updates take 100 ms
        and more. `keep=False`: plotted only, not among the run's `records` (the
        System tab's samples, which are not metrics.jsonl's)."""
        run = self._run(key)
        if records and keep:
            run.kept.append(b"\n".join(lines) if lines is not None else list(records))
        if run.in_flight:  # after the run's lines still being parsed, in their order
            run.in_flight += 1
            self._parser.submit_parsed(run, columns(records))
        else:
            ingest(run, *columns(records), self._smoothing)

    def append_data(self, key: str, data: bytes) -> None:
        """New lines of a run's metrics.jsonl as read (complete lines joined by newlines:
        engine/runs/tail.py's poll_data), kept at once and parsed in a process of its own
        (engine/runs/parse_worker.py): the GUI thread pays a pipe write now and, at the
        next timer tick, the unpickling of their columns. Plotted at the first tick
        after they are parsed (a hidden dashboard takes them too, and draws them
        when shown)."""
        run = self._run(key)
        if not data:
            return
        run.kept.append(data)
        if self._parser is None:
            self._parser = parser = ParseWorker()
            self.destroyed.connect(lambda *_: parser.close())  # its process goes with the widget
        run.in_flight += 1
        self._parser.submit(run, data)

    TAKE_BUDGET_S = 0.015  # a tick takes the parse process's answers for this long at most

    def _take_parsed(self, timeout: float = 0.0) -> None:
        """Plot what the parse process has answered (the timer calls this, shown or not:
        the answers wait in a pipe); `timeout`: wait for the first that long. At most
        TAKE_BUDGET_S of answers a call: 50 runs opened at once arrive over a few ticks
        instead of holding one for 80 ms."""
        if self._parser is not None and self._parser.pending():
            self._apply(self._parser.ready(timeout, self.TAKE_BUDGET_S))

    def wait_parsed(self, timeout: float = 30.0) -> None:
        """Plot everything given to append_data so far (for tests and exports: the
        parse is asynchronous)."""
        if self._parser is not None:
            self._apply(self._parser.wait(timeout))

    def _apply(self, results) -> None:
        """Parsed chunks into their runs' series; those of a run removed (or cleared)
        since are dropped."""
        for run, (table, rest) in results:
            run.in_flight -= 1
            if self._runs.get(run.key) is run:
                ingest(run, table, rest, self._smoothing)

    def _run(self, key: str) -> Run:
        run = self._runs.get(key)
        if run is None:
            self.add_run(key)
            run = self._runs[key]
        return run

    def set_records(self, key: str, records: list[dict], label: str | None = None,
                    lines: list[bytes] | None = None) -> None:
        """Replace a run's data (an old run opened from the history); `lines` as in append."""
        self._replace_run(key, label)
        self.append(key, records, lines)
        self.flush()

    def set_data(self, key: str, data: bytes, label: str | None = None) -> None:
        """Replace a run's data with the lines of its metrics.jsonl (an old run opened
        from the history: a million lines parse in the parse process, not here);
        plotted once parsed, as append_data."""
        self._replace_run(key, label)
        self.append_data(key, data)

    def _replace_run(self, key: str, label: str | None) -> None:
        """The run emptied (its lines in flight dropped), keeping its colour."""
        color = self._runs[key].color if key in self._runs else None
        self.remove_run(key)
        self.add_run(key, label, color)

    def set_run_visible(self, key: str, visible: bool) -> None:
        run = self._runs[key]
        run.visible = visible
        for s in run.series.values():
            if s.curve is not None:
                s.curve.setVisible(visible)
        self._show_marks(run)
        self._compile_text()
        for i in range(self.run_list.count()):
            item = self.run_list.item(i)
            if item.data(Qt.UserRole) == key:
                state = Qt.Checked if visible else Qt.Unchecked
                if item.checkState() != state:
                    item.setCheckState(state)
        self._fit(self._all_plots())  # the ranges of what is still shown
        self.run_visibility_changed.emit(key, visible)

    def is_run_visible(self, key: str) -> bool:
        return self._runs[key].visible

    def _run_item_changed(self, item: QtWidgets.QListWidgetItem) -> None:
        key = item.data(Qt.UserRole)
        if key in self._runs:
            visible = item.checkState() == Qt.Checked
            if self._runs[key].visible != visible:
                self.set_run_visible(key, visible)

    # ----- view settings -----------------------------------------------------------
    def set_x_mode(self, mode: str) -> None:
        if mode not in ("step", "time"):
            raise ValueError(f"x mode must be 'step' or 'time', not {mode!r}")
        self._x_mode = mode
        i = self.x_combo.findData(mode)
        if self.x_combo.currentIndex() != i:
            self.x_combo.setCurrentIndex(i)
        for pw in self._all_plots().values():
            pw.getPlotItem().setLabel("bottom", "step" if mode == "step" else "wall time (s)")
        self._mark_all_dirty()
        for run in self._runs.values():
            run.compile_dirty = run.compiled is not None  # its line moves to the other x
            run.markers_dirty = bool(run.markers)  # and so do its markers
        self.flush()
        self.auto_range()

    @property
    def x_mode(self) -> str:
        return self._x_mode

    def set_smoothing(self, weight: float) -> None:
        weight = min(max(float(weight), 0.0), 0.99)
        self._smoothing = weight
        self.smooth_label.setText(f"{weight:.2f}")
        v = round(weight * 100)
        if self.smooth_slider.value() != v:
            self.smooth_slider.setValue(v)
        for run in self._runs.values():
            for s in run.series.values():
                if s.spec.smooth:
                    s.smoothed = MinMaxBuffer(max(s.y.n, 1), envelope=True)
                    if weight > 0:
                        s.smoothed.extend(ema(s.y.view(), weight))
                    s.dirty = True
        self.flush()

    @property
    def smoothing(self) -> float:
        return self._smoothing

    def _mark_dirty(self, plot_id: str) -> None:
        for run in self._runs.values():
            for s in run.series.values():
                if s.spec.plot == plot_id:
                    s.dirty = True

    def _mark_all_dirty(self, *_) -> None:
        for run in self._runs.values():
            for s in run.series.values():
                s.dirty = True

    # ----- drawing ----------------------------------------------------------------
    def series_data(self, key: str, series: str) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) a curve shows: x per the x mode, y smoothed where the slider applies."""
        xb, yb = self._buffers(self._runs[key].series[series])
        return xb.view(), yb.view()

    def _buffers(self, s: Series) -> tuple[MinMaxBuffer, MinMaxBuffer]:
        xb = s.step if self._x_mode == "step" else s.time
        yb = s.smoothed if s.spec.smooth and self._smoothing > 0 else s.y
        return xb, yb

    def _live(self) -> bool:
        """Whether the plots show their data whole (see _envelope): following, or
        pyqtgraph's own auto-range (its menu) on the first plot, which all plots' x
        follows (setXLink)."""
        return self._follow or self.plots[PLOTS[0].id].getPlotItem().vb.autoRangeEnabled()[0]

    def _crowded(self) -> bool:
        """More runs than LEGEND_RUNS overlaid: their curves are made 1 pixel wide, validation
        curves without markers, envelopes of one segment a pixel column. 50 runs' curves
        repainted took 38 ms an update here (2-pixel lines drawn as two, a marker item per
        validation curve); a plot of 50 curves shows no more with them."""
        return len(self._runs) > self.LEGEND_RUNS

    def _envelope(self, s: Series, geometry: dict, shapes: dict) -> tuple | None:
        """What the series shows while the plots follow their data (the live case)
        and it has two values per pixel or more: its envelope (`envelope_parts`) in
        view coordinates (log10 on a log-y plot), one segment per pixel column
        (columns half a pen width apart), as Segments.set_columns takes it: what the
        raw series looks like, built from the min/max levels without touching the
        million values. A solid 2-pixel pen draws it as two 1-pixel lines (see
        set_columns): the same picture (see tests/widgets/test_dashboard.py), and
        Qt's raster engine draws 1-pixel lines about five times as fast as it strokes
        wider ones. None otherwise (zoomed in by the user, or a short series): the
        raw series, which the PlotDataItem clips to the view and peak-downsamples
        only where there are more than five points per pixel: every point shows.
        `geometry`: each plot's pixels, filled here once per flush; `shapes`: see
        envelope_parts, for one flush."""
        plot_id = s.spec.plot
        g = geometry.get(plot_id)
        if g is None:
            pw = self._pw(plot_id)
            vb = pw.getPlotItem().vb
            dpr = pw.devicePixelRatioF()
            (x0, x1), (y0, y1) = vb.viewRange()
            g = geometry[plot_id] = (max(vb.width(), 200.0) * dpr, (x1 - x0) / max(vb.width() * dpr, 1.0),
                                     (y1 - y0) / max(vb.height() * dpr, 1.0), self._log_y and plot_id in LOG_PLOTS)
        columns, px, py, log = g
        width = s.pen.widthF()
        per_px = 1 if self._crowded() else 2  # (many runs overlaid: one segment a pixel column is plenty)
        parts = envelope_parts(*self._buffers(s), int(columns * per_px / max(width, 1.0)), shapes)
        if parts is None:
            return None
        x0, y0, x1, y1 = parts
        if log:
            up0, up1 = y0 > 0, y1 > 0  # values without a logarithm: down to the smallest that has one
            if not (up0.all() and up1.all()):
                if up0.any() or up1.any():
                    least = min(y0.min(initial=math.inf, where=up0), y1.min(initial=math.inf, where=up1))
                    y0, y1 = np.where(up0, y0, least), np.where(up1, y1, least)
                else:
                    x0 = y0 = x1 = y1 = x0[:0]
            y0, y1 = np.log10(y0), np.log10(y1)
        return x0, y0, x1, y1, round(width) if s.thin_pen is not None else 1, px, py

    def drawn(self, key: str, series: str) -> tuple[np.ndarray, np.ndarray, bool]:
        """What is on screen for a series: (x, y, envelope), the envelope's segments in
        view coordinates, or the raw data the curve was given."""
        s = self._runs[key].series[series]
        if s.segments is not None and not s.raw:
            return (*s.segments.pairs(), True)
        x, y = s.curve.getOriginalDataset()
        return np.asarray(x), np.asarray(y), False

    def curve(self, key: str, series: str) -> pg.PlotDataItem | None:
        s = self._runs.get(key, Run("", "", "")).series.get(series)
        return s.curve if s else None

    def _make_curve(self, run: Run, s: Series) -> pg.PlotDataItem:
        spec = s.spec
        style = Qt.DashLine if spec.eval else RANK_STYLES[spec.rank % len(RANK_STYLES)]
        per_rank = PER_RANK.match(spec.key) is not None and spec.plot != "step_time"  # beside the run's own curve
        crowded = self._crowded()  # many runs overlaid: thin lines, no markers (each costs its repaint)
        pen = pg.mkPen(run.color, width=1 if per_rank or crowded else 2 if not spec.eval else 1.5, style=style)
        kw = {}
        if spec.eval and not crowded:
            kw = {"symbol": "o", "symbolSize": 5, "symbolBrush": run.color, "symbolPen": None}
        # Only finite values reach the buffers, so pyqtgraph may skip its own scan. (No name:
        # its legend entry is _legend_entry's, made only while the legends are shown.)
        curve = pg.PlotDataItem(pen=pen, skipFiniteCheck=True, **kw)
        curve.run, curve.series = run, s  # its legend entry follows the run's label (_relabel)
        curve.legend_pen = s.pen = pen  # the legend shows it whichever item draws (LegendSample)
        s.thin_pen = None
        if pen.widthF() == 2 and style == Qt.SolidLine:  # see _envelope
            s.thin_pen = pg.mkPen(run.color, width=1)
        # shown or hidden (the run list, a click on the legend): its envelope too
        curve.visibleChanged.connect(lambda: s.segments is not None and s.segments.setVisible(curve.isVisible()))
        curve.setClipToView(True)
        curve.setDownsampling(auto=True, method="peak")
        curve.setVisible(run.visible)
        pi = self._pw(spec.plot).getPlotItem()
        pi.addItem(curve)
        if self.legends_shown():
            self._legend_entry(pi, curve, run, spec)
        return curve

    def _legend_entry(self, pi: pg.PlotItem, curve: pg.PlotDataItem, run: Run, spec, fit: bool = True) -> None:
        """The curve's entry in its plot's legend."""
        if pi.legend is None:
            return
        pi.legend.addItem(curve, self._series_name(run, spec))
        curve.in_legend = True
        cache_painting(pi.legend)  # its new entry
        sample, label = pi.legend.items[-1]
        curve.visibleChanged.connect(sample.update)  # a cached sample shows the curve hidden or not
        label.setToolTip(f"{run.label}: {spec.label}")
        if fit:
            fit_legend(pi)

    def _tick(self) -> None:
        """The timer: new points reach the curves while they can be seen; a hidden
        dashboard (a dock tabbed away, a minimised window) catches up when shown. The
        parse process's answers are taken either way."""
        self._take_parsed()
        if self.isVisible() and not self.window().isMinimized():
            self.flush(new_curves=self.NEW_CURVES_PER_TICK)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.flush()

    @QtCore.Slot()
    def flush(self, new_curves: int | None = None) -> None:
        """Push changed series to their curves (the timer calls this 10 times a second).
        At least `new_curves` curves are made (default: all), more while NEW_CURVE_BUDGET_S
        of the call lasts, the rest at the next call: a new curve and its legend entry cost
        pyqtgraph about 6 ms here (2 ms without the entry), so three runs of five series
        appearing together would hold one update for 90 ms, and 50 runs opened from the
        runs table for 1.8 s; a few a tick keeps each update near the others.
        Called with `new_curves` (the timer), the y ranges move a few a call (see _fit),
        and a call that moves x does only that: moving x lays out the axes again and
        repaints them, and every envelope is rebuilt for it; the new points are drawn
        at the next tick, a tenth of a second later (never two ticks in a row: x moves
        at every tick while a run is young). Those were the slowest updates of a
        growing 3-run overlay (29 ms mean, against 22 ms for the others, here)."""
        self._take_parsed()
        # the ranges first: a widened envelope depends on the y range (see _envelope)
        timer = new_curves is not None
        x_alone = timer and not self._x_was_alone
        if self._fit({s.spec.plot for run in self._runs.values() for s in run.series.values() if s.dirty},
                     self.RANGE_MOVES_PER_TICK if timer else None, x_alone) and x_alone:
            self._x_was_alone = True
            return  # the series stay dirty
        self._x_was_alone = False
        t_start = time.perf_counter()
        live, geometry, shapes = self._live(), {}, {}
        for run in self._runs.values():
            for s in run.series.values():
                if not s.dirty:
                    continue
                if s.curve is None:
                    if new_curves is not None:
                        if new_curves <= 0 and time.perf_counter() - t_start > self.NEW_CURVE_BUDGET_S:
                            continue  # stays dirty: the next tick
                        new_curves -= 1
                    s.curve = self._make_curve(run, s)
                env = self._envelope(s, geometry, shapes) if live else None
                if env is not None:
                    if s.segments is None:
                        s.segments = Segments(s.thin_pen or s.pen)
                        s.segments.setVisible(s.curve.isVisible())
                        self._pw(s.spec.plot).getPlotItem().vb.addItem(s.segments)
                    s.segments.set_columns(*env)
                    if s.raw:  # the curve stays for its legend entry and visibility, empty
                        s.curve.setData([], [])
                        s.raw = False
                else:
                    if s.segments is not None and s.segments.count():
                        s.segments.clear()
                    s.curve.setData(*(b.view() for b in self._buffers(s)))
                    s.raw = True
                s.dirty = False
        if any(run.compile_dirty for run in self._runs.values()):
            self._show_compiles()
        if any(run.markers_dirty for run in self._runs.values()):
            self._show_markers()
        if not self.system_note.isHidden() and any(s.spec.plot in self.system_plots
                                                for run in self._runs.values() for s in run.series.values()):
            self.system_note.setVisible(False)

    # ----- confusion matrix ------------------------------------------------------------
    def set_confusion(self, matrix, labels=None, title: str = "Confusion matrix (validation)") -> None:
        self.confusion.set_matrix(matrix, labels, title)

    # ----- export -----------------------------------------------------------------
    def export_png(self, path: str | Path) -> Path:
        """The plots as one PNG (what is on screen, at the widget's size)."""
        self.wait_parsed()
        self.flush()
        path = Path(path)
        if not self.plots_area.grab().save(str(path), "PNG"):
            raise OSError(f"could not write {path}")
        return path

    def export_csv(self, path: str | Path, keys: list[str] | None = None) -> Path:
        """The raw records of the runs (default: the visible ones), one row each."""
        from engine.runs.history import write_metrics_csv

        keys = keys if keys is not None else [k for k, r in self._runs.items() if r.visible]
        return write_metrics_csv(path, {self._runs[k].label: self.records(k) for k in keys})

    def _ask_png(self) -> None:
        path, _ = QtWidgets.QFileDialog.getSaveFileName(self, "Export plots as PNG", "plots.png", "PNG image (*.png)")
        if path:
            self._report(lambda: self.export_png(path))

    def _ask_csv(self) -> None:
        path, _ = QtWidgets.QFileDialog.getSaveFileName(self, "Export metrics as CSV", "metrics.csv", "CSV (*.csv)")
        if path:
            self._report(lambda: self.export_csv(path))

    def _report(self, fn) -> None:
        try:
            fn()
        except OSError as exc:
            QtWidgets.QMessageBox.warning(self, "Export failed", str(exc))


