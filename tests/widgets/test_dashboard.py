"""The dashboard on metrics.jsonl files written here in the runtime's format:
curves hold the data, x by step or wall time, EMA smoothing, log y, crosshair,
several runs overlaid with show/hide, CSV export equal to metrics.jsonl, PNG export,
peak memory per rank, the confusion matrix; envelopes drawn as the raw series
draws, the axes' own tick layout equal to pyqtgraph's. The buffers and envelopes
on their own, without Qt: test_dashboard_buffers.py."""
import csv
import json
import math
import os

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QImage, QPainter
import pyqtgraph as pg

from engine.runs.tail import MetricsTail, read_metrics
from widgets.dashboard import (ConfusionMatrixWidget, Dashboard, GridAxis, MinMaxBuffer, Segments, ema, envelope,
                               envelope_parts)
from widgets.dashboard.ingest import Run, ingest_columns

from test_dashboard_buffers import check_envelope  # beside this file (pytest puts its folder on sys.path)

pytestmark = pytest.mark.gui


def write_metrics(path, n=40, t0=12.5, eval_every=10, loss0=2.0, ranks=None):
    """Lines as engine/runtime/loop.py writes them, plus an end event."""
    with open(path, "w") as f:
        for s in range(1, n + 1):
            rec = {"step": s, "epoch": s // 20, "time": t0 + 0.25 * s, "loss": loss0 * math.exp(-s / 15) + 0.01 * (s % 3),
                   "lr": 1e-3 * (1 - s / (2 * n)), "samples_per_s": 500.0 + s, "peak_mem_mb": 100.0 + s / 10}
            if ranks:
                rec["peak_mem_mb"] = [100.0 + r + s / 10 for r in range(ranks)]
            f.write(json.dumps(rec) + "\n")
            if s % eval_every == 0:
                f.write(json.dumps({"step": s, "epoch": s // 20, "time": t0 + 0.25 * s + 0.01, "lr": rec["lr"],
                                    "val_loss": loss0 * math.exp(-s / 18), "val_acc": min(1.0, s / n)}) + "\n")
        f.write(json.dumps({"event": "end", "state": "succeeded", "step": n, "time": t0 + 0.25 * n + 0.1}) + "\n")
    return path


@pytest.fixture
def dash(qtbot):
    d = Dashboard()
    qtbot.addWidget(d)
    d.resize(1100, 700)
    d.show()
    return d


def curve_xy(d, key, series):
    x, y = d.curve(key, series).getOriginalDataset()  # what it was given (getData: after clipping)
    return np.asarray(x), np.asarray(y)


def test_points_arrive_as_the_file_grows(dash, tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("")
    tail = MetricsTail(path)
    dash.add_run("r", "run r")
    full = write_metrics(tmp_path / "full.jsonl").read_text().splitlines(keepends=True)
    with open(path, "a") as f:
        for chunk in (full[:7], full[7:20], full[20:]):
            f.writelines(chunk)
            f.flush()
            dash.append_data("r", tail.poll_data())  # as the app does: the lines kept, parsed in a process
            dash.wait_parsed()
            dash.flush()  # what the 10 Hz timer does
            x, y = curve_xy(dash, "r", "loss")
            assert len(x) == len([r for r in read_metrics(path) if "loss" in r])
    recs = read_metrics(path)
    train = [r for r in recs if "loss" in r]
    x, y = curve_xy(dash, "r", "loss")
    assert x.dtype == np.float64 and x.tolist() == [r["step"] for r in train]
    assert y.tolist() == [r["loss"] for r in train]
    vx, vy = curve_xy(dash, "r", "val_loss")
    assert vx.tolist() == [10, 20, 30, 40] and vy.tolist() == [r["val_loss"] for r in recs if "val_loss" in r]
    assert dash.records("r") == recs  # every record kept, the end event included
    assert all(type(part) is bytes for part in dash._runs["r"].kept)  # as lines, not dicts


def test_the_timer_updates_the_curves(dash, qtbot, tmp_path):
    dash.append("r", read_metrics(write_metrics(tmp_path / "m.jsonl", n=5)))
    qtbot.waitUntil(lambda: dash.curve("r", "loss") is not None and len(curve_xy(dash, "r", "loss")[0]) == 5, timeout=3000)


def test_x_by_wall_time_smoothing_and_log_y(dash, tmp_path):
    recs = read_metrics(write_metrics(tmp_path / "m.jsonl", t0=100.0))
    dash.append("r", recs)
    dash.set_x_mode("time")
    train = [r for r in recs if "loss" in r]
    x, y = curve_xy(dash, "r", "loss")
    assert x == pytest.approx([r["time"] - 100.25 for r in train])  # seconds since the first record
    assert dash.plots["loss"].getPlotItem().getAxis("bottom").labelText == "wall time (s)"

    dash.set_smoothing(0.8)
    assert dash.smooth_slider.value() == 80
    raw = [r["loss"] for r in train]
    s, want = raw[0], []
    for v in raw:
        s = 0.8 * s + 0.2 * v
        want.append(s)
    assert curve_xy(dash, "r", "loss")[1] == pytest.approx(want, rel=1e-12)
    # appending continues the same EMA
    more = {"step": 41, "time": 111.0, "loss": 0.5}
    dash.append("r", [more])
    dash.flush()
    assert curve_xy(dash, "r", "loss")[1][-1] == pytest.approx(0.8 * want[-1] + 0.2 * 0.5, rel=1e-12)
    # validation points are never smoothed
    assert curve_xy(dash, "r", "val_loss")[1].tolist() == [r["val_loss"] for r in recs if "val_loss" in r]

    dash.log_check.setChecked(True)
    assert dash.plots["loss"].getPlotItem().ctrl.logYCheck.isChecked()
    assert not dash.plots["acc"].getPlotItem().ctrl.logYCheck.isChecked()


def test_overlay_two_runs_show_hide_and_crosshair(dash, tmp_path):
    a = read_metrics(write_metrics(tmp_path / "a.jsonl", loss0=2.0))
    b = read_metrics(write_metrics(tmp_path / "b.jsonl", loss0=3.0, n=30))
    dash.set_records("runs/a", a, label="a")
    dash.set_records("runs/b", b, label="b")
    ca, cb = dash.curve("runs/a", "loss"), dash.curve("runs/b", "loss")
    assert ca.opts["pen"].color().name() != cb.opts["pen"].color().name()
    assert len(curve_xy(dash, "runs/b", "loss")[0]) == 30
    text = dash.show_crosshair(10.2)
    assert "step 10" in text
    la = [r for r in a if r.get("step") == 10 and "loss" in r][0]["loss"]
    assert f"loss {la:.4g}" in text.split("|")[0] and text.split("|")[1].strip().startswith("b:")
    # hide b from the run list
    item = dash.run_list.item(1)
    assert item.text() == "b"
    item.setCheckState(Qt.Unchecked)
    assert not cb.isVisible() and ca.isVisible() and not dash.is_run_visible("runs/b")
    assert "b:" not in dash.show_crosshair(10)
    dash.set_run_visible("runs/b", True)
    assert cb.isVisible() and item.checkState() == Qt.Checked
    dash.remove_run("runs/a")
    assert dash.run_keys() == ["runs/b"] and ca.scene() is None


def test_many_runs_drop_the_legends_and_markers_and_get_them_back(dash, tmp_path):
    """More runs than LEGEND_RUNS: the legends go (the run list names the runs), curves
    are 1 pixel wide, validation curves without markers; back at LEGEND_RUNS runs the
    legends return with an entry for every curve, made while they were off too."""
    n = dash.LEGEND_RUNS + 2
    recs = read_metrics(write_metrics(tmp_path / "m.jsonl"))
    for i in range(n):
        dash.set_records(f"runs/r{i}", recs, label=f"r{i}")
    loss = dash.plots["loss"].getPlotItem()
    assert not dash.legends_shown() and not dash.legend_check.isChecked() and not loss.legend.isVisible()
    assert len(loss.legend.items) == 2 * dash.LEGEND_RUNS  # (train and val) of the runs before the crowd only
    last = f"runs/r{n - 1}"
    assert dash.curve(last, "loss").opts["pen"].widthF() == 1
    assert dash.curve(last, "val_loss").opts["symbol"] is None
    assert dash.run_list.count() == n
    few = f"runs/r{0}"  # made before the crowd: as one run's are
    assert dash.curve(few, "loss").opts["pen"].widthF() == 2 and dash.curve(few, "val_loss").opts["symbol"] == "o"
    dash.remove_run(last)
    assert not dash.legends_shown()  # LEGEND_RUNS + 1 still
    dash.remove_run(f"runs/r{n - 2}")
    assert dash.legends_shown()
    names = [lb.full for _, lb in loss.legend.items]
    assert len(names) == 2 * dash.LEGEND_RUNS and "r0: train" in names and f"r{n - 3}: val" in names, names
    dash.set_legends_shown(False)  # the user's choice stays when runs come and go
    dash.set_records("runs/extra", recs, label="extra")
    dash.remove_run("runs/extra")
    assert not dash.legends_shown()


@pytest.mark.parametrize("kept", ["dicts", "lines"])
def test_csv_export_equals_metrics_jsonl(dash, tmp_path, kept):
    path = write_metrics(tmp_path / "metrics.jsonl", n=25)
    if kept == "dicts":
        dash.set_records("run1", read_metrics(path))
    else:
        dash.set_data("run1", MetricsTail(path).poll_data())
    out = dash.export_csv(tmp_path / "out.csv")
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert len(rows) == len(lines)
    for row, rec in zip(rows, lines):
        assert row.pop("run") == "run1"
        got = {k: (v if k in ("event", "state") else json.loads(v)) for k, v in row.items() if v != ""}
        assert got == rec


def test_png_export_and_memory_per_rank(dash, tmp_path):
    dash.append("r", read_metrics(write_metrics(tmp_path / "m.jsonl", ranks=2)))
    dash.flush()
    assert curve_xy(dash, "r", "peak_mem_mb[1]")[1][0] == pytest.approx(101.1)
    dash.set_peak_memory("r", [130.0, 128.5])
    peaks = dash._runs["r"].peaks
    assert [(p.pos().x(), p.pos().y()) for p in peaks.points()] == [(40.0, 130.0), (40.0, 128.5)]
    dash.set_run_visible("r", False)
    assert not peaks.isVisible()
    dash.set_run_visible("r", True)
    png = dash.export_png(tmp_path / "plots.png")
    img = QImage(str(png))
    assert not img.isNull() and img.width() == dash.plots_area.width() and img.height() == dash.plots_area.height()


def test_confusion_matrix_widget(qtbot):
    w = ConfusionMatrixWidget()
    qtbot.addWidget(w)
    m = np.array([[5, 1, 0], [0, 7, 2], [1, 0, 9]])
    w.set_matrix(m, ["cat", "dog", "eel"])
    assert w.image.isVisible() and not w.empty.isVisible()
    shown = w.image.image
    assert shown.shape == (3, 3) and shown[1, 1] == pytest.approx(7 / 9)
    assert [t.toPlainText() for t in w._texts][:3] == ["5", "1", "0"]
    with pytest.raises(ValueError, match="square"):
        w.set_matrix(np.zeros((2, 3)))
    w.set_matrix(None)
    assert w.empty.isVisible() and not w.image.isVisible()


def test_a_long_series_stays_exact_and_is_drawn_as_its_envelope(dash):
    """Buffers grow by doubling; every appended value lands once, in order. While
    the plots follow their data, a long series reaches its curve as one segment per
    pixel column (its min/max envelope); zoomed in by the user, the curve gets the
    raw points again, and the region on screen is drawn from them exactly."""
    n, chunk = 200_003, 20_000
    values = np.random.default_rng(1).standard_normal(n)
    for i in range(0, n, chunk):
        dash.append("big", [{"step": s, "time": s / 100, "loss": float(values[s])} for s in range(i, min(n, i + chunk))])
        dash.flush()
    x, y = dash.series_data("big", "loss")
    assert x.dtype == np.float64 and len(x) == n and x[-1] == n - 1 and np.array_equal(y, values)
    c = dash.curve("big", "loss")
    cx, cy, is_envelope = dash.drawn("big", "loss")
    vb = dash.plots["loss"].getPlotItem().vb
    dpr = dash.devicePixelRatioF()
    columns = int(max(vb.width(), 200) * dpr)  # one per pixel (200 at least)
    assert is_envelope and columns <= len(cx) // 4 <= columns + 40
    assert len(c.getOriginalDataset()[0] or []) == 0  # the curve keeps its legend entry, empty
    # the envelope as two 1-pixel lines, which draw what the 2-pixel pen would
    segments = dash._runs["big"].series["loss"].segments
    assert segments.isVisible() and segments.pen.widthF() == 1 and c.legend_pen.widthF() == 2
    s = dash._runs["big"].series["loss"]
    ex, ey = envelope(s.step, s.y, columns)
    check_envelope(ex, ey, values)
    (x0, x1), (y0, y1) = vb.viewRange()
    tx, ty = as_thin_lines(ex, ey, 2, (x1 - x0) / (vb.width() * dpr), (y1 - y0) / (vb.height() * dpr))
    assert np.array_equal(cx, tx) and np.array_equal(cy, ty)
    dash.set_run_visible("big", False)
    assert not segments.isVisible()
    dash.set_run_visible("big", True)

    vb.setXRange(1000, 1099, padding=0)
    vb.sigRangeChangedManually.emit(vb.state["mouseEnabled"])  # what a mouse zoom emits
    dash.flush()
    x, y, is_envelope = dash.drawn("big", "loss")
    assert not is_envelope and len(x) == n and len(segments.pairs()[0]) == 0
    assert c.opts["clipToView"] and c.opts["autoDownsample"] and c.opts["downsampleMethod"] == "peak"
    shown_x, shown_y = c.getData()  # after pyqtgraph's clipping to the view: no downsampling of 100 points
    assert set(range(1000, 1100)) <= set(shown_x.astype(int)) and len(shown_x) <= 104
    assert np.array_equal(shown_x, np.arange(shown_x[0], shown_x[-1] + 1))
    assert np.array_equal(shown_y, values[shown_x.astype(int)])

    dash.auto_range()
    dash.flush()
    x, y, is_envelope = dash.drawn("big", "loss")
    assert is_envelope and len(x) < 4 * columns + 160 and len(c.getOriginalDataset()[0] or []) == 0


def as_thin_lines(x, y, width, px, py):
    """Segments (in pairs of points, as `envelope` gives them) that a 1-pixel pen
    draws as a `width`-pixel pen draws (x, y): each made longer by (width - 1) / 2
    pixels at both ends, and drawn `width` times, one pixel to the right each time
    (px, py: a pixel's size in the units of x and y). What Segments.set_columns
    writes into its lines, computed here on its own."""
    a, b = y[0::2], y[1::2]
    grow = np.where(b >= a, (width - 1) / 2 * py, -(width - 1) / 2 * py)
    y = np.empty_like(y)
    y[0::2], y[1::2] = a - grow, b + grow
    return np.concatenate([x + i * px for i in range(width)]), np.tile(y, width)


def test_the_series_of_a_run_share_the_envelopes_shape_and_keep_their_values(dash):
    """The series of a run, as long as each other, are drawn from one envelope
    shape (where its columns start and end, built once a flush): each still shows
    its own values, the same as its envelope built on its own."""
    n = 120_000
    rng = np.random.default_rng(7)
    values = {k: np.cumsum(rng.standard_normal(n)) + 50 for k in ("loss", "acc", "lr")}
    for i in range(0, n, 30_000):
        dash.append("r", [{"step": s, **{k: float(v[s]) for k, v in values.items()}} for s in range(i, i + 30_000)])
        dash.flush()
    dpr = dash.devicePixelRatioF()
    for key, v in values.items():
        s = dash._runs["r"].series[key]
        vb = dash.plots[s.spec.plot].getPlotItem().vb
        cx, cy, is_envelope = dash.drawn("r", key)
        ex, ey = envelope(s.step, s.y, int(max(vb.width(), 200) * dpr))
        check_envelope(ex, ey, v)
        (x0, x1), (y0, y1) = vb.viewRange()
        tx, ty = as_thin_lines(ex, ey, 2, (x1 - x0) / (vb.width() * dpr), (y1 - y0) / (vb.height() * dpr))
        assert is_envelope and np.array_equal(cx, tx) and np.array_equal(cy, ty), key


@pytest.mark.parametrize("width", [1, 2, 3])
def test_segments_hold_the_thin_lines_of_an_envelope(qtbot, width):
    """Segments.set_columns writes an envelope (with blocks of finer levels and a raw
    tail after its columns: 12,345 values) as `as_thin_lines` draws it, and its
    bounds are those of all the lines."""
    n = 12_345
    values = np.cumsum(np.random.default_rng(5).standard_normal(n))
    xb, yb = MinMaxBuffer(), MinMaxBuffer(envelope=True)
    xb.extend(np.arange(n, dtype=np.float64))
    yb.extend(values)
    parts = envelope_parts(xb, yb, 300)
    x, y = envelope(xb, yb, 300)
    assert len(x) == 2 * len(parts[0]) and n - 1 - x[-1] == 0 and x[-2] == n - 2  # ends with the raw tail
    segments = Segments(pg.mkPen("b"))
    segments.set_columns(*parts, width, 0.5, 0.01)
    tx, ty = as_thin_lines(x, y, width, 0.5, 0.01)
    sx, sy = segments.pairs()
    assert np.array_equal(sx, tx) and np.array_equal(sy, ty) and segments.count() == len(tx) // 2
    r = segments.boundingRect()
    assert (r.left(), r.right(), r.top(), r.bottom()) == pytest.approx((tx.min(), tx.max(), ty.min(), ty.max()),
                                                                       rel=1e-12)
    segments.clear()
    assert segments.count() == 0 and segments.boundingRect().isNull()


def test_the_envelope_draws_what_the_raw_series_draws(qtbot):
    """The same plot rendered offscreen from all 300,000 points and from the
    envelope: at most a few pixels differ by more than a pixel's shift, where
    the flat and noisy parts, the spike and the step all show."""
    n = 300_000
    x = np.arange(1, n + 1, dtype=np.float64)
    y = 2.0 * np.exp(-x / 1e5) + 0.05 * np.random.default_rng(0).standard_normal(n)
    y[150_000] += 1.0
    y[200_000:250_000] = 1.2
    xb, yb = MinMaxBuffer(), MinMaxBuffer(envelope=True)
    xb.extend(x)
    yb.extend(y)
    pw = pg.PlotWidget(background="w")
    qtbot.addWidget(pw)
    pw.resize(460, 380)
    pw.show()
    curve = pw.plot(pen=pg.mkPen("#1f77b4", width=2))

    def render(*data, connect):
        curve.setData(*data, connect=connect)
        pw.getPlotItem().vb.setRange(xRange=(0, n), yRange=(-0.5, 3.5), padding=0)
        img = pw.grab().toImage().convertToFormat(QImage.Format_RGB32)
        rows = np.frombuffer(img.constBits(), np.uint8).reshape(img.height(), img.bytesPerLine() // 4, 4)
        return rows[:, :img.width(), :3].copy()

    raw = render(x, y, connect="all")
    vb = pw.getPlotItem().vb
    env = render(*envelope(xb, yb, int(vb.width())), connect="pairs")
    # as the dashboard draws it: as two 1-pixel lines
    curve.setPen(pg.mkPen("#1f77b4", width=1))
    thin = render(*as_thin_lines(*envelope(xb, yb, int(vb.width())), 2, n / vb.width(), 4.0 / vb.height()),
                  connect="pairs")
    drawn = np.any(raw != 255, axis=2).sum()
    assert drawn > 10_000
    # 21 pixels of 14,088 here, 14 for the thin lines (drawn as one 1-pixel line, 742;
    # a column per 2 pixels, 763); and no drawn pixel of the raw picture is missing
    for picture in (env, thin):
        assert off(picture, raw) <= 0.005 * drawn and off(raw, picture) <= 0.002 * drawn


def off(picture, reference):
    """Pixels of `picture` whose colour is not within a pixel of there in `reference`."""
    padded = np.pad(reference, ((1, 1), (1, 1), (0, 0)), mode="edge")
    near = np.zeros(picture.shape[:2], bool)
    for dy in range(3):
        for dx in range(3):
            near |= np.all(padded[dy:dy + picture.shape[0], dx:dx + picture.shape[1]] == picture, axis=2)
    return (~near).sum()


def test_incremental_ema_equals_the_full_recomputation(dash):
    values = np.random.default_rng(4).standard_normal(50_000).cumsum()
    dash.set_smoothing(0.9)
    for i in range(0, len(values), 3_333):
        dash.append("r", [{"step": s, "loss": float(values[s])} for s in range(i, min(len(values), i + 3_333))])
    smoothed = dash.series_data("r", "loss")[1]
    np.testing.assert_allclose(smoothed, ema(values, 0.9), rtol=1e-12, atol=1e-12)
    dash.set_smoothing(0.5)  # a new weight recomputes from the raw values
    np.testing.assert_allclose(dash.series_data("r", "loss")[1], ema(values, 0.5), rtol=1e-12, atol=1e-12)
    dash.set_smoothing(0.0)  # off: the raw values, and no smoothed copy kept while off
    assert np.array_equal(dash.series_data("r", "loss")[1], values)
    more = np.random.default_rng(5).standard_normal(1_000).cumsum()
    dash.append("r", [{"step": 50_000 + s, "loss": float(v)} for s, v in enumerate(more)])
    dash.set_smoothing(0.7)  # on again after points arrived while it was off
    np.testing.assert_allclose(dash.series_data("r", "loss")[1], ema(np.concatenate([values, more]), 0.7),
                               rtol=1e-12, atol=1e-12)


def test_a_hidden_dashboard_catches_up_when_shown(dash, tmp_path):
    dash.append("r", read_metrics(write_metrics(tmp_path / "m.jsonl", n=5)))
    dash._tick()
    assert len(curve_xy(dash, "r", "loss")[0]) == 5
    dash.hide()
    dash.append("r", [{"step": 6, "loss": 0.1}])
    dash._tick()  # the timer: nothing is pushed to curves no one sees
    assert len(curve_xy(dash, "r", "loss")[0]) == 5
    dash.show()
    assert len(curve_xy(dash, "r", "loss")[0]) == 6


def test_grid_is_opaque_behind_the_curves_and_x_ticks_are_shared_exactly(dash, tmp_path):
    """The grid keeps its colours, blended over the background beforehand (a
    translucent line costs a thread-pool round trip per line in Qt's raster
    engine), under the curves; the five x axes reuse one tick layout, which equals
    what each would lay out itself: the dashboard's own layout (_lean_specs) puts
    the same ticks, labels and label boxes where pyqtgraph's does, over ranges of
    every kind and on log axes."""
    dash.append("r", read_metrics(write_metrics(tmp_path / "m.jsonl", n=40)))
    dash.flush()
    dash.plots_area.grab()  # paint once
    image = QImage(10, 10, QImage.Format_ARGB32)  # held: a painter on a collected image crashes
    painter = QPainter(image)
    ranges = [None, (0, 1e6), (123456, 987654), (0.5, 2.7), (1e-4, 3e-3), (-5, 5), (0.999, 1.001), (2, 2)]
    try:
        for pid, pw in dash.plots.items():
            pi = pw.getPlotItem()
            bg = pw.backgroundBrush().color()
            for ax in ("left", "bottom"):
                axis = pi.getAxis(ax)
                assert axis.zValue() < pi.vb.zValue()
                for log in (False, True) if pid == "loss" else (False,):
                    axis.setLogMode(log)
                    for r in ranges if not log else [None, (-4, 1), (0.5, 2.7), (-5, 5)]:  # decades
                        if r is not None:
                            axis.setRange(*r)
                        ours = axis.generateDrawSpecs(painter)
                        own = pg.AxisItem.generateDrawSpecs(axis, painter)
                        assert axis._lean()
                        assert [(rect.getRect(), int(flags), text) for rect, flags, text in ours[2]] == \
                            [(rect.getRect(), int(flags), text) for rect, flags, text in own[2]]  # the labels
                        assert [(a, b) for _, a, b in ours[1]] == [(a, b) for _, a, b in own[1]]  # tick positions
                        assert [ours[0][1], ours[0][2]] == [own[0][1], own[0][2]]  # the axis line
                axis.setLogMode(False)
                axis.linkedViewChanged(pi.vb)  # its view's range again
                ours = axis.generateDrawSpecs(painter)
                own = pg.AxisItem.generateDrawSpecs(axis, painter)
                for (pen, *_), (tpen, *_) in zip(ours[1], own[1]):
                    c, t = pen.color(), tpen.color()
                    assert c.alpha() == 255 and t.alpha() < 255
                    a = t.alphaF()
                    assert c.redF() == pytest.approx(bg.redF() + (t.redF() - bg.redF()) * a, abs=1 / 255)
    finally:
        painter.end()


def test_records_given_as_dicts_wait_for_the_lines_still_being_parsed(qtbot):
    """The app gives a run's new metrics lines to the parse process, then its ranks'
    records as dicts: these must not overtake the lines (the run's time origin is its
    first metrics record, not a rank's later one), and the parse process goes with
    the dashboard."""
    from PySide6.QtCore import QCoreApplication, QEvent

    d = Dashboard()
    d.set_x_mode("time")
    lines = [json.dumps({"step": s, "time": 100.0 + s / 10, "loss": 1.0 / s}) for s in range(1, 201)]
    d.append_data("r", "\n".join(lines).encode())
    d.append("r", [{"step": 5, "time": 100.5, "step_ms_rank1": 3.0}])  # queued behind the lines
    assert "loss" not in d._runs["r"].series and "step_ms_rank1" not in d._runs["r"].series
    d.wait_parsed()
    x, _ = d.series_data("r", "loss")
    assert x[0] == 0.0 and x[-1] == pytest.approx(19.9)  # from step 1's time, 100.1
    assert d.series_data("r", "step_ms_rank1")[0].tolist() == pytest.approx([0.4])
    d.append("r", [{"step": 6, "time": 100.6, "step_ms_rank1": 3.0}])  # nothing in flight: at once
    assert len(d.series_data("r", "step_ms_rank1")[0]) == 2
    pid = d._parser._proc.pid
    assert os.path.exists(f"/proc/{pid}")
    d.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.DeferredDelete)
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped


def test_a_large_poll_read_as_columns_equals_reading_it_record_by_record(qtbot):
    """A batch of like records goes in as one array (fast); the result is the same as
    reading them one by one (a small or mixed batch): NaN losses dropped, times
    relative to the run's first, eval lines and events in between kept in order."""
    rng = np.random.default_rng(3)

    def train(start, n, t0=100.0):
        loss = rng.standard_normal(n)
        loss[::17] = float("nan")
        return [{"step": s, "epoch": 0, "time": t0 + s * 0.01, "loss": float(v), "lr": 1e-3,
                 "samples_per_s": 500.0 + s, "steps": 4} for s, v in zip(range(start, start + n), loss)]

    polls = [train(1, 300), [{"step": 300, "val_loss": 0.5, "val_acc": 0.75, "time": 103.5}], train(301, 200),
             [{"event": "end", "state": "succeeded", "step": 500}]]
    whole = [{"step": 600, "epoch": 0, "time": 99.0, "val_loss": 0.9, "val_acc": 0.4}]  # a finished run read whole:
    for i in range(4):  # step lines with eval lines between (a table of the step lines, the rest one by one)
        whole += train(601 + 100 * i, 100) + [{"step": 700 + 100 * i, "epoch": 0, "time": 200.0 + i, "val_loss": 0.5,
                                                "val_acc": 0.7}]
    whole.append({"event": "end", "state": "succeeded", "step": 1000})
    odd = train(501, 100)  # like records whose first has no number where the others have: one by one
    for i, r in enumerate(odd):
        r["acc"] = None if i == 0 else 0.5 + i / 1000
        r["peak_mem_mb"] = [100.0 + i, 200.0 + i]  # one a rank
    polls.insert(3, odd)
    fresh = (Dashboard(), Dashboard(), Dashboard())  # the whole run in a dashboard of its own, first (its time origin)
    for d in fresh:
        qtbot.addWidget(d)
    fresh[0].append("w", whole)
    for i in range(0, len(whole), 10):
        fresh[1].append("w", whole[i:i + 10])
    fresh[2].append_data("w", "\n".join(map(json.dumps, whole)).encode())
    fresh[2].wait_parsed()
    for mode in ("step", "time"):
        for d in fresh:
            d.set_x_mode(mode)
        for name in ("loss", "lr", "val_loss", "val_acc"):
            xs, ys = fresh[1].series_data("w", name)
            assert len(xs) and xs.min() >= 0
            for d in (fresh[0], fresh[2]):
                x, y = d.series_data("w", name)
                np.testing.assert_array_equal(x, xs)
                np.testing.assert_array_equal(y, ys)
    polls.append(whole)
    fast, slow, worker = Dashboard(), Dashboard(), Dashboard()
    for d in (fast, slow, worker):
        qtbot.addWidget(d)
    for poll in polls:
        fast.append("r", poll)
        for i in range(0, len(poll), 10):  # (batches under 64 records are read one by one)
            slow.append("r", poll[i:i + 10])
        worker.append_data("r", "\n".join(map(json.dumps, poll)).encode())  # as the app does: parsed in a process
    assert "loss" not in worker._runs["r"].series  # nothing plotted before the answers are taken
    worker.wait_parsed()
    assert worker._parser.alive  # (parsed there, not here after a failure)
    for mode in ("step", "time"):
        for d in (fast, slow, worker):
            d.set_x_mode(mode)
        for name in ("loss", "lr", "samples_per_s", "val_loss", "val_acc", "acc", "peak_mem_mb[1]"):
            (xs, ys) = slow.series_data("r", name)
            for d in (fast, worker):
                x, y = d.series_data("r", name)
                np.testing.assert_array_equal(x, xs)
                np.testing.assert_array_equal(y, ys)
    x, y = fast.series_data("r", "loss")
    assert len(x) == sum(math.isfinite(r.get("loss", math.nan)) for p in polls for r in p) == 940 \
        and np.isfinite(y).all()
    assert len(slow.series_data("r", "acc")[0]) == 99 and len(slow.series_data("r", "peak_mem_mb[1]")[0]) == 100
    fast.set_x_mode("step")
    assert fast.series_data("r", "loss")[0][0] == 2  # step 1's loss was NaN
    assert fast.records("r") == [r for p in polls for r in p]
    assert [json.dumps(r) for r in worker.records("r")] == [json.dumps(r) for p in polls for r in p]  # (NaN != NaN)
    s_fast, s_slow = fast._runs["r"].series["loss"], slow._runs["r"].series["loss"]
    assert (s_fast.y.lo, s_fast.y.hi) == (s_slow.y.lo, s_slow.y.hi)
    from engine.runs.tail import columns, parse_chunk

    table, rest = columns(polls[0])  # the big polls did go in as columns
    assert rest == [] and table["step"].tolist() == list(range(1, 301))
    cols = {}
    ingest_columns(Run("k", "k", "#000"), table, cols)
    assert {"loss", "lr"} <= set(cols)
    assert columns(polls[0][:10]) == (None, polls[0][:10])
    assert columns(odd) == (None, odd)
    table, rest = columns(whole)  # the step lines as a table, the eval lines and the end event one by one
    assert len(table["step"]) == 400 and [r.get("val_loss") for r in rest] == [0.9] + [0.5] * 4 + [None]
    assert parse_chunk(b"\n".join(json.dumps(r).encode() for r in polls[2]))[0]["step"].tolist() == \
        list(range(301, 501))


def test_while_following_the_ranges_hold_the_data_and_move_in_steps(dash):
    """The dashboard sets the ranges itself while it follows the data: every point
    inside, x changed far less often than at every update (so pyqtgraph's axes keep
    their ticks and pictures), a flat series at +-5% of its value. A zoom by the user
    ends following; Fit follows again."""
    loss_vb, lr_vb = (dash.plots[p].getPlotItem().vb for p in ("loss", "lr"))
    moves, last = 0, None
    for i in range(50):
        dash.append("r", [{"step": s, "loss": 2.0 - s / 1e4 + 0.1 * (s % 7), "lr": 1e-3}
                          for s in range(i * 100, (i + 1) * 100)])
        dash.flush()
        (x0, x1), (y0, y1) = loss_vb.viewRange()
        steps = np.arange((i + 1) * 100)
        loss = 2.0 - steps / 1e4 + 0.1 * (steps % 7)
        assert x0 <= 0 and x1 >= steps[-1] and y0 <= loss.min() and y1 >= loss.max()
        assert x1 - x0 <= 1.5 * steps[-1] + 10  # and the data fill most of it
        moves += (x0, x1) != last
        last = (x0, x1)
    assert moves <= 20
    assert lr_vb.viewRange()[1] == pytest.approx([0.95e-3, 1.05e-3])

    loss_vb.setXRange(100, 200, padding=0)
    loss_vb.sigRangeChangedManually.emit(loss_vb.state["mouseEnabled"])  # what a mouse zoom emits
    dash.append("r", [{"step": s, "loss": 5.0, "lr": 1e-3} for s in range(5000, 6000)])
    dash.flush()
    assert loss_vb.viewRange()[0] == pytest.approx([100, 200])
    dash.auto_range()
    (x0, x1), (y0, y1) = loss_vb.viewRange()
    assert x1 >= 5999 and y1 >= 5.0


def test_the_timer_moves_a_few_y_ranges_a_tick_until_all_hold_their_data(dash):
    """Plots whose data leave their ranges together are refitted over the next ticks,
    at most RANGE_MOVES_PER_TICK a tick (one when x moves too); a plain flush fits all."""
    keys = ("loss", "acc", "lr", "samples_per_s", "peak_mem_mb")
    plots = ("loss", "acc", "lr", "throughput", "memory")
    dash.append("r", [{"step": s, **{k: 1.0 + s % 3 for k in keys}} for s in range(1, 101)])
    dash.flush()
    before = {p: dash._y_lim.get(p) for p in plots}
    assert all(before.values())
    dash.append("r", [{"step": s, **{k: 50.0 for k in keys}} for s in range(101, 111)])  # x holds
    moved = []
    for _ in range(5):
        dash._tick()
        now = {p: dash._y_lim.get(p) for p in plots}
        moved.append(sum(now[p] != before[p] for p in plots))
        before = now
    assert max(moved) <= Dashboard.RANGE_MOVES_PER_TICK and sum(moved) == 5
    for p in plots:
        assert dash.plots[p].getPlotItem().vb.viewRange()[1][1] >= 50.0


def test_a_tick_that_moves_x_leaves_the_new_points_to_the_next_one(dash):
    """The timer's tick that moves the x range does only that (the axes laid out
    again, every envelope rebuilt at the next); the tick after draws the new points
    and moves the y ranges, even if x moves again then; a plain flush does it all."""
    vb = dash.plots["loss"].getPlotItem().vb

    def last_drawn():
        return dash.drawn("r", "loss")[0].max()

    dash.append("r", [{"step": s, "loss": 1.0 + s % 3} for s in range(1, 101)])
    dash._tick()  # the first range is not a move: drawn at once
    assert last_drawn() == pytest.approx(100, abs=10)
    x_before, y_before = dash._x_lim, dash._y_lim["loss"]

    dash.append("r", [{"step": s, "loss": 50.0} for s in range(101, 201)])  # out of both ranges
    dash._tick()
    assert dash._x_lim != x_before and vb.viewRange()[0] == pytest.approx(list(dash._x_lim))
    assert last_drawn() == pytest.approx(100, abs=10) and dash._y_lim["loss"] == y_before

    dash.append("r", [{"step": s, "loss": 50.0} for s in range(201, 401)])  # x moves again
    x_second = dash._x_lim
    dash._tick()
    assert dash._x_lim != x_second
    assert last_drawn() == pytest.approx(400, abs=10) and dash._y_lim["loss"][1] >= 50.0

    dash.append("r", [{"step": s, "loss": 1.0} for s in range(401, 1001)])
    dash.flush()
    assert last_drawn() == pytest.approx(1000, abs=10) and dash._x_lim[1] >= 1000


def test_a_long_series_on_a_log_plot_is_drawn_in_decades(dash):
    """On a log-y plot the envelope is drawn in view coordinates (log10 of the
    values); a value without a logarithm (0 here) reaches down to the smallest
    that has one."""
    n = 60_000
    loss = np.exp(-np.arange(n) / 1e4) + 1e-3
    loss[100] = 0.0
    dash.append("r", [{"step": s, "loss": float(loss[s])} for s in range(n)])
    dash.set_log_y(True)
    dash.flush()  # the 0 has no logarithm: pyqtgraph's own auto-range, when the plot is painted
    dash.plots["loss"].viewport().repaint()
    dash.flush()  # the envelope again, for the range pyqtgraph chose
    x, y, is_envelope = dash.drawn("r", "loss")
    assert is_envelope and np.isfinite(y).all()
    vb = dash.plots["loss"].getPlotItem().vb
    pixel = (vb.viewRange()[1][1] - vb.viewRange()[1][0]) / (vb.height() * dash.devicePixelRatioF())
    assert y.max() == pytest.approx(np.log10(loss.max()) + pixel / 2)
    assert y.min() == pytest.approx(np.log10(loss[loss > 0].min()) - pixel / 2)
    y0, y1 = vb.viewRange()[1]  # the range holds it, in decades too
    assert y0 <= y.min() and y1 >= y.max() and y1 - y0 < 5


def test_tick_values_equal_pyqtgraphs():
    """GridAxis.tickValues is pyqtgraph's (without numpy), tick for tick."""
    axis = GridAxis("bottom", QColor("white"), {})
    rng = np.random.default_rng(1)
    for level in (1, 2):
        axis.setStyle(maxTickLevel=level)
        for _ in range(3000):
            lo = float(rng.uniform(-1e3, 1e3)) * 10.0 ** int(rng.integers(-8, 8))
            hi = lo + float(rng.uniform(1e-6, 1e3)) * 10.0 ** int(rng.integers(-6, 8))
            size = float(rng.uniform(20, 2000))
            if rng.random() < 0.5:
                lo, hi = hi, lo
            assert axis.tickValues(lo, hi, size) == pg.AxisItem.tickValues(axis, lo, hi, size)


def test_large_tick_labels_are_short(dash):
    """Along a million steps pyqtgraph's labels (200000 400000 ...) ran into each other."""
    axis = dash.plots["loss"].getPlotItem().getAxis("bottom")
    assert axis.tickStrings([0, 2e5, 4e5, 1e6, 1.2e6], 1, 2e5) == ["0", "200k", "400k", "1M", "1.2M"]
    assert axis.tickStrings([2.5e5, 1.25e6], 1, 2.5e5) == ["250k", "1.25M"]
    assert axis.tickStrings([0, 500, 1000], 1, 500) == ["0", "500", "1000"]  # small ones as pyqtgraph writes them


def test_the_package_gives_its_public_names():
    """widgets.dashboard hands out the names of its modules (looked up on first use,
    so that its Qt-free modules load without Qt): each is the module's own object."""
    import importlib

    import widgets.dashboard as package

    modules = [importlib.import_module(f"widgets.dashboard.{m}")
               for m in ("series", "buffers", "ingest", "segments", "axis", "confusion", "widget")]
    for name in package.__all__:
        assert any(getattr(package, name) is getattr(m, name, None) for m in modules), name
    assert package.Dashboard is Dashboard and "Dashboard" in dir(package)
    with pytest.raises(AttributeError):
        package.NoSuchName  # noqa: B018


def test_a_one_process_run_draws_its_step_time(dash, tmp_path):
    """A run of one process writes its step time in metrics.jsonl (several processes: each
    rank's own file), so its Step time plot is not empty."""
    from pathlib import Path

    from engine.project import load_project
    from engine.runs.build import prepare_run
    from engine.runtime.train import run

    ex = Path(__file__).resolve().parents[2] / "resources" / "examples" / "mlp_digits.lflow"
    p = load_project(ex)
    p.training = p.training.model_copy(update={"log_interval": 1})
    d = prepare_run(p, tmp_path / "run", steps=6)
    assert run(d).state == "succeeded"
    recs = read_metrics(d / "metrics.jsonl")
    train = [r for r in recs if "loss" in r]
    assert all(r["step_ms"] > 0 for r in train)
    dash.add_run("r", "run r")
    dash.append_data("r", MetricsTail(d / "metrics.jsonl").poll_data())
    dash.wait_parsed()
    dash.flush()
    x, y = curve_xy(dash, "r", "step_ms")
    assert x.tolist() == [r["step"] for r in train] and y.tolist() == [r["step_ms"] for r in train]
