"""The entry point of every run: `python -m engine.runtime.train RUN_DIR [--resume]` trains
in this process (trainer.py's Trainer), or, under torchrun (WORLD_SIZE > 1), as one rank
of the distributed trainer (parallel_trainer.py). Both are trainer.py's BaseTrainers; the
loop both run is loop.py's `fit`, and the files it writes are folder.py's.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from .folder import latest_checkpoint, write_failure
from .loop import ProgressFn, fit
from .records import RunStatus
from .elastic import Resize, fit_world
from .recovery import Decision, decide, give_up
from .spec import RunSpec
from .steps import seed_all
from .trainer import Trainer


def load_spec(run_dir: str | Path) -> RunSpec:
    """RUN_DIR/run.json, typed and checked (spec.RunSpec.load)."""
    return RunSpec.load(run_dir)


def pick_device() -> torch.device:
    from .distributed.mesh import cuda_device_order
    from .steps import set_matmul_precision

    cuda_device_order()  # (before CUDA starts: cuda:i is nvidia-smi's GPU i)
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    set_matmul_precision(device)  # (TF32 on a GPU)
    return device


def run(run_dir: str | Path, *, resume: bool = False, progress: ProgressFn | None = None,
        attempt: Decision | None = None) -> RunStatus:
    """Single-process run of a prepared run folder."""
    run_dir = Path(run_dir)
    spec = RunSpec.load(run_dir)
    (run_dir / "logs").mkdir(exist_ok=True)
    with open(run_dir / "logs" / "rank0.log", "a") as logf:
        def log(msg: str) -> None:
            logf.write(msg.rstrip() + "\n")
            logf.flush()
        try:
            resize = None
            if spec.world > 1:  # planned for several processes, started on one (elastic.py)
                spec, resize = one_process(spec, log)
            seed_all(spec.training.seed)
            trainer = Trainer(run_dir, spec, pick_device())
            trainer.resize = resize
        except BaseException as exc:
            log(traceback.format_exc())
            write_failure(run_dir, spec.total_steps, f"{type(exc).__name__}: {exc}")
            raise
        return fit(trainer, run_dir, resume=resume, progress=progress, log=log, attempt=attempt)


def one_process(spec: RunSpec, log) -> tuple[RunSpec, Resize]:
    """The spec of a run planned for several processes as one process runs it: the whole
    global batch, in as many micro-batches as a replica's share of it was (torchrun
    restarted the run on the one device left, or `--nproc 1` was asked)."""
    import dataclasses

    resize = fit_world(spec.plan, 1, spec.training.batch_size, predicted_step_s=spec.predicted.step_s)
    log(resize.describe())
    k = spec.training.grad_accumulation * resize.accumulation
    return dataclasses.replace(spec, plan=resize.plan,
                               training=dataclasses.replace(spec.training, grad_accumulation=k)), resize


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.runtime.train")
    ap.add_argument("run_dir")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    run_dir = Path(args.run_dir)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: the distributed trainer
        from .parallel_trainer import run_distributed  # (torch.distributed: imported only under torchrun)

        # rank 0 decides whether this (re)start goes on, and from which checkpoint; every rank follows
        status = run_distributed(run_dir, resume=args.resume)
        return 0 if status.ok or (status.error or "").startswith("stopped restarting") else 1  # (no restart after a stop)
    # torchrun --max-restarts (training.restarts) starts the workers again after a failure:
    # go on from the latest checkpoint instead of training from step 0 again, unless the
    # failure is one no restart cures (recovery.decide)
    spec = RunSpec.load(run_dir)
    attempt = decide(run_dir, spec.training.restarts.max_restarts, spec.training.restarts.backoff_s)
    if attempt.stop:
        give_up(run_dir, attempt, spec.total_steps, print)
        return 0  # (the agent must not start it again)
    time.sleep(attempt.wait_s)
    resume = args.resume or (attempt.attempt > 0 and latest_checkpoint(run_dir) is not None)
    status = run(run_dir, resume=resume, attempt=attempt)
    return 0 if status.ok else 1


def _exit_now(code: int) -> None:
    """End a distributed worker without the interpreter's teardown: with the process
    group destroyed and every file written and closed, what is left are C++ objects
    whose destructors race gloo's own threads ("terminate called without an active
    exception", SIGABRT, seen about once in a few hundred CPU runs under load)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    code = main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _exit_now(code)
    sys.exit(code)
