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
(engine/runs/parse_worker.py) into float64 columns that the timer takes (runs.py's
`ingest`): the GUI thread never parses a live run's JSON. Records as dicts (append,
set_records) are read here. This widget only displays.

Several runs can be overlaid: colour per run, line style per series (solid = train,
dashed with dots = validation), a checkable run list to show/hide each. Which plot
a record key feeds is series.py's; the axes and painting caches are axis.py's.
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

from widgets.dashboard.axis import GridAxis, SameRangeViewBox, cache_painting
from widgets.dashboard.buffers import MinMaxBuffer, ema, envelope_parts
from widgets.dashboard.confusion import ConfusionMatrixWidget
from widgets.dashboard.fit import add_legend_row, fit_legend, keep_fitted, set_legend_name, set_title
from widgets.dashboard.ingest import Run, Series, ingest
from widgets.dashboard.segments import Segments
from widgets.dashboard.series import LOG_PLOTS, PER_RANK, PLOTS, SYSTEM_PLOTS, short_labels

# Colour per run: a palette that stays readable on light and dark backgrounds.
RUN_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
              "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
RANK_STYLES = [Qt.SolidLine, Qt.DashLine, Qt.DotLine, Qt.DashDotLine, Qt.DashDotDotLine]


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


class Dashboard(QtWidgets.QWidget):
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

    # ----- layout ---------------------------------------------------------------
    def _build_ui(self) -> None:
        pal = self.palette()
        bg = pal.color(QtGui.QPalette.Base)
        fg = pal.color(QtGui.QPalette.Text)
        grid_alpha = 0.15

        self.x_combo = QtWidgets.QComboBox()
        self.x_combo.addItem("Step", "step")
        self.x_combo.addItem("Wall time (s)", "time")
        self.x_combo.setToolTip("What the x axis shows")
        self.x_combo.currentIndexChanged.connect(lambda _: self.set_x_mode(self.x_combo.currentData()))
        self.smooth_slider = QtWidgets.QSlider(Qt.Horizontal)
        self.smooth_slider.setRange(0, 99)
        self.smooth_slider.setFixedWidth(90)
        self.smooth_slider.setToolTip("Exponential moving average of the training curves")
        self.smooth_label = QtWidgets.QLabel("0.00")
        self.smooth_label.setMinimumWidth(30)
        self.smooth_slider.valueChanged.connect(lambda v: self.set_smoothing(v / 100))
        self.log_check = QtWidgets.QCheckBox("Log y")
        self.log_check.setToolTip("Logarithmic y axis for loss and learning rate")
        self.log_check.toggled.connect(self.set_log_y)
        self.legend_check = QtWidgets.QCheckBox("Legends")
        self.legend_check.setChecked(True)
        self.legend_check.setToolTip("Show the legend under each plot (click an entry to hide its curve)")
        self.legend_check.toggled.connect(self.set_legends_shown)
        # Exports sit in one menu button so the bar stays narrow enough for a
        # bottom dock on a 1200-pixel-wide window.
        self.export_button = QtWidgets.QToolButton()
        self.export_button.setText("Export")
        self.export_button.setPopupMode(QtWidgets.QToolButton.InstantPopup)
        menu = QtWidgets.QMenu(self.export_button)
        self.png_action = menu.addAction("Plots as PNG…", self._ask_png)
        self.csv_action = menu.addAction("Data as CSV…", self._ask_csv)
        self.export_button.setMenu(menu)
        self.reset_button = QtWidgets.QToolButton()
        self.reset_button.setText("Fit")
        self.reset_button.setToolTip("Zoom all plots to their data (mouse: drag to pan, wheel to zoom)")
        self.reset_button.clicked.connect(self.auto_range)

        self.readout = QtWidgets.QLabel(" ")
        self.readout.setTextFormat(Qt.RichText)
        self.readout.setStyleSheet("padding: 2px 6px; color: palette(text);")
        # Crosshair values; may be long: it must never widen the dock.
        self.readout.setSizePolicy(QtWidgets.QSizePolicy.Ignored, QtWidgets.QSizePolicy.Preferred)
        bar = QtWidgets.QHBoxLayout()
        bar.setContentsMargins(4, 2, 4, 2)
        bar.addWidget(QtWidgets.QLabel("X"))
        bar.addWidget(self.x_combo)
        bar.addSpacing(8)
        bar.addWidget(QtWidgets.QLabel("Smoothing"))
        bar.addWidget(self.smooth_slider)
        bar.addWidget(self.smooth_label)
        bar.addSpacing(8)
        bar.addWidget(self.log_check)
        bar.addWidget(self.legend_check)
        # the first compile's time (training.compile): what it cost before the first step
        self.compile_label = QtWidgets.QLabel("")
        self.compile_label.setToolTip("torch.compile's first compile, before the step clock started")
        self.compile_label.setVisible(False)
        bar.addWidget(self.compile_label)
        bar.addWidget(self.readout, 1)
        bar.addWidget(self.reset_button)
        bar.addWidget(self.export_button)


        self.plots_area = QtWidgets.QWidget()
        self._grid = grid = QtWidgets.QGridLayout(self.plots_area)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setSpacing(4)
        self._columns = 0  # as laid out by _reflow
        self.plots: dict[str, pg.PlotWidget] = {}  # the Training tab's (the grid that reflows)
        self.system_plots: dict[str, pg.PlotWidget] = {}  # the System tab's: each rank's CPU, memory, GPU
        self._vlines: dict[str, pg.InfiniteLine] = {}
        first = None
        shared_ticks: dict = {}
        for i, spec in enumerate([*PLOTS, *SYSTEM_PLOTS]):
            pw = pg.PlotWidget(background=bg, axisItems={k: GridAxis(k, bg, shared_ticks) for k in ("left", "bottom")},
                               viewBox=SameRangeViewBox())  # (x linked by range, not by screen position)
            pi = pw.getPlotItem()
            set_title(pi, spec.title, fg, self.TITLE_H)
            pi.showGrid(x=True, y=True, alpha=grid_alpha)
            pi.setLabel("left", spec.y_label)
            pi.setLabel("bottom", "step")
            pi.getAxis("bottom").showLabel(False)  # the bar's X says it, once for all plots
            for ax in ("left", "bottom"):
                pi.getAxis(ax).setPen(fg)
                pi.getAxis(ax).setTextPen(fg)
                pi.getAxis(ax).setZValue(-200)  # grid behind the curves (see GridAxis)
            for ax in ("left", "bottom", "top", "right"):  # hidden ones too: it re-lays their label per range
                pi.getAxis(ax).enableAutoSIPrefix(False)  # "accuracy (x0.001)" reads badly
            pi.setClipToView(True)
            pi.setDownsampling(auto=True, mode="peak")
            pi.hideButtons()  # the bar's Fit does it for all plots
            # Zoom/pan by the user ends following, which switches from envelope to raw
            # data; the envelope has a column per pixel: redraw on a resize too.
            pi.vb.sigRangeChangedManually.connect(self._stop_following)
            pi.vb.sigYRangeChanged.connect(lambda *_, pid=spec.id: self._mark_dirty(pid))  # thin lines
            if first is None:  # x: all plots are linked to this one
                pi.vb.sigXRangeChanged.connect(self._mark_all_dirty)
            pi.vb.sigResized.connect(self._mark_all_dirty)
            legend = add_legend_row(pi, fg)
            for item in (legend, pi.titleLabel):
                cache_painting(item)
            for ax in ("left", "bottom"):  # the axes cache their own painting (see GridAxis.paint)
                for child in pi.getAxis(ax).childItems():
                    if isinstance(child, QtWidgets.QGraphicsTextItem):  # its label
                        cache_painting(child)
            vline = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(fg, width=1, style=Qt.DotLine))
            vline.setVisible(False)
            pi.addItem(vline, ignoreBounds=True)
            self._vlines[spec.id] = vline
            if first is None:
                first = pi
            else:
                pi.setXLink(first)  # zoom/pan one plot, all follow
            pw.scene().sigMouseMoved.connect(lambda pos, pid=spec.id: self._mouse_moved(pid, pos))
            pw.setMinimumSize(self.MIN_PLOT_W, self.MIN_PLOT_H)
            keep_fitted(pi)
            (self.plots if i < len(PLOTS) else self.system_plots)[spec.id] = pw
        self.confusion = ConfusionMatrixWidget(background=bg, foreground=fg)
        self.confusion.setMinimumSize(self.MIN_PLOT_W, self.MIN_PLOT_H)
        self.plots_scroll = QtWidgets.QScrollArea()
        self.plots_scroll.setWidget(self.plots_area)
        self.plots_scroll.setWidgetResizable(True)
        self.plots_scroll.setFrameShape(QtWidgets.QFrame.NoFrame)
        self.plots_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.plots_scroll.viewport().installEventFilter(self)  # its width sets the columns (_reflow)
        self._reflow()

        self.run_list = QtWidgets.QListWidget()
        self.run_list.setToolTip("Runs on the plots: untick to hide one")
        self.run_list.itemChanged.connect(self._run_item_changed)
        self.run_list.setTextElideMode(Qt.ElideMiddle)
        self.run_list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        key_note = QtWidgets.QLabel("solid: train\ndashed ·: validation\nstyle per rank: memory")
        key_note.setStyleSheet("color: palette(mid); font-size: 8pt;")
        key_note.setWordWrap(True)
        side = QtWidgets.QVBoxLayout()
        side.setContentsMargins(0, 0, 0, 0)
        title = QtWidgets.QLabel("<b>Runs</b>")
        side.addWidget(title)
        side.addWidget(self.run_list, 1)
        side.addWidget(key_note)
        self.side = side_w = QtWidgets.QWidget()
        side_w.setLayout(side)
        side_w.setFixedWidth(self.SIDE_W)
        side_w.setVisible(False)  # one run: its name is the dock's business, the legends say the rest

        self.system_area = QtWidgets.QWidget()
        sys_grid = QtWidgets.QGridLayout(self.system_area)
        sys_grid.setContentsMargins(0, 0, 0, 0)
        sys_grid.setSpacing(4)
        for i, pw in enumerate(self.system_plots.values()):
            sys_grid.addWidget(pw, i // 2, i % 2)
        self.system_note = QtWidgets.QLabel("No system metrics yet: each rank samples its CPU and memory "
                                            "every few seconds (logs/rankN.system.jsonl)")
        self.system_note.setStyleSheet("color: palette(mid);")
        sys_grid.addWidget(self.system_note, 2, 0, 1, 2)
        self.tabs = QtWidgets.QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self.plots_scroll, "Training")
        # scrolled as the Training tab is: the plots' own minimum height must not hold the
        # bottom dock area tall once the user turns to another of its tabs
        self.system_scroll = QtWidgets.QScrollArea()
        self.system_scroll.setWidget(self.system_area)
        self.system_scroll.setWidgetResizable(True)
        self.system_scroll.setFrameShape(QtWidgets.QFrame.NoFrame)
        self.system_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.tabs.addTab(self.system_scroll, "System")
        self.tabs.currentChanged.connect(lambda _: self.flush())

        body = QtWidgets.QHBoxLayout()
        body.setContentsMargins(0, 0, 0, 0)
        body.addWidget(self.tabs, 1)
        body.addWidget(side_w)

        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.setSpacing(2)
        lay.addLayout(bar)
        lay.addLayout(body, 1)

    def _reflow(self) -> None:
        """As many columns as the width takes plots of MIN_PLOT_W (COLUMNS at most);
        rows below MIN_PLOT_H scroll."""
        width = self.plots_scroll.viewport().width()
        spacing = self._grid.horizontalSpacing()
        cols = max(1, min(self.COLUMNS, int((width + spacing) // (self.MIN_PLOT_W + spacing))))
        if cols == self._columns:
            return
        self._columns = cols
        widgets = [*self.plots.values(), self.confusion]
        for w in widgets:
            self._grid.removeWidget(w)
        for i, w in enumerate(widgets):
            self._grid.addWidget(w, i // cols, i % cols)
        for c in range(self.COLUMNS):
            self._grid.setColumnStretch(c, 1 if c < cols else 0)
        rows = math.ceil(len(widgets) / cols)
        for r in range(len(widgets)):
            self._grid.setRowStretch(r, 1 if r < rows else 0)

    def columns(self) -> int:
        return self._columns

    def _pw(self, plot_id: str) -> pg.PlotWidget:
        pw = self.plots.get(plot_id)
        return pw if pw is not None else self.system_plots[plot_id]

    def _all_plots(self) -> dict[str, pg.PlotWidget]:
        return {**self.plots, **self.system_plots}

    def show_system(self, shown: bool = True) -> None:
        """The System tab (each rank's CPU and memory), or the Training one."""
        self.tabs.setCurrentIndex(1 if shown else 0)

    def eventFilter(self, obj, event) -> bool:
        if event.type() == QtCore.QEvent.Resize and obj is self.plots_scroll.viewport():
            self._reflow()
        return False

    def set_legends_shown(self, shown: bool) -> None:
        """The legend rows under the plots, or none (more room for the curves)."""
        if self.legend_check.isChecked() != shown:
            self.legend_check.setChecked(shown)  # (calls back here)
            return
        self._legends_auto_off = False  # (add_run sets it again when it was the one hiding them)
        if shown:  # curves made while the legends were off get their entries now
            for run in self._runs.values():
                for sr in run.series.values():
                    if sr.curve is not None and not getattr(sr.curve, "in_legend", False):
                        self._legend_entry(self._pw(sr.spec.plot).getPlotItem(), sr.curve, run, sr.spec, fit=False)
        for pw in self._all_plots().values():
            pi = pw.getPlotItem()
            pi.legend_shown = shown
            fit_legend(pi)

    def legends_shown(self) -> bool:
        return self.legend_check.isChecked()

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
        if run.peaks is not None:
            self.plots["memory"].getPlotItem().removeItem(run.peaks)
        if run.compile_line is not None:
            self.plots["throughput"].getPlotItem().removeItem(run.compile_line)
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
        if run.peaks is not None:
            run.peaks.setVisible(visible)
        if run.compile_line is not None:
            run.compile_line.setVisible(visible)
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
        if not self.system_note.isHidden() and any(s.spec.plot in self.system_plots
                                                for run in self._runs.values() for s in run.series.values()):
            self.system_note.setVisible(False)

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

    # ----- crosshair ----------------------------------------------------------------
    def _mouse_moved(self, plot_id: str, pos) -> None:
        vb = self._pw(plot_id).getPlotItem().vb
        if not vb.sceneBoundingRect().contains(pos):
            return
        self.show_crosshair(vb.mapSceneToView(pos).x())

    def show_crosshair(self, x: float) -> str:
        """Put the crosshair at x on every plot; the readout lists each visible run's
        values at the nearest point. Returns the readout as plain text."""
        for line in self._vlines.values():
            line.setPos(x)
            line.setVisible(True)
        unit = "step" if self._x_mode == "step" else "t"
        parts_html, parts_text = [], []
        for run in self._runs.values():
            if not run.visible:
                continue
            vals = []
            for skey in run.series:
                xs, ys = self.series_data(run.key, skey)
                if len(xs) == 0:
                    continue
                i = int(np.clip(np.searchsorted(xs, x), 0, len(xs) - 1))
                if i > 0 and abs(xs[i - 1] - x) <= abs(xs[i] - x):
                    i -= 1
                vals.append(f"{skey} {_fmt(ys[i])}")
            if vals:
                parts_text.append(f"{run.short}: " + ", ".join(vals))
                parts_html.append(f"<span style='color:{run.color}'>■</span> <b>{run.short}</b>: " + ", ".join(vals))
        xs = f"{x:.0f}" if self._x_mode == "step" else f"{x:.1f}s"
        self.readout.setText(f"{unit} {xs} &nbsp; " + " &nbsp;│&nbsp; ".join(parts_html))
        return f"{unit} {xs}  " + " | ".join(parts_text)

    # ----- confusion matrix ------------------------------------------------------------
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


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    a = abs(v)
    if a != 0 and (a < 1e-3 or a >= 1e5):
        return f"{v:.3g}"
    return f"{v:.4g}"
