"""The dashboard's buffers without Qt (widgets/dashboard/buffers.py): min/max levels
built as values arrive equal a full pass, a buffer grows without copying everything
at once, the envelope of a series covers it exactly, the EMA skips non-finite values.
This file imports neither Qt nor pyqtgraph, and checks that the buffers, the series'
names and the runs' model load without them."""
import mmap
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from widgets.dashboard.buffers import BLOCK, MinMaxBuffer, ema, envelope

ROOT = Path(__file__).resolve().parents[2]


def test_buffers_series_and_runs_import_without_qt():
    """In a fresh interpreter (pytest-qt has loaded Qt into this one): the modules of
    the dashboard that compute, not draw, load no Qt and no pyqtgraph."""
    code = ("import sys\n"
            "import widgets.dashboard.buffers, widgets.dashboard.series, widgets.dashboard.ingest\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'shiboken6', 'pyqtgraph')))\n"
            "print('widgets.dashboard.widget' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[]", "False"]


def test_ema_ignores_non_finite_values():
    out = ema(np.array([1.0, np.nan, 3.0]), 0.5)
    assert out.tolist() == [1.0, 1.0, 2.0]
    assert ema(np.array([1.0, 2.0]), 0.0).tolist() == [1.0, 2.0]


def check_envelope(cx, cy, values):
    """Segments (x = index) of a series of `values`: each covers the values of its
    index range and the last value of the previous one, min to max exactly; together
    they cover the series in order; the raw tail is drawn point to point."""
    x0, x1, y0, y1 = cx[0::2].astype(int), cx[1::2].astype(int), cy[0::2], cy[1::2]
    assert x0[0] == 0 and x1[-1] == len(values) - 1
    column = np.r_[True, x0[1:] == x1[:-1] + 1]  # a column starts after the previous one
    tail = np.r_[False, x0[1:] == x1[:-1]]  # a raw segment starts where the previous one ends
    assert np.all(column ^ tail) and np.all(np.diff(tail.astype(int)) >= 0)  # columns, then the raw tail
    for i in np.flatnonzero(column):
        span = values[x0[i] - 1 if i else 0: x1[i] + 1]
        assert (y0[i], y1[i]) == (span.min(), span.max())
    assert np.array_equal(y0[tail], values[x0[tail]]) and np.array_equal(y1[tail], values[x1[tail]])
    assert np.all(x1[tail] == x0[tail] + 1)
    assert cy.min() == values.min() and cy.max() == values.max()


@pytest.mark.parametrize("chunks", [[5000] * 40, [1] * 50 + [7, 13, 999, 64 * 16 + 3] + [30_000] * 6,
                                    [3, 700_001] + [99_999] * 9 + [1] * 40])
def test_min_max_levels_built_as_values_arrive_equal_a_full_pass(chunks):
    values = np.random.default_rng(2).standard_normal(sum(chunks))
    b = MinMaxBuffer(envelope=True)
    at = 0
    for k in chunks:
        b.extend(values[at: at + k])
        at += k
    assert np.array_equal(b.view(), values)
    assert len(b.levels) >= 2
    for k, level in enumerate(b.levels):
        size = BLOCK << k
        blocks = values[: len(values) // size * size].reshape(-1, size)
        assert np.array_equal(level.lo[:level.n], blocks.min(axis=1))
        assert np.array_equal(level.hi[:level.n], blocks.max(axis=1))
        if level.n > 1 << 12:  # a large level fills a reservation in place (no doubling)
            assert isinstance(getattr(level.lo.base, "obj", None), mmap.mmap) and len(level.lo) >= 1 << 20


def test_a_buffer_grows_without_copying_everything_at_once():
    """Each extend moves at most two old values per new one into the next, larger array
    (never all of them in one update, as a doubling does), and large arrays are plain
    pages (no transparent huge pages, whose first touch stalled updates)."""
    b, at, worst = MinMaxBuffer(capacity=16), 0, 0
    values = np.arange(2_000_000, dtype=np.float64)
    for k in [1_000] * 50 + [10_000] * 195:
        before = b._moved if b._next is not None else 0
        had_next = b._next is not None
        b.extend(values[at: at + k])
        at += k
        assert np.array_equal(b.view(), values[:at])
        if had_next and b._next is not None:
            worst = max(worst, (b._moved - before) / k)
    assert 0 < worst <= 2
    assert len(b.a) >= at and isinstance(b.a.base.obj, mmap.mmap)  # frombuffer: a memoryview of the map


@pytest.mark.parametrize("n", [50, 2 * 400, 12_345, 300_001])
def test_envelope_segments_cover_the_series(n):
    values = np.cumsum(np.random.default_rng(3).standard_normal(n))
    xb, yb = MinMaxBuffer(), MinMaxBuffer(envelope=True)
    xb.extend(np.arange(n, dtype=np.float64))
    yb.extend(values)
    env = envelope(xb, yb, 400)
    if n < 800:
        assert env is None  # under two values per column: drawn as they are
        return
    check_envelope(*env, values)
    assert len(env[0]) // 2 <= 400 + 40
