"""The live training dashboard (`Dashboard`) and the parts it is made of.

    series.py     which plot and series each metrics key feeds (PlotSpec, SeriesSpec,
                  PLOTS, spec_for, series_values); plain Python
    buffers.py    growable float64 buffers with min/max levels (MinMaxBuffer), the
                  envelope of a series from them, the EMA; numpy only
    ingest.py     what the dashboard keeps per run and series (Run, Series) and how a
                  poll's values reach them (ingest); no Qt
    segments.py   Segments: the graphics item that draws an envelope
    axis.py       GridAxis (opaque grid, cached and shared tick layouts) and the
                  painting caches of titles, labels and legends
    fit.py        titles and legend rows fitted to their plot
    confusion.py  ConfusionMatrixWidget
    widget.py     Dashboard: the runs, their records, the 10 Hz updates, the curves,
                  export; with the parts it is made of (mixins):
      grid.py       the bar, the plots' grid, the System tab, the run list, legends
      follow.py     the ranges while the plots follow their data; Fit; log y
      marks.py      the first compile's line, the peak memory per rank
      crosshair.py  the crosshair and the bar's readout

The names below are looked up on first use (PEP 562), not imported with the package:
`import widgets.dashboard.buffers` (or series, ingest) then loads neither Qt nor
pyqtgraph, so those parts run and are tested without them
(tests/widgets/test_dashboard_buffers.py). `from widgets.dashboard import Dashboard`
works as with any other package.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from widgets.dashboard.axis import GridAxis
    from widgets.dashboard.buffers import BLOCK, MinMaxBuffer, ema, envelope, envelope_parts
    from widgets.dashboard.confusion import ConfusionMatrixWidget
    from widgets.dashboard.segments import Segments
    from widgets.dashboard.series import LOG_PLOTS, PLOTS, PlotSpec, SeriesSpec, series_values, spec_for
    from widgets.dashboard.widget import RUN_COLORS, Dashboard

__all__ = [
    "BLOCK", "LOG_PLOTS", "PLOTS", "RUN_COLORS", "ConfusionMatrixWidget", "Dashboard", "GridAxis", "MinMaxBuffer",
    "PlotSpec", "Segments", "SeriesSpec", "ema", "envelope", "envelope_parts", "series_values", "spec_for",
]
# the module of this package that holds each of them
_WHERE = {name: module for module, names in {
    "widget": ("Dashboard", "RUN_COLORS"),
    "confusion": ("ConfusionMatrixWidget",),
    "series": ("PlotSpec", "SeriesSpec", "PLOTS", "LOG_PLOTS", "series_values", "spec_for"),
    "buffers": ("BLOCK", "MinMaxBuffer", "ema", "envelope", "envelope_parts"),
    "segments": ("Segments",),
    "axis": ("GridAxis",),
}.items() for name in names}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
