"""The dashboard's widgets, laid out: the bar (x axis, smoothing, log y, legends, the first
compile's time, the crosshair's readout, Fit, Export), the Training tab's plots in a grid
whose columns follow the width (`_reflow`), the System tab's, and the run list beside
them; the legend rows shown or hidden. A part of Dashboard (widget.py), which it is mixed
into: the attributes it sets (plots, system_plots, run_list, readout, ...) are the ones
the other parts read.
"""
from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6 import QtGui, QtWidgets
from PySide6.QtCore import Qt

from widgets.dashboard.axis import GridAxis, SameRangeViewBox, cache_painting
from widgets.dashboard.confusion import ConfusionMatrixWidget
from widgets.dashboard.fit import add_legend_row, fit_legend, keep_fitted, set_title
from widgets.dashboard.series import PLOTS, SYSTEM_PLOTS


class Layout:
    """Dashboard's widgets and their layout (a mixin: Dashboard holds the sizes it reads,
    TITLE_H, MIN_PLOT_W, MIN_PLOT_H, SIDE_W, COLUMNS)."""

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
