"""What a run's recovery did, on the dashboard's loss plot (widgets/dashboard/marks.py,
events.py): a restart record of metrics.jsonl (engine/runtime/recovery.py restart_record)
becomes a labelled vertical line at its step, whose tooltip says why, the time lost and
the world after; drawn as the lines arrive, again (once) when the run is opened again,
where the step is whatever the zoom, and at the wall time on that axis. Real widgets,
offscreen."""
from __future__ import annotations

import json
import math

import pytest
from PySide6.QtCore import QPointF
from PySide6.QtWidgets import QApplication

from engine.runs.tail import MetricsTail, read_metrics
from engine.runtime.recovery import restart_record
from widgets.dashboard import Dashboard

pytestmark = pytest.mark.gui


def _step(s: int) -> dict:
    return {"step": s, "epoch": 0, "time": 10.0 + 0.5 * s, "loss": 2.0 * math.exp(-s / 40), "lr": 1e-3,
            "samples_per_s": 400.0, "peak_mem_mb": 120.0}


def restarted_metrics(path):
    """A run of 2 processes that lost one at step 57 (resumed from the checkpoint at 40 on
    one process, after 12 s down), and a failed checkpoint at 90: its metrics.jsonl as the
    runtime leaves it (the lines after the checkpoint cut, the restart record after the cut)."""
    attempt = {"attempt": 1, "started": 1012.0, "world": 1, "layout": {"pp": 1, "dp": 1, "tp": 1},
               "resumed_from": 40, "resized": {"accumulation": 2},
               "after": {"step": 57, "error": "rank 1 ended without a word (killed: SIGKILL)", "rank": 1, "at": 1000.0}}
    restart = {**restart_record(attempt, 40), "time": 31.0}
    restart.setdefault("layout", attempt["layout"])  # (what recovery.py writes once the world was re-planned)
    restart.setdefault("accumulation", 2)
    lines = [_step(s) for s in range(1, 41)] + [restart] + [_step(s) for s in range(41, 121)]
    lines.insert(lines.index(_step(90)) + 1, {"step": 90, "event": "checkpoint_failed", "checkpoint": "step_90",
                                              "error": "OSError: [Errno 28] No space left on device", "time": 55.1})
    lines.append({"event": "end", "state": "succeeded", "step": 120, "time": 71.0})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


@pytest.fixture
def dash(qtbot):
    d = Dashboard()
    qtbot.addWidget(d)
    d.resize(1100, 700)
    d.show()
    qtbot.waitExposed(d)
    return d


def _line_x_on_screen(dash, i: int = 0) -> tuple[float, float]:
    """(where the marker's line is on the scene, where step x of its marker maps to)."""
    line = dash._runs["r"].marker_lines[i]
    vb = dash.plots["loss"].getPlotItem().vb
    return line.mapToScene(QPointF(0, 0)).x(), vb.mapViewToScene(QPointF(line.marker.step, 0)).x()


def test_a_restart_is_marked_at_its_step_live_on_reload_and_zoomed(dash, tmp_path):
    full = restarted_metrics(tmp_path / "full.jsonl").read_text().splitlines(keepends=True)
    path = tmp_path / "metrics.jsonl"
    path.write_text("")
    tail = MetricsTail(path)
    dash.add_run("r", "run r")
    for chunk, markers in ((full[:30], 0), (full[30:45], 1), (full[45:], 2)):  # as the lines arrive
        with open(path, "a") as f:
            f.writelines(chunk)
        dash.append_data("r", tail.poll_data())
        dash.wait_parsed()
        dash.flush()
        assert len(dash.markers("r")) == markers
    restart, failed = dash.markers("r")
    assert (restart["kind"], restart["label"], restart["x"], restart["visible"]) == ("restart", "restart 1", 40.0, True)
    text = restart["text"]
    assert "resumed at step 40 (failed at step 57)" in text and "killed: SIGKILL" in text
    assert "down 12.0 s" in text and "then on 1 process (dp1), 2 micro-batches a step" in text
    line = dash._runs["r"].marker_lines[0]
    assert line.toolTip() == text and line.label.toolTip() == text and line.label.toPlainText() == "restart 1"
    assert line in dash.plots["loss"].getPlotItem().items
    assert (failed["label"], failed["x"]) == ("checkpoint failed", 90.0) and "No space left" in failed["text"]
    # the curve is whole: a record of recovery is no point of any series
    assert len(dash.series_data("r", "loss")[0]) == 120

    # the crosshair on the line says what happened there
    assert "restart 1 at step 40, down 12.0 s, then on 1 process (dp1), why: rank 1 ended" in dash.show_crosshair(40.0)
    assert "restart" not in dash.show_crosshair(100.0)

    # zoomed in by the user: the line stays at step 40
    vb = dash.plots["loss"].getPlotItem().vb
    vb.setXRange(30, 50, padding=0)
    dash._stop_following()
    dash.flush()
    QApplication.processEvents()  # (the view's transform reaches its items)
    on_screen, step_40 = _line_x_on_screen(dash)
    assert on_screen == pytest.approx(step_40, abs=0.5) and line.isVisible()
    assert vb.viewRange()[0][0] < 40 < vb.viewRange()[0][1]

    # the wall-time axis: the line moves to the record's time, since the run's first record
    dash.set_x_mode("time")
    assert dash.markers("r")[0]["x"] == pytest.approx(31.0 - _step(1)["time"])
    dash.set_x_mode("step")
    assert dash.markers("r")[0]["x"] == 40.0

    # hidden with its run
    dash.set_run_visible("r", False)
    assert not any(m["visible"] for m in dash.markers("r"))
    dash.set_run_visible("r", True)

    # the run opened again (its whole file read at once): its markers once, not twice
    dash.set_data("r", path.read_bytes().rstrip(b"\n"), label="run r")
    dash.wait_parsed()
    dash.flush()
    assert [(m["label"], m["x"]) for m in dash.markers("r")] == [("restart 1", 40.0), ("checkpoint failed", 90.0)]
    lines = [it for it in dash.plots["loss"].getPlotItem().items if getattr(it, "marker", None) is not None]
    assert len(lines) == 2
    assert dash.records("r") == read_metrics(path)

    # and records given as dicts (set_records) the same
    dash.set_records("r", read_metrics(path))
    assert [m["x"] for m in dash.markers("r")] == [40.0, 90.0]

    dash.remove_run("r")
    assert not [it for it in dash.plots["loss"].getPlotItem().items if getattr(it, "marker", None) is not None]


def test_runs_overlaid_each_marks_its_own_restarts(dash, tmp_path):
    a = restarted_metrics(tmp_path / "a.jsonl")
    dash.set_records("a", read_metrics(a), label="run-a")
    dash.set_records("b", [_step(s) for s in range(1, 60)], label="run-b")
    assert len(dash.markers("a")) == 2 and dash.markers("b") == []
    assert dash._runs["a"].marker_lines[0].toolTip().startswith("run-a: restart 1")
    assert dash.show_crosshair(40.0).count("restart 1") == 1 and "a: restart 1 at step 40" in dash.show_crosshair(40.0)  # (the runs by their short names)
