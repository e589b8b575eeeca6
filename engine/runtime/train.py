"""The single-process trainer and the entry point of every run:
`python -m engine.runtime.train RUN_DIR [--resume]` trains in this process, or, under
torchrun (WORLD_SIZE > 1), as one rank of the distributed trainer (parallel.py). What
both trainers share is trainer.py's BaseTrainer; the loop both run is loop.py's `fit`,
and the files it writes are folder.py's.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

import torch

from .batches import chunks, forward, to_device
from .folder import RunBusy, RunLock, latest_checkpoint, save_tensors, write_failure  # noqa: F401  (importers')
from .loop import ProgressFn, fit
from .records import OK_STATES
from .spec import RunSpec
from .distributed.stages import apply_checkpointing, top_blocks
from .steps import compute_loss, eval_sums, lr_lambda, seed_all  # noqa: F401  (lr_lambda: importers')
from .trainer import BaseTrainer


def load_spec(run_dir: str | Path) -> RunSpec:
    """RUN_DIR/run.json, typed and checked (spec.RunSpec.load)."""
    return RunSpec.load(run_dir)


# ----- the single-process trainer ---------------------------------------------
class Trainer(BaseTrainer):
    """One process holds the whole model."""

    def __init__(self, run_dir: Path, spec: RunSpec, device: torch.device):
        super().__init__(run_dir, spec, device)
        # activation checkpointing as the plan says (the node flags, the planner's choice),
        # in the regions the distributed runtime cuts (stages.checkpoint_regions)
        model = apply_checkpointing(self.build_model(), set(spec.plan.checkpoint), top_blocks(spec.model["nodes"]))
        self.model = self.state_model = model.to(device).train()
        self.init_optimizer()
        self.open_data()
        self.accumulate = spec.training.grad_accumulation
        if self.batch_size % self.accumulate:
            raise ValueError(f"training.batch_size {self.batch_size} is not divisible by training.grad_accumulation "
                             f"{self.accumulate}; change one of them")
        # plan.mixed_precision bf16: the forward and the loss autocast (weights, gradients and
        # the optimizer stay float32), as the distributed trainer does without FSDP; float8: the
        # same, with the Linear layers' matmuls in float8 (torchao: float8.py)
        self.autocast = self.autocast_for(spec.plan.mixed_precision in ("bf16", "float8"))
        # float8, then training.compile: in place (the optimizer's parameters and the
        # checkpoints' names stay)
        self.model = self.convert_model(self.model)

    def warm_up_inputs(self):
        from .compiling import zeros_like_inputs

        x = zeros_like_inputs(self.spec.model, self.batch_size // self.accumulate, self.device)
        return x if len(x) > 1 else next(iter(x.values()))

    def train_step(self, step: int) -> torch.Tensor:
        """One optimizer step; its loss stays on the device (reading it would wait for the step)."""
        x, y = self.batches.batch(step)
        x, y = to_device(x, self.device), to_device(y, self.device)
        self.opt.zero_grad(set_to_none=True)
        # training.grad_accumulation equal micro-batches, one optimizer step: the gradient and the
        # loss are those of the mean of their mean losses (1: the whole batch at once)
        value = None
        parts = zip(chunks(x, self.accumulate), y.chunk(self.accumulate)) if self.accumulate > 1 else ((x, y),)
        for xm, ym in parts:
            with self.autocast():
                loss = compute_loss(self.loss_kind, forward(self.model, xm), ym, self.loss_options)
                if self.accumulate > 1:  # (no division, and no node for it in the backward, otherwise)
                    loss = loss / self.accumulate
            loss.backward()
            loss = loss.detach().float()
            value = loss if value is None else value + loss
        if self.grad_clip:  # multi-tensor kernels on GPUs; no host sync (the scale stays a tensor)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.opt.step()
        self.sched.step()
        return value

    def log_sync(self, loss_sum: torch.Tensor, stop: bool, step_s: float) -> tuple[float, float | None, bool, float]:
        """At a log step: (the summed loss of the steps since the last one, this rank's own
        part of it, whether to stop, the mean step time). One process: no collective."""
        value = float(loss_sum.item())
        return value, value, stop, step_s

    @torch.no_grad()
    def evaluate(self) -> dict:
        self.model.eval()
        sums = [0.0] * 5
        # batches of the training batch's size: what fits in training fits here (a language model's
        # logits are batch x seq x vocab: 256 windows of 1024 tokens at 50k words were 52 GB)
        for x, y in self.data.val_batches(self.batch_size):
            x, y = to_device(x, self.device), to_device(y, self.device)
            sums = [a + b for a, b in zip(sums, eval_sums(self.loss_kind, forward(self.model, x), y, self.loss_options))]
        self.model.train()
        return self.eval_record(sums)

    def save_final(self, path: Path) -> None:
        save_tensors(self.model.state_dict(), path)


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def run(run_dir: str | Path, *, resume: bool = False, progress: ProgressFn | None = None) -> dict:
    """Single-process run of a prepared run folder."""
    run_dir = Path(run_dir)
    spec = RunSpec.load(run_dir)
    (run_dir / "logs").mkdir(exist_ok=True)
    with open(run_dir / "logs" / "rank0.log", "a") as logf:
        def log(msg: str) -> None:
            logf.write(msg.rstrip() + "\n")
            logf.flush()
        try:
            seed_all(spec.training.seed)
            trainer = Trainer(run_dir, spec, pick_device())
        except BaseException as exc:
            log(traceback.format_exc())
            write_failure(run_dir, spec.total_steps, f"{type(exc).__name__}: {exc}")
            raise
        return fit(trainer, run_dir, resume=resume, progress=progress, log=log)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.runtime.train")
    ap.add_argument("run_dir")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    # torchrun --max-restarts starts the workers again after a failure: go on from the
    # latest checkpoint instead of training from step 0 again
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    resume = args.resume or (restarted and latest_checkpoint(Path(args.run_dir)) is not None)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: the distributed trainer
        from .parallel import run_distributed  # (torch.distributed: imported only under torchrun)

        status = run_distributed(args.run_dir, resume=resume)
    else:
        status = run(args.run_dir, resume=resume)
    return 0 if status["state"] in OK_STATES else 1


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
