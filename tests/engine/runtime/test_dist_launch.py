"""Local torchrun launch: `train --nproc N`, the failing rank's traceback, and
Ctrl-C ending every process (torchrun and each worker in its own session)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.cli import main
from engine.project import Restarts, load_project, save_project
from engine.runs.build import prepare_run
from engine.runtime.spec import RunSpec
from remote.launch.local import launch_local
from remote.launch.procs import alive

ROOT = Path(__file__).resolve().parents[3]
MLP = ROOT / "resources" / "examples" / "mlp_digits.lflow"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("torchrun")]


def _pids_mentioning(text: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd and alive(int(entry)):
                out.append(int(entry))
    return out


def test_train_nproc_2_runs_data_parallel(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", str(MLP), "--nproc", "2", "--steps", "4", "--out", str(out)]) == 0
    assert RunSpec.load(out).plan.dp == 2
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "loss" in r] == [1, 2, 3, 4]
    assert json.loads((out / "status.json").read_text())["state"] == "succeeded"
    assert (out / "model.pt").exists() and (out / "logs" / "rank1.log").exists()
    assert "succeeded on 2 processes" in capsys.readouterr().err


def test_train_refuses_a_placement_that_cannot_run(tmp_path, capsys):
    rc = main(["train", str(MLP), "--nproc", "2", "--pp", "2", "--schedule", "1f1b", "--microbatches", "1",
               "--out", str(tmp_path / "r")])
    assert rc == 2
    assert "microbatches is 1 and pp is 2" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_failing_rank_traceback_is_reported(tmp_path):
    p = load_project(MLP)
    p.graph.add_node("Custom", {"path": "tests.engine.runtime._dist_fail:FailsOnRank1"}, id="bug")
    e = p.graph.outgoing("act1")[0]
    p.graph.disconnect(e)
    p.graph.connect("act1", "out", "bug", "in")
    p.graph.connect("bug", "out", e.dst, e.dst_port)
    from engine import trust

    with trust.allowing(["tests.engine.runtime._dist_fail:FailsOnRank1"]):  # the user trusts their own layer
        d = prepare_run(p, tmp_path / "run", steps=3, placement={"dp": 2})
    job = launch_local(d, 2)
    assert job.wait(timeout=300) != 0
    rank, tb = job.failure
    assert rank == 1 and "custom layer broke on rank 1" in tb and tb.startswith("Traceback")
    assert "rank 1 failed first" in job.describe_failure()
    assert not [p for p in [job.pid, *job.seen] if alive(p)]
    err = json.loads((d / "logs" / "rank1.error").read_text())  # a typed record: JSON, not a repr
    assert err["rank"] == 1 and "custom layer broke on rank 1" in err["error"]


def test_rank_error_records_of_older_runs_still_read(tmp_path):
    from engine.runtime.records import RankError
    from remote.launch.local import read_rank_error

    old = tmp_path / "rank0.error"
    old.write_text(repr({"rank": 0, "time": 5.0, "error": "ValueError: x"}))  # how runs before JSON wrote it
    assert read_rank_error(old) == RankError(0, 5.0, "ValueError: x")
    old.write_text('{"rank": 2, "time": 7, "error": "E"}')
    assert read_rank_error(old) == RankError(2, 7.0, "E") and RankError.parse('{"rank": true}') is None
    old.write_text("__import__('os').system('false')")  # never evaluated
    assert read_rank_error(old) is None
    old.write_text('{"rank": "0"}')
    assert read_rank_error(old) is None


def test_ctrl_c_ends_every_process_and_checkpoints(tmp_path):
    proj = tmp_path / "mlp.lflow"
    p = load_project(MLP)
    p.training.checkpoint_interval = 100000
    save_project(p, proj)
    out = tmp_path / "run"
    cli = subprocess.Popen([sys.executable, "main.py", "train", str(proj), "--nproc", "2", "--steps", "100000",
                            "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           start_new_session=True)
    metrics = out / "metrics.jsonl"
    end = time.monotonic() + 240
    while time.monotonic() < end and (not metrics.exists() or metrics.read_text().count("\n") < 3):
        assert cli.poll() is None, cli.communicate()
        time.sleep(0.5)
    assert len(_pids_mentioning(str(out))) >= 3  # torchrun and two workers
    cli.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal delivers
    try:
        _, err = cli.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # say what the CLI and the ranks were doing, then end them
        left = {pid: Path(f"/proc/{pid}/status").read_text().split("SigBlk:")[1].split()[0]
                for pid in _pids_mentioning(str(out)) + [cli.pid] if Path(f"/proc/{pid}/status").exists()}
        left["pytest"] = Path("/proc/self/status").read_text().split("SigBlk:")[1].split()[0]
        for pid in _pids_mentioning(str(out)) + [cli.pid]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the CLI did not end within 120 s of SIGINT; blocked signals per process: {left}; "
                    f"launcher log: {(out / 'logs' / 'launcher.log').read_text()[-1500:]}")
    assert cli.returncode == 130, err
    time.sleep(0.5)
    assert _pids_mentioning(str(out)) == []
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "cancelled"
    assert (out / "checkpoints" / "latest").exists()


def test_cli_resume_under_another_layout(tmp_path):
    """train --nproc 2 (DDP), then --resume with --pp 2: the DCP checkpoint of step 4
    continues as a pipeline, with the single-process losses."""
    from engine.runtime.train import run

    p = load_project(MLP)
    p.training.checkpoint_interval = 4
    p.training.log_interval = 1  # compared step by step
    proj = tmp_path / "mlp.lflow"
    save_project(p, proj)
    ref = prepare_run(p, tmp_path / "ref", steps=6)
    run(ref)
    want = {r["step"]: r["loss"] for r in map(json.loads, (ref / "metrics.jsonl").read_text().splitlines()) if "loss" in r}
    d = tmp_path / "run"
    assert main(["train", str(proj), "--nproc", "2", "--steps", "4", "--out", str(d)]) == 0
    assert main(["train", str(proj), "--resume", str(d), "--steps", "6", "--nproc", "2", "--pp", "2",
                 "--microbatches", "2"]) == 0
    plan = RunSpec.load(d).plan
    assert plan.pp == 2 and plan.dp == 1
    got = {r["step"]: r["loss"] for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines()) if "loss" in r}
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    for step in got:
        assert got[step] == pytest.approx(want[step], rel=1e-4), step


def test_a_rank_killed_by_a_signal_is_named_with_the_step_reached(tmp_path):
    """SIGKILL leaves no traceback: rank 0 then fails on the lost connection, and only
    torchrun's root cause says which rank died first (with no restarts left: a run that
    restarts itself is tests/engine/runtime/test_recovery.py's)."""
    p = load_project(MLP)
    p.training = p.training.model_copy(update={"restarts": Restarts(max_restarts=0)})
    d = prepare_run(p, tmp_path / "run", steps=100_000, placement={"dp": 2})
    job = launch_local(d, 2)
    metrics = d / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and len(metrics.read_text().splitlines() if metrics.exists() else []) < 20:
        time.sleep(0.3)
    victim = job.rank_pid(1)
    assert victim, "rank 1 not found"
    os.kill(victim, signal.SIGKILL)
    assert job.wait(timeout=300) != 0
    rank, text = job.failure
    assert rank == 1 and "killed by SIGKILL" in text
    st = json.loads((d / "status.json").read_text())
    assert st["state"] == "failed" and st["failed_rank"] == 1 and st["step"] >= 10
    assert st["error"].startswith("rank 1: rank 1 was killed by SIGKILL")
    assert f"rank 1 failed first at step {st['step']}" in job.describe_failure()
    from engine.runs.history import failure_report

    report = failure_report(d)  # what the app's failure dialog shows
    assert report["rank"] == 1 and "SIGKILL" in report["traceback"]
