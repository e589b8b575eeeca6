"""What the dashboard holds per run and per series, and how a poll's values get there.

A `Run` keeps its records as they came (dicts or the lines of metrics.jsonl), its
time origin, its `Series` by key and the markers of what its recovery did (events.py);
a `Series` keeps its steps, wall times, values and smoothed values in MinMaxBuffers
(buffers.py), and the items that draw it, which the dashboard (widget.py) makes. `ingest` appends one poll's values (a table
of columns from engine/runs/tail.py's `columns`, and the records left over) to a run's
series. No Qt here: the drawing items are only held.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from widgets.dashboard.buffers import MinMaxBuffer, ema
from widgets.dashboard.events import MARKED, Marker, marker_of
from widgets.dashboard.series import SeriesSpec, series_values, spec_for

if TYPE_CHECKING:
    import pyqtgraph as pg
    from PySide6 import QtGui

    from widgets.dashboard.segments import Segments


class Series:
    """One series of a run (a record key): its steps, times, values and smoothed values
    as they arrive, and what draws it (its curve and, while it is an envelope, its
    segments), which the dashboard makes and keeps here."""

    def __init__(self, spec: SeriesSpec):
        self.spec = spec
        self.step = MinMaxBuffer()
        self.time = MinMaxBuffer()
        self.y = MinMaxBuffer(envelope=True)
        self.smoothed = MinMaxBuffer(envelope=True)
        self.curve: pg.PlotDataItem | None = None
        self.pen: QtGui.QPen | None = None  # its own
        self.thin_pen: QtGui.QPen | None = None  # 1 pixel, for its envelope (see Dashboard._envelope)
        self.segments: Segments | None = None  # its envelope, while it shows one
        self.raw = False  # the curve holds the raw series
        self.dirty = True


class Parts(list):
    """Pieces of one series' new values (arrays), joined once per poll."""

    def joined(self) -> np.ndarray:
        if len(self) == 1:  # one batch a poll, the usual case: no copy
            return self[0]
        return np.concatenate([np.asarray(v, dtype=np.float64) for v in self])


class Run:
    """One run on the plots: its colour and label, its records as they came, its time
    origin, its series by key and its peak memory markers."""

    def __init__(self, key: str, label: str, color: str):
        self.key, self.label, self.color = key, label, color
        self.short = label  # what the plots call it beside other runs (Dashboard._relabel)
        self.visible = True
        self.kept: list[list[dict] | bytes] = []  # its records: polls' dicts, or their lines as read
        self.in_flight = 0  # its chunks at the parse process (and records queued behind them)
        self.t0: float | None = None
        self.t_last = 0.0
        self.series: dict[str, Series] = {}
        self.peaks: pg.ScatterPlotItem | None = None  # final peak memory per rank
        self.peak_values: list[float] = []
        # the first compile (metrics record {"event": "compiled", "seconds", "step", "time"}):
        # (seconds, step, time relative to t0), shown as a label and a line, not as a step time
        self.compiled: tuple[float, float, float] | None = None
        self.compile_line: pg.InfiniteLine | None = None
        self.compile_dirty = False
        # what its recovery did (restarts, a preemption, a failed checkpoint: events.py), in
        # the order they came, and the lines that mark them on the loss plot (marks.py)
        self.markers: list[Marker] = []
        self.marker_lines: list[pg.InfiniteLine] = []
        self.markers_dirty = False


def ingest(run: Run, table: dict | None, records: list[dict], smoothing: float) -> None:
    """Append a poll's values to the run's series: `table`, the bulk as columns (see
    engine/runs/tail.py's `columns`), and `records`, what is left, one by one; the series
    the EMA slider applies to are smoothed with weight `smoothing` (0: off)."""
    cols: dict[str, tuple[SeriesSpec, list, list, list]] = {}
    t_table = None
    if table is not None:
        if records and run.t0 is None and "time" in table:  # the run's origin: its first timed step
            run.t0 = min([float(table["time"][0]), *(t for r in records if type(r.get("step")) in (int, float)
                                                     and type(t := r.get("time")) in (int, float)
                                                     and math.isfinite(t))])
        ingest_columns(run, table, cols)
        t_table = run.t_last
    for r in records:
        step = r.get("step")
        if type(step) is not int and type(step) is not float:
            continue  # event lines (start/end) carry no point
        if r.get("event") == "compiled":
            _compiled(run, r, step)
            continue
        if r.get("event") in MARKED:
            _marker(run, r, step)
            continue
        t = r.get("time")
        if (type(t) is float or type(t) is int) and math.isfinite(t):
            if run.t0 is None:
                run.t0 = t
            run.t_last = t - run.t0
        rel = run.t_last  # a record without a time sits at the previous one's
        for spec, v in series_values(r):
            c = cols.get(spec.key)
            if c is None:
                c = cols[spec.key] = (spec, [], [], [])
            c[1].append(step)
            c[2].append(rel)
            c[3].append(v)
    if t_table is not None:  # (the table's lines were read first; the latest time is the latest)
        run.t_last = max(run.t_last, t_table)
    for skey, (spec, steps, times, ys) in cols.items():
        s = run.series.get(skey)
        if s is None:
            s = run.series[skey] = Series(spec)
        prev = s.smoothed.a[s.smoothed.n - 1] if s.smoothed.n else None
        steps, times, ys = (parts.joined() if isinstance(parts, Parts) else parts
                            for parts in (steps, times, ys))
        if not len(ys):
            continue
        s.step.extend(steps)
        s.time.extend(times)
        ys = np.asarray(ys, dtype=np.float64)  # finite only: series_values drops the rest
        s.y.extend(ys)
        if spec.smooth and smoothing > 0:  # kept only while it is shown
            s.smoothed.extend(ema(ys, smoothing, prev))
        s.dirty = True


def _compiled(run: Run, r: dict, step: float) -> None:
    """The run's first compile record (a resumed compiled run has more: the first is kept)."""
    sec, t = r.get("seconds"), r.get("time")
    if run.compiled is not None or type(sec) not in (int, float) or not math.isfinite(sec):
        return
    t = float(t) if type(t) in (int, float) and math.isfinite(t) else None
    if t is not None and run.t0 is None:
        run.t0 = t
    run.compiled = (float(sec), float(step), (t - run.t0) if t is not None else run.t_last)
    run.compile_dirty = True


def _marker(run: Run, r: dict, step: float) -> None:
    """A restart, a preemption or a failed checkpoint: a marker at its step (and time)."""
    t = r.get("time")
    if type(t) in (int, float) and math.isfinite(t):
        if run.t0 is None:
            run.t0 = t
        rel = t - run.t0
    else:
        rel = run.t_last
    label, text, short = marker_of(r)
    run.markers.append(Marker(r["event"], float(step), rel, label, text, short))
    run.markers_dirty = True


def ingest_columns(run: Run, table: dict[str, np.ndarray], cols: dict) -> None:
    """The plotted columns of a table (engine/runs/tail.py's `columns`: a batch of records
    with the same keys, steps and times finite) into `cols`, at C speed; the times
    relative to the run's first."""
    step, rel = table["step"], table.get("time")
    if rel is not None:
        if run.t0 is None:
            run.t0 = float(rel[0])
        rel = rel - run.t0
        run.t_last = float(rel[-1])
    else:
        rel = np.full(len(step), run.t_last)
    for k, ys in table.items():
        spec = spec_for(k)
        if spec is None:
            continue
        ok = np.isfinite(ys)
        c = cols.get(spec.key)
        if c is None:
            c = cols[spec.key] = (spec, Parts(), Parts(), Parts())
        for part, values in zip(c[1:], (step, rel, ys)):
            part.append(values if ok.all() else values[ok])
