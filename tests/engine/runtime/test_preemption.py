"""A preempted run (engine/runtime/loop.py StopSignal, recovery.py): the preemption signal
checkpoints the run and ends it as preempted, a user's cancel still ends it as cancelled, and
a resume after a preemption is the next attempt of the same lineage, which no stop rule counts.
Real torchrun processes on this machine (2 ranks, gloo); the Slurm side is test_slurm_real.py."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from engine.project import load_project
from engine.runs.build import prepare_run
from engine.runtime.recovery import decide, read_attempts
from engine.runtime.records import CANCEL_FILE, RunStatus
from remote.launch.local import launch_local
from remote.launch.procs import alive

ROOT = Path(__file__).resolve().parents[3]
MLP = ROOT / "resources" / "examples" / "mlp_digits.lflow"
STEPS = 200

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("torchrun")]


def _run_dir(tmp_path: Path) -> Path:
    p = load_project(MLP)
    p.training = p.training.model_copy(update={"steps": STEPS, "checkpoint_interval": 40, "eval_interval": 10_000,
                                               "log_interval": 1})
    return prepare_run(p, tmp_path / "run", placement={"dp": 2})


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _events(run_dir: Path) -> list[dict]:
    """The run's event records, less the checkpoints' (a save's cost, one per checkpoint)."""
    return [r for r in _records(run_dir) if "event" in r and r["event"] != "checkpoint"]


def _wait_for_step(run_dir: Path, step: int, timeout: float = 120) -> None:
    end = time.time() + timeout
    while time.time() < end:
        st = RunStatus.read(run_dir)
        if st is not None and st.state == "running" and st.step >= step:
            return
        time.sleep(0.02)
    raise AssertionError(f"the run did not reach step {step}")


def _stopped_here(run_dir: Path, state: str) -> int:
    """The run ended as `state` at a step before its last, with a checkpoint there."""
    st = RunStatus.read(run_dir)
    assert st.state == state and 0 < st.step < STEPS, st
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{st.step}"
    assert _records(run_dir)[-1] == {**_records(run_dir)[-1], "event": "end", "state": state, "step": st.step}
    return st.step


def test_the_preemption_signal_checkpoints_and_ends_preempted_and_the_resume_is_one_lineage(tmp_path):
    d = _run_dir(tmp_path)
    job = launch_local(d, 2)
    _wait_for_step(d, 10)
    assert len(job.preempt()) == 2  # SIGUSR1 to both workers, as Slurm's warning reaches them
    assert job.wait(timeout=60) == 0  # exit 0: torchrun's agent spends no restart on it
    at = _stopped_here(d, "preempted")
    assert {"step": at, "event": "preempted"}.items() <= _events(d)[-2].items()
    assert not [p for p in [job.pid, *job.seen] if alive(p)]

    again = launch_local(d, 2, resume=True)
    assert again.wait(timeout=120) == 0, again.describe_failure()
    assert RunStatus.read(d).state == "succeeded"
    recs = _records(d)
    steps = [r["step"] for r in recs if "loss" in r]
    assert steps == list(range(1, STEPS + 1))  # none lost, none twice
    events = _events(d)
    assert [e["event"] for e in events] == ["preempted", "restart", "end"]  # the preemption stays in the lineage
    assert events[1]["reason"] == "preempted" and events[1]["step"] == at and events[1]["attempt"] == 1
    attempts = read_attempts(d)
    assert [a["attempt"] for a in attempts] == [0, 1] and attempts[1]["resumed_from"] == at
    assert attempts[1]["after"]["error"] == "preempted" and attempts[1]["after"]["preempted"] is True


def test_under_slurm_a_cancel_ends_cancelled_and_slurms_own_sigterm_ends_preempted(tmp_path):
    """With SLURM_JOB_ID set, as in a job step: Layerflow's cancel (LocalJob.terminate writes
    the cancel request first) ends the run as cancelled; a SIGTERM that comes with no request
    (Slurm's, at a preemption or a requeue) ends it as preempted."""
    d = _run_dir(tmp_path)
    slurm = {"SLURM_JOB_ID": "4242"}
    job = launch_local(d, 2, env=slurm)
    _wait_for_step(d, 10)
    job.terminate(grace=60)  # (SIGTERM to torchrun too, which then exits 1, as for any cancel)
    assert (d / CANCEL_FILE).exists()
    first = _stopped_here(d, "cancelled")

    job = launch_local(d, 2, resume=True, env=slurm)  # (the launch removes the old cancel request)
    assert not (d / CANCEL_FILE).exists()
    _wait_for_step(d, first + 10)
    for r in (0, 1):  # what slurmstepd does: SIGTERM to every process of the step
        os.kill(job.rank_pid(r), signal.SIGTERM)
    assert job.wait(timeout=60) == 0
    assert _stopped_here(d, "preempted") > first
    assert not [p for p in [job.pid, *job.seen] if alive(p)]


def test_a_start_after_a_preemption_is_the_next_attempt_and_no_stop_rule_counts_it(tmp_path, monkeypatch):
    """decide() alone, from the run folder: after a preemption (status.json says so, or Slurm
    requeued the job) no backoff and no stop; a torchrun restart in that allocation counts on
    from its number; the same error before and after a preemption is still the same error twice."""
    rd = tmp_path
    (rd / "logs").mkdir()
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    att = rd / "attempts.jsonl"
    att.write_text(json.dumps({"attempt": 0, "started": 1.0}) + "\n"
                   + json.dumps({"attempt": 1, "started": 2.0, "after": {"step": 12, "error": "ValueError: bad"}}) + "\n")
    RunStatus("preempted", 30, 50).write(rd)
    d = decide(rd, 0, 5.0)
    assert (d.attempt, d.stop, d.wait_s) == (2, None, 0.0)
    assert d.failure["error"] == "preempted" and d.failure["step"] == 30 and d.failure["preempted"]
    with open(att, "a") as f:
        f.write(json.dumps({"attempt": 2, "started": 3.0, "after": d.failure}) + "\n")
    # in that allocation, torchrun restarts the workers after the same error at the same step
    RunStatus("failed", 12, 50, error="ValueError: bad").write(rd)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    d = decide(rd, 3, 5.0)
    assert d.attempt == 3 and "the same error twice at step 12" in d.stop
    # a requeue whose attempt was killed before it could say so (status still running) is a preemption too
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    RunStatus("running", 44, 50).write(rd)
    d = decide(rd, 0, 5.0)
    assert (d.attempt, d.stop, d.wait_s) == (3, None, 0.0) and d.failure["preempted"] and "requeued" in d.failure["error"]
    # a first start is still attempt 0
    monkeypatch.delenv("SLURM_RESTART_COUNT")
    att.unlink()
    RunStatus("pending", 0, 50).write(rd)
    assert decide(rd, 0, 5.0).attempt == 0
