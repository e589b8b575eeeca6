"""A remote job opened from the Remote jobs panel plots in the dashboard like a local
run: the tracker's mirror folder (run.json, status.json, metrics.jsonl) is a run
folder, and new lines mirrored into it reach the plot."""
import json
import shutil
from pathlib import Path

import pytest

from app.window import MainWindow
from app.settings import Settings
from engine.project import load_project
from engine.runs.build import prepare_run
from engine.runtime.train import run
from engine.runs.tail import read_metrics

EX = Path(__file__).resolve().parents[2] / "resources" / "examples"
pytestmark = pytest.mark.gui


def test_opening_a_job_mirror_plots_it_and_follows_new_lines(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / "config"))  # an empty job database
    project = load_project(EX / "mlp_digits.lflow")
    project.training.log_interval = 1  # a line per step, mirrored in two halves
    finished = prepare_run(project, tmp_path / "src", steps=20)
    run(finished)
    lines = (finished / "metrics.jsonl").read_text().splitlines(keepends=True)

    # a mirror as remote/tracker.py writes it, halfway through the job
    mirror = tmp_path / "config" / "jobs" / "job-1"
    mirror.mkdir(parents=True)
    shutil.copy(finished / "run.json", mirror / "run.json")
    (mirror / "status.json").write_text(json.dumps({"state": "running", "step": 10, "total_steps": 20}))
    (mirror / "metrics.jsonl").write_text("".join(lines[:10]))

    w = MainWindow(load_project(EX / "mlp_digits.lflow"), settings=Settings(tmp_path / "home"), recover=False)
    qtbot.addWidget(w)
    w.show()
    w.jobs_panel.open_requested.emit(str(mirror))
    ui = w.run_ui
    assert str(mirror) in ui.dashboard.run_keys()
    qtbot.waitUntil(lambda: len(ui.dashboard.records(str(mirror))) == 10, timeout=5000)

    with open(mirror / "metrics.jsonl", "a") as f:  # the tracker mirrors the rest
        f.write("".join(lines[10:]))
    (mirror / "status.json").write_text(json.dumps({"state": "succeeded", "step": 20, "total_steps": 20}))
    qtbot.waitUntil(lambda: ui.dashboard.records(str(mirror)) == read_metrics(mirror / "metrics.jsonl"), timeout=10000)
    ui.dashboard.wait_parsed()  # the new lines were parsed in the dashboard's parse process, and plotted
    assert ui.dashboard.series_data(str(mirror), "loss")[0].tolist() == \
        [r["step"] for r in read_metrics(mirror / "metrics.jsonl") if "loss" in r]
    ui.shutdown()
