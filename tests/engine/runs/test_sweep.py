"""Sweeps (engine/runs/sweep.py): the file checked key by key, the points, and a real queue of
runs of the digits MLP: two at once, one stopped early by a rule; the runs table and the
`sweep` / `runs` commands over it."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.project import load_project
from engine.runs.history import filter_rows, run_row, runs_table, sort_rows
from engine.runtime.records import RunStatus
from engine.runs.sweep import Sweep, SweepError, check_sweep, load_sweep
from remote.sweep_queue import SweepRunner

EXAMPLE = Path(__file__).resolve().parents[3] / "resources" / "examples" / "mlp_digits.lflow"


@pytest.fixture
def project(tmp_path):
    shutil.copy(EXAMPLE, tmp_path / "mlp_digits.lflow")
    return load_project(tmp_path / "mlp_digits.lflow")


@pytest.mark.parametrize("bad, where", [
    ({"parameters": {"training.optimizer.lr": [1e-3, -1.0]}}, "sweep.parameters.training.optimizer.lr[1]: training.optimizer.lr"),
    ({"parameters": {"placement.dp": [1, 0]}}, "sweep.parameters.placement.dp[1]: placement.dp"),
    ({"parameters": {"placement.schedule": ["1f1b", "zigzag"]}}, "sweep.parameters.placement.schedule[1]: placement.schedule"),
    ({"parameters": {"training.optimizer.lrr": [0.1]}}, "sweep.parameters.training.optimizer.lrr[0]"),
    ({"parameters": {"placement.ddp": [1]}}, "sweep.parameters.placement.ddp[0]: placement.ddp: placement has no field"),
    ({"parameters": {"model.width": [1]}}, "sweep.parameters.model.width: a setting is training."),
    ({"parameters": {}}, "sweep.parameters: give at least one"),
    ({"method": "random", "parameters": {"training.seed": [1, 2]}}, "sweep.budget: a random sweep needs a budget"),
    ({"method": "bayes", "parameters": {"training.seed": [1]}}, "sweep.method"),
    ({"parameters": {"training.seed": [1]}, "parallel": 0}, "sweep.parallel"),
    ({"parameters": {"training.seed": [1]}, "stop": {"rules": [{"metric": "loss", "at_step": 3}]}},
     "sweep.stop.rules[0]: give one of above or below"),
    ({"parameters": {"training.seed": [1]}, "stop": {"rules": [{"metric": "loss", "above": 1, "at": 3}]}},
     "sweep.stop.rules[0].at: unknown key"),
    ({"parameters": {"training.seed": [1]}, "stopp": {}}, "sweep.stopp: unknown key"),
])
def test_a_bad_sweep_is_one_line_naming_the_key(project, bad, where):
    with pytest.raises(SweepError) as exc:
        SweepRunner(project, bad)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(where), msg


def test_a_several_process_point_is_planned_before_anything_runs(project):
    # dp 3 does not divide the batch of 64: refused by the planner before any run starts
    with pytest.raises(SweepError) as exc:
        check_sweep(project, load_sweep({"parameters": {"placement.dp": [1, 3]}}))
    assert str(exc.value).startswith("sweep point 2 (dp=3): training.batch_size 64 is not divisible by dp=3")
    assert not (project.directory / "runs").exists()


def test_grid_and_random_points():
    grid = Sweep.from_json({"parameters": {"training.optimizer.lr": [1e-3, 1e-2], "placement.dp": [1, 2]}})
    assert grid.points() == [{"training.optimizer.lr": 1e-3, "placement.dp": 1}, {"training.optimizer.lr": 1e-3, "placement.dp": 2},
                             {"training.optimizer.lr": 1e-2, "placement.dp": 1}, {"training.optimizer.lr": 1e-2, "placement.dp": 2}]
    assert len(Sweep.from_json({"budget": 3, "parameters": grid.parameters}).points()) == 3
    rnd = {"method": "random", "budget": 3, "seed": 7, "parameters": {"training.optimizer.lr": [1, 2, 3, 4, 5, 6]}}
    a, b = Sweep.from_json(rnd).points(), Sweep.from_json(rnd).points()
    assert a == b and len({p["training.optimizer.lr"] for p in a}) == 3  # the same draw, no point twice
    rng = Sweep.from_json({"method": "random", "budget": 20, "parameters": {
        "training.optimizer.lr": {"low": 1e-4, "high": 1e-1, "log": True}, "training.batch_size": {"low": 16, "high": 64, "int": True}}})
    pts = rng.points()
    assert all(1e-4 <= p["training.optimizer.lr"] <= 1e-1 and isinstance(p["training.batch_size"], int) for p in pts)


def test_a_sweep_section_and_a_file(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"sweep": {"parameters": {"training.seed": [1, 2]}}}))
    assert load_sweep(f).points() == [{"training.seed": 1}, {"training.seed": 2}]
    f.write_text("{not json")
    with pytest.raises(SweepError, match=r"s.json: not JSON \(line 1"):
        load_sweep(f)


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_a_real_queue_two_at_once_one_stopped_early(project, capsys):
    """Two runs at once (both processes seen alive together); the one whose lr breaks the
    rule is stopped after step 30 the way Stop does (cancelled, checkpointed) and says so;
    the other trains to its end. Each folder is tagged with the sweep and its point."""
    sweep = {"name": "lrs", "parameters": {"training.optimizer.lr": [0.001, 0.005]}, "steps": 1500,
             "stop": {"rules": [{"metric": "lr", "above": 0.002, "at_step": 30}]}, "parallel": 2}
    runner = SweepRunner(project, sweep)
    assert runner.parallel == 2
    both_alive = []

    def on_event(event, run):
        alive = [h for h in runner._handles.values() if h.job.proc.poll() is None]
        both_alive.append(len(alive))

    runs = runner.run(on_event=on_event)
    assert max(both_alive) == 2, both_alive
    slow, fast = runs
    assert slow.state == "succeeded" and slow.step == 1500, (slow, fast)
    assert fast.state == "stopped" and fast.note.startswith("lr above 0.002 at step 30"), fast
    assert 30 <= fast.step < 1500
    st = RunStatus.read(fast.run_dir)
    assert st.state == "cancelled" and st.extra["stopped_early"] == fast.note
    assert list((fast.run_dir / "checkpoints").iterdir())  # stopped as Stop does: a checkpoint to go on from
    tag = json.loads((fast.run_dir / "sweep.json").read_text())
    assert tag["sweep"] == runner.id and tag["point"] == {"training.optimizer.lr": 0.005}
    assert fast.run_dir.parent == project.directory / "runs"
    record = json.loads(runner.state_file.read_text())
    assert [r["state"] for r in record["runs"]] == ["succeeded", "stopped"]

    rows = runs_table(project.directory / "runs", sweep=runner.id)
    assert [r["settings"]["lr"] for r in rows] == [0.001, 0.005]
    assert rows[1]["state"].startswith("stopped early: lr above 0.002 at step 30")
    done = rows[0]
    assert done["step"] == 1500 and done["best_val_acc"] > 0.5
    assert done["measured_step_s"] == pytest.approx(64 / done["samples_per_s"], rel=1e-9)
    assert done["predicted_step_s"] > 0 and done["step_time_ratio"] == pytest.approx(
        done["measured_step_s"] / done["predicted_step_s"], rel=1e-9)
    assert sort_rows(rows, "best_val_acc")[0]["best_val_acc"] == max(r["best_val_acc"] or 0 for r in rows)
    assert [r["settings"]["lr"] for r in filter_rows(rows, ["lr<0.002"])] == [0.001]
    assert [r["settings"]["lr"] for r in filter_rows(rows, ["state~stopped"])] == [0.005]

    from app.cli import main

    capsys.readouterr()
    assert main(["runs", str(project.path), "--sort", "final_loss", "--filter", "lr>0.0001", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["settings"]["lr"] for r in out} == {0.001, 0.005}
    assert out == sort_rows(out, "final_loss")
    assert main(["runs", str(project.directory), "--sort", "best_val_acc"]) == 0
    text = capsys.readouterr().out
    assert "stopped early: lr above 0.002" in text and "measured_step_s" in text


def test_cli_sweep_dry_run_prints_the_queue(project, tmp_path, capsys):
    from app.cli import main

    f = tmp_path / "sweep.json"
    f.write_text(json.dumps({"parameters": {"training.optimizer.lr": [0.001, 0.01], "placement.dp": [1, 2]}, "steps": 5}))
    assert main(["sweep", str(project.path), str(f), "--dry-run", "--parallel", "3"]) == 0
    out = capsys.readouterr().out
    assert "4 runs (grid) on this machine, 3 at once" in out
    lines = [ln.split() for ln in out.splitlines() if ln[:1].isdigit()]
    assert [ln[:4] for ln in lines] == [["1", "0.001", "1", "1"], ["2", "0.001", "2", "2"],
                                        ["3", "0.01", "1", "1"], ["4", "0.01", "2", "2"]]
    assert not (project.directory / "runs").exists()
    f.write_text(json.dumps({"parameters": {"placement.dp": [1, "two"]}}))
    assert main(["sweep", str(project.path), str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: sweep.parameters.placement.dp[1]: placement.dp: must be a valid integer, unable to parse "
                   "string as an integer, not 'two'"]


def test_run_row_of_a_folder_without_a_sweep(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "loss": 2.0, "samples_per_s": 100.0, "peak_mem_mb": 10},
        {"step": 2, "loss": 1.0, "samples_per_s": 300.0, "peak_mem_mb": 12},
        {"step": 3, "loss": 1.5, "samples_per_s": 200.0, "peak_mem_mb": 11, "val_loss": 1.2, "val_acc": 0.5}]))
    row = run_row(d)
    assert row["final_loss"] == 1.5 and row["best_loss"] == 1.0 and row["samples_per_s"] == 200.0
    assert row["peak_mem_mb"] == 12 and row["sweep"] is None and row["measured_step_s"] is None
    assert row["cpu_pct_mean"] is None and row["rss_mb_peak"] is None  # no system samples: empty columns
    (d / "logs").mkdir()
    (d / "logs" / "rank0.system.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"rank": 0, "t": 1.0, "cpu_pct": 50.0, "rss_mb": 100.0}, {"rank": 0, "t": 6.0, "cpu_pct": 100.0, "rss_mb": 140.0}]))
    (d / "logs" / "rank1.system.jsonl").write_text(json.dumps({"rank": 1, "t": 1.0, "cpu_pct": 90.0, "rss_mb": 120.0}))
    row = run_row(d)
    assert row["cpu_pct_mean"] == 80.0 and row["rss_mb_peak"] == 140.0 and row["gpu_util_pct_mean"] is None
