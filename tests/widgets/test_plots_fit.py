"""Plots that fit (issue 60): at every size every plot shows the run's whole x range (the
plots are linked by range, not by their place on the screen), a warm-up step does not
flatten the step-time plot, the empty confusion matrix's note sits whole inside its plot
with no axes under it, and legends with room show their names whole."""
from __future__ import annotations

import math

import pytest
from PySide6.QtWidgets import QApplication

from widgets.dashboard import Dashboard

pytestmark = pytest.mark.gui
N = 100


def records(ranks=1):
    out = []
    for s in range(1, N + 1):
        r = {"step": s, "time": 10 + 0.25 * s, "loss": 2 * math.exp(-s / 15), "lr": 1e-3,
             "samples_per_s": 500.0 + s, "peak_mem_mb": 100.0 + s / 10}
        for k in range(ranks):
            r[f"step_ms_rank{k}"] = 100.0 if s == 1 else 3.0 + (s % 5) * 0.1 + k * 0.2
            r[f"loss_rank{k}"] = r["loss"] + 0.01 * k
        out.append(r)
        if s % 10 == 0:
            out.append({"step": s, "time": 10 + 0.25 * s, "val_loss": 2 * math.exp(-s / 18), "val_acc": s / N})
    return out


@pytest.fixture
def dash(qtbot):
    d = Dashboard()
    qtbot.addWidget(d)
    d.show()
    return d


def settle(d):
    d.wait_parsed()
    d.flush()
    for _ in range(5):
        QApplication.processEvents()


@pytest.mark.parametrize("size", [(480, 700), (760, 520), (1100, 700), (1440, 480)])
def test_every_plot_shows_the_whole_run_at_every_size(dash, size):
    dash.resize(*size)
    dash.set_records("r", records(ranks=2), label="r")
    settle(dash)
    for pid, pw in dash.plots.items():
        (x0, x1), _ = pw.getPlotItem().vb.viewRange()
        assert x0 <= 1 and x1 >= N, f"{pid} at {size}: x {x0:.1f}..{x1:.1f} of steps 1..{N}"


def test_a_warm_up_step_does_not_flatten_the_step_time(dash):
    dash.resize(1100, 700)
    dash.set_records("r", records(), label="r")
    settle(dash)
    _, (y0, y1) = dash.plots["step_time"].getPlotItem().vb.viewRange()
    assert y0 <= 3.0 and 3.4 <= y1 < 10, f"step time y {y0:.2f}..{y1:.2f}: the 100 ms first step sets it"
    _, (t0, t1) = dash.plots["throughput"].getPlotItem().vb.viewRange()
    assert t0 <= 502 and t1 >= 600


@pytest.mark.parametrize("size", [(480, 700), (1100, 700)])
def test_the_empty_confusion_note_is_whole_and_off_the_axes(dash, size):
    dash.resize(*size)
    dash.set_records("r", records(), label="r")
    settle(dash)
    cm = dash.confusion
    dash.plots_scroll.ensureWidgetVisible(cm)
    QApplication.processEvents()
    pi = cm.getPlotItem()
    assert cm.empty.isVisible()
    assert not pi.getAxis("left").isVisible() and not pi.getAxis("bottom").isVisible()
    note = cm.empty.mapRectToScene(cm.empty.boundingRect())
    assert pi.vb.sceneBoundingRect().adjusted(-1, -1, 1, 1).contains(note), (note, pi.vb.sceneBoundingRect())
    cm.set_matrix([[3, 1], [0, 4]])
    assert pi.getAxis("left").isVisible() and pi.getAxis("bottom").isVisible()


def test_legends_with_room_show_their_names_whole(dash):
    dash.resize(1440, 700)
    dash.set_records("r", records(ranks=4), label="r")
    settle(dash)
    for pid, pw in dash.plots.items():
        pi = pw.getPlotItem()
        if pi.legend is None or not pi.legend.isVisible():
            continue
        for _, label in pi.legend.items:
            assert label.text == label.full, f"{pid}: '{label.full}' shown as '{label.text}'"
            assert label.sceneBoundingRect().right() <= pi.sceneBoundingRect().right() + 1
