"""A run folder's small records, typed: status.json (`RunStatus`) and
logs/rank{R}.error (`RankError`).

The runtime writes them (engine/runtime/folder.py, parallel_trainer.py); this machine's launcher
adds which rank failed first (remote/launch/local.py); the GUI, the CLI, the Python API
and the run list read them. Reading is lenient, since run folders outlive versions: a
field that is missing or of the wrong type reads as its default, times written as
ISO-8601 text read as epoch seconds, and fields this version does not know are kept
(`extra`) and written back unchanged. Standard library only: this ships to GPU nodes.
"""
from __future__ import annotations

import ast
import errno
import json
import math
import os
import time
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path

# A run's (and a remote job's) states, one vocabulary for the runtime, the run list, the
# job database and the Python API. The run writes pending..preempted itself; the host
# concludes the others when the run cannot say: a local run whose process died without
# writing its end (interrupted), one Slurm ended at its time limit (timeout), a remote
# job whose processes its nodes no longer show (lost: a later poll may find it again), a
# Slurm job requeued after a preemption, waiting to go on from its checkpoint (resuming).
# preempted: the attempt was stopped by the cluster, not by the user (loop.py StopSignal),
# and checkpointed where it stopped; a run folder's attempt that has ended, but a Slurm
# job that Slurm requeues goes on (remote/jobs.py: no terminal state of a job).
FINAL_STATES = ("succeeded", "failed", "cancelled", "preempted")  # what a run writes when it ends
STATES = ("pending", "running", *FINAL_STATES, "interrupted", "timeout", "lost", "resuming")
ENDED_STATES = (*FINAL_STATES, "interrupted", "timeout")  # nothing more will happen to it (here)
RESUMABLE_STATES = ("cancelled", "failed", "interrupted", "preempted")  # a checkpoint to go on from
# ended as asked: finished, or stopped by the user or the cluster (a checkpoint kept); the
# trainer exits 0, so torchrun's agent spends no restart on a preemption
OK_STATES = ("succeeded", "cancelled", "preempted")

STATUS_FILE = "status.json"
# Written in the run folder by Layerflow's own cancel paths (remote/jobctl.py cancel and
# slurm-cancel, LocalJob's stop) before they signal the run: the signal then reads as the
# user's cancel, not as a preemption (loop.py StopSignal says why a file). A launcher
# removes a stale one before it starts an attempt.
CANCEL_FILE = "cancel.requested"
# Written in rank 0's run folder by the tracker before it starts a returning node again
# (remote/tracker.py): torchrun's agents then stop the workers (SIGTERM) to take the node in,
# and the run reads that stop as the cluster's, not the user's: it checkpoints, ends the
# attempt preempted, and the next one (on more devices) resumes there. {"host", "at"}.
RESIZE_FILE = "resize.requested"
STATUS_BYTES = 2048  # status.json is padded to this: on a full disk it is rewritten in place, in blocks it owns
DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


def _int(v) -> int | None:
    return v if type(v) is int else None


def epoch_seconds(v) -> float | None:
    """A time as run folders hold it (epoch seconds, or ISO-8601 text) in epoch seconds."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, str):
        try:
            return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _text(v) -> str | None:
    return v if isinstance(v, str) else None


def write_text_atomic(path: Path, text: str) -> None:
    """Written whole or not at all: a temp file beside it, then a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@dataclass
class RunStatus:
    """Where a run (or a remote job) stands: status.json, what `Run.status()` and
    `Job.status()` return. state: one of STATES (a run writes pending..cancelled itself)."""
    state: str = "pending"
    step: int = 0
    total_steps: int | None = None
    pid: int | None = None  # the process that writes it (rank 0's)
    started: float | None = None  # epoch seconds
    ended: float | None = None
    error: str | None = None  # why it failed (the first failing rank's, when the launcher knows it)
    failed_rank: int | None = None
    failure: str | None = None  # the last line of that rank's traceback
    peer_error: str | None = None  # what rank 0 saw when another rank failed first
    extra: dict = field(default_factory=dict)  # fields of other versions, kept as they were

    @property
    def done(self) -> bool:
        """Nothing left to wait for: it ended (ENDED_STATES), or a remote job's nodes no longer show it (lost)."""
        return self.state in ENDED_STATES or self.state == "lost"

    @property
    def ok(self) -> bool:
        """It ended as asked: finished, or stopped by the user (a checkpoint to go on from)."""
        return self.state in OK_STATES

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        for k in ("failed_rank", "failure", "peer_error"):  # written only once known
            if d[k] is None:
                del d[k]
        return {**self.extra, **d}

    @classmethod
    def from_json(cls, d) -> RunStatus:
        if not isinstance(d, dict):
            return cls()
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(state=d["state"] if isinstance(d.get("state"), str) else "pending",
                   step=_int(d.get("step")) or 0, total_steps=_int(d.get("total_steps")), pid=_int(d.get("pid")),
                   started=epoch_seconds(d.get("started")), ended=epoch_seconds(d.get("ended")),
                   error=_text(d.get("error")),
                   failed_rank=_int(d.get("failed_rank")), failure=_text(d.get("failure")),
                   peer_error=_text(d.get("peer_error")), extra={k: v for k, v in d.items() if k not in known})

    @classmethod
    def read(cls, run_dir: str | Path) -> RunStatus | None:
        """The run folder's status.json; None when there is none (or it is being written
        for the first time and cannot be parsed yet)."""
        try:
            d = json.loads((Path(run_dir) / STATUS_FILE).read_text())
        except (OSError, ValueError):
            return None
        return cls.from_json(d)

    def write(self, run_dir: str | Path) -> None:
        """RUN_DIR/status.json, whole every time (a temp file, renamed). On a full disk, where
        no temp file fits, the padded file is overwritten within its own blocks, so a run
        still ends as 'failed' with its reason rather than staying 'running'."""
        path = Path(run_dir) / STATUS_FILE
        text = json.dumps(self.to_json(), indent=1, sort_keys=True)
        try:
            write_text_atomic(path, text.ljust(STATUS_BYTES))
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise
            data = text.encode()
            if len(data) > STATUS_BYTES and self.error:
                short = {**self.to_json(), "error": self.error[:STATUS_BYTES // 2] + "..."}
                data = json.dumps(short, indent=1, sort_keys=True).encode()
            with open(path, "r+b") as f:
                f.write(data.ljust(max(STATUS_BYTES, len(data))))
                f.truncate()


@dataclass
class RankError:
    """What a rank that failed by itself wrote (logs/rank{R}.error): when, and why."""
    rank: int
    time: float  # epoch seconds: the earliest is the rank that failed first
    error: str

    def to_json(self) -> dict:
        return {"rank": self.rank, "time": self.time, "error": self.error}

    @classmethod
    def parse(cls, text: str) -> RankError | None:
        """JSON; runs before session 9 wrote a Python repr of the same dict, read as a
        literal (never evaluated). None when it is neither."""
        try:
            d = json.loads(text)
        except ValueError:
            try:
                d = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return None
        if not (isinstance(d, dict) and type(d.get("rank")) is int and isinstance(d.get("error"), str)
                and isinstance(d.get("time"), (int, float)) and not isinstance(d.get("time"), bool)):
            return None
        return cls(d["rank"], float(d["time"]), d["error"])

    @classmethod
    def read(cls, path: str | Path) -> RankError | None:
        try:
            return cls.parse(Path(path).read_text())
        except OSError:
            return None


# ----- a run's settings, flat (TensorBoard's hparams, MLflow's params) ------------------
SETTING_SECTIONS = ("training", "plan")
SETTING_SKIP = {"training.dataset", "plan.mesh", "plan.stages", "plan.tp_plan", "plan.version", "plan.checkpoint"}


def run_settings(run_json: dict) -> dict[str, str | int | float | bool]:
    """The settings a run was made with (its run.json), flat and scalar: the training
    settings (training.optimizer.lr, training.batch_size, ...), the layout (plan.pp,
    plan.dp, plan.tp, plan.schedule, plan.microbatches, ...), the step count, loss and
    the project's name. Short lists read as text ("[0.9, 0.999]"); None values and the
    bulky parts (the stages' node lists, the mesh) are left out."""
    out: dict[str, str | int | float | bool] = {}

    def walk(prefix: str, v) -> None:
        if prefix in SETTING_SKIP or v is None:
            return
        if isinstance(v, dict):
            for k in sorted(v):
                walk(f"{prefix}.{k}", v[k])
        elif isinstance(v, (bool, int, str)) or (isinstance(v, float) and math.isfinite(v)):
            out[prefix] = v
        elif isinstance(v, (list, tuple)) and len(v) <= 8 and all(isinstance(x, (bool, int, float, str)) for x in v):
            out[prefix] = json.dumps(list(v))

    if not isinstance(run_json, dict):
        return out
    for section in SETTING_SECTIONS:
        if isinstance(run_json.get(section), dict):
            walk(section, run_json[section])
    for k in ("name", "total_steps", "loss"):
        v = run_json.get(k)
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            out[k] = v
    return out


NOT_SCALARS = frozenset(("step", "epoch", "time", "steps", "rank", "event", "seconds", "blocks"))


def record_scalars(rec: dict) -> dict[str, float]:
    """The numbers of one metrics.jsonl record as other tools' scalars, by name: a step
    record's loss, lr, samples_per_s, peak_mem_mb...; an evaluation record's val_* only
    (its lr repeats the step record's); the first compile's seconds as compile_seconds;
    nothing of other events. Finite numbers only."""
    if rec.get("event") is not None:
        s = rec.get("seconds")
        ok = rec.get("event") == "compiled" and isinstance(s, (int, float)) and not isinstance(s, bool)
        return {"compile_seconds": float(s)} if ok and math.isfinite(s) else {}
    evaluation = any(k.startswith("val_") for k in rec)
    out = {}
    for k, v in rec.items():
        if k in NOT_SCALARS or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        if evaluation and not k.startswith("val_"):
            continue
        out[k] = float(v)
    return out


__all__ = [
    "ENDED_STATES",
    "FINAL_STATES",
    "OK_STATES",
    "RESUMABLE_STATES",
    "STATES",
    "RankError",
    "RunStatus",
    "epoch_seconds",
    "record_scalars",
    "run_settings",
    "write_text_atomic",
]


def pid_alive(pid) -> bool:
    """Whether a process of that id runs (a zombie, exited but not reaped, does not)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    # A zombie (exited, not yet reaped by its parent) is not running.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def last_traceback(text: str) -> str | None:
    """The last Python traceback in a log, up to the exception line."""
    i = (text or "").rfind("Traceback (most recent call last):")
    if i < 0:
        return None
    return text[i:].strip()


def request_cancel(run_dir: str | Path) -> None:
    """Mark the run as cancelled by its user, before the stop signal is sent (CANCEL_FILE)."""
    try:
        (Path(run_dir) / CANCEL_FILE).write_text(f"{time.time():.3f}\n")
    except OSError:
        pass  # (no folder yet, or a full disk: the signal still stops the run)


def clear_cancel(run_dir: str | Path) -> None:
    """Before a new attempt starts: an old cancel request is not this attempt's."""
    try:
        (Path(run_dir) / CANCEL_FILE).unlink()
    except OSError:
        pass


def resize_requested(run_dir: str | Path) -> dict | None:
    """RESIZE_FILE's content ({"host", "at"}), or None when there is none."""
    try:
        got = json.loads((Path(run_dir) / RESIZE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else {}


def cancel_requested(run_dir: str | Path) -> bool:
    return (Path(run_dir) / CANCEL_FILE).exists()
