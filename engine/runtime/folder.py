"""A run folder as a run writes it. engine/runs/build.py made it (run.json, data.npz, an optional
weights.pt); every rank of the run adds:

    run.lock                    RunLock: one writer at a time (rank 0's; the kernel frees it however it ends)
    status.json                 records.RunStatus: state, step, error (rank 0)
    metrics.jsonl               MetricsWriter: one JSON record a line, flushed at once (rank 0)
    logs/rank{R}.metrics.jsonl  RankMetrics: each rank's own step time and loss (distributed runs)
    logs/rank{R}.system.jsonl   sysmetrics.SystemSampler: each rank's CPU, memory (and GPU) every few seconds
    events.out.tfevents.*       tensorboard.TensorBoardLog: the records as TensorBoard scalars, the settings as hparams (rank 0)
    checkpoints/step_N/         one checkpoint (dist_checkpoint.py's format)
    checkpoints/latest          the name of the newest whole one
    checkpoints/best            the name of the best one by training.best_metric (CheckpointPolicy)
    checkpoints/scores.json     {"metric": ..., "scores": {step_N: value}} of the checkpoints kept
    model.pt                    the final weights (state_dict)

`RunFolder` holds these for the loop (loop.py `fit`), with the run's clock (which goes on
across a resume). A full disk ends a run with `disk_full_message`, which names the
checkpoint to go on from. Imports only torch and the standard library.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time
import traceback
from pathlib import Path

import torch

from .records import DISK_FULL, RunStatus, write_text_atomic
from .sysmetrics import SystemSampler

CHECKPOINTS = "checkpoints"
LATEST = "latest"  # checkpoints/latest: the name of the newest whole checkpoint
BEST = "best"  # checkpoints/best: the name of the best checkpoint by the run's best_metric
SCORES = "scores.json"  # checkpoints/scores.json: each kept checkpoint's best_metric value
HIGHER_IS_BETTER = {"val_acc"}


# ----- files written whole, and a full disk ---------------------------------------
def write_json_atomic(path: Path, obj: dict) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True))


def save_tensors(obj, path: Path) -> None:
    """torch.save through a Python file: a full disk raises OSError(ENOSPC), not torch's
    opaque 'unexpected pos' RuntimeError."""
    with open(path, "wb") as f:
        torch.save(obj, f)


def disk_full(exc: BaseException | None) -> OSError | None:
    """The 'no space left' (or quota) error behind `exc`, if that is what it is."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


class DiskFull(OSError):
    """The run folder's disk filled up; the message says what to do."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def disk_full_message(run_dir: Path, exc: OSError, step: int) -> str:
    try:
        free = shutil.disk_usage(run_dir).free / 2 ** 20
        room = f", {free:,.1f} MB free"
    except OSError:
        room = ""
    ckpt = latest_checkpoint(run_dir)
    where = f" at {exc.filename}" if getattr(exc, "filename", None) else ""
    then = (f"the latest whole checkpoint is {ckpt.name}: free space, then resume it "
            f"(python main.py train {run_dir / 'project.lflow'} --resume {run_dir})"
            if ckpt else "no checkpoint was written yet: free space and start the run again")
    return (f"disk full: {exc.strerror or 'no space left on device'}{where} at step {step} "
            f"(the run folder's disk{room}); {then}")


def latest_checkpoint(run_dir: Path) -> Path | None:
    marker = Path(run_dir) / CHECKPOINTS / LATEST
    if not marker.exists():
        return None
    name = marker.read_text().strip()
    p = Path(run_dir) / CHECKPOINTS / name
    return p if name and p.is_dir() else None


def write_failure(run_dir: Path, total_steps: int, error: str) -> None:
    """status.json of a run that failed before its loop began (building the model, the mesh)."""
    RunStatus("failed", 0, total_steps, os.getpid(), time.time(), time.time(), error).write(run_dir)


# ----- the metrics files ------------------------------------------------------------
class MetricsWriter:
    """Appends one JSON line per record and flushes it, so a tail sees it at once."""

    def __init__(self, path: Path, truncate_at: int | None = None):
        self.path = path
        if truncate_at is not None and path.exists():
            with open(path, "r+b") as f:
                f.truncate(truncate_at)
        self.f = open(path, "ab")

    def write(self, rec: dict) -> None:
        self.f.write((json.dumps(rec) + "\n").encode())
        self.f.flush()

    def offset(self) -> int:
        return self.f.tell()

    def close(self) -> None:
        self.f.close()


class RankMetrics:
    """logs/rankN.metrics.jsonl of a multi-process run: this rank's own step time,
    throughput and (where it computes one) local loss, for the dashboard's per-rank
    plots. Buffered, flushed every FLUSH_EVERY steps and at the end: no sync, no
    collective. A resumed run keeps the lines up to its checkpoint's step."""

    FLUSH_EVERY = 10

    def __init__(self, run_dir: Path, rank: int, resume_step: int | None = None):
        self.path = run_dir / "logs" / f"rank{rank}.metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        if resume_step is not None and self.path.exists():
            kept = []
            for ln in self.path.read_text(errors="replace").splitlines(keepends=True):
                try:
                    if ln.endswith("\n") and int(json.loads(ln).get("step", 0)) <= resume_step:
                        kept.append(ln)
                except (ValueError, TypeError, AttributeError):
                    continue  # a torn or foreign line
            write_text_atomic(self.path, "".join(kept))
        self.f = open(self.path, "a" if resume_step is not None else "w")
        self.n = 0

    def write(self, step: int, t: float, step_s: float, samples: int, loss: float | None) -> None:
        rec = {"step": step, "time": round(t, 4), "rank": self.rank, "step_ms": round(step_s * 1e3, 3),
               "samples_per_s": round(samples / max(step_s, 1e-9), 2)}
        if loss is not None and math.isfinite(loss):
            rec["loss"] = loss
        self.f.write(json.dumps(rec) + "\n")
        self.n += 1
        if self.n % self.FLUSH_EVERY == 0:
            self.f.flush()

    def close(self) -> None:
        try:
            self.f.close()
        except OSError:
            pass


# ----- one writer ------------------------------------------------------------------
class RunBusy(RuntimeError):
    """Another process is writing this run folder."""


class RunLock:
    """An exclusive lock on a run folder while a run writes it (fcntl.flock on
    RUN/run.lock, released by the kernel when the writer dies, however it dies)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "run.lock"
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunBusy(f"{self.path.parent} is being written by a run still going (pid {holder}); "
                          "stop it (or wait for it) before starting another on this folder") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# ----- the folder, as one rank of a run writes it -------------------------------------
def _say(log, msg: str) -> None:
    try:
        log(msg)
    except OSError:
        pass  # the log is on a full disk too: status.json carries the reason


class RunFolder:
    """RUN_DIR for one rank of a run. The `writer` (rank 0, or the one process) holds the
    lock and writes status.json, metrics.jsonl and checkpoints/latest; `rank` (set in a
    distributed run) writes that rank's own metrics. Locked when made; `open` begins the
    writing (fresh, or where a checkpoint left off), `close` ends it."""

    def __init__(self, path: str | Path, total_steps: int, *, writer: bool = True, rank: int | None = None):
        self.path, self.writer, self.rank = Path(path), writer, rank
        self.status = RunStatus("running", 0, total_steps, os.getpid(), time.time())
        self.metrics: MetricsWriter | None = None
        self.rank_metrics: RankMetrics | None = None
        self.sampler: SystemSampler | None = None  # this rank's system metrics (open starts it, close stops it)
        self.sinks: list = []  # more writers of the records (the TensorBoard log): write(rec), close()
        self.started = False
        self.t0 = time.perf_counter()
        self.lock = RunLock(self.path).acquire() if writer else None  # one writer per run folder

    def open(self, resumed: dict | None = None, device=None) -> int:
        """Begin writing; returns the step the run starts from. `resumed`: the extra state
        of the checkpoint it goes on from: the clock goes on from its elapsed time, and
        metrics.jsonl is cut back to its offset (the lines after it are of steps that run again).
        The system sampler starts (`device`: the rank's, for its GPU numbers)."""
        start = int(resumed["step"]) if resumed else 0
        self.t0 = time.perf_counter() - (float(resumed.get("elapsed", 0.0)) if resumed else 0.0)
        if self.writer:
            cut = resumed.get("metrics_offset") if resumed else 0
            self.metrics = MetricsWriter(self.path / "metrics.jsonl", truncate_at=cut)
        if self.rank is not None:
            self.rank_metrics = RankMetrics(self.path, self.rank, start if resumed else None)
        self.sampler = SystemSampler(self.path, self.rank or 0, self.elapsed, lambda: self.status.step,
                                     device).start(start if resumed else None)
        self.started = True
        self.set_status(step=start)
        return start

    def elapsed(self, now: float | None = None) -> float:
        """Seconds of training so far (a resumed run's include those before its checkpoint)."""
        return (time.perf_counter() if now is None else now) - self.t0

    # ---- records ----
    def write(self, rec: dict) -> None:
        """A metrics.jsonl record (the writer's; the other ranks write none)."""
        if self.metrics:
            self.metrics.write(rec)
            for sink in self.sinks:
                sink.write(rec)

    def write_rank(self, step: int, t: float, step_s: float, samples: int, loss: float | None) -> None:
        if self.rank_metrics:
            self.rank_metrics.write(step, t, step_s, samples, loss)

    def offset(self) -> int | None:
        """Where metrics.jsonl ends now (a checkpoint keeps it: a resume cuts back to it)."""
        return self.metrics.offset() if self.metrics else None

    def set_status(self, **fields) -> None:
        for k, v in fields.items():
            if k not in RunStatus.__dataclass_fields__ or k == "extra":
                raise AttributeError(f"RunStatus has no field {k!r}")
            setattr(self.status, k, v)
        if self.writer:
            self.status.write(self.path)

    # ---- checkpoints ----
    def checkpoint_dir(self, step: int) -> Path:
        return self.path / CHECKPOINTS / f"step_{step}"

    def latest(self) -> Path | None:
        return latest_checkpoint(self.path)

    def mark_latest(self, ckpt: Path) -> None:
        """`latest` names a checkpoint only once every rank has written its part."""
        if self.writer:
            write_text_atomic(self.path / CHECKPOINTS / LATEST, ckpt.name)

    def discard(self, ckpt: Path) -> None:
        """Half a checkpoint (its save failed): gone, and its space with it."""
        if self.writer and self.latest() != ckpt:
            shutil.rmtree(ckpt, ignore_errors=True)

    # ---- the end ----
    def failed(self, exc: BaseException, step: int, log) -> BaseException:
        """Records why the run failed (status.json's error; the traceback in the log) and
        returns what to raise: DiskFull, whose message says what to do, or `exc` itself."""
        full = disk_full(exc)
        self.status.error = disk_full_message(self.path, full, step) if full else f"{type(exc).__name__}: {exc}"
        _say(log, traceback.format_exc())
        if full is None:
            return exc
        err = DiskFull(full.errno, self.status.error)
        err.__cause__ = exc
        return err

    def close(self, state: str, step: int, log) -> dict:
        """Ends the files: metrics.jsonl's last record {"event": "end", ...}, status.json's
        final state (what a full disk cannot stop: it is rewritten in place), the lock
        released. Returns the status."""
        try:
            if state in ("cancelled", "preempted"):  # (a stop request, a preemption or Ctrl-C: it checkpointed there)
                _say(log, f"{state} at step {step}")
            if self.rank_metrics:
                self.rank_metrics.close()
            if self.sampler:
                self.sampler.stop()
            for sink in self.sinks:
                try:
                    sink.close()
                except Exception:  # noqa: BLE001 - an optional copy of the records must not hide how the run ended
                    pass
            if self.metrics:
                try:
                    self.metrics.write({"event": "end", "state": state, "step": step, "time": round(self.elapsed(), 4)})
                    self.metrics.close()
                except OSError:
                    pass  # a full disk: status.json still says how the run ended
            self.status.state, self.status.step, self.status.ended = state, step, time.time()
            if self.started and self.writer:
                self.status.write(self.path)
        finally:
            if self.lock:
                self.lock.release()
        return self.status.to_json()


# ----- which checkpoints stay -------------------------------------------------------
class CheckpointPolicy:
    """After a checkpoint is whole (rank 0): keep the last `keep` checkpoints (None: all)
    and the best by `metric` (val_acc: highest; val_loss, loss: lowest), named by
    checkpoints/best; remove the others. Never removed: `latest` and the checkpoint this
    process resumed from. A checkpoint's score is the metric logged at its own step (an
    evaluation at that step for val_*; the default eval_interval 50 divides
    checkpoint_interval 100), kept in checkpoints/scores.json across resumes."""

    def __init__(self, folder: Path, keep: int | None = 3, metric: str = "val_loss"):
        self.dir = Path(folder) / CHECKPOINTS
        self.keep, self.metric = keep, metric
        self.protected: set[str] = set()  # the checkpoint resumed from

    def scores(self) -> dict[str, float]:
        try:
            data = json.loads((self.dir / SCORES).read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("metric") != self.metric or not isinstance(data.get("scores"), dict):
            return {}
        return {k: float(v) for k, v in data["scores"].items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}

    def best(self, scores: dict[str, float]) -> str | None:
        live = {k: v for k, v in scores.items() if (self.dir / k).is_dir()}
        if not live:
            return None
        pick = max if self.metric in HIGHER_IS_BETTER else min
        # ties: the earlier step (it reached the value first)
        return pick(sorted(live, key=_step_of), key=lambda k: live[k])

    def saved(self, name: str, value: float | None) -> list[str]:
        """`name` is whole now (and `latest`), with this metric value (None: not measured
        at its step). Records the score, marks the best, removes what the policy drops;
        returns the names removed."""
        scores = self.scores()
        if value is not None and math.isfinite(value):
            scores[name] = float(value)
        best = self.best(scores)
        steps = sorted((p.name for p in self.dir.glob("step_*") if p.is_dir() and p.name[5:].isdigit()),
                       key=_step_of)
        latest = latest_checkpoint(self.dir.parent)
        keep = set(steps if self.keep is None else steps[-self.keep:])
        keep |= {n for n in (best, latest.name if latest else None, name) if n} | self.protected
        removed = [n for n in steps if n not in keep]
        scores = {k: v for k, v in scores.items() if k not in removed and (self.dir / k).is_dir()}
        write_json_atomic(self.dir / SCORES, {"metric": self.metric, "scores": scores})
        if best:
            write_text_atomic(self.dir / BEST, best)
        for n in removed:  # after the markers: a crash here leaves an extra folder, never a dangling name
            shutil.rmtree(self.dir / n, ignore_errors=True)
        return removed


def _step_of(name: str) -> int:
    return int(name[5:]) if name[5:].isdigit() else -1
