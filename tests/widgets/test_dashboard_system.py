"""The dashboard's System tab (each rank's CPU and memory over time, from the runtime's
logs/rankR.system.jsonl) and the first compile's time shown as a label and a line."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.runtime.sysmetrics import SystemTail
from widgets.dashboard import Dashboard


@pytest.fixture
def dash(qtbot):
    d = Dashboard()
    qtbot.addWidget(d)
    d.resize(1000, 600)
    d.show()
    return d


def write_system(run_dir, ranks=2, n=6):
    (run_dir / "logs").mkdir(parents=True)
    for r in range(ranks):
        (run_dir / "logs" / f"rank{r}.system.jsonl").write_text("".join(
            json.dumps({"step": 10 * i, "time": 5.0 * i, "rank": r, "cpu_pct": 90.0 + r + i,
                        "rss_mb": 300.0 + 10 * r + i}) + "\n" for i in range(n)))


def test_system_tab_plots_each_rank(dash, tmp_path):
    write_system(tmp_path)
    tail = SystemTail(tmp_path)
    dash.append("r", tail.poll_records())
    assert not dash.system_note.isHidden()  # (until a flush sees the series)
    dash.show_system()
    dash.flush()
    assert dash.tabs.tabText(dash.tabs.currentIndex()) == "System" and dash.system_note.isHidden()
    for r in range(2):
        x, y = dash.series_data("r", f"cpu_pct_rank{r}")
        assert list(x) == [0, 10, 20, 30, 40, 50] and list(y) == [90.0 + r + i for i in range(6)]
        curve = dash.curve("r", f"rss_mb_rank{r}")
        assert curve in dash.system_plots["rss"].getPlotItem().items
        _, cy = curve.getOriginalDataset()
        assert np.allclose(cy, [300.0 + 10 * r + i for i in range(6)])
    names = [lb.full for _, lb in dash.system_plots["cpu"].getPlotItem().legend.items]
    assert sorted(names) == ["rank 0", "rank 1"]
    assert not any(s.spec.plot in dash.plots for s in dash._runs["r"].series.values())  # none on the Training tab
    # more samples later (the tail's byte offset), and the wall-time axis
    with open(tmp_path / "logs" / "rank1.system.jsonl", "a") as f:
        f.write(json.dumps({"step": 60, "time": 30.0, "rank": 1, "cpu_pct": 50.0, "rss_mb": 400.0}) + "\n")
    dash.append("r", tail.poll_records())
    dash.set_x_mode("time")
    x, y = dash.series_data("r", "cpu_pct_rank1")
    assert list(x)[-1] == 30.0 and list(y)[-1] == 50.0
    # zoomable like the others: the user's range stays
    vb = dash.system_plots["cpu"].getPlotItem().vb
    vb.setYRange(0, 1000, padding=0)
    vb.sigRangeChangedManually.emit([True, True])
    dash.flush()
    assert vb.viewRange()[1] == pytest.approx([0, 1000])


def test_first_compile_is_a_label_and_a_line(dash):
    recs = [{"step": 0, "time": 2.5, "event": "compiled", "mode": "blocks", "seconds": 12.34, "blocks": 3},
            *({"step": s, "time": 2.5 + 0.1 * s, "loss": 1.0 / s, "lr": 0.01, "samples_per_s": 640.0}
              for s in range(1, 11))]
    dash.append("r", recs)
    dash.flush()
    assert dash.compile_seconds("r") == pytest.approx(12.34)
    assert dash.compile_label.isVisible() and dash.compile_label.text() == "compile 12.3 s"
    line = dash._runs["r"].compile_line
    assert line in dash.plots["throughput"].getPlotItem().items and line.value() == 0
    # no series of it: not a step time, not a throughput point
    assert set(dash._runs["r"].series) == {"loss", "lr", "samples_per_s"}
    assert list(dash.series_data("r", "samples_per_s")[0]) == list(range(1, 11))
    dash.set_x_mode("time")
    assert line.value() == pytest.approx(0.0)  # (the run's clock starts at its compile record)
    dash.set_run_visible("r", False)
    assert not line.isVisible() and not dash.compile_label.isVisible()
    dash.remove_run("r")
    assert line not in dash.plots["throughput"].getPlotItem().items


def test_first_compile_read_from_a_metrics_file(dash):
    """The lines of a compiled run's metrics.jsonl, parsed in the parse process as a
    finished run opened from the history is: the compile record reaches the label too."""
    lines = [{"step": 0, "time": 40.0, "event": "compiled", "mode": "whole", "seconds": 38.5, "blocks": 1},
             *({"step": s, "epoch": 0, "time": 40.0 + 0.01 * s, "loss": 1.0 / s, "lr": 0.01, "samples_per_s": 900.0}
               for s in range(1, 201)),
             {"event": "end", "state": "succeeded", "step": 200, "time": 42.0}]
    dash.set_data("old", "\n".join(json.dumps(r) for r in lines).encode(), label="old")
    dash.wait_parsed()
    dash.flush()
    assert dash.compile_seconds("old") == pytest.approx(38.5) and dash.compile_label.text() == "compile 38.5 s"
    assert len(dash.series_data("old", "loss")[0]) == 200
