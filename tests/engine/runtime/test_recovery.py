"""A run that gets over a lost rank by itself (engine/runtime/recovery.py, training.restarts):
real torchrun processes on this machine, a rank killed with SIGKILL or stopped with SIGSTOP
mid-run, and the run's losses compared with an unbroken run's, step for step."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from engine.project import Restarts, load_project
from engine.runs.build import prepare_run
from engine.runtime.recovery import decide, read_attempts
from engine.runtime.records import RankError, RunStatus
from remote.launch.local import launch_local
from remote.launch.procs import alive

ROOT = Path(__file__).resolve().parents[3]
MLP = ROOT / "resources" / "examples" / "mlp_digits.lflow"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("torchrun")]


def _project(steps: int, restarts: Restarts | None = None):
    p = load_project(MLP)
    p.training = p.training.model_copy(update={"steps": steps, "checkpoint_interval": 40, "eval_interval": 10_000,
                                               "log_interval": 1, "restarts": restarts or Restarts(backoff_s=0.5)})
    return p


def _losses(run_dir: Path) -> dict[int, float]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in recs if "loss" in r]
    assert len(steps) == len(set(steps)), "a step is in metrics.jsonl twice"
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


def _rank_pid(job, rank: int) -> int:
    pid = job.rank_pid(rank)
    assert pid, f"rank {rank} not found"
    return pid


def _wait_for_step(run_dir: Path, step: int, timeout: float = 180) -> None:
    """Until metrics.jsonl has reached `step` (and the checkpoint before it is written)."""
    end = time.time() + timeout
    while time.time() < end:
        st = RunStatus.read(run_dir)
        if st is not None and st.step >= step and (run_dir / "checkpoints").exists():
            return
        time.sleep(0.05)
    raise AssertionError(f"the run did not reach step {step}")


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    """The same run with nothing killed: the losses each recovered run must equal."""
    d = prepare_run(_project(400), tmp_path_factory.mktemp("unbroken") / "run", placement={"dp": 2})
    assert launch_local(d, 2).wait(timeout=300) == 0
    return _losses(d)


def test_a_killed_rank_restarts_the_run_which_ends_as_an_unbroken_run(tmp_path, unbroken):
    d = prepare_run(_project(400), tmp_path / "run", placement={"dp": 2})
    job = launch_local(d, 2)
    _wait_for_step(d, 60)
    os.kill(_rank_pid(job, 1), signal.SIGKILL)
    assert job.wait(timeout=300) == 0, job.describe_failure()
    st = RunStatus.read(d)
    assert st.state == "succeeded" and st.step == 400
    got = _losses(d)
    assert sorted(got) == sorted(unbroken) == list(range(1, 401))
    for s in got:
        assert got[s] == pytest.approx(unbroken[s], rel=1e-4, abs=1e-6), s
    attempts = read_attempts(d)
    assert [a["attempt"] for a in attempts] == [0, 1]
    assert attempts[0]["layout"] == {"pp": 1, "dp": 2, "tp": 1} and attempts[0]["world"] == 2
    assert attempts[1]["resumed_from"] in (40, 80, 120) and attempts[1]["after"]["step"] >= 60
    recs = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    restart = [r for r in recs if r.get("event") == "restart"]  # the curves' marker
    assert len(restart) == 1 and restart[0]["attempt"] == 1 and restart[0]["step"] == attempts[1]["resumed_from"]
    assert restart[0]["down_s"] >= 0
    # the cause is the killed rank, which wrote nothing, not its peer's closed connection
    assert attempts[0]["ranks_here"] == [0, 1] and attempts[1]["after"]["rank"] == 1
    assert restart[0]["reason"].startswith("rank 1 ended without a word (killed by a signal")
    assert attempts[1]["after"]["seen"].startswith("rank 0: ")
    assert not [p for p in [job.pid, *job.seen] if alive(p)]
    from engine.runs.history import run_row

    row = run_row(d)  # the runs table: how often it restarted, and the time that cost
    assert row["restarts"] == 1 and row["down_s"] == restart[0]["down_s"]


def test_a_stopped_rank_is_a_hang_the_run_gets_over(tmp_path, unbroken):
    """SIGSTOP: the rank neither steps nor dies; its peer sees no step for the hang timeout,
    ends itself, and the agent starts the group again from the checkpoint."""
    d = prepare_run(_project(400, Restarts(backoff_s=0.5, hang_timeout_s=4)), tmp_path / "run", placement={"dp": 2})
    job = launch_local(d, 2)
    _wait_for_step(d, 60)
    os.kill(_rank_pid(job, 1), signal.SIGSTOP)
    assert job.wait(timeout=300) == 0, job.describe_failure()
    assert RunStatus.read(d).state == "succeeded"
    got = _losses(d)
    assert sorted(got) == list(range(1, 401))
    for s in got:
        assert got[s] == pytest.approx(unbroken[s], rel=1e-4, abs=1e-6), s
    attempts = read_attempts(d)
    assert len(attempts) == 2 and "no step for" in attempts[1]["after"]["error"]
    assert not [p for p in [job.pid, *job.seen] if alive(p)]


def test_the_same_error_twice_stops_restarting(tmp_path):
    """A bug in the user's layer fails the same way at the same step every time: the second
    time, the run stops at once and says why, instead of using up every restart."""
    p = _project(50, Restarts(max_restarts=5, backoff_s=0.2))
    p.graph.add_node("Custom", {"path": "tests.engine.runtime._dist_fail:FailsOnRank1"}, id="bug")
    e = p.graph.outgoing("act1")[0]
    p.graph.disconnect(e)
    p.graph.connect("act1", "out", "bug", "in")
    p.graph.connect("bug", "out", e.dst, e.dst_port)
    from engine import trust

    with trust.allowing(["tests.engine.runtime._dist_fail:FailsOnRank1"]):
        d = prepare_run(p, tmp_path / "run", placement={"dp": 2})
    job = launch_local(d, 2)
    assert job.wait(timeout=300) != 0
    st = RunStatus.read(d)
    assert st.state == "failed" and st.error.startswith("stopped restarting: the same error twice at step 0")
    assert "custom layer broke on rank 1" in st.error and "train --resume" in st.error
    assert len(read_attempts(d)) == 2  # attempt 0 and one restart, not five
    assert job.failure[0] == 1 and "custom layer broke on rank 1" in job.failure[1]


def test_decide_reads_only_what_earlier_attempts_wrote(tmp_path, monkeypatch):
    """Each rank decides alone from the run folder: a first start goes on; a restart waits
    (doubling, at most 60 s) unless the error and step repeat; the first failing rank's
    error counts, not its peers' (whose text names ports and changes)."""
    rd = tmp_path
    (rd / "logs").mkdir()
    RunStatus("failed", 12, 50, error="RuntimeError: Connection closed by peer [127.0.0.1]:40123").write(rd)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    first = decide(rd, 3, 2.0)
    assert (first.attempt, first.stop, first.failure, first.wait_s) == (0, None, None, 0.0)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    d = decide(rd, 3, 2.0)
    assert d.stop is None and d.wait_s == 8.0 and d.failure["step"] == 12
    assert d.failure["error"].startswith("RuntimeError: Connection closed")
    (rd / "logs" / "rank1.error").write_text(json.dumps(RankError(1, time.time(), "ValueError: bad").to_json()))
    assert decide(rd, 3, 2.0).failure == {**decide(rd, 3, 2.0).failure, "error": "ValueError: bad", "rank": 1}
    (rd / "attempts.jsonl").write_text(json.dumps({"attempt": 2, "started": 1.0,
                                                   "after": {"step": 12, "error": "ValueError: bad"}}) + "\n")
    assert "the same error twice at step 12 (ValueError: bad)" in decide(rd, 3, 2.0).stop
    # a peer's error only, and a rank of this folder that wrote none: that rank is the cause
    (rd / "logs" / "rank1.error").unlink()
    (rd / "logs" / "rank0.error").write_text(json.dumps(RankError(
        0, time.time(), "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[127.0.0.1]:5123").to_json()))
    (rd / "attempts.jsonl").write_text(json.dumps({"attempt": 0, "started": 1.0, "ranks_here": [0, 1]}) + "\n")
    silent = decide(rd, 9, 2.0).failure
    assert (silent["rank"], silent["error"]) == (1, "rank 1 ended without a word (killed by a signal: SIGKILL, "
                                                     "the out-of-memory killer)")
    assert silent["seen"].startswith("rank 0: RuntimeError: [../gloo")
    # the ranks here all wrote (the one that ended first is on another node): the first error
    (rd / "attempts.jsonl").write_text(json.dumps({"attempt": 0, "started": 1.0, "ranks_here": [0]}) + "\n")
    assert decide(rd, 9, 2.0).failure["rank"] == 0
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "9")
    (rd / "attempts.jsonl").write_text("")
    assert decide(rd, 9, 30.0).wait_s == 60.0


def test_the_restart_policy_is_a_setting_of_the_project_and_of_each_run(tmp_path, capsys):
    """training.restarts lives in the project (left out of the file at its defaults, so older
    files stay byte for byte); `train --restarts N` and lf's train(restarts=) set it for one
    run; a bad value is one line."""
    from app.cli import main
    from engine.runtime.spec import RunSpec
    from engine.runs.build import RunError, build_run

    p = load_project(MLP)
    assert "restarts" not in p.to_dict()["training"]
    p.training = p.training.model_copy(update={"restarts": Restarts(max_restarts=7, hang_timeout_s=30)})
    assert p.to_dict()["training"]["restarts"] == {"max_restarts": 7, "backoff_s": 2.0, "hang_timeout_s": 30.0}
    rd = build_run(p, tmp_path / "a", restarts=0).run_dir
    assert RunSpec.load(rd).training.restarts.max_restarts == 0
    assert RunSpec.load(rd).training.restarts.hang_timeout_s == 30.0
    with pytest.raises(RunError, match="restarts must be a whole number from 0 to 100, not -1"):
        build_run(p, tmp_path / "b", restarts=-1)
    assert not (tmp_path / "b").exists()
    assert main(["train", str(MLP), "--steps", "2", "--restarts", "0", "--out", str(tmp_path / "c")]) == 0
    assert RunSpec.load(tmp_path / "c").training.restarts.max_restarts == 0
    assert main(["train", "--resume", str(tmp_path / "c"), "--restarts", "2"]) == 2
    assert "--restarts sets up a new run" in capsys.readouterr().err


def test_asynchronous_checkpoints_resume_a_killed_run_as_synchronous_ones_do(tmp_path, unbroken):
    """training.checkpoint_async: the files are written behind the steps; a rank killed after
    such a checkpoint resumes from it, and every loss is the unbroken (synchronous) run's."""
    p = _project(400)
    p.training = p.training.model_copy(update={"checkpoint_async": True})
    d = prepare_run(p, tmp_path / "run", placement={"dp": 2})
    job = launch_local(d, 2)
    _wait_for_step(d, 90)
    os.kill(_rank_pid(job, 1), signal.SIGKILL)
    assert job.wait(timeout=300) == 0, job.describe_failure()
    got = _losses(d)
    assert sorted(got) == list(range(1, 401))
    for s in got:
        assert got[s] == pytest.approx(unbroken[s], rel=1e-4, abs=1e-6), s
    assert read_attempts(d)[1]["resumed_from"] in (40, 80, 120)
    assert (d / "checkpoints" / "latest").read_text().strip() == "step_400"


def test_a_failed_asynchronous_save_is_named_and_the_one_before_stays_the_latest(tmp_path, monkeypatch):
    import concurrent.futures

    from engine.runtime import dist_checkpoint
    from engine.runtime.train import run

    real = dist_checkpoint.dcp.async_save
    calls = []

    def second_fails(state, **kw):
        calls.append(kw["checkpoint_id"])
        if len(calls) == 2:
            f = concurrent.futures.Future()
            f.set_exception(OSError(28, "No space left on device"))
            return f
        return real(state, **kw)

    monkeypatch.setattr(dist_checkpoint.dcp, "async_save", second_fails)
    p = _project(100)
    p.training = p.training.model_copy(update={"checkpoint_async": True})
    rd = prepare_run(p, tmp_path / "run")
    assert run(rd).state == "succeeded"  # the run goes on: its previous checkpoint is whole
    recs = [json.loads(line) for line in (rd / "metrics.jsonl").read_text().splitlines()]
    failed = [r for r in recs if r.get("event") == "checkpoint_failed"]
    assert len(failed) == 1 and failed[0]["checkpoint"] == "step_80" and "No space left" in failed[0]["error"]
    assert not (rd / "checkpoints" / "step_80").exists() and (rd / "checkpoints" / "step_40").exists()
    assert "checkpoint step_80 failed" in (rd / "logs" / "rank0.log").read_text()
    assert (rd / "checkpoints" / "latest").read_text().strip() == "step_100"


def test_the_hang_watch_waits_through_an_evaluation_and_fires_after(tmp_path, monkeypatch):
    """An evaluation or a checkpoint holds the watch (a long validation set is no hang); the
    clock starts again after it, and a rank that then makes no step is ended."""
    from engine.runtime.recovery import HangWatch

    w = HangWatch(tmp_path, 0, 0.3, lambda _msg: None, period_s=0.05)
    fired = []
    monkeypatch.setattr(w, "_end", lambda idle: fired.append(idle))  # (the real one ends the process)
    w.step_done()
    w.hold()
    time.sleep(0.8)
    assert not fired
    w.pause()
    time.sleep(0.8)
    w.close()
    assert fired and fired[0] > 0.3
