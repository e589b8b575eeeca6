"""Live training dashboard: loss, accuracy, learning rate, throughput, peak memory.

Follows pyqtgraph's scrollingPlots example (DESIGN.md): one PlotDataItem per
(run, series), fed from growable float64 buffers, and setData only from a 10 Hz
QTimer for the series that changed, while the dashboard can be seen. Each buffer
keeps min/max levels as values arrive, so while the plots follow their data a
million-point series reaches its curve as one segment per pixel column (`envelope`:
the picture of the raw series, see tests/widgets/test_dashboard.py); zoomed in by
the user, a curve gets the raw series and pyqtgraph's clipToView and peak
downsampling. A live run's new lines of metrics.jsonl come in as read (append_data)
and are parsed in a process of its own (engine/parse_worker.py) into float64 columns
that the timer takes: the GUI thread never parses a live run's JSON. Records as dicts
(append, set_records) are read here. This widget only displays.

Several runs can be overlaid: colour per run, line style per series (solid = train,
dashed with dots = validation), a checkable run list to show/hide each.
"""
from __future__ import annotations

import bisect
import math
import mmap
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import pyqtgraph as pg
from PySide6 import QtCore, QtGui, QtWidgets
from PySide6.QtCore import Qt

from engine.parse_worker import ParseWorker
from engine.tail import columns, parse_jsonl

try:  # vectorised EMA (scipy comes with scikit-learn); a loop otherwise
    from scipy.signal import lfilter
except ImportError:  # pragma: no cover
    lfilter = None

# Colour per run: a palette that stays readable on light and dark backgrounds.
RUN_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
              "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
RANK_STYLES = [Qt.SolidLine, Qt.DashLine, Qt.DotLine, Qt.DashDotLine, Qt.DashDotDotLine]


@dataclass(frozen=True)
class PlotSpec:
    id: str
    title: str
    y_label: str
    log_able: bool = False  # the log-y toggle applies to it
    legend_at_bottom: bool = False  # rising curves: keep the legend off their end


PLOTS = [
    PlotSpec("loss", "Loss", "loss", log_able=True),
    PlotSpec("acc", "Accuracy", "accuracy", legend_at_bottom=True),
    PlotSpec("lr", "Learning rate", "lr", log_able=True),
    PlotSpec("throughput", "Throughput", "samples/s"),
    PlotSpec("memory", "Peak memory per rank", "MB", legend_at_bottom=True),
    PlotSpec("step_time", "Step time per rank", "ms", legend_at_bottom=True),
]


LOG_PLOTS = {p.id for p in PLOTS if p.log_able}


@dataclass(frozen=True)
class SeriesSpec:
    key: str  # series key: the record key, or key[rank] for per-rank lists
    plot: str
    label: str
    eval: bool = False  # sparse points (one per evaluation): dashed line with dots
    smooth: bool = False  # the EMA slider applies
    rank: int = 0


_STATIC = {
    "loss": SeriesSpec("loss", "loss", "train", smooth=True),
    "val_loss": SeriesSpec("val_loss", "loss", "val", eval=True),
    "acc": SeriesSpec("acc", "acc", "train", smooth=True),
    "train_acc": SeriesSpec("train_acc", "acc", "train", smooth=True),
    "val_acc": SeriesSpec("val_acc", "acc", "val", eval=True),
    "lr": SeriesSpec("lr", "lr", "lr"),
    "samples_per_s": SeriesSpec("samples_per_s", "throughput", "samples/s", smooth=True),
}
# Peak memory: a list per rank (`"peak_mem_mb": [r0, r1]`), a scalar (rank 0), or
# one key per rank (`"peak_mem_mb_rank1"`); all land on the memory plot.
_MEM = re.compile(r"^(peak_)?mem(ory)?(_\w*?)?(_rank(?P<rank>\d+))?$")
# One rank's own numbers in a multi-process run (engine/tail.py RankMetricsTail):
# its step time, its throughput and, on a last pipeline stage, its replica's loss.
_PER_RANK = re.compile(r"^(?P<what>step_ms|samples_per_s|loss)_rank(?P<rank>\d+)$")
_PER_RANK_PLOT = {"step_ms": ("step_time", "rank {}"), "samples_per_s": ("throughput", "rank {}"),
                  "loss": ("loss", "rank {} (its replica)")}


_SPEC_CACHE: dict[str, SeriesSpec | None] = {}
_RANK_CACHE: dict[tuple[str, int], SeriesSpec] = {}


def _spec_for(key: str) -> SeriesSpec | None:
    """The series a record key feeds (None: not plotted); cached, records repeat keys."""
    try:
        return _SPEC_CACHE[key]
    except KeyError:
        pass
    spec = _STATIC.get(key)
    if spec is None and (m := _PER_RANK.match(key)):
        plot, label = _PER_RANK_PLOT[m.group("what")]
        r = int(m.group("rank"))
        spec = SeriesSpec(key, plot, label.format(r), smooth=plot != "step_time", rank=r)
    elif spec is None:
        m = _MEM.match(key)
        if m:
            r = int(m.group("rank") or 0)
            spec = SeriesSpec(key, "memory", f"rank {r}", rank=r)
    _SPEC_CACHE[key] = spec
    return spec


def _rank_spec(key: str, rank: int) -> SeriesSpec:
    spec = _RANK_CACHE.get((key, rank))
    if spec is None:
        spec = _RANK_CACHE[(key, rank)] = SeriesSpec(f"{key}[{rank}]", "memory", f"rank {rank}", rank=rank)
    return spec


def series_values(record: dict) -> list[tuple[SeriesSpec, float]]:
    """The plottable finite numbers of one metrics record."""
    out = []
    for k, v in record.items():
        spec = _spec_for(k)
        if spec is None:
            continue
        tv = type(v)
        if tv is float or tv is int:
            if math.isfinite(v):
                out.append((spec, float(v)))
        elif tv is list and spec.plot == "memory":  # one value per rank
            for r, x in enumerate(v):
                if (type(x) is float or type(x) is int) and math.isfinite(x):
                    out.append((_rank_spec(k, r), float(x)))
    return out


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


BLOCK = 16  # values per block of the finest min/max level (see _Buffer and envelope)


_SMALL = 1 << 16  # values (512 KiB): up to this, a buffer is a numpy array that doubles
_RESERVE = 1 << 24  # values (128 MiB of address space): what a larger buffer maps at once
_LEVEL_SMALL = 1 << 12  # values: a min/max level past this fills a reservation (see _Level)


def _empty(n: int, reserve: int = 0, small: int = _SMALL) -> np.ndarray:
    """An uninitialised float64 array of n values or more. A large one is a private
    anonymous mapping of `reserve` values (n if that is larger): address space, whose
    pages the kernel supplies, zeroed, as they are first written. So a series of a
    million values grows in the one array it started with, each value written once;
    growing by copying into new arrays cost a 45-series overlay 13 ms of its 17 ms
    per update here, against 3 ms this way. The mapping is marked MADV_NOHUGEPAGE:
    with transparent huge pages the kernel zeroes (and may compact memory for) 2 MiB
    at a time on first touch, which stalled one update for 150-280 ms. Where the
    address space cannot be had (a strict overcommit policy, a ulimit -v), n values.
    Up to `small` values, a plain array."""
    if n <= small or not hasattr(mmap, "MAP_PRIVATE"):
        return np.empty(n, dtype=np.float64)
    for size in dict.fromkeys((max(n, reserve), n)):
        try:
            m = mmap.mmap(-1, size * 8, flags=mmap.MAP_PRIVATE)
        except (OSError, OverflowError):
            continue
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            m.madvise(mmap.MADV_NOHUGEPAGE)
        return np.frombuffer(m, dtype=np.float64)  # keeps the mapping alive; unmapped with its last view
    return np.empty(n, dtype=np.float64)


class _Buffer:
    """A float64 array that grows without a pause: `a` is always one contiguous array
    and `view()` its filled part (no copy). Past _SMALL values it is a reservation of
    _RESERVE values (see _empty) that fills in place. When an array must be replaced
    (a small one outgrown, a reservation filling up), it does not copy everything when
    it is full (which at a million values costs milliseconds, and which every series
    of a run would pay in the same update): it starts the next array once the current
    one is half full and moves two old values into it for every new one, so the new
    array is complete when the old one fills: each extend costs O(new values). With
    `envelope`, it also keeps the min and max of every complete block of BLOCK * 2**k
    values, for every level k with two blocks or more, updated as values arrive:
    O(new values) per update, n/BLOCK extra values in all."""

    def __init__(self, capacity: int = 256, envelope: bool = False):
        self.a = _empty(max(capacity, 2))
        self.n = 0
        self._next: np.ndarray | None = None  # the larger array being filled
        self._moved = 0  # values of `a` already copied into it
        self.levels: list[_Level] | None = [] if envelope else None
        self.lo, self.hi = math.inf, -math.inf  # the smallest and largest value so far

    def extend(self, values) -> None:
        values = np.asarray(values, dtype=np.float64)
        k, n = len(values), self.n
        if k:
            self.lo, self.hi = min(self.lo, float(values.min())), max(self.hi, float(values.max()))
        need = n + k
        if need > len(self.a):  # more than the free half at once: switch now (O(k) anyway)
            if self._next is not None and len(self._next) >= need:
                bigger, start = self._next, self._moved
            else:
                bigger, start = _empty(max(need, 2 * len(self.a)), _RESERVE), 0
            bigger[start:n] = self.a[start:n]
            self.a, self._next, self._moved = bigger, None, 0
        self.a[n:need] = values
        self.n = need
        if self._next is None and need * 2 >= len(self.a):
            self._next, self._moved = _empty(2 * len(self.a), _RESERVE), 0
        if self._next is not None:
            self._next[n:need] = values
            end = min(self._moved + 2 * k, n)
            self._next[self._moved:end] = self.a[self._moved:end]
            self._moved = max(end, self._moved)
            if self._moved >= n:  # complete: the old values moved, the new ones written
                self.a, self._next, self._moved = self._next, None, 0
        if self.levels is not None:
            self._summarise()

    def _summarise(self) -> None:
        src_lo = src_hi = self.a  # level k sums up level k-1 by pairs
        n_src, size = self.n, BLOCK
        for k in range(64):
            full = n_src // size
            if full < 2:
                break
            if k == len(self.levels):
                self.levels.append(_Level())
            level = self.levels[k]
            if full == level.n:
                break  # no new block here, so none above either
            start, end = level.n * size, full * size
            if k == 0:  # blocks of BLOCK raw values (reduceat: twice as fast as reshape + min)
                at = np.arange(0, end - start, size)
                level.add(np.minimum.reduceat(src_lo[start:end], at), np.maximum.reduceat(src_hi[start:end], at))
            else:  # pairs of the level below
                level.add(np.minimum(src_lo[start:end:2], src_lo[start + 1:end:2]),
                          np.maximum(src_hi[start:end:2], src_hi[start + 1:end:2]))
            src_lo, src_hi, n_src, size = level.lo, level.hi, level.n, 2

    def view(self) -> np.ndarray:
        return self.a[: self.n]


class _Level:
    """The min (`lo`) and max (`hi`) of each of the first n blocks of one size of a
    _Buffer's values. A level has 1/16 of the values or fewer: it doubles while small,
    then reserves the address space of a _RESERVE-value buffer's level (8 MiB) and
    fills it in place. Doubling all the way copied every level of every series in the
    same update whenever the series reached a power of two, and fresh copies of
    megabytes fault their pages in at once: 10-25 ms more at 524,288 points in a
    3-run overlay."""

    __slots__ = ("lo", "hi", "n")

    def __init__(self):
        self.lo, self.hi, self.n = np.empty(64), np.empty(64), 0

    def add(self, lo: np.ndarray, hi: np.ndarray) -> None:
        n = self.n
        need = n + len(lo)
        if need > len(self.lo):
            cap = max(need, 2 * len(self.lo))
            self.lo, self.hi = (_moved_to(_empty(cap, _RESERVE // BLOCK, small=_LEVEL_SMALL), a[:n])
                                for a in (self.lo, self.hi))
        self.lo[n:need], self.hi[n:need] = lo, hi
        self.n = need


def _moved_to(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    new[:len(old)] = old
    return new


def envelope(xb: _Buffer, yb: _Buffer, bins: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The series (xb, yb) as line segments (x, y in pairs of points: pyqtgraph's
    connect="pairs") that draw what it looks like in `bins` columns, about one per
    pixel. Each column is one segment from its min, at its first x, to its max, at
    its last x, its range widened to the previous column's last value so that the
    segments join where the line between the two would. Columns are bins of equal
    counts over the coarsest min/max level of yb with two blocks per bin or more
    (the raw values when there is none); after them come one block of each finer
    level still left, then the last raw values, each a segment from the one before.
    One segment per pixel, where pyqtgraph's peak downsampling draws ten. None when
    there are fewer than two values per bin (nothing to reduce)."""
    parts = envelope_parts(xb, yb, bins)
    return None if parts is None else _pairs(*parts)


def _pairs(x0: np.ndarray, y0: np.ndarray, x1: np.ndarray, y1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segments from (x0, y0) to (x1, y1) as x, y in pairs of points."""
    x = np.empty(2 * len(x0), dtype=np.float64)
    y = np.empty_like(x)
    x[0::2], x[1::2], y[0::2], y[1::2] = x0, x1, y0, y1
    return x, y


def envelope_parts(xb: _Buffer, yb: _Buffer, bins: int, shapes: dict | None = None) -> tuple[np.ndarray, ...] | None:
    """`envelope`'s segments as four arrays, (x0, y0, x1, y1): what _Segments draws,
    built without the pairs in between (the dashboard builds one per series and tick).
    Where they come from in yb (the level, the columns' first and last values, the
    finer blocks left) depends on yb's length and `bins` only: `shapes`, a dict kept
    by the caller while the buffers do not grow, holds it for the next series of
    that length (the five series of a run, which grow together)."""
    n, levels = yb.n, yb.levels
    if n < 2 * bins:
        return None
    shape = shapes.get((n, bins)) if shapes is not None else None
    if shape is None:
        k = next((k for k in range(len(levels) - 1, -1, -1) if levels[k].n >= 2 * bins), -1)
        size, nb = (BLOCK << k, levels[k].n) if k >= 0 else (1, n)
        edges = np.arange(0, bins * nb, nb) // bins  # = arange(bins) * nb // bins
        first = edges * size
        last = np.empty_like(first)
        last[:-1] = first[1:] - 1
        last[-1] = nb * size - 1
        start = nb * size
        more = []  # at most one block of each finer level is left: (level, block)
        for j in range(k - 1, -1, -1):
            size = BLOCK << j
            if levels[j].n * size > start:
                more.append((j, start // size))
                first, last = np.append(first, start), np.append(last, start + size - 1)
                start += size
        shape = (k, nb, edges, first, last, more, start)
        if shapes is not None:
            shapes[n, bins] = shape
    k, nb, edges, first, last, more, start = shape
    lo, hi = (levels[k].lo, levels[k].hi) if k >= 0 else (yb.a, yb.a)
    mn, mx = np.minimum.reduceat(lo[:nb], edges), np.maximum.reduceat(hi[:nb], edges)
    if more:
        mn = np.concatenate((mn, [levels[j].lo[i] for j, i in more]))
        mx = np.concatenate((mx, [levels[j].hi[i] for j, i in more]))
    before = yb.a[last[:-1]]
    np.minimum(mn[1:], before, out=mn[1:])
    np.maximum(mx[1:], before, out=mx[1:])
    xa, ya = xb.a, yb.a
    if start == n:
        return xa[first], mn, xa[last], mx
    return (np.concatenate((xa[first], xa[start - 1:n - 1])), np.concatenate((mn, ya[start - 1:n - 1])),
            np.concatenate((xa[last], xa[start:n])), np.concatenate((mx, ya[start:n])))


class _Segments(pg.GraphicsObject):
    """Line segments in view coordinates, drawn with one QPainter.drawLines: what a
    curve shows while it is an envelope. A PlotDataItem costs pyqtgraph about 0.5 ms
    per curve and update for the same picture (its setData, its bounds computed twice
    more over the data, its path bookkeeping); this holds the segments and their
    bounds and nothing else."""

    def __init__(self, pen: QtGui.QPen):
        super().__init__()
        self.pen = pen
        self._lines = pg.Qt.internals.PrimitiveArray(QtCore.QLineF, 4)
        self._rect = QtCore.QRectF()
        self._n = 0

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """The lines drawn, as x, y in pairs of points."""
        m = self._lines.ndarray()[:self._n]
        return _pairs(m[:, 0], m[:, 1], m[:, 2], m[:, 3])

    def clear(self) -> None:
        empty = np.empty(0)
        self.set_columns(empty, empty, empty, empty)

    def set_columns(self, x0: np.ndarray, y0: np.ndarray, x1: np.ndarray, y1: np.ndarray,
                    width: int = 1, px: float = 0.0, py: float = 0.0) -> None:
        """The segments from (x0, y0) to (x1, y1). With `width` > 1, drawn by a
        1-pixel pen as a `width`-pixel pen draws them (px, py: a pixel's size in
        view units): `width` copies, each one pixel to the right of
        the one before, made longer by (width - 1) / 2 pixels at both ends. Written
        straight into the QLineF array that is drawn."""
        k = len(x0)
        if width > 1 and k:
            half = (width - 1) / 2 * py
            grow = np.where(y1 >= y0, half, -half)
            y0, y1 = y0 - grow, y1 + grow
        else:
            width = 1
        self._n = k * width
        self._lines.resize(self._n)
        m = self._lines.ndarray()
        for i in range(width):
            block = m[i * k:(i + 1) * k]
            if i:
                np.add(x0, i * px, out=block[:, 0])
                np.add(x1, i * px, out=block[:, 2])
            else:
                block[:, 0], block[:, 2] = x0, x1
            block[:, 1], block[:, 3] = y0, y1
        self.prepareGeometryChange()
        if k:
            xs, ys = m[:self._n, 0::2], m[:self._n, 1::2]
            left, top = float(xs.min()), float(ys.min())
            self._rect = QtCore.QRectF(left, top, float(xs.max()) - left, float(ys.max()) - top)
        else:
            self._rect = QtCore.QRectF()
        self.informViewBoundsChanged()
        self.update()

    def count(self) -> int:
        """How many lines it draws."""
        return self._n

    def boundingRect(self) -> QtCore.QRectF:
        return self._rect

    def dataBounds(self, ax: int, frac: float = 1.0, orthoRange=None):
        if not self._n:
            return None, None
        r = self._rect
        return (r.left(), r.right()) if ax == 0 else (r.top(), r.bottom())

    def paint(self, p, *args) -> None:
        if self._n:
            p.setPen(self.pen)
            p.drawLines(*self._lines.drawargs())


def ema(values: np.ndarray, weight: float, start: float | None = None) -> np.ndarray:
    """s[i] = w*s[i-1] + (1-w)*x[i], starting from `start` (default: the first value).
    Non-finite inputs are replaced by the running value so one NaN does not poison the rest."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0 or weight <= 0:
        return values.copy()
    s = float(values[0]) if start is None or not math.isfinite(start) else float(start)
    if not np.all(np.isfinite(values)):
        values = values.copy()
        bad = ~np.isfinite(values)
        values[bad] = s if math.isfinite(s) else 0.0
    if lfilter is not None:
        out, _ = lfilter([1.0 - weight], [1.0, -weight], values, zi=[weight * s])
        return out
    out = np.empty_like(values)  # pragma: no cover
    for i, x in enumerate(values):
        s = weight * s + (1 - weight) * x
        out[i] = s
    return out


class _Series:
    def __init__(self, spec: SeriesSpec):
        self.spec = spec
        self.step = _Buffer()
        self.time = _Buffer()
        self.y = _Buffer(envelope=True)
        self.smoothed = _Buffer(envelope=True)
        self.curve: pg.PlotDataItem | None = None
        self.pen: QtGui.QPen | None = None  # its own
        self.thin_pen: QtGui.QPen | None = None  # 1 pixel, for its envelope (see Dashboard._envelope)
        self.segments: _Segments | None = None  # its envelope, while it shows one
        self.raw = False  # the curve holds the raw series
        self.dirty = True


class _Parts(list):
    """Pieces of one series' new values (arrays), joined once per poll."""

    def joined(self) -> np.ndarray:
        if len(self) == 1:  # one batch a poll, the usual case: no copy
            return self[0]
        return np.concatenate([np.asarray(v, dtype=np.float64) for v in self])


class _Run:
    def __init__(self, key: str, label: str, color: str):
        self.key, self.label, self.color = key, label, color
        self.visible = True
        self.kept: list[list[dict] | bytes] = []  # its records: polls' dicts, or their lines as read
        self.in_flight = 0  # its chunks at the parse process (and records queued behind them)
        self.t0: float | None = None
        self.t_last = 0.0
        self.series: dict[str, _Series] = {}
        self.peaks: pg.ScatterPlotItem | None = None  # final peak memory per rank
        self.peak_values: list[float] = []


class _GridAxis(pg.AxisItem):
    """An axis whose grid lines are opaque: pyqtgraph draws them in the tick colour at
    a low alpha, and Qt's raster engine hands every translucent line to its GUI
    thread pool, whose wake-ups cost more than all the rest of a repaint on a small
    machine. Here each grid pen gets the colour it had, blended over the plot's
    background beforehand; the axis is put behind the view box so that the curves
    cross the grid (a translucent grid tinted them slightly).

    The axes of one dashboard share their latest ticks (`shared`):
    the x axes of all plots are linked and the same size, so when the x range moves
    one of them lays out the ticks and labels and the others reuse them."""

    def __init__(self, orientation: str, background: QtGui.QColor, shared: dict):
        super().__init__(orientation)
        self._bg = QtGui.QColor(background)
        self._opaque: dict[int, QtGui.QPen] = {}
        self._shared = shared.setdefault("specs", {})  # key: generateDrawSpecs' result
        self._pixmaps = shared.setdefault("pixmaps", {})  # key: the axis drawn (see paint)
        self._text_sizes: dict[str, dict[str, tuple[float, float]]] = {}  # font key: label: (width, height)
        # painted once into a pixmap and blitted until its ticks change (see paint):
        # replaying the axis' QPicture cost 0.2 ms per axis and repaint, 12 axes here
        self._pixmap: tuple | None = None  # (pixmap, x, y) while self.picture is set
        # two levels of grid, not pyqtgraph's three: its third (a line every tenth of a
        # major step) doubled the cost of laying out an axis (1.4 ms to 0.75 ms), and
        # when the data of all five plots leaves their ranges in one update, those
        # layouts were the largest part of the slowest updates
        self.setStyle(maxTickLevel=1)

    def _key(self) -> tuple:
        """What the axis' ticks and labels depend on, for `shared`."""
        view = self.linkedView()
        # rounded: the plots' sizes, laid out in floats, differed in the 14th digit
        rect = view.mapRectToItem(self, view.boundingRect()).getRect() if view is not None else ()
        return (self.orientation, *self.range, self.logMode, *(round(v, 3) for v in (*self.size().toTuple(), *rect)))

    def paint(self, p, opt, widget):
        """The axis and its grid from a pixmap, drawn when its ticks change and shared
        by the axes that draw the same (the five x axes): a Qt item cache
        (DeviceCoordinateCache) is one pixmap per item, and when x moved all five were
        drawn again, 0.4 ms each. pyqtgraph sets `picture` to None whenever the axis
        must be drawn again."""
        t = p.worldTransform()
        if t.isScaling() or t.isRotating():  # an export, say: as pyqtgraph does
            return super().paint(p, opt, widget)
        rect = self.boundingRect()
        dpr = p.device().devicePixelRatioF() if p.device() is not None else 1.0
        left, top = rect.left() + t.dx(), rect.top() + t.dy()  # in device pixels
        x0, y0 = math.floor(left), math.floor(top)
        if self.picture is None or self._pixmap is None or self._pixmap[1:] != (x0 - t.dx(), y0 - t.dy()):
            key = (self._key(), round(left - x0, 3), round(top - y0, 3), math.ceil(rect.width() + left - x0),
                   math.ceil(rect.height() + top - y0), dpr, self.pen().color().rgba(), self.textPen().color().rgba(),
                   self.style["tickFont"].key() if self.style["tickFont"] is not None else None)
            pixmaps = self._pixmaps
            pm = pixmaps.get(key)
            if pm is None:
                pm = QtGui.QPixmap(round(key[3] * dpr), round(key[4] * dpr))
                pm.setDevicePixelRatio(dpr)
                pm.fill(Qt.transparent)
                painter = QtGui.QPainter(pm)
                try:
                    painter.translate(left - x0 - rect.left(), top - y0 - rect.top())
                    if self.style["tickFont"] is not None:
                        painter.setFont(self.style["tickFont"])
                    specs = self.generateDrawSpecs(painter)
                    if specs is not None:
                        self.drawPicture(painter, *specs)
                finally:
                    painter.end()
                if len(pixmaps) >= 16:  # the latest few
                    del pixmaps[next(iter(pixmaps))]
                pixmaps[key] = pm
            self.picture = True  # drawn: until pyqtgraph sets it to None
            self._pixmap = (pm, x0 - t.dx(), y0 - t.dy())
        pm, x, y = self._pixmap
        p.drawPixmap(QtCore.QPointF(x, y), pm)

    def generateDrawSpecs(self, p):
        key = self._key()
        if key in self._shared:
            return self._shared[key]
        specs = self._lean_specs(p) if self._lean() else None
        if specs is None:
            specs = super().generateDrawSpecs(p)
            if specs is not None:
                axis, ticks, texts = specs
                specs = axis, [(self._opaque_pen(pen), p1, p2) for pen, p1, p2 in ticks], texts
        if len(self._shared) >= 8:  # the latest few: one per plot row and orientation
            del self._shared[next(iter(self._shared))]
        self._shared[key] = specs
        return specs

    def _lean(self) -> bool:
        """Whether _lean_specs covers this axis: the dashboard's own (left or bottom,
        with a grid, automatic ticks and labels shown, the axis line not cut at ticks)."""
        st = self.style
        return (self.orientation in ("left", "bottom") and self.grid is not False and self.linkedView() is not None
                and self._tickLevels is None and st["showValues"] and st["tickAlpha"] is None
                and not any(st["stopAxisAtTick"]))

    def _lean_specs(self, p):
        """pyqtgraph's AxisItem.generateDrawSpecs for the axes the dashboard has (see
        _lean), with the same ticks, labels and places (tests/widgets compare them),
        laid out at a third of its cost: 1.1 ms an axis here, paid by every axis whose
        range moves, up to six in one update. Each label's size is measured once per
        font and kept; the axis' bounds are mapped once, not once per label; the grid
        pens are made opaque once per level. Returns None where pyqtgraph would."""
        st = self.style
        if st["tickFont"] is not None:
            p.setFont(st["tickFont"])
        bounds = self.mapRectFromParent(self.geometry())
        view = self.linkedView()
        tick_bounds = view.mapRectToItem(self, view.boundingRect())
        left = self.orientation == "left"
        if left:
            span = (bounds.topRight() + QtCore.QPointF(-1.0, -1.0), bounds.bottomRight() + QtCore.QPointF(-1.0, 1.0))
            tick_start, tick_stop, axis = tick_bounds.right(), bounds.right(), 0
        else:
            span = (bounds.topLeft() + QtCore.QPointF(-1.0, 1.0), bounds.topRight() + QtCore.QPointF(1.0, 1.0))
            tick_start, tick_stop, axis = tick_bounds.top(), bounds.top(), 1
        vt = self.deviceTransform_()
        if vt is None:
            return None
        d = vt.map(span[1]) - vt.map(span[0])
        length = math.hypot(d.x(), d.y())
        if length == 0:
            return None
        levels = self.tickValues(self.range[0], self.range[1], length)
        r0, r1 = self.range
        dif = r1 - r0
        if dif == 0:
            scale, offset = 1, 0
        elif axis == 0:
            scale = -bounds.height() / dif
            offset = r0 * scale - bounds.height()
        else:
            scale = bounds.width() / dif
            offset = r0 * scale
        x_min, x_max = sorted((r0 * scale - offset, r1 * scale - offset))
        positions, tick_specs = [], []
        base = self.tickPen()
        solid = base.brush().style() == Qt.BrushStyle.SolidPattern
        for i, (_, ticks) in enumerate(levels):
            alpha = 255 / (i + 1) * self.grid / 255.0 * min(max(0.05 * length / (len(ticks) + 1), 0.0), 1.0)
            pen = base
            if solid:
                pen = QtGui.QPen(base)
                c = QtGui.QColor(pen.color())
                c.setAlpha(int(alpha))
                pen.setColor(c)
            pen = self._opaque_pen(pen)
            at = []
            for v in ticks:
                x = v * scale - offset
                if x < x_min or x > x_max:
                    at.append(None)
                    continue
                at.append(x)
                if axis == 0:
                    tick_specs.append((pen, QtCore.QPointF(tick_start, x), QtCore.QPointF(tick_stop, x)))
                else:
                    tick_specs.append((pen, QtCore.QPointF(x, tick_start), QtCore.QPointF(x, tick_stop)))
            positions.append(at)
        axis_spec = (self.pen(), span[0], span[1])
        text_offset = st["tickTextOffset"][axis] + max(0, st["tickLength"])
        sizes = self._text_sizes.setdefault(p.font().key(), {})
        if len(sizes) > 4096:  # labels of many ranges: start again
            sizes.clear()
        br = self.boundingRect()
        text_specs, measured = [], []
        size2 = last_size2 = 0
        flags = (Qt.AlignRight | Qt.AlignVCenter if left else Qt.AlignHCenter | Qt.AlignTop) | Qt.TextDontClip
        for i in range(min(len(levels), st["maxTextLevel"] + 1)):
            spacing, values = levels[i]
            strings = self.tickStrings(values, self.autoSIPrefixScale * self.scale, spacing)
            if not strings:
                continue
            rects = []
            for j, s in enumerate(strings):
                if positions[i][j] is None:
                    rects.append(None)
                    continue
                wh = sizes.get(s)
                if wh is None:
                    r = p.boundingRect(QtCore.QRectF(0, 0, 100, 100), Qt.AlignCenter, s)
                    wh = sizes[s] = (r.width(), r.height() * 0.8)  # pyqtgraph's: its rects are a bit tall
                rects.append(wh)
                measured.append(wh)
            size = sum(wh[1 - axis] for wh in measured)  # along the axis
            size2 = max((wh[axis] for wh in measured), default=0)  # across it
            if i > 0 and any(len(text_specs) >= n and size / length >= limit for n, limit in st["textFillLimits"]):
                break  # crowded: no labels on this level
            last_size2 = size2
            for j, s in enumerate(strings):
                x, wh = positions[i][j], rects[j]
                if x is None:
                    continue
                w, h = wh
                if left:
                    rect = QtCore.QRectF(tick_stop - text_offset - w, x - h / 2, w, h)
                else:
                    rect = QtCore.QRectF(x - w / 2.0, tick_stop + text_offset, w, h)
                if br & rect != rect:
                    continue
                text_specs.append((rect, flags, s))
        self._updateMaxTextSize(last_size2)
        return axis_spec, tick_specs, text_specs

    def tickValues(self, minVal, maxVal, size):
        """pyqtgraph's tick values (linear axes), in plain Python: its numpy version
        (np.isclose of every tick against those of the levels above) was a third of
        laying out an axis. A tick within 1% of a step of one on a level above is
        left out, as there."""
        if self.logMode:
            return super().tickValues(minVal, maxVal, size)
        lo, hi = sorted((minVal, maxVal))
        lo, hi, scale = lo * self.scale, hi * self.scale, self.scale
        out, seen = [], []
        for spacing, offset in self.tickSpacing(lo, hi, size):
            start = math.ceil((lo - offset) / spacing) * spacing + offset
            tol = spacing / scale * 0.01
            values = [v for v in ((k * spacing + start) / scale for k in range(int((hi - start) / spacing) + 1))
                      if not _near(seen, v, tol)]
            seen = sorted(seen + values)
            out.append((spacing / scale, values))
        return out

    def tickStrings(self, values, scale, spacing):
        """Large numbers as 200k or 1.2M: pyqtgraph writes 200000 (its SI prefixes
        are off, see _build_ui), and along an x axis of a million steps the labels
        ran into each other."""
        if self.logMode or not values or max(abs(v * scale) for v in values) < 1e4:
            return super().tickStrings(values, scale, spacing)
        return [_short(v * scale, spacing * scale) for v in values]

    def _opaque_pen(self, pen: QtGui.QPen) -> QtGui.QPen:
        c = pen.color()
        out = self._opaque.get(c.rgba())
        if out is None:
            a, bg = c.alphaF(), self._bg
            out = self._opaque[c.rgba()] = QtGui.QPen(pen)
            out.setColor(QtGui.QColor.fromRgbF(*(b + (f - b) * a for f, b in (
                (c.redF(), bg.redF()), (c.greenF(), bg.greenF()), (c.blueF(), bg.blueF())))))
        return out


def _near(ordered: list[float], v: float, tol: float) -> bool:
    """Whether a value of the sorted list `ordered` is within tol of v."""
    i = bisect.bisect_left(ordered, v)
    return (i < len(ordered) and ordered[i] - v <= tol) or (i > 0 and v - ordered[i - 1] <= tol)


def _cache_painting(item: QtWidgets.QGraphicsItem) -> None:
    """Paint `item`, and the text and legend samples under it, once into a pixmap and
    blit that until they change (Qt repaints a cached item when it calls update(), as
    a text item does when its text changes). A cache mode holds for one item, not its
    children, and pyqtgraph's titles, axis labels and legend entries are
    QGraphicsTextItems under the item that lays them out: their text was laid out and
    drawn again on every repaint, 2 ms of the 9 ms that repainting six plots took.
    A pyqtgraph LabelItem (a title, a legend entry's text) only lays out the text
    item under it and draws nothing itself: it is marked as having no contents, so
    that a repaint neither asks it for its bounds (Python) nor blits an empty cached
    pixmap for it, 0.85 ms of a repaint of the five plots of three runs."""
    if type(item) is pg.LabelItem and type(item).paint is QtWidgets.QGraphicsWidget.paint:
        item.setFlag(QtWidgets.QGraphicsItem.ItemHasNoContents)
    else:
        item.setCacheMode(QtWidgets.QGraphicsItem.DeviceCoordinateCache)
    for child in item.childItems():
        if isinstance(child, (QtWidgets.QGraphicsTextItem, pg.ItemSample, pg.LabelItem)):
            _cache_painting(child)


class _LegendSample(pg.ItemSample):
    """A legend entry's sample line in its curve's own pen (`legend_pen`), also while
    the curve is empty and its envelope (a _Segments, maybe of 1-pixel lines) draws."""

    def paint(self, p, *args):
        pen = getattr(self.item, "legend_pen", None)
        if pen is None or not self.item.isVisible() or self.item.opts.get("symbol") is not None:
            return super().paint(p, *args)
        p.setPen(pen)
        p.drawLine(0, 11, 20, 11)


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


class Dashboard(QtWidgets.QWidget):
    """Plots of one or more runs' metrics, updated live."""

    UPDATE_MS = 100  # 10 updates a second
    NEW_CURVES_PER_TICK = 1
    RANGE_MOVES_PER_TICK = 1  # y ranges (see _fit): each laid out again costs a repaint 1.7 ms
    COLUMNS = 4  # 6 plots and the confusion matrix in two rows
    run_visibility_changed = QtCore.Signal(str, bool)

    def __init__(self, parent=None, smoothing: float = 0.0):
        super().__init__(parent)
        self._runs: dict[str, _Run] = {}
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
        bar.addWidget(self.readout, 1)
        bar.addWidget(self.reset_button)
        bar.addWidget(self.export_button)


        self.plots_area = QtWidgets.QWidget()
        grid = QtWidgets.QGridLayout(self.plots_area)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setSpacing(4)
        self.plots: dict[str, pg.PlotWidget] = {}
        self._vlines: dict[str, pg.InfiniteLine] = {}
        first = None
        shared_ticks: dict = {}
        for i, spec in enumerate(PLOTS):
            pw = pg.PlotWidget(background=bg, axisItems={k: _GridAxis(k, bg, shared_ticks) for k in ("left", "bottom")})
            pi = pw.getPlotItem()
            pi.setTitle(f"<span style='font-size:10pt; font-weight:600'>{spec.title}</span>", color=fg)
            pi.showGrid(x=True, y=True, alpha=grid_alpha)
            pi.setLabel("left", spec.y_label)
            pi.setLabel("bottom", "step")
            for ax in ("left", "bottom"):
                pi.getAxis(ax).setPen(fg)
                pi.getAxis(ax).setTextPen(fg)
                pi.getAxis(ax).setZValue(-200)  # grid behind the curves (see _GridAxis)
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
            legend = pi.addLegend(offset=(-8, -8 if spec.legend_at_bottom else 8), labelTextColor=fg,
                                  labelTextSize="8pt", sampleType=_LegendSample)
            legend.setBrush(pg.mkBrush(bg.red(), bg.green(), bg.blue(), 200))
            for item in (legend, pi.titleLabel):
                _cache_painting(item)
            for ax in ("left", "bottom"):  # the axes cache their own painting (see _GridAxis.paint)
                for child in pi.getAxis(ax).childItems():
                    if isinstance(child, QtWidgets.QGraphicsTextItem):  # its label
                        _cache_painting(child)
            vline = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(fg, width=1, style=Qt.DotLine))
            vline.setVisible(False)
            pi.addItem(vline, ignoreBounds=True)
            self._vlines[spec.id] = vline
            if first is None:
                first = pi
            else:
                pi.setXLink(first)  # zoom/pan one plot, all follow
            pw.scene().sigMouseMoved.connect(lambda pos, pid=spec.id: self._mouse_moved(pid, pos))
            pw.setMinimumSize(140, 110)
            self.plots[spec.id] = pw
            grid.addWidget(pw, i // self.COLUMNS, i % self.COLUMNS)
        self.confusion = ConfusionMatrixWidget(background=bg, foreground=fg)
        self.confusion.setMinimumSize(140, 110)
        grid.addWidget(self.confusion, len(PLOTS) // self.COLUMNS, len(PLOTS) % self.COLUMNS)

        self.run_list = QtWidgets.QListWidget()
        self.run_list.setToolTip("Runs on the plots: untick to hide one")
        self.run_list.itemChanged.connect(self._run_item_changed)
        self.run_list.setTextElideMode(Qt.ElideMiddle)
        self.run_list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        key_note = QtWidgets.QLabel("solid: train\ndashed ·: validation\nstyle per rank: memory")
        key_note.setStyleSheet("color: palette(mid); font-size: 8pt;")
        side = QtWidgets.QVBoxLayout()
        side.setContentsMargins(0, 0, 0, 0)
        title = QtWidgets.QLabel("<b>Runs</b>")
        side.addWidget(title)
        side.addWidget(self.run_list, 1)
        side.addWidget(key_note)
        side_w = QtWidgets.QWidget()
        side_w.setLayout(side)
        side_w.setFixedWidth(150)

        body = QtWidgets.QHBoxLayout()
        body.setContentsMargins(0, 0, 0, 0)
        body.addWidget(self.plots_area, 1)
        body.addWidget(side_w)

        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.setSpacing(2)
        lay.addLayout(bar)
        lay.addLayout(body, 1)

    # ----- runs -----------------------------------------------------------------
    def run_keys(self) -> list[str]:
        return list(self._runs)

    def add_run(self, key: str, label: str | None = None, color: str | None = None) -> None:
        """A run to plot (no-op if already there); `key` is any unique string (its folder)."""
        if key in self._runs:
            return
        used = {r.color for r in self._runs.values()}
        color = color or next((c for c in RUN_COLORS if c not in used), RUN_COLORS[len(self._runs) % len(RUN_COLORS)])
        run = _Run(key, label or Path(key).name, color)
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

    def remove_run(self, key: str) -> None:
        run = self._runs.pop(key, None)
        if run is None:
            return
        for s in run.series.values():
            if s.curve is not None:
                self.plots[s.spec.plot].getPlotItem().removeItem(s.curve)
            if s.segments is not None:
                self.plots[s.spec.plot].getPlotItem().vb.removeItem(s.segments)
        if run.peaks is not None:
            self.plots["memory"].getPlotItem().removeItem(run.peaks)
        for i in range(self.run_list.count()):
            if self.run_list.item(i).data(Qt.UserRole) == key:
                self.run_list.takeItem(i)
                break
        self._fit(self.plots)

    def clear(self) -> None:
        for key in list(self._runs):
            self.remove_run(key)
        self.set_confusion(None)
        self.readout.setText(" ")
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

    def append(self, key: str, records: list[dict], lines: list[bytes] | None = None) -> None:
        """New metrics records of a run (plotted at the next timer tick). `lines`: the
        lines of metrics.jsonl they were read from (engine/tail.py), kept instead of the
        dicts: a third of their memory. Three runs of a million records held as dicts
        took 1.5 GB here, and growing that much memory made single updates take 100 ms
        and more."""
        run = self._run(key)
        if records:
            run.kept.append(b"\n".join(lines) if lines is not None else list(records))
        if run.in_flight:  # after the run's lines still being parsed, in their order
            run.in_flight += 1
            self._parser.submit_parsed(run, columns(records))
        else:
            self._ingest(run, *columns(records))

    def append_data(self, key: str, data: bytes) -> None:
        """New lines of a run's metrics.jsonl as read (complete lines joined by newlines:
        engine/tail.py's poll_data), kept at once and parsed in a process of its own
        (engine/parse_worker.py): the GUI thread pays a pipe write now and, at the
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

    def _take_parsed(self, timeout: float = 0.0) -> None:
        """Plot what the parse process has answered (the timer calls this, shown or not:
        the answers wait in a pipe); `timeout`: wait for the first that long."""
        if self._parser is not None and self._parser.pending():
            self._apply(self._parser.ready(timeout))

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
                self._ingest(run, table, rest)

    def _run(self, key: str) -> "_Run":
        run = self._runs.get(key)
        if run is None:
            self.add_run(key)
            run = self._runs[key]
        return run

    def _ingest(self, run: "_Run", table: dict | None, records: list[dict]) -> None:
        """Append a poll's values to the run's series: `table`, the bulk as columns (see
        engine/tail.py's `columns`), and `records`, what is left, one by one."""
        cols: dict[str, tuple[SeriesSpec, list, list, list]] = {}
        t_table = None
        if table is not None:
            if records and run.t0 is None and "time" in table:  # the run's origin: its first timed step
                run.t0 = min([float(table["time"][0]), *(t for r in records if type(r.get("step")) in (int, float)
                                                         and type(t := r.get("time")) in (int, float)
                                                         and math.isfinite(t))])
            self._ingest_columns(run, table, cols)
            t_table = run.t_last
        for r in records:
            step = r.get("step")
            if type(step) is not int and type(step) is not float:
                continue  # event lines (start/end) carry no point
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
                s = run.series[skey] = _Series(spec)
            prev = s.smoothed.a[s.smoothed.n - 1] if s.smoothed.n else None
            steps, times, ys = (parts.joined() if isinstance(parts, _Parts) else parts
                                for parts in (steps, times, ys))
            if not len(ys):
                continue
            s.step.extend(steps)
            s.time.extend(times)
            ys = np.asarray(ys, dtype=np.float64)  # finite only: series_values drops the rest
            s.y.extend(ys)
            if spec.smooth and self._smoothing > 0:  # kept only while it is shown
                s.smoothed.extend(ema(ys, self._smoothing, prev))
            s.dirty = True

    @staticmethod
    def _ingest_columns(run: "_Run", table: dict[str, np.ndarray], cols: dict) -> None:
        """The plotted columns of a table (engine/tail.py's `columns`: a batch of records
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
            spec = _spec_for(k)
            if spec is None:
                continue
            ok = np.isfinite(ys)
            c = cols.get(spec.key)
            if c is None:
                c = cols[spec.key] = (spec, _Parts(), _Parts(), _Parts())
            for part, values in zip(c[1:], (step, rel, ys)):
                part.append(values if ok.all() else values[ok])

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
        for i in range(self.run_list.count()):
            item = self.run_list.item(i)
            if item.data(Qt.UserRole) == key:
                state = Qt.Checked if visible else Qt.Unchecked
                if item.checkState() != state:
                    item.setCheckState(state)
        self._fit(self.plots)  # the ranges of what is still shown
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
        for pw in self.plots.values():
            pw.getPlotItem().setLabel("bottom", "step" if mode == "step" else "wall time (s)")
        self._mark_all_dirty()
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
                    s.smoothed = _Buffer(max(s.y.n, 1), envelope=True)
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
        self._fit(self.plots)

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

    def _buffers(self, s: _Series) -> tuple[_Buffer, _Buffer]:
        xb = s.step if self._x_mode == "step" else s.time
        yb = s.smoothed if s.spec.smooth and self._smoothing > 0 else s.y
        return xb, yb

    def _live(self) -> bool:
        """Whether the plots show their data whole (see _envelope): following, or
        pyqtgraph's own auto-range (its menu) on the first plot, which all plots' x
        follows (setXLink)."""
        return self._follow or self.plots[PLOTS[0].id].getPlotItem().vb.autoRangeEnabled()[0]

    def _envelope(self, s: _Series, geometry: dict, shapes: dict) -> tuple | None:
        """What the series shows while the plots follow their data (the live case)
        and it has two values per pixel or more: its envelope (`envelope_parts`) in
        view coordinates (log10 on a log-y plot), one segment per pixel column
        (columns half a pen width apart), as _Segments.set_columns takes it: what the
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
            pw = self.plots[plot_id]
            vb = pw.getPlotItem().vb
            dpr = pw.devicePixelRatioF()
            (x0, x1), (y0, y1) = vb.viewRange()
            g = geometry[plot_id] = (max(vb.width(), 200.0) * dpr, (x1 - x0) / max(vb.width() * dpr, 1.0),
                                     (y1 - y0) / max(vb.height() * dpr, 1.0), self._log_y and plot_id in LOG_PLOTS)
        columns, px, py, log = g
        width = s.pen.widthF()
        parts = envelope_parts(*self._buffers(s), int(columns * 2 / max(width, 1.0)), shapes)
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
        s = self._runs.get(key, _Run("", "", "")).series.get(series)
        return s.curve if s else None

    def _make_curve(self, run: _Run, s: _Series) -> pg.PlotDataItem:
        spec = s.spec
        style = Qt.DashLine if spec.eval else RANK_STYLES[spec.rank % len(RANK_STYLES)]
        per_rank = _PER_RANK.match(spec.key) is not None and spec.plot != "step_time"  # beside the run's own curve
        pen = pg.mkPen(run.color, width=1 if per_rank else 2 if not spec.eval else 1.5, style=style)
        kw = {}
        if spec.eval:
            kw = dict(symbol="o", symbolSize=5, symbolBrush=run.color, symbolPen=None)
        name = spec.label if len(self._runs) == 1 else f"{run.label}: {spec.label}"
        # Only finite values reach the buffers, so pyqtgraph may skip its own scan.
        curve = pg.PlotDataItem(pen=pen, name=name, skipFiniteCheck=True, **kw)
        curve.legend_pen = s.pen = pen  # the legend shows it whichever item draws (_LegendSample)
        s.thin_pen = None
        if pen.widthF() == 2 and style == Qt.SolidLine:  # see _envelope
            s.thin_pen = pg.mkPen(run.color, width=1)
        # shown or hidden (the run list, a click on the legend): its envelope too
        curve.visibleChanged.connect(lambda: s.segments is not None and s.segments.setVisible(curve.isVisible()))
        curve.setClipToView(True)
        curve.setDownsampling(auto=True, method="peak")
        curve.setVisible(run.visible)
        pi = self.plots[spec.plot].getPlotItem()
        pi.addItem(curve)
        if pi.legend is not None:
            _cache_painting(pi.legend)  # its new entry
            sample = next((smp for smp, _ in pi.legend.items if smp.item is curve), None)
            if sample is not None:  # a cached sample shows the curve hidden or not: repaint it then
                curve.visibleChanged.connect(sample.update)
        return curve

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
        At most `new_curves` curves are made (default: all), the rest at the next call:
        a new curve and its legend entry cost pyqtgraph about 6 ms here, so three runs
        of five series appearing together would hold one update for 90 ms; one a tick
        keeps the updates that make them near the others (all 15 shown within 1.5 s).
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
        live, geometry, shapes = self._live(), {}, {}
        for run in self._runs.values():
            for s in run.series.values():
                if not s.dirty:
                    continue
                if s.curve is None:
                    if new_curves is not None:
                        if new_curves <= 0:
                            continue  # stays dirty: the next tick
                        new_curves -= 1
                    s.curve = self._make_curve(run, s)
                env = self._envelope(s, geometry, shapes) if live else None
                if env is not None:
                    if s.segments is None:
                        s.segments = _Segments(s.thin_pen or s.pen)
                        s.segments.setVisible(s.curve.isVisible())
                        self.plots[s.spec.plot].getPlotItem().vb.addItem(s.segments)
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
                        lo, hi = min(lo, s.y.lo), max(hi, s.y.hi)
                if plot_id == "memory" and run.peak_values:
                    lo, hi = min(lo, *run.peak_values), max(hi, *run.peak_values)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return None
        vb = self.plots[plot_id].getPlotItem().vb
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
        vb = self.plots[plot_id].getPlotItem().vb
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
            for skey, s in run.series.items():
                xs, ys = self.series_data(run.key, skey)
                if len(xs) == 0:
                    continue
                i = int(np.clip(np.searchsorted(xs, x), 0, len(xs) - 1))
                if i > 0 and abs(xs[i - 1] - x) <= abs(xs[i] - x):
                    i -= 1
                vals.append(f"{skey} {_fmt(ys[i])}")
            if vals:
                parts_text.append(f"{run.label}: " + ", ".join(vals))
                parts_html.append(f"<span style='color:{run.color}'>■</span> <b>{run.label}</b>: " + ", ".join(vals))
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
        run.peaks = pg.ScatterPlotItem(spots=spots, name=f"{run.label}: peak per rank" if len(self._runs) > 1
                                       else "peak per rank (o rank 0, □ rank 1, …)")
        run.peaks.setToolTip("\n".join(f"rank {r}: {v:.1f} MB" for r, v in enumerate(peaks)))
        run.peaks.setVisible(run.visible)
        pi.addItem(run.peaks)
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
        from engine.runs import write_metrics_csv

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


def _short(v: float, spacing: float) -> str:
    """v with a k, M or G suffix and as many decimals as ticks `spacing` apart need."""
    unit, suffix = next(((u, x) for u, x in ((1e9, "G"), (1e6, "M"), (1e3, "k")) if abs(v) >= u), (1.0, ""))
    step, decimals = spacing / unit, 0  # the decimals a multiple of the spacing needs
    while decimals < 6 and abs(round(step, decimals) - step) > 1e-9 * step:
        decimals += 1
    text = f"{v / unit:.{decimals}f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + suffix


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    a = abs(v)
    if a != 0 and (a < 1e-3 or a >= 1e5):
        return f"{v:.3g}"
    return f"{v:.4g}"


class ConfusionMatrixWidget(pg.PlotWidget):
    """Counts of (true class, predicted class) as a heat map with the numbers on it."""

    MAX_LABELLED = 16  # above this many classes, cell numbers would not fit

    def __init__(self, background=None, foreground=None, parent=None):
        super().__init__(parent, background=background)
        self._fg = foreground if foreground is not None else QtGui.QColor("black")
        pi = self.getPlotItem()
        pi.setTitle("<span style='font-size:10pt; font-weight:600'>Confusion matrix (validation)</span>", color=self._fg)
        pi.setLabel("left", "true class")
        pi.setLabel("bottom", "predicted class")
        for ax in ("left", "bottom"):
            pi.getAxis(ax).setPen(self._fg)
            pi.getAxis(ax).setTextPen(self._fg)
        pi.setMouseEnabled(False, False)
        pi.hideButtons()
        pi.invertY(True)
        pi.setAspectLocked(False)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.image.setColorMap(pg.colormap.get("CET-L12") if "CET-L12" in pg.colormap.listMaps() else pg.colormap.get("viridis"))
        pi.addItem(self.image)
        self._texts: list[pg.TextItem] = []
        self.empty = pg.TextItem("no confusion matrix yet:\nshown after a classification run", color=self._fg, anchor=(0.5, 0.5))
        pi.addItem(self.empty)
        self.matrix: np.ndarray | None = None
        self.set_matrix(None)

    def set_matrix(self, matrix, labels=None, title: str | None = None) -> None:
        pi = self.getPlotItem()
        for t in self._texts:
            pi.removeItem(t)
        self._texts = []
        if title:
            pi.setTitle(f"<span style='font-size:10pt; font-weight:600'>{title}</span>", color=self._fg)
        if matrix is None:
            self.matrix = None
            self.image.clear()
            self.image.setVisible(False)
            self.empty.setVisible(True)
            self.empty.setPos(0.5, 0.5)
            pi.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
            for ax in ("left", "bottom"):
                pi.getAxis(ax).setTicks(None)
            return
        m = np.asarray(matrix, dtype=np.float64)
        if m.ndim != 2 or m.shape[0] != m.shape[1]:
            raise ValueError(f"a confusion matrix must be square, got shape {m.shape}")
        n = m.shape[0]
        self.matrix = m
        self.empty.setVisible(False)
        # Colour by the row's share so rare classes read as clearly as common ones.
        rows = m.sum(axis=1, keepdims=True)
        share = np.divide(m, rows, out=np.zeros_like(m), where=rows > 0)
        self.image.setImage(share, levels=(0, 1), autoLevels=False)
        self.image.setRect(QtCore.QRectF(-0.5, -0.5, n, n))
        self.image.setVisible(True)
        labels = [str(x) for x in (labels if labels is not None else range(n))]
        step = max(1, n // 12)
        ticks = [[(i, labels[i]) for i in range(0, n, step)]]
        for ax in ("left", "bottom"):
            pi.getAxis(ax).setTicks(ticks)
        if n <= self.MAX_LABELLED:
            font = QtGui.QFont()
            font.setPointSizeF(8 if n <= 6 else 7 if n <= 12 else 6)
            for i in range(n):
                for j in range(n):
                    color = "white" if share[i, j] > 0.5 else self._fg
                    t = pg.TextItem(f"{int(m[i, j])}", color=color, anchor=(0.5, 0.5))
                    t.setFont(font)
                    t.setPos(j, i)
                    pi.addItem(t)
                    self._texts.append(t)
        pi.setRange(xRange=(-0.5, n - 0.5), yRange=(-0.5, n - 0.5), padding=0.02)
