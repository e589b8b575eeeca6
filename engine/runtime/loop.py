"""The training loop, fit(), for the single-process trainer (train.py) and the distributed
one (parallel_trainer.py) alike; `python -m engine.runtime.train RUN_DIR [--resume]` (train.py)
picks the trainer.

    fit            the loop, top-down: a step; at a log step, the components below
    MetricLogger   which steps log (training.log_interval, or an interval from the step
                   time) and their records, each the mean loss of the steps since the last
    Evaluator      the validation set, every eval_interval steps and at the last
    Checkpointer   every checkpoint_interval steps, at the last, where a run stops; resume
    StopSignal     SIGTERM, or the process that started the run gone: finish the step,
                   checkpoint, end as cancelled; a preemption (SIGUSR1, or Slurm's own
                   SIGTERM without a cancel request): the same, ending as preempted

What it writes is folder.py's RunFolder:

  metrics.jsonl    one JSON object a line: {step, epoch, time, loss, lr, samples_per_s, (one process: step_ms,)
                   peak_mem_mb[, steps]}; evaluation lines {step, epoch, time, lr, val_loss,
                   val_acc}; with training.compile, a first line {"event": "compiled",
                   "seconds": ...}; at a preemption {"event": "preempted", "step": ...}
                   (before its checkpoint: a resume keeps it); a last line {"event": "end", "state": ...}
  status.json      {state: running|succeeded|failed|cancelled|preempted, step, total_steps, ...}
  logs/rank0.log   progress and, on failure, the traceback
  logs/rankR.system.jsonl  each rank's CPU %, memory (and GPU) every few seconds, from a
                   thread of its own (sysmetrics.py; the steps do nothing for it)
  events.out.tfevents.*    the records as TensorBoard scalars and the settings as hparams
                   (rank 0; tensorboard.py, when the tensorboard package is installed)
  checkpoints/     step_N/ per checkpoint, and `latest` naming the newest
  model.pt         the final weights (state_dict)

A resumed run continues the same trajectory: the batch of step s is a function of
(seed, s) (runtime/data.py) and checkpoints carry the optimizer, scheduler and RNG
states; metrics written after the checkpoint are cut off before training goes on.
Runs on the user's machine and on cluster nodes alike: imports only torch, numpy and the
standard library.
"""
from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path
from typing import Callable

import torch

# (names importers take from here: dist_checkpoint's save_tensors; the functions the exported
# script copies, engine/interop/script_export.py)
from .folder import (  # noqa: F401
    DISK_FULL, CheckpointPolicy, DiskFull, MetricsWriter, RankMetrics, RunBusy, RunFolder, RunLock, disk_full, disk_full_message,
    latest_checkpoint, save_tensors, write_json_atomic, write_text_atomic,
)
from .steps import (  # noqa: F401
    compute_loss, correct_count, lr_lambda, make_optimizer, peak_mem_mb, reset_peak_mem, rng_state, seed_all,
    set_rng_state,
)
from .records import RunStatus, cancel_requested, pid_alive, resize_requested
from .recovery import Decision, HangWatch, record_attempt, restart_record, under_agent
from .tensorboard import TensorBoardLog

ProgressFn = Callable[[int, int, dict], None]


def fit(trainer, run_dir: str | Path, *, resume: bool = False, progress: ProgressFn | None = None,
        writes_metrics: bool = True, log=print, attempt: Decision | None = None) -> RunStatus:
    """Trains from step 0 (or, resumed, from the latest checkpoint) to total_steps, or until
    asked to stop; returns the final status (what status.json holds)."""
    tr, total = trainer.spec.training, trainer.total_steps
    folder = RunFolder(run_dir, total, writer=writes_metrics, rank=trainer.rank if trainer.distributed else None)
    checkpoints = Checkpointer(trainer, folder, tr.checkpoint_interval,
                               CheckpointPolicy(folder.path, tr.keep_checkpoints, tr.best_metric),
                               asynchronous=tr.checkpoint_async, log=log)
    evaluator = Evaluator(trainer, folder, tr.eval_interval, log)
    state, start, step, watch = "running", 0, 0, None
    with StopSignal(folder.path) as stop:
        try:
            start = step = folder.open(checkpoints.load_latest(log) if resume else None,
                                       device=getattr(trainer, "device", None))
            if folder.writer:  # (rank 0) the records as TensorBoard scalars too, where it is installed
                tb = TensorBoardLog.open(folder.path, trainer.spec.to_json(), start, log)
                if tb is not None:
                    folder.sinks.append(tb)
            # training.compile: the first compile happens here, before the step clock starts
            compiled = trainer.warm_up(start, log) if hasattr(trainer, "warm_up") else None
            if compiled:
                folder.write({"step": start, "time": round(folder.elapsed(), 4), **compiled})
            if attempt is not None and folder.writer:  # (rank 0) this attempt in the run's lineage
                _record_attempt(trainer, folder, attempt, start)
            watch = HangWatch(folder.path, trainer.rank, tr.restarts.hang_timeout_s, log) if under_agent() else None
            metrics = MetricLogger(trainer, folder, start, tr.log_interval)
            reset_peak_mem(trainer.device)  # (the steps' peak: not the compile's, nor a resume's load)
            while step < total:
                # the hot path: the loss stays on the device; nothing waits for the step to end
                metrics.add(trainer.train_step(step))
                step += 1
                if watch is not None:
                    watch.step_done()
                if not (metrics.due(step) or evaluator.due(step) or checkpoints.due(step)
                        or (stop.requested and not trainer.distributed)):  # (distributed: at log steps, agreed)
                    continue
                # a log step: one host sync (and, distributed, one collective) for all the steps since the last
                rec, stop_now = metrics.log(step, stop.code)
                ending = stop.ending(stop_now) if stop_now else None  # (every rank alike: the agreed code)
                if ending == "preempted":  # before this step's checkpoint, whose offset a resume cuts back to
                    folder.write({"step": step, "event": "preempted", "time": round(folder.elapsed(), 4)})
                checkpoints.settle()  # (a save written behind the steps that has ended)
                if watch is not None and (evaluator.due(step) or checkpoints.due(step)):
                    watch.hold()  # an evaluation or a save is no step: its time is not a hang
                if evaluator.due(step):
                    rec.update(evaluator.run(step, rec))
                if checkpoints.due(step):
                    checkpoints.save(step, rec)
                folder.set_status(step=step)
                if progress:
                    progress(step, total, rec)
                if stop_now:  # (distributed: every rank, at the same log step)
                    checkpoints.save(step, rec)
                    checkpoints.settle(block=True)
                    state = ending
                    break
                metrics.restart_clock()  # (evaluating and checkpointing took no step's time)
                if watch is not None:
                    watch.pause()
            else:
                state = "succeeded"
                checkpoints.settle(block=True)
                if folder.writer or trainer.distributed:  # distributed: a collective; rank 0 writes
                    trainer.save_final(folder.path / "model.pt")
        except KeyboardInterrupt:  # Ctrl-C (or a progress callback's): checkpointed where it stopped
            state = "cancelled"
            if step > start:
                checkpoints.save(step)
                checkpoints.settle(block=True)
        except BaseException as exc:
            state = "failed"
            raise folder.failed(exc, step, log)
        finally:
            if watch is not None:
                watch.close()
            trainer.data.close()  # (the loader's workers)
            folder.close(state, step, log)
    return folder.status


# ----- the components ----------------------------------------------------------------
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


def _record_attempt(trainer, folder: RunFolder, attempt: Decision, start: int) -> None:
    """attempts.jsonl gets this attempt (world, layout, the step it resumed from); a restart
    also gets a record in metrics.jsonl, after the cut a resume makes."""
    plan = getattr(trainer, "plan", None) or trainer.spec.plan  # (the layout this start runs: elastic.py)
    resize = getattr(trainer, "resize", None)
    rec = record_attempt(folder.path, attempt, int(os.environ.get("WORLD_SIZE", "1")),
                         {"pp": plan.pp, "dp": plan.dp, "tp": plan.tp}, start if start else None,
                         resize.record() if resize is not None and resize.changed else None,
                         getattr(getattr(trainer, "sharing", None), "here", None))
    if attempt.attempt > 0:
        folder.write({**restart_record(rec, start), "time": round(folder.elapsed(), 4)})


def wait_for_device(device) -> None:
    """Until the work queued on `device` has run (a GPU's stream; nothing to wait for on the CPU)."""
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device is not None and device.type not in ("cpu", "meta") and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize(device)


class MetricLogger:
    """The log steps and their records. Between two, the losses are summed on the device;
    at a log step the trainer's log_sync reads them (one host sync, and distributed, one
    collective that also says whether any rank was asked to stop and the mean step time)."""

    def __init__(self, trainer, folder: RunFolder, start: int, fixed: int | None):
        self.trainer, self.folder, self.start, self.fixed = trainer, folder, start, fixed
        self.next = next_log_step(start, start, fixed)
        self.loss_sum: torch.Tensor | None = None
        self.last, self.t_last = start, time.perf_counter()

    def add(self, loss: torch.Tensor) -> None:
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss

    def due(self, step: int) -> bool:
        return step >= self.next or step == self.trainer.total_steps

    def log(self, step: int, stop: bool) -> tuple[dict, bool]:
        """The record of the steps since the last log step, written; whether to stop now."""
        tr, n = self.trainer, step - self.last
        # the steps' device work is queued (the loop never waits for it): their time ends when
        # it has run, not when the host queued the last kernel (samples_per_s, the automatic
        # log interval and every bench ratio read this clock)
        wait_for_device(tr.device)
        now = time.perf_counter()
        own_s = (now - self.t_last) / n  # this rank's own step time
        loss_total, own, stop_now, step_s = tr.log_sync(self.loss_sum, stop, own_s)
        value = loss_total / n
        if not math.isfinite(value):
            within = f"at step {step}" if n == 1 else f"in steps {self.last + 1}-{step}"
            raise FloatingPointError(f"loss became {value} {within}: lower the learning rate "
                                     f"(training.optimizer.lr) or set training.grad_clip")
        rec = {"step": step, "epoch": tr.batches.epoch_of(step - 1), "time": round(self.folder.elapsed(now), 4),
               "loss": value, "lr": tr.lr(), "samples_per_s": round(tr.batch_size / max(step_s, 1e-9), 2),
               "peak_mem_mb": round(self.peak(), 1)}
        if n > 1:
            rec["steps"] = n  # the loss is the mean over this many steps, ending at `step`
        if self.folder.rank is None:  # one process: its step time here (several: each rank's own file)
            rec["step_ms"] = round(step_s * 1e3, 3)
        if tr.data.source_kind:  # a data set read in place: corrupt samples it skipped so far
            skipped = tr.skipped_samples()
            if skipped:
                rec["skipped_samples"] = skipped
        self.folder.write(rec)
        self.folder.write_rank(step, rec["time"], own_s, tr.local_batch, own / n if own is not None else None)
        self.next = next_log_step(step, self.start, self.fixed, step_s)
        self.loss_sum, self.last = None, step
        return rec, stop_now

    def restart_clock(self) -> None:
        self.t_last = time.perf_counter()

    def peak(self) -> float:
        """The peak memory of the steps since the last record (MB; the CPU: the process's
        peak resident set), then the counter reset; the run's highest so far stays in
        trainer.peak_seen_mb (what peak_mem_per_rank reports)."""
        tr = self.trainer
        value = peak_mem_mb(tr.device)
        tr.peak_seen_mb = max(getattr(tr, "peak_seen_mb", 0.0), value)
        reset_peak_mem(tr.device)
        return value


class Evaluator:
    """The validation set's loss (and accuracy), every eval_interval steps and at the last."""

    def __init__(self, trainer, folder: RunFolder, every: int, log):
        self.trainer, self.folder, self.every, self.log = trainer, folder, every, log

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.trainer.total_steps

    def run(self, step: int, rec: dict) -> dict:
        """Evaluates, writes an evaluation record beside the step's `rec`; returns the values."""
        ev = self.trainer.evaluate()
        self.folder.write({"step": step, "epoch": rec["epoch"], "time": round(self.folder.elapsed(), 4),
                           "lr": rec["lr"], **ev})
        self.log(f"step {step}/{self.trainer.total_steps} loss {rec['loss']:.4f} "
                 + " ".join(f"{k} {v:.4f}" for k, v in ev.items()))
        return ev


class Checkpointer:
    """checkpoints/step_N every checkpoint_interval steps, at the last and where a run
    stops; `latest` names one only once it is whole (a half one is removed); then the
    writer applies the policy (folder.py CheckpointPolicy: the last N and the best).

    What each save cost goes into metrics.jsonl, once the checkpoint is whole:
    {"step", "event": "checkpoint", "checkpoint", "blocked_s", "write_s", "time"}:
    blocked_s what the steps waited for it, write_s the whole save (the same for a save
    made while the steps wait; for one written behind them, until its files were whole).
    engine/runs/checkpoint_interval.py suggests an interval from them. (A resume cuts
    metrics.jsonl at its checkpoint's offset, taken before the save: the record of the
    checkpoint it resumes from goes with the lines after it.)"""

    def __init__(self, trainer, folder: RunFolder, every: int, policy: CheckpointPolicy | None = None,
                 asynchronous: bool = False, log=print):
        self.trainer, self.folder, self.every, self.policy = trainer, folder, every, policy
        self.saved: int | None = None  # the step last saved (a stop there needs no second one)
        # training.checkpoint_async: the files are written behind the next steps, one save in
        # flight at most; `latest` names it once rank 0's save is whole (all ranks' parts then are)
        self.asynchronous, self.log = asynchronous, log
        self.pending: tuple | None = None  # (PendingSave, folder, step, rec, its cost: {t0, blocked_s[, ended]})
        self.blocked_s = 0.0  # what the steps waited for the last save

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.trainer.total_steps

    def load_latest(self, log) -> dict:
        """The latest checkpoint into the trainer; its extra state (step, elapsed, metrics offset)."""
        ckpt = self.folder.latest()
        if ckpt is None:
            raise FileNotFoundError(f"{self.folder.path} has no checkpoint to resume from")
        state = self.trainer.load_checkpoint(ckpt)
        if self.policy is not None:
            self.policy.protected.add(ckpt.name)  # never removed while this process goes on from it
        log(f"resumed from {ckpt.name} at step {int(state['step'])}")
        return state

    def save(self, step: int, rec: dict | None = None) -> None:
        """Checkpoint `step`; `rec`: the values logged at it (its score for the policy)."""
        if step == self.saved:
            return
        self.settle(block=True)  # one save in flight at most
        d = self.folder.checkpoint_dir(step)
        t0 = time.perf_counter()
        try:
            pending = self.trainer.save_checkpoint(d, {"step": step, "elapsed": self.folder.elapsed(),
                                                       "metrics_offset": self.folder.offset()},
                                                   **({"asynchronous": True} if self.asynchronous else {}))
        except BaseException:
            self.folder.discard(d)
            raise
        self.saved = step
        self.blocked_s = time.perf_counter() - t0  # what the steps waited for this save
        if self.folder.writer:
            self.log(f"checkpoint {d.name}: the steps waited {self.blocked_s:.4f} s"
                     + (" (written behind the next steps)" if pending is not None else ""))
        if pending is None:
            self._whole(d, rec)
            self._cost(step, d, self.blocked_s, self.blocked_s)
        else:
            cost = {"t0": t0, "blocked_s": self.blocked_s}
            future = getattr(pending, "future", None)  # (its writer thread says when the files are whole,
            if hasattr(future, "add_done_callback"):  # not the log step that looks next)
                future.add_done_callback(lambda _f: cost.setdefault("ended", time.perf_counter()))
            self.pending = (pending, d, step, rec, cost)

    def settle(self, block: bool = False) -> None:
        """An asynchronous save that has ended: `latest` names it, or, if it failed, the
        failure is named and the checkpoint before it stays the latest. `block`: wait for it."""
        if self.pending is None:
            return
        pending, d, step, rec, cost = self.pending
        if not block and not pending.done():
            return
        self.pending = None
        try:
            pending.wait()
        except Exception as exc:  # noqa: BLE001  (the run goes on: its previous checkpoint is whole)
            self.folder.discard(d)
            keep = self.folder.latest()
            why = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            self.log(f"checkpoint {d.name} failed ({why}); {keep.name if keep else 'no checkpoint'} stays the latest")
            self.folder.write({"step": step, "event": "checkpoint_failed", "checkpoint": d.name, "error": why,
                               "time": round(self.folder.elapsed(), 4)})
            return
        self._whole(d, rec)
        self._cost(step, d, cost["blocked_s"], cost.get("ended", time.perf_counter()) - cost["t0"])

    def _cost(self, step: int, d: Path, blocked_s: float, write_s: float) -> None:
        """The checkpoint record of a whole save (rank 0's; the others write none)."""
        self.folder.write({"step": step, "event": "checkpoint", "checkpoint": d.name, "blocked_s": round(blocked_s, 6),
                           "write_s": round(max(write_s, blocked_s), 6), "time": round(self.folder.elapsed(), 4)})

    def _whole(self, d: Path, rec: dict | None) -> None:
        self.folder.mark_latest(d)
        if self.policy is not None and self.folder.writer:  # (every rank has written its part: save's barrier)
            value = (rec or {}).get(self.policy.metric)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            try:
                self.policy.saved(d.name, float(value) if ok else None)
            except OSError:  # bookkeeping only: the checkpoint is whole and `latest` names it
                pass


PREEMPT_SIGNAL = signal.SIGUSR1  # "the cluster wants these machines back": Slurm's warning, forwarded
PREEMPTED = 1 << 20  # a preemption's stop code: above any sum of plain stops (log_sync adds the ranks' codes)


def under_slurm() -> bool:
    """This process is a step of a Slurm job (srun or the batch script started it)."""
    return "SLURM_JOB_ID" in os.environ


class StopSignal:
    """A request to stop: SIGTERM (what a launcher's stop sends), SIGUSR1 (a preemption),
    or the process that started the run gone (watch_parent). The loop finishes its step,
    checkpoints, and ends as cancelled or preempted; distributed, at the next log step,
    where the ranks agree on it (log_sync adds the ranks' stop codes, so a rank that got
    no signal itself ends the way the one that did).

    A user's cancel and a preemption are told apart by a file, not by the signal alone:
    Slurm sends the same SIGTERM for `scancel`, a preemption, `scontrol requeue` and a node
    going down, and a signal loses its sender on the way (slurmstepd, srun, torchrun each
    pass it on), so no signal can say who asked. Layerflow's own cancel paths (jobctl's
    cancel and slurm-cancel, which the tracker's cancel runs; LocalJob's stop) write
    records.CANCEL_FILE into the run folder before they signal; each rank looks for it at
    the agreed stop step, after the signal came, on the file system it shares with the
    writer, which no forwarding can lose. So, at the stop:

        CANCEL_FILE present       cancelled (the user's cancel wins over a preemption)
        SIGUSR1                   preempted: Slurm's warning (sbatch --signal=B:USR1@GRACE,
                                  before a preemption or the time limit), which the batch
                                  script passes to the workers (torchrun ignores it)
        SIGTERM under Slurm       preempted: Slurm's own TERM at a preemption or a requeue
                                  (a bare `scancel` typed by hand reads so too; the job's
                                  Slurm state, CANCELLED, still says what it was)
        SIGTERM with RESIZE_FILE  preempted: torchrun's agent stopping the workers to take
                                  in a node that came back (the tracker wrote the file
                                  before it started that node): the next attempt grows
        SIGTERM elsewhere, the parent gone, Ctrl-C: cancelled, as before

    Launchers remove a stale CANCEL_FILE before they start an attempt."""

    def __init__(self, run_dir: str | Path | None = None) -> None:
        self.requested = False
        self.preempt = False
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._old: dict = {}

    def __call__(self, signum, frame) -> None:
        self.requested = True
        if signum == PREEMPT_SIGNAL or (signum == signal.SIGTERM and under_slurm()):
            self.preempt = True

    @property
    def code(self) -> int:
        """This rank's stop code for log_sync: 0 go on, 1 stop, PREEMPTED a preemption."""
        if not self.requested:
            return 0
        return PREEMPTED if self.preempt else 1

    def ending(self, agreed: float) -> str:
        """How the run ends at an agreed stop; `agreed`: the ranks' stop codes added."""
        if self.run_dir is not None and cancel_requested(self.run_dir):
            return "cancelled"
        if self.run_dir is not None and resize_requested(self.run_dir) is not None:
            return "preempted"
        return "preempted" if agreed >= PREEMPTED else "cancelled"

    def __enter__(self) -> StopSignal:
        watch_parent(self)
        for sig in (signal.SIGTERM, PREEMPT_SIGNAL):
            try:
                self._old[sig] = signal.signal(sig, self)
            except ValueError:  # not the main thread (tests, GUI): no signal handling
                pass
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            if old is not None:
                signal.signal(sig, old)


PARENT_ENV = "LAYERFLOW_PARENT_PID"  # set by the launcher of a run that must not outlive it


def watch_parent(stop: StopSignal, grace_s: float = 30.0, period_s: float = 1.0) -> None:
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

    def loop() -> None:
        while pid_alive(pid):
            time.sleep(period_s)
        stop.requested = True
        time.sleep(grace_s)
        os._exit(143)

    threading.Thread(target=loop, name="layerflow-parent-watch", daemon=True).start()
