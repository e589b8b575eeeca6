"""A run that gets over a failed or hung rank by itself.

torchrun's elastic agent does the restarting (`--max-restarts`, training.restarts): it
starts every worker again after one fails. What this module adds is what the agent does
not know:

    at each (re)start     decide(): go on, or stop for good (the same error twice at the
                          same step: no restart cures it; a preemption never counts); the wait before the restart
                          (backoff, doubling); the attempt recorded in the one run folder
                          (attempts.jsonl) and as a "restart" record in metrics.jsonl, the
                          curves' marker; the run then resumes from its latest checkpoint
                          (train.py), whose batches are those of an unbroken run, since the
                          batch of step s is a function of (seed, s). A start after a
                          preemption (Slurm's requeue, or a resume of a preempted run) is
                          the next attempt of the same lineage, its "after" marked preempted
    while it runs         HangWatch: a rank with no step for the timeout (fixed, or derived
                          from the measured step time) ends itself, so the agent restarts
                          the group: no run waits forever on a stopped or stuck peer

Standard library only (it ships to the nodes).
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .records import RESIZE_FILE, RankError, RunStatus, resize_requested, write_text_atomic

ATTEMPTS_FILE = "attempts.jsonl"
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"  # set by torchrun's agent: 0, then 1, 2, ... per restart
REQUEUE_ENV = "SLURM_RESTART_COUNT"  # set by Slurm in a job it requeued: 1, 2, ... per requeue
HUNG_EXIT = 75  # a rank that ended itself because it saw no step for the hang timeout
MAX_BACKOFF_S = 60.0
HANG_FLOOR_S = 120.0  # the derived timeout is never below this (a slow evaluation, a checkpoint)
HANG_STEPS = 30  # ... and is this many measured step times


def attempt_number() -> int:
    """0 for a run's first start; k for torchrun's k-th restart of its workers."""
    try:
        return max(0, int(os.environ.get(RESTART_ENV, "0")))
    except ValueError:
        return 0


def read_attempts(run_dir: Path) -> list[dict]:
    """Every attempt recorded so far (attempts.jsonl), oldest first; unreadable lines skipped."""
    try:
        lines = (Path(run_dir) / ATTEMPTS_FILE).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


# what a rank sees when a peer ends under it (gloo, NCCL, the store): never the cause itself
PEER_ERROR = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|ECONNRESET|"
                        r"remote process exited|network error|DistNetworkError|Socket Timeout|"
                        r"communicator was aborted|Connection refused|peer closed", re.I)


def previous_failure(run_dir: Path) -> dict:
    """How the attempt before this one ended: {step, error, rank, at}. The error is the one
    of the rank that failed first (its logs/rank{R}.error; those of earlier attempts were
    cleared when the attempt after them was recorded), not what its peers saw after it (a
    closed connection, whose text changes from run to run). When every error written is a
    peer's and a rank of this folder wrote none, that rank ended without a word (SIGKILL,
    the out-of-memory killer): it is the cause, and the peers' first error is kept as
    "seen". Else status.json's. A status still saying running: the attempt ended without
    a word (a rank killed by a signal, or hung)."""
    run_dir = Path(run_dir)
    st = RunStatus.read(run_dir) or RunStatus()
    try:
        at = round((run_dir / "status.json").stat().st_mtime, 3)
    except OSError:
        at = None
    errors = sorted((e for e in map(RankError.read, (run_dir / "logs").glob("rank*.error")) if e is not None),
                    key=lambda e: e.time)
    own = [e for e in errors if not PEER_ERROR.search(e.error)]
    attempts = read_attempts(run_dir)
    here = attempts[-1].get("ranks_here") if attempts else None  # the ranks that write into this folder
    silent = sorted(set(here) - {e.rank for e in errors}) if isinstance(here, list) and errors and not own else []
    out = {"step": st.step, "at": at}
    if own:
        out.update(error=own[0].error, rank=own[0].rank)
    elif silent:
        out.update(error=f"rank {silent[0]} ended without a word (killed by a signal: SIGKILL, the out-of-memory "
                         f"killer)", rank=silent[0], seen=f"rank {errors[0].rank}: {errors[0].error}")
    elif errors:
        out.update(error=errors[0].error, rank=errors[0].rank)
    else:
        out.update(error="ended without a word (a rank was killed or hung)" if st.state == "running"
                   else (st.error or st.state), rank=st.failed_rank)
    return out


def _env_int(name: str) -> int:
    try:
        return max(0, int(os.environ.get(name, "0")))
    except ValueError:
        return 0


def after_preemption(run_dir: Path, k: int) -> dict | None:
    """How the attempt before this one ended, when the cluster stopped it: status.json says
    preempted (it checkpointed at the signal), or this is the first start of a job Slurm
    requeued (the attempt before may have been killed before it could say). None otherwise."""
    run_dir = Path(run_dir)
    st = RunStatus.read(run_dir)
    said = st is not None and st.state == "preempted"
    if not said and not (k == 0 and _env_int(REQUEUE_ENV) > 0):
        return None
    try:
        at = round((run_dir / "status.json").stat().st_mtime, 3)
    except OSError:
        at = None
    error = "preempted" if said else "requeued by Slurm (the attempt before ended without a checkpoint at its stop)"
    out = {"step": st.step if st is not None else 0, "error": error, "rank": None, "at": at, "preempted": True}
    joined = resize_requested(run_dir) if said else None
    if joined is not None:  # stopped to take in a node that came back (records.RESIZE_FILE)
        out.update(error=f"grown: {joined.get('host') or 'a node'} joined again", joined=joined.get("host"))
    return out


def _next_attempt(run_dir: Path) -> int:
    """The next attempt number of the run's lineage (attempts.jsonl), whoever started it:
    torchrun's agent (its restart count runs on across membership changes and is 0 again in
    a job Slurm requeued) or a resume. Only rank 0 reads and writes the file (agreed_start)."""
    numbers = [a["attempt"] for a in read_attempts(run_dir) if type(a.get("attempt")) is int]
    return max(numbers) + 1 if numbers else 1


@dataclass
class Decision:
    attempt: int
    stop: str | None  # why no restart can cure it; None: go on
    failure: dict | None  # how the previous attempt ended (None on a first start)
    wait_s: float  # the backoff before this attempt starts
    at: float = 0.0  # when it was decided: error files older than this are the previous attempts'


def decide(run_dir: Path, max_restarts: int, backoff_s: float) -> Decision:
    """What this (re)start does, from the files earlier attempts wrote (rank 0 decides and
    tells the others: parallel_trainer.agreed_start). After a preemption: the next
    attempt of the lineage at once (no backoff, no stop rule: no error happened; and no
    restart of torchrun's used, since a preempted rank exits 0)."""
    k, now = attempt_number(), time.time()
    preempted = after_preemption(run_dir, k)
    if preempted is not None:
        return Decision(_next_attempt(run_dir), None, preempted, 0.0, now)
    if k == 0:
        return Decision(0, None, None, 0.0, now)
    failure = previous_failure(run_dir)
    earlier = [a.get("after") for a in read_attempts(run_dir)
               if isinstance(a.get("after"), dict) and not a["after"].get("preempted")]  # (a preemption is no error)
    if earlier and (earlier[-1].get("step"), earlier[-1].get("error")) == (failure["step"], failure["error"]):
        why = (f"the same error twice at step {failure['step']} ({failure['error']}): a restart does not cure it; "
               f"fix it and resume the run (train --resume)")
        return Decision(_next_attempt(run_dir), why, failure, 0.0, now)
    return Decision(_next_attempt(run_dir), None, failure, min(MAX_BACKOFF_S, backoff_s * 2 ** (k - 1)), now)


def record_attempt(run_dir: Path, decision: Decision, world: int, layout: dict, resumed_from: int | None,
                   resized: dict | None = None, ranks_here: list[int] | None = None) -> dict:
    """Rank 0 appends this attempt to attempts.jsonl: when, on what world and layout, from
    which checkpoint, how the attempt before it ended ("after"), and, on a world other than
    the planned one, how the plan was laid out again for it ("resized": elastic.Resize.record)."""
    rec = {"attempt": decision.attempt, "started": round(time.time(), 3), "world": world, "layout": layout,
           "resumed_from": resumed_from}
    if resized:
        rec["resized"] = resized
    if ranks_here is not None:  # (the ranks whose error files land here: previous_failure)
        rec["ranks_here"] = ranks_here
    if decision.failure is not None:
        rec["after"] = decision.failure
    if decision.wait_s:
        rec["waited_s"] = round(decision.wait_s, 3)
    with open(Path(run_dir) / ATTEMPTS_FILE, "a") as f:
        f.write(json.dumps(rec) + "\n")
    (Path(run_dir) / RESIZE_FILE).unlink(missing_ok=True)  # (counted in "after")
    for p in (Path(run_dir) / "logs").glob("rank*.error"):  # counted in "after": the next decide reads only new ones
        e = RankError.read(p)
        if e is not None and e.time < decision.at:
            p.unlink(missing_ok=True)
    return rec


def restart_record(rec: dict, start: int) -> dict:
    """The metrics.jsonl record of a restart (the dashboard's marker): which attempt, from
    which step, why, and how long the run was down (failure to this attempt's start)."""
    after = rec.get("after") or {}
    out = {"step": start, "event": "restart", "attempt": rec["attempt"], "reason": after.get("error"),
           "failed_at_step": after.get("step"), "world": rec.get("world")}
    if rec.get("resized"):
        out["layout"] = rec["layout"]
        out["accumulation"] = rec["resized"]["accumulation"]
    if after.get("at") is not None:
        out["down_s"] = round(max(0.0, rec["started"] - after["at"]), 3)
    return out


def under_agent() -> bool:
    """Started by torchrun's agent, which restarts the workers when one ends."""
    return RESTART_ENV in os.environ


def give_up(run_dir: Path, decision: Decision, total_steps: int | None, log) -> None:
    """Rank 0 writes the run's end: failed, and why it stopped restarting."""
    st = RunStatus.read(run_dir) or RunStatus(total_steps=total_steps)
    st.state, st.ended, st.error = "failed", time.time(), f"stopped restarting: {decision.stop}"
    st.write(run_dir)
    log(f"attempt {decision.attempt}: {st.error}")


class HangWatch:
    """Ends this rank when no step ends for `timeout_s` (fixed), or, with None, for
    HANG_STEPS times the mean step time measured so far (at least HANG_FLOOR_S). Armed from
    the first step on (a first compile or a resume's load count for nothing). Ending the
    process (not raising) is the only way out of a collective that waits on a stopped peer;
    the agent then restarts the group."""

    def __init__(self, run_dir: Path, rank: int, timeout_s: float | None, log, period_s: float = 1.0):
        self.run_dir, self.rank, self.fixed, self.log = Path(run_dir), rank, timeout_s, log
        self.period_s = min(period_s, timeout_s / 4) if timeout_s else period_s
        self.last = None  # monotonic time of the last step's end
        self.steps, self.busy_s = 0, 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def timeout(self) -> float:
        if self.fixed:
            return self.fixed
        mean = self.busy_s / self.steps if self.steps else 0.0
        return max(HANG_FLOOR_S, HANG_STEPS * mean)

    def step_done(self) -> None:
        now = time.monotonic()
        if self.last is not None:
            self.steps += 1
            self.busy_s += now - self.last
        self.last = now
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="layerflow-hang-watch", daemon=True)
            self._thread.start()

    def hold(self) -> None:
        """Before an evaluation or a checkpoint (not steps, and as long as the validation set
        makes them): the watch waits until pause() starts its clock again."""
        self.last = None

    def pause(self) -> None:
        """After an evaluation or a checkpoint: the clock starts again."""
        self.last = time.monotonic()

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.period_s):
            last = self.last
            if last is None:  # held (an evaluation, a save)
                continue
            idle = time.monotonic() - last
            if idle > self.timeout():
                self._end(idle)

    def _end(self, idle: float) -> None:
        why = f"no step for {idle:.0f} s (hang timeout {self.timeout():.0f} s): this rank is treated as failed"
        try:
            self.log(f"rank {self.rank}: {why}")
            logs = self.run_dir / "logs"
            logs.mkdir(exist_ok=True)
            write_text_atomic(logs / f"rank{self.rank}.error", json.dumps(RankError(self.rank, time.time(), why).to_json()))
            if self.rank == 0:
                st = RunStatus.read(self.run_dir)
                if st is not None and st.state == "running":
                    st.state, st.ended, st.error = "failed", time.time(), why
                    st.write(self.run_dir)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(HUNG_EXIT)
