"""A series' values as they arrive, and what a plot draws of them: numpy only.

`MinMaxBuffer` is a float64 array that grows without a pause (large ones in a
reserved mapping, see `_empty`) and keeps, as values arrive, the min and max of
every block of BLOCK * 2**k values (`MinMaxLevel`, one per k). `envelope` and
`envelope_parts` read those levels to give a series as one line segment per pixel
column: the picture of the raw series without touching its million values.
`ema` is the exponential moving average of the smoothing slider. No Qt and no
pyqtgraph here (tests/widgets/test_dashboard_buffers.py checks it): the dashboard
(widget.py) and its segments item (segments.py) draw what these compute.
"""
from __future__ import annotations

import math
import mmap

import numpy as np

try:  # vectorised EMA (scipy comes with scikit-learn); a loop otherwise
    from scipy.signal import lfilter
except ImportError:  # pragma: no cover
    lfilter = None


BLOCK = 16  # values per block of the finest min/max level (see MinMaxBuffer and envelope)


_SMALL = 1 << 16  # values (512 KiB): up to this, a buffer is a numpy array that doubles
_RESERVE = 1 << 24  # values (128 MiB of address space): what a larger buffer maps at once
_LEVEL_SMALL = 1 << 12  # values: a min/max level past this fills a reservation (see MinMaxLevel)


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


class MinMaxBuffer:
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
        self.levels: list[MinMaxLevel] | None = [] if envelope else None
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
                self.levels.append(MinMaxLevel())
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


class MinMaxLevel:
    """The min (`lo`) and max (`hi`) of each of the first n blocks of one size of a
    MinMaxBuffer's values. A level has 1/16 of the values or fewer: it doubles while
    small, then reserves the address space of a _RESERVE-value buffer's level (8 MiB)
    and fills it in place. Doubling all the way copied every level of every series in the
    same update whenever the series reached a power of two, and fresh copies of
    megabytes fault their pages in at once: 10-25 ms more at 524,288 points in a
    3-run overlay."""

    __slots__ = ("hi", "lo", "n")

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


def envelope(xb: MinMaxBuffer, yb: MinMaxBuffer, bins: int) -> tuple[np.ndarray, np.ndarray] | None:
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
    return None if parts is None else pairs(*parts)


def pairs(x0: np.ndarray, y0: np.ndarray, x1: np.ndarray, y1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segments from (x0, y0) to (x1, y1) as x, y in pairs of points."""
    x = np.empty(2 * len(x0), dtype=np.float64)
    y = np.empty_like(x)
    x[0::2], x[1::2], y[0::2], y[1::2] = x0, x1, y0, y1
    return x, y


def envelope_parts(xb: MinMaxBuffer, yb: MinMaxBuffer, bins: int,
                   shapes: dict | None = None) -> tuple[np.ndarray, ...] | None:
    """`envelope`'s segments as four arrays, (x0, y0, x1, y1): what segments.py's
    Segments draws, built without the pairs in between (the dashboard builds one per
    series and tick).
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
