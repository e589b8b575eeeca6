"""The plan's predicted step time corrected by what the newest run of the same layout
measured on this machine (engine/runs/calibration.py), as `plan` and the editor show it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.runs import calibration
from engine.planning.planner import format_plan, make_plan
from engine.project import load_project, save_project
from engine.runs.build import prepare_run
from engine.runtime.spec import RunSpec
from engine.runtime.train import run

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def project(tmp_path):
    p = load_project(ROOT / "resources" / "examples" / "mlp_digits.lflow")
    p.training.log_interval = 2
    p.training.eval_interval = 1000
    save_project(p, tmp_path / "mlp.lflow")
    return load_project(tmp_path / "mlp.lflow")


def test_a_run_corrects_the_next_plan_of_its_layout(project, tmp_path):
    plan = make_plan(project, 1)
    assert calibration.apply(plan, project) is None and "calibrated" not in format_plan(plan)  # no run yet
    rd = prepare_run(project, tmp_path / "runs" / "first", steps=40)
    predicted = RunSpec.load(rd).predicted
    assert predicted.step_s == pytest.approx(plan.doc["predicted"]["step_s"], rel=1e-6)
    assert (predicted.device, predicted.nproc) == ("cpu", 1)
    run(rd)
    recs = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
    paces = sorted(project.training.batch_size / r["samples_per_s"] for r in recs if "loss" in r and r["step"] > 3)
    plan = make_plan(project, 1)
    cal = calibration.apply(plan, project)
    assert cal["run"] == "first" and cal["measured_step_s"] == pytest.approx(paces[len(paces) // 2], rel=0.5)
    assert min(paces) <= cal["measured_step_s"] <= max(paces)
    assert cal["ratio"] == pytest.approx(cal["measured_step_s"] / predicted.step_s)
    assert plan.doc["predicted"]["calibrated_step_s"] == pytest.approx(plan.doc["predicted"]["step_s"] * cal["ratio"])
    assert "calibrated step:" in format_plan(plan) and "run first's first steps" in format_plan(plan)
    # another layout, batch or device: not this run's pace
    other = make_plan(project, 2, placement={"dp": 2})
    assert calibration.apply(other, project) is None
    project.training.batch_size = 32
    assert calibration.apply(make_plan(project, 1), project) is None


def test_plan_on_the_command_line_shows_the_calibrated_figure(project, tmp_path):
    rd = prepare_run(project, tmp_path / "runs" / "r1", steps=30)
    run(rd)
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), "plan", str(tmp_path / "mlp.lflow"), "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["calibration"]["run"] == "r1" and doc["predicted"]["calibrated_step_s"] > 0


def test_a_run_that_has_not_got_past_its_warm_up_says_nothing(project, tmp_path):
    rd = prepare_run(project, tmp_path / "runs" / "short", steps=4)
    run(rd)
    assert calibration.measured_step_s(rd) is None
    assert calibration.apply(make_plan(project, 1), project) is None
