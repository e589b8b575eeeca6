"""The dashboard on metrics.jsonl files written here in the runtime's format:
curves hold the data, x by step or wall time, EMA smoothing, log y, crosshair,
several runs overlaid with show/hide, CSV export equal to metrics.jsonl, PNG export,
peak memory per rank, the confusion matrix."""
import csv
import json
import math

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage

from engine.tail import MetricsTail, read_metrics
from widgets.dashboard import ConfusionMatrixWidget, Dashboard, ema

pytestmark = pytest.mark.gui


def write_metrics(path, n=40, t0=12.5, eval_every=10, loss0=2.0, ranks=None):
    """Lines as engine/runtime/train.py writes them, plus an end event."""
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
            dash.append("r", tail.poll_records())
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


def test_ema_ignores_non_finite_values():
    out = ema(np.array([1.0, np.nan, 3.0]), 0.5)
    assert out.tolist() == [1.0, 1.0, 2.0]
    assert ema(np.array([1.0, 2.0]), 0.0).tolist() == [1.0, 2.0]


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


def test_csv_export_equals_metrics_jsonl(dash, tmp_path):
    path = write_metrics(tmp_path / "metrics.jsonl", n=25)
    recs = read_metrics(path)
    dash.set_records("run1", recs)
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


def test_a_long_series_stays_exact_and_is_drawn_as_its_envelope(dash, qtbot):
    """Buffers grow by doubling; every appended value lands once, in order. A long
    series reaches the curve as per-block min/max (what peak downsampling would
    draw); zoomed in by the user, the curve gets the raw points again."""
    n, chunk = 200_003, 20_000
    rng = np.random.default_rng(1)
    values = rng.standard_normal(n)
    for i in range(0, n, chunk):
        dash.append("big", [{"step": s, "time": s / 100, "loss": float(values[s])} for s in range(i, min(n, i + chunk))])
        dash.flush()
    x, y = dash.series_data("big", "loss")
    assert x.dtype == np.float64 and len(x) == n and x[-1] == n - 1 and np.array_equal(y, values)
    cx, cy = curve_xy(dash, "big", "loss")
    blocks = n // 64
    assert len(cx) == 2 * blocks + n % 64
    assert np.array_equal(cy[0:2 * blocks:2], values[: blocks * 64].reshape(-1, 64).min(axis=1))
    assert np.array_equal(cy[1:2 * blocks:2], values[: blocks * 64].reshape(-1, 64).max(axis=1))
    assert np.array_equal(cy[2 * blocks:], values[blocks * 64:]) and cx[-1] == n - 1
    assert cy.max() == values.max() and cy.min() == values.min()
    vb = dash.plots["loss"].getPlotItem().vb
    vb.setXRange(1000, 2000)
    vb.sigRangeChangedManually.emit(vb.state["mouseEnabled"])  # what a mouse zoom emits
    dash.flush()
    assert len(curve_xy(dash, "big", "loss")[0]) == n
    dash.auto_range()
    dash.flush()
    assert len(curve_xy(dash, "big", "loss")[0]) == 2 * blocks + n % 64
    c = dash.curve("big", "loss")
    assert c.opts["clipToView"] and c.opts["autoDownsample"] and c.opts["downsampleMethod"] == "peak"
