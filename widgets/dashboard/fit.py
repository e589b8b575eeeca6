"""Titles and legends that fit their plot, whatever its size.

A plot's title spans the whole plot (pyqtgraph puts it over the data column only) and
is shortened to fit: the full title, else its short form (`SHORT`), else elided with
"…"; the full title is then the title's tooltip. The legend is a row of its own under
the x axis (`add_legend_row`), never over the curves: as many entries a line as the
width takes, the row as tall as its lines (up to 4 in a tall plot, names elided past that). `fit_plot_texts` does both, at every
resize of the plot (`keep_fitted`).
"""
from __future__ import annotations

import math

import pyqtgraph as pg

from widgets.dashboard.axis import LegendSample

# Shorter titles for narrow plots (the full one is the tooltip).
SHORT = {
    "Peak memory per rank": "Memory per rank",
    "Step time per rank": "Step time",
    "Confusion matrix (validation)": "Confusion (val)",
    "Learning rate": "LR",
}
LEGEND_ROW = 4  # the PlotItem layout's rows: 0 title, 1 top axis, 2 data, 3 x axis
MAX_LINES = 2  # a legend taller than this would take the curves' room: its names are elided
MAX_TALL_LINES = 4  # in a plot tall enough for them (max_lines)
CURVES_MIN_H = 90.0  # the curves' height a longer legend leaves at least
SAMPLE_W = 24.0  # an entry's line sample and the space after it
_LEGEND_FONT = pg.QtGui.QFont()
_LEGEND_FONT.setPointSizeF(8)
LINE_H = 18.0  # one line of legend entries (8 pt text beside a 20-pixel sample, squeezed)


def _html(text: str) -> str:
    return f"<span style='font-size:10pt; font-weight:600'>{text}</span>"


def set_title(pi: pg.PlotItem, title: str, color, height: float = 22) -> None:
    """The plot's title, across the whole plot, fitted to its width (fit_plot_texts)."""
    pi.full_title = title
    pi.setTitle(_html(title), color=color)
    if not getattr(pi, "_title_spans", False):
        pi.layout.removeItem(pi.titleLabel)
        pi.layout.addItem(pi.titleLabel, 0, 0, 1, 3)
        pi._title_spans = True
    pi.layout.setRowFixedHeight(0, height)
    pi.titleLabel.setMaximumHeight(height)
    pi._title_shown = title
    fit_title(pi)


def add_legend_row(pi: pg.PlotItem, color) -> pg.LegendItem:
    """A legend in a row of the plot's layout under its x axis (PlotItem.addItem fills
    it with the named curves, as it does pyqtgraph's own floating legend)."""
    legend = pg.LegendItem(labelTextColor=color, labelTextSize="8pt", sampleType=LegendSample,
                           frame=False, horSpacing=4, verSpacing=-4)
    legend.layout.setContentsMargins(4, 0, 4, 0)
    pi.legend = legend
    pi.layout.addItem(legend, LEGEND_ROW, 0, 1, 3)
    pi.layout.setRowFixedHeight(LEGEND_ROW, 0)
    pi.legend_shown = True
    return legend


def title_width(pi: pg.PlotItem) -> float:
    """The width the title's text takes (its text item, margins included)."""
    return pi.titleLabel.item.boundingRect().width()


def fit_title(pi: pg.PlotItem) -> None:
    full = getattr(pi, "full_title", None)
    if full is None:
        return
    room = pi.titleLabel.geometry().width() or pi.geometry().width()
    if room <= 0:
        return
    fm_bold = pg.QtGui.QFont(pi.titleLabel.item.font())
    fm_bold.setPointSizeF(10)
    fm_bold.setWeight(pg.QtGui.QFont.DemiBold)
    fm = pg.QtGui.QFontMetricsF(fm_bold)
    margin = 12.0  # the text item's document margins
    text = full
    if fm.horizontalAdvance(text) + margin > room:
        text = SHORT.get(full, full)
    if fm.horizontalAdvance(text) + margin > room:
        text = fm.elidedText(full, pg.QtCore.Qt.ElideRight, max(0.0, room - margin))
    if text != getattr(pi, "_title_shown", None):
        pi._title_shown = text
        pi.titleLabel.setText(_html(text))
    pi.titleLabel.setToolTip(full if text != full else "")


def fit_legend(pi: pg.PlotItem) -> None:
    """As many legend entries a line as the plot's width takes, at most MAX_LINES lines
    (names elided to their column then, the full name on hover); the row as tall as its
    lines (none when the legend is hidden or empty)."""
    legend = pi.legend
    if legend is None:
        return
    n = len(legend.items)
    if not n or not getattr(pi, "legend_shown", True):
        legend.setVisible(False)
        if getattr(legend, "in_layout", True):  # (a hidden item keeps its row's height in the layout)
            pi.layout.removeItem(legend)
            legend.in_layout = False
        _row_height(pi, 0)
        return
    if not getattr(legend, "in_layout", True):
        pi.layout.addItem(legend, LEGEND_ROW, 0, 1, 3)
        legend.in_layout = True
    legend.setVisible(True)
    fm = pg.QtGui.QFontMetricsF(_LEGEND_FONT)
    room = max(1.0, (pi.geometry().width() or 200) - 12)
    for _, label in legend.items:
        if not hasattr(label, "full"):
            label.full = label.text
    widest = max(SAMPLE_W + fm.horizontalAdvance(label.full) + 12 for _, label in legend.items)
    cols = max(1, min(n, int(room // widest)))
    if math.ceil(n / cols) > max_lines(pi):
        cols = math.ceil(n / max_lines(pi))
    text_room = room / cols - SAMPLE_W - 12
    for _, label in legend.items:
        text = label.full if fm.horizontalAdvance(label.full) <= text_room else \
            fm.elidedText(label.full, pg.QtCore.Qt.ElideRight, max(8.0, text_room))
        if text != label.text:
            label.setText(text)
        if text != label.full and not label.toolTip():
            label.setToolTip(label.full)
    if cols != legend.columnCount:
        legend.setColumnCount(cols)
    _row_height(pi, math.ceil(n / cols) * LINE_H + 2)


def max_lines(pi: pg.PlotItem) -> int:
    """Lines the legend may take before its names are elided: MAX_LINES, more in a tall
    plot (up to MAX_TALL_LINES), so whole names wrap onto lines of their own while the
    curves keep CURVES_MIN_H pixels."""
    h = pi.geometry().height()
    return max(MAX_LINES, min(MAX_TALL_LINES, int((h - CURVES_MIN_H - 50) // LINE_H)))


def _row_height(pi: pg.PlotItem, h: float) -> None:
    if pi.layout.rowMaximumHeight(LEGEND_ROW) != h:
        pi.layout.setRowFixedHeight(LEGEND_ROW, h)
        pi.layout.invalidate()


def set_legend_name(label, name: str) -> None:
    """A legend entry's full name (fit_legend shows it, elided if need be)."""
    if getattr(label, "full", None) != name:
        label.full = name
        label.setText(name)


def fit_plot_texts(pi: pg.PlotItem) -> None:
    fit_title(pi)
    fit_legend(pi)


def keep_fitted(pi: pg.PlotItem) -> None:
    """Fit the title and legend again whenever the plot is resized."""
    pi.geometryChanged.connect(lambda: fit_plot_texts(pi))


