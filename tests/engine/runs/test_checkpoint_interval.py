"""The checkpoint interval Layerflow suggests (engine/runs/checkpoint_interval.py): the
Young/Daly formula with numbers worked by hand, the per-device MTBF setting, and the
suggestion from what a real short run recorded of its own saves (engine/runtime/loop.py's
Checkpointer: a {"event": "checkpoint", "blocked_s", "write_s"} record per save)."""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from engine.project import load_project
from engine.runs import checkpoint_interval as ci
from engine.runs.build import build_run
from engine.runs.tail import read_metrics
from engine.runtime.train import run

ROOT = Path(__file__).resolve().parents[3]
MLP = ROOT / "resources" / "examples" / "mlp_digits.lflow"


def test_young_daly_worked_by_hand():
    # C = 10 s, M = 1 h: sqrt(2 x 10 x 3600) = sqrt(72,000) = 268.33 s
    assert ci.young_daly_s(10, 3600) == pytest.approx(268.328, abs=1e-3)
    s = ci.suggest(10.0, 2.0, devices=1, device_mtbf_h=1.0)
    assert s.tau_s == pytest.approx(268.328, abs=1e-3) and s.mtbf_s == 3600
    assert s.steps == 134  # 268.3 s of 2 s steps
    assert "sqrt(2 x 10 s x 3,600 s) = 268.3 s" in s.line and s.line.startswith("every 134 steps")
    # M is the device's MTBF over the run's devices: 4 devices of 4 h fail as often as one of 1 h
    assert ci.suggest(10.0, 2.0, devices=4, device_mtbf_h=4.0).tau_s == pytest.approx(s.tau_s)
    assert "4 h per device / 4 devices" in ci.suggest(10.0, 2.0, devices=4, device_mtbf_h=4.0).line
    assert ci.suggest(0.001, 60.0, device_mtbf_h=1.0).steps == 1  # tau 2.7 s of 60 s steps: never below one step
    with pytest.raises(ValueError):
        ci.young_daly_s(1.0, 0)


def test_the_default_mtbf_is_llama3s_and_a_setting_overrides_it(monkeypatch):
    # 16,384 GPUs x 54 days x 24 h / 419 interruptions
    assert ci.DEVICE_MTBF_H == pytest.approx(50_677, abs=1)
    assert ci.device_mtbf_hours() == (pytest.approx(50_677, abs=1), ci.DEFAULT_SOURCE)
    # a 16,384-device run then fails every 3.1 hours
    assert ci.suggest(60, 1.0, devices=16_384).mtbf_s / 3600 == pytest.approx(3.09, abs=0.01)
    ci.save_device_mtbf_hours(20_000)  # (the config folder is the test's own: conftest)
    assert ci.device_mtbf_hours()[0] == 20_000 and "device_mtbf_h" in ci.device_mtbf_hours()[1]
    assert ci.suggest(10, 1.0, devices=2).mtbf_s == 20_000 * 3600 / 2
    monkeypatch.setenv(ci.MTBF_ENV, "500")
    assert ci.device_mtbf_hours() == (500.0, f"${ci.MTBF_ENV}")
    monkeypatch.setenv(ci.MTBF_ENV, "not a number")  # ignored: the saved setting again
    assert ci.device_mtbf_hours()[0] == 20_000
    ci.save_device_mtbf_hours(None)
    assert ci.device_mtbf_hours()[0] == pytest.approx(ci.DEVICE_MTBF_H)
    with pytest.raises(ValueError):
        ci.save_device_mtbf_hours(-3)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_real_runs_checkpoints_measured_and_the_interval_suggested(tmp_path, asynchronous):
    project = load_project(MLP)
    project.training.checkpoint_interval = 5
    project.training.eval_interval = 1000
    project.training.checkpoint_async = asynchronous
    rd = build_run(project, tmp_path / "runs" / "r1", steps=20).run_dir
    assert run(rd).state == "succeeded"
    recs = read_metrics(rd / "metrics.jsonl")
    saves = [r for r in recs if r.get("event") == "checkpoint"]
    assert [r["step"] for r in saves] == [5, 10, 15, 20]
    assert [r["checkpoint"] for r in saves] == ["step_5", "step_10", "step_15", "step_20"]
    for r in saves:
        assert 0 < r["blocked_s"] <= r["write_s"] < 30 and r["time"] > 0
        if not asynchronous:
            assert r["write_s"] == r["blocked_s"]  # the steps waited for the whole save
    assert recs[-1]["event"] == "end"  # (the last save's record comes before the end)

    # the suggestion from those records, worked out here from the same numbers
    batch = json.loads((rd / "run.json").read_text())["training"]["batch_size"]
    rates = [r["samples_per_s"] for r in recs if "loss" in r and "event" not in r][ci.WARMUP_RECORDS:]
    step_s = batch / statistics.median(rates)
    c = statistics.median(r["blocked_s"] for r in saves)
    got = ci.suggest_for_runs(tmp_path / "runs", device_mtbf_h=1.0)
    assert got is not None and got.run == "r1" and got.saves == 4 and got.devices == 1 and got.current == 5
    assert got.cost_s == pytest.approx(c) and got.step_s == pytest.approx(step_s)
    assert got.tau_s == pytest.approx(math.sqrt(2 * c * 3600))
    assert got.steps == max(1, round(math.sqrt(2 * c * 3600) / step_s))
    assert f"every {got.steps:,} steps" in got.line and "median of 4 in r1" in got.line


def test_no_suggestion_without_measured_checkpoints(tmp_path):
    assert ci.suggest_for_runs(tmp_path / "nothing") is None
    d = tmp_path / "runs" / "old"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"training": {"batch_size": 8}}))
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "time": 0.1, "loss": 1.0, "samples_per_s": 80.0}) + "\n")
    assert ci.suggest_for_runs(tmp_path / "runs") is None  # an older run: no checkpoint records
    with open(d / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 1, "event": "checkpoint", "blocked_s": 2.0, "write_s": 2.0}) + "\n")
    (d / "attempts.jsonl").write_text(json.dumps({"attempt": 0, "world": 4}) + "\n")
    got = ci.suggest_for_runs(tmp_path / "runs", device_mtbf_h=4.0)
    assert (got.devices, got.step_s, got.cost_s) == (4, 0.1, 2.0)  # the world the run ran on
    assert got.tau_s == pytest.approx(math.sqrt(2 * 2.0 * 3600))


def test_runs_table_and_cli_show_each_attempts_layout_and_the_suggestion(tmp_path, capsys):
    """A run that lost a node: attempts.jsonl says dp2, then dp1 (and dp1 again); the runs
    table's row and `layerflow runs` say "dp2 → dp1", and the CLI prints the interval."""
    from app.cli import main
    from engine.runs.history import attempt_layouts, run_row

    d = tmp_path / "runs" / "lost-a-node"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"name": "lost-a-node", "total_steps": 100, "training": {
        "batch_size": 32, "checkpoint_interval": 10}, "plan": {"pp": 1, "dp": 2, "tp": 1}}))
    (d / "status.json").write_text(json.dumps({"state": "succeeded", "step": 100, "total_steps": 100,
                                               "started": 1000.0, "ended": 1100.0}))
    lines = [{"step": s, "time": s * 0.5, "loss": 1.0 / s, "samples_per_s": 64.0} for s in range(1, 101)]
    lines += [{"step": s, "event": "checkpoint", "blocked_s": 1.5, "write_s": 1.5, "time": s * 0.5}
              for s in (10, 20, 30)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    attempts = [{"attempt": 0, "started": 1000.0, "world": 2, "layout": {"pp": 1, "dp": 2, "tp": 1}},
                {"attempt": 1, "started": 1030.0, "world": 1, "layout": {"pp": 1, "dp": 1, "tp": 1},
                 "after": {"step": 25, "error": "rank 1 lost", "at": 1020.0}},
                {"attempt": 2, "started": 1060.0, "world": 1, "layout": {"pp": 1, "dp": 1, "tp": 1},
                 "after": {"step": 45, "error": "preempted", "at": 1055.0}}]
    (d / "attempts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in attempts))
    assert attempt_layouts(attempts[:1]) == "dp2"
    assert attempt_layouts([{"attempt": 0, "world": 4, "layout": {"pp": 2, "dp": 2, "tp": 1}},
                            {"attempt": 1, "world": 3}]) == "pp2×dp2 → world 3"
    row = run_row(d)
    assert (row["restarts"], row["down_s"], row["layouts"], row["checkpoint_s"]) == (2, 15.0, "dp2 → dp1", 1.5)

    assert main(["runs", str(tmp_path / "runs"), "--mtbf-hours", "2"]) == 0
    out = capsys.readouterr().out
    header, first = out.splitlines()[:2]
    assert "restarts" in header and "layouts" in header and "checkpoint_s" in header
    assert "dp2 → dp1" in first and "1.5" in first
    # C 1.5 s, M 2 h / 1 device (the world of its last attempt), 0.5 s steps: sqrt(2 x 1.5 x 7200) = 147 s = 294 steps
    want = ci.suggest(1.5, 0.5, 1, 2.0, saves=3, run="lost-a-node", total_steps=100)
    assert want.steps == 294
    assert f"checkpoint_interval, from lost-a-node (it ran with 10): {want.line}" in out, out
    assert "median of 3 in lost-a-node" in want.line and "longer than the run (100 steps)" in want.line
