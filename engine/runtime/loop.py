"""The training loop, fit(), and everything it writes, for the single-process trainer
(train.py) and the distributed one (parallel.py) alike; `python -m engine.runtime.train
RUN_DIR [--resume]` (train.py) picks the trainer.

Runs on the user's machine and on cluster nodes alike, so it imports only torch,
numpy and the standard library. Everything it needs is in RUN_DIR (engine/run.py
writes it): run.json (the compiled model spec, training settings, placement/plan),
data.npz and an optional weights.pt. It writes, into the same folder:

  metrics.jsonl    one JSON object a line: {step, epoch, time, loss, lr, samples_per_s,
                   peak_mem_mb}; evaluation lines {step, epoch, time, lr, val_loss,
                   val_acc}; a last line {"event": "end", "state": ...}
  status.json      {state: running|succeeded|failed|cancelled, step, total_steps, ...}
  logs/rank0.log   progress and, on failure, the traceback
  checkpoints/     step_N/ per checkpoint, and `latest` naming the newest
  model.pt         the final weights (state_dict)

A resumed run continues the same trajectory: the batch of step s is a function of
(seed, s) (runtime/data.py) and checkpoints carry the optimizer, scheduler and RNG
states; metrics written after the checkpoint are cut off before training goes on.
"""
from __future__ import annotations

import errno
import json
import math
import os
import random
import shutil
import signal
import time
import traceback
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .records import RunStatus

ProgressFn = Callable[[int, int, dict], None]


# ----- settings -> torch objects ------------------------------------------------
def lr_lambda(schedule: dict, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the base lr at scheduler step s (0-based): linear warm-up, then
    constant, cosine (down to min_lr_ratio at the last step) or step decay."""
    name, warm = schedule.get("name", "constant"), int(schedule.get("warmup_steps", 0))
    min_ratio = float(schedule.get("min_lr_ratio", 0.0))
    step_size, gamma = int(schedule.get("step_size", 100)), float(schedule.get("gamma", 0.5))

    def f(s: int) -> float:
        if warm and s < warm:
            return (s + 1) / warm
        if name == "cosine":
            progress = min(1.0, (s - warm) / max(1, total_steps - warm))
            return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        if name == "step":
            return gamma ** ((s - warm) // step_size)
        return 1.0

    return f


def make_optimizer(params, cfg: dict) -> torch.optim.Optimizer:
    name, lr, wd = cfg.get("name", "adam"), float(cfg["lr"]), float(cfg.get("weight_decay", 0.0))
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=float(cfg.get("momentum", 0.0)), weight_decay=wd)
    betas = tuple(cfg.get("betas", (0.9, 0.999)))
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=wd)
    return torch.optim.Adam(params, lr=lr, betas=betas, weight_decay=wd)


def compute_loss(kind: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if kind == "cross_entropy":
        if out.dim() > 2:  # per-token logits (B, T, C) against targets (B, T)
            return F.cross_entropy(out.flatten(0, -2), y.flatten())
        return F.cross_entropy(out, y)
    if kind == "mse":
        return F.mse_loss(out, y.reshape(out.shape).to(out.dtype))
    raise ValueError(f"the Output node's loss is '{kind}': choose cross_entropy or mse to train")


def correct_count(out: torch.Tensor, y: torch.Tensor) -> int:
    pred = out.argmax(dim=-1)
    return int((pred.reshape(y.shape) == y).sum())


def peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    except (ImportError, OSError):
        return 0.0


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ----- run folder files ---------------------------------------------------------
DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
STATUS_BYTES = 2048  # status.json is padded to this: on a full disk it is rewritten in place, in blocks it owns


def disk_full(exc: BaseException | None) -> OSError | None:
    """The 'no space left' (or quota) error behind `exc`, if that is what it is."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def save_tensors(obj, path: Path) -> None:
    """torch.save through a Python file: a full disk raises OSError(ENOSPC), not torch's
    opaque 'unexpected pos' RuntimeError."""
    with open(path, "wb") as f:
        torch.save(obj, f)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: dict) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True))


class Status:
    """Writes the run's status.json (a records.RunStatus), whole every time."""

    def __init__(self, run_dir: Path, total_steps: int):
        self.path = run_dir / "status.json"
        self.record = RunStatus("running", 0, total_steps, os.getpid(), time.time())

    @property
    def fields(self) -> dict:
        return self.record.to_json()

    def update(self, **kw) -> None:
        for k, v in kw.items():
            if k not in RunStatus.__dataclass_fields__ or k == "extra":
                raise AttributeError(f"RunStatus has no field {k!r}")
            setattr(self.record, k, v)
        text = json.dumps(self.fields, indent=1, sort_keys=True)
        try:
            write_text_atomic(self.path, text.ljust(STATUS_BYTES))
        except OSError as exc:
            if not disk_full(exc):
                raise
            self._rewrite_in_place(text)

    def _rewrite_in_place(self, text: str) -> None:
        """No room for a temp file: overwrite the padded file within its own size, so the
        run still ends as 'failed' with its reason rather than staying 'running'."""
        fields = dict(self.fields)
        data = text.encode()
        if len(data) > STATUS_BYTES and fields.get("error"):
            fields["error"] = str(fields["error"])[:STATUS_BYTES // 2] + "..."
            data = json.dumps(fields, indent=1, sort_keys=True).encode()
        with open(self.path, "r+b") as f:
            f.write(data.ljust(max(STATUS_BYTES, len(data))))
            f.truncate()


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


def latest_checkpoint(run_dir: Path) -> Path | None:
    marker = run_dir / "checkpoints" / "latest"
    if not marker.exists():
        return None
    name = marker.read_text().strip()
    p = run_dir / "checkpoints" / name
    return p if name and p.is_dir() else None


# ----- the loop -----------------------------------------------------------------
LOG_PERIOD_S = 0.25  # an automatic log interval fills about this much time (the dashboard stays live)
MAX_LOG_INTERVAL = 100
WARMUP_LOGS = 3  # the first steps are each logged: a new run shows its loss at once


def log_interval_for(step_s: float, done: int) -> int:
    """Steps until the next metrics record when training.log_interval is not set: as many
    as fill LOG_PERIOD_S (a log step's sync and record cost well under 1% of that), from 1
    to MAX_LOG_INTERVAL. `step_s` is the agreed mean step time, so every rank picks the same."""
    if done < WARMUP_LOGS:
        return 1
    return max(1, min(MAX_LOG_INTERVAL, int(LOG_PERIOD_S / max(step_s, 1e-9))))


def next_log_step(step: int, start: int, fixed: int | None, step_s: float = 0.0) -> int:
    """The step after `step` that logs: a set interval's next multiple (10, 20, ...), or
    the automatic interval counted from here (`start`: where this run began or resumed)."""
    if fixed:
        return (step // fixed + 1) * fixed
    return step + log_interval_for(step_s, step - start)


class _Stop:
    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum, frame) -> None:  # SIGTERM: finish this step, then stop
        self.requested = True


class RunBusy(RuntimeError):
    """Another process is writing this run folder."""


class RunLock:
    """An exclusive lock on a run folder while a run writes it (fcntl.flock on
    RUN/run.lock, released by the kernel when the writer dies, however it dies)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "run.lock"
        self.fd: int | None = None

    def acquire(self) -> "RunLock":
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

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


PARENT_ENV = "LAYERFLOW_PARENT_PID"  # set by the launcher of a run that must not outlive it


def watch_parent(stop: _Stop, grace_s: float = 30.0, period_s: float = 1.0) -> None:
    """If the process that started this run (the CLI or the GUI, named by
    $LAYERFLOW_PARENT_PID) ends, however it ends, stop as after SIGTERM (checkpoint,
    then exit); if the run has not stopped `grace_s` later, exit at once. A run
    started detached on purpose has no such variable and is not watched."""
    import threading

    try:
        pid = int(os.environ.get(PARENT_ENV, "0"))
    except ValueError:
        return
    if pid <= 1:
        return

    def alive() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def loop() -> None:
        while alive():
            time.sleep(period_s)
        stop.requested = True
        time.sleep(grace_s)
        os._exit(143)

    threading.Thread(target=loop, name="layerflow-parent-watch", daemon=True).start()


def fit(trainer, run_dir: Path, spec: dict, *, resume: bool = False, progress: ProgressFn | None = None,
        writes_metrics: bool = True, log=print) -> dict:
    """Runs steps until total_steps or a stop request; returns the final status."""
    tr = spec["training"]
    total = trainer.total_steps
    eval_every, ckpt_every = int(tr["eval_interval"]), int(tr["checkpoint_interval"])
    start, elapsed0, offset = 0, 0.0, None
    lock = RunLock(run_dir).acquire() if writes_metrics else None  # one writer per run folder
    status = Status(run_dir, total) if writes_metrics else None
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise FileNotFoundError(f"{run_dir} has no checkpoint to resume from")
        state = trainer.load_checkpoint(ckpt)
        start, elapsed0, offset = int(state["step"]), float(state.get("elapsed", 0.0)), state.get("metrics_offset")
        log(f"resumed from {ckpt.name} at step {start}")
    metrics = MetricsWriter(run_dir / "metrics.jsonl", truncate_at=offset if resume else 0) if writes_metrics else None
    distributed = hasattr(trainer, "rank")  # parallel.py's trainer: ranks agree on stopping at log steps
    rank_metrics = RankMetrics(run_dir, int(trainer.rank), start if resume else None) if distributed else None
    stop = _Stop()
    watch_parent(stop)
    old_handler = None
    try:
        old_handler = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread (tests, GUI): no signal handling
        pass
    t0 = time.perf_counter() - elapsed0
    step = start
    state_name, error = "running", None

    def checkpoint(at: int) -> None:
        d = run_dir / "checkpoints" / f"step_{at}"
        try:
            trainer.save_checkpoint(d, {"step": at, "elapsed": time.perf_counter() - t0,
                                        "metrics_offset": metrics.offset() if metrics else None})
            if writes_metrics:  # `latest` moves only once the checkpoint is whole
                write_text_atomic(run_dir / "checkpoints" / "latest", d.name)
        except BaseException:
            if writes_metrics and latest_checkpoint(run_dir) != d:
                shutil.rmtree(d, ignore_errors=True)  # half a checkpoint: gone, and its space with it
            raise

    fixed = int(tr["log_interval"]) if tr.get("log_interval") else None  # None: from the step time
    next_log = next_log_step(start, start, fixed)
    loss_sum, last_log, t_last = None, start, time.perf_counter()
    try:
        if status:
            status.update(step=start)
        while step < total:
            # the hot path: the loss stays on the device; nothing waits for the step to end
            loss = trainer.train_step(step)
            loss_sum = loss if loss_sum is None else loss_sum + loss
            step += 1
            if not (step >= next_log or step == total or step % eval_every == 0 or step % ckpt_every == 0
                    or (stop.requested and not distributed)):
                continue
            # a log step: one host sync (and, distributed, one collective) for all the steps since the last
            now = time.perf_counter()
            n = step - last_log
            own_s = (now - t_last) / n
            loss_total, own, stop_now, step_s = trainer.log_sync(loss_sum, stop.requested, own_s)
            value = loss_total / n
            if not math.isfinite(value):
                within = f"at step {step}" if n == 1 else f"in steps {last_log + 1}-{step}"
                raise FloatingPointError(f"loss became {value} {within}: lower the learning rate "
                                         f"(training.optimizer.lr) or set training.grad_clip")
            rec = {"step": step, "epoch": trainer.batches.epoch_of(step - 1), "time": round(now - t0, 4),
                   "loss": value, "lr": trainer.lr(), "samples_per_s": round(trainer.batch_size / max(step_s, 1e-9), 2),
                   "peak_mem_mb": round(peak_mem_mb(trainer.device), 1)}
            if n > 1:
                rec["steps"] = n  # the loss is the mean over this many steps, ending at `step`
            if metrics:
                metrics.write(rec)
            if rank_metrics:
                rank_metrics.write(step, rec["time"], own_s, trainer.local_batch, own / n if own is not None else None)
            if step % eval_every == 0 or step == total:
                ev = trainer.evaluate()
                if metrics:
                    metrics.write({"step": step, "epoch": rec["epoch"], "time": round(time.perf_counter() - t0, 4),
                                   "lr": rec["lr"], **ev})
                rec.update(ev)
                log(f"step {step}/{total} loss {value:.4f} " + " ".join(f"{k} {v:.4f}" for k, v in ev.items()))
            if step % ckpt_every == 0 or step == total:
                checkpoint(step)
            if status:
                status.update(step=step)
            if progress:
                progress(step, total, rec)
            if stop_now:  # (distributed: agreed by every rank, at the same log step)
                checkpoint(step)
                state_name = "cancelled"
                break
            next_log = next_log_step(step, start, fixed, step_s)
            loss_sum, last_log, t_last = None, step, time.perf_counter()
        else:
            state_name = "succeeded"
            if writes_metrics or distributed:  # distributed: a collective; rank 0 writes
                trainer.save_final(run_dir / "model.pt")
    except KeyboardInterrupt:
        state_name = "cancelled"
        if step > start:
            checkpoint(step)
    except BaseException as exc:
        state_name, error = "failed", f"{type(exc).__name__}: {exc}"
        full = disk_full(exc)
        if full is not None:
            error = disk_full_message(run_dir, full, step)
        try:
            log(traceback.format_exc())
        except OSError:
            pass  # the log is on the full disk too; status.json carries the reason
        if full is not None:
            raise DiskFull(full.errno, error) from exc
        raise
    finally:
        if state_name == "cancelled":  # (a stop request or Ctrl-C: it checkpointed where it stopped)
            try:
                log(f"cancelled at step {step}")
            except OSError:
                pass  # a full disk: status.json still says it
        if rank_metrics:
            rank_metrics.close()
        if metrics:
            try:
                metrics.write({"event": "end", "state": state_name, "step": step,
                               "time": round(time.perf_counter() - t0, 4)})
                metrics.close()
            except OSError:
                pass  # a full disk: status.json still says how the run ended
        if status:
            status.update(state=state_name, step=step, ended=time.time(), error=error)
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
        if lock:
            lock.release()
    return status.fields if status else {"state": state_name, "step": step}


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


def load_spec(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())
