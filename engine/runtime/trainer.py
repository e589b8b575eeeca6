"""The trainers' common part, BaseTrainer, and the one-process Trainer (one process holds the
whole model); parallel_trainer.ParallelTrainer (one rank of several) is a BaseTrainer too.

    the run's settings    from the typed spec (spec.py RunSpec): steps, batch, loss, clipping
    the data              batches.py RunData: this rank's share of the batch of (seed, step),
                          read in place (datasets/) or from the run folder's data.npz
    the model             the diagram's module with its seed's weights (model.py), then weights.pt
    optimizer, schedule   of the spec's OptimizerSpec and ScheduleSpec (steps.py)
    checkpoints           dist_checkpoint.py's one format, read by its one safe loader

    float8                placement.mixed_precision float8 (float8.py): refused at start where it
                          cannot run; the Linear layers converted by convert_model
    compilation           training.compile (compiling.py): the model compiled in place, its
                          first compile done by warm_up before the loop's clock starts

fit (loop.py) drives a trainer through these methods and attributes only:
train_step, log_sync, evaluate, lr, save_checkpoint, load_checkpoint, save_final, warm_up;
total_steps, batch_size, local_batch, batches, device, spec, distributed, rank, data.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable

import torch
from torch import fx, nn

from .batches import RunData, chunks, forward, to_device
from .distributed.stages import apply_checkpointing, top_blocks
from .folder import save_tensors
from .model import build_graph_module, load_weights
from .spec import RunSpec
from .steps import (compute_loss, eval_record, eval_sums, left_as_it_was, lr_lambda, make_optimizer, rng_state,
                    set_rng_state)


class BaseTrainer:
    """A subclass builds `model` (what the optimizer steps) and `state_model` (what a
    checkpoint holds: the layers under their node ids), then calls `init_optimizer`."""

    distributed = False  # several ranks: they agree on stopping at log steps, rank 0 writes the files
    rank = 0

    model: nn.Module
    state_model: nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR

    def __init__(self, run_dir: str | Path, spec: RunSpec, device: torch.device):
        self.run_dir, self.spec, self.device = Path(run_dir), spec, device
        tr = spec.training
        self.total_steps = spec.total_steps
        self.batch_size = tr.batch_size  # the global batch of one optimizer step: what samples_per_s counts
        self.local_batch = tr.batch_size  # this rank's share of it
        self.loss_kind = spec.loss
        self.loss_options = spec.loss_options
        self.grad_clip = tr.grad_clip
        self.plan = spec.plan
        if self.plan.mixed_precision == "float8":  # refused now, in one line, where it cannot run
            from . import float8

            float8.check(device, tp=self.plan.tp, emulate=float8.emulated())

    def eval_record(self, sums) -> dict:
        """The validation record of summed eval_sums (steps.py): val_loss, val_acc,
        val_top5, val_ppl as the loss and the task have them."""
        return eval_record(self.loss_kind, sums, self.spec.data.n_classes, self.spec.data.task == "language_model")

    def open_data(self, share: tuple[int, int | None] = (0, None), local_world: int = 1) -> None:
        """This rank's data: `share` [lo:hi] of each global batch (a subclass knows it once
        its mesh is built); `batches.batch(step)` then reads only that."""
        self.data = RunData(self.run_dir, self.spec.data, self.batch_size, self.spec.training.seed, share=share,
                            end_step=self.total_steps, local_world=local_world, pin_memory=self.device.type == "cuda")
        self.batches = self.data.train

    def build_model(self) -> fx.GraphModule:
        """The whole model on the CPU: initial weights a function of the seed alone, then
        the run's weights file (an imported model's), if it has one."""
        gm = build_graph_module(self.spec.model, device="cpu", seed=self.spec.training.seed)
        if self.spec.weights:
            load_weights(gm, str(self.run_dir / self.spec.weights))
        return gm

    def convert_model(self, model: nn.Module, log=None) -> nn.Module:
        """What runs after tensor parallelism and before FSDP/DDP (parallel.parallelize's
        hook; the single-process trainer calls it on its whole model): float8's Linear
        layers (placement.mixed_precision float8), then training.compile. In place: the
        parameters, their names, state_dict and checkpoints stay those of the eager model."""
        if self.plan.mixed_precision == "float8":
            from . import float8

            float8.convert(model, emulate=float8.emulated(), head=float8.head_of(self.spec.model["nodes"]),
                           log=log or self._note)
        from .compiling import compile_module

        return compile_module(model, self.spec.training.compile, log=None, spec_nodes=self.spec.model["nodes"])

    def compile_model(self, model: nn.Module) -> nn.Module:
        """parallelize()'s hook (the name it was given for training.compile): convert_model."""
        return self.convert_model(model)

    def _note(self, msg: str) -> None:
        """A line for the run log from before fit's log exists: kept, and written by warm_up."""
        self.notes = [*getattr(self, "notes", []), msg]

    def warm_up_inputs(self):
        """A batch of this rank's micro-batch shapes (zeros) for warm_up's compile; None:
        the trainer compiles at its first step instead."""
        return None

    def warm_up(self, step: int, log=print) -> dict | None:
        """The first compile of a compiled model, before the loop's step clock starts
        (compiling.warm_up): its metrics record {"event": "compiled", "seconds", ...}, or
        None (nothing compiled). Training state is left as it was. Distributed, every rank
        does it together (warm_up_step): the record's seconds are the slowest rank's."""
        for msg in getattr(self, "notes", []):  # (what convert_model said before the log existed)
            log(msg)
        self.notes = []
        from .compiling import compiled_regions, warm_up

        if self.spec.training.compile in (None, "off"):
            return None
        regions = [r for m in getattr(self, "parts", [self.model]) for r in compiled_regions(m)]
        for r in regions:  # (a block that falls back later says so in the same log)
            r.log = log
        if self.distributed:  # (every rank, even one without regions: the step has collectives)
            return self.warm_up_step(step, regions, log)
        if not regions:
            return None
        x = self.warm_up_inputs()
        if x is None:
            log(f"compile {self.spec.training.compile}: {len(regions)} blocks compile at the first step")
            return None
        from .batches import forward

        return warm_up(self.model, lambda: forward(self.model, x), getattr(self, "autocast", contextlib.nullcontext),
                       log)

    def warm_up_step(self, step: int, regions: list, log=print) -> dict | None:
        """The distributed warm-up: one training step of every rank together (the schedule,
        DDP's or FSDP's collectives, as the real ones) on the first validation batch, with
        the optimizer and the learning-rate schedule held still; then buffers, random
        streams and gradients are put back. A rank's stage only compiles inside the
        pipeline's schedule, so the step is the one way to reach every region."""
        import time

        import torch.distributed as dist

        from .batches import rows

        mode = self.spec.training.compile
        batch = next(iter(self.data.val_batches(self.local_batch)), None)
        if batch is None:
            log(f"compile {mode}: no validation batch to warm up on: the blocks compile at the first step")
            return None
        x, y = batch
        k = rows(x)
        if k < self.local_batch:  # (a small validation set: repeat its rows up to the step's shapes)
            reps = -(-self.local_batch // k)
            x = ({n: v.repeat(reps, *[1] * (v.dim() - 1))[:self.local_batch] for n, v in x.items()}
                 if isinstance(x, dict) else x.repeat(reps, *[1] * (x.dim() - 1))[:self.local_batch])
            y = y.repeat(reps, *[1] * (y.dim() - 1))[:self.local_batch]
        modules = list(getattr(self, "parts", [self.model]))
        batches, t0 = self.batches, time.perf_counter()
        with left_as_it_was(modules):
            class _One:  # the warm-up batch at any step
                skipped = 0

                def batch(self, _step):
                    return x, y

            self.batches = _One()
            held = [(o, o.__dict__.get("step")) for o in (self.opt, self.sched)]  # (a scheduler wraps opt.step)
            self.opt.step = self.sched.step = lambda *a, **k: None
            try:
                self.train_step(step)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
            finally:
                self.batches = batches
                for o, own in held:
                    if own is None:
                        del o.step
                    else:
                        o.step = own
        seconds = torch.tensor(time.perf_counter() - t0, dtype=torch.float64, device=self.device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        seconds = float(seconds.item())
        failed = [r.name for r in regions if r.failed]
        rec = {"event": "compiled", "mode": mode, "seconds": round(seconds, 3), "blocks": len(regions)}
        if failed:
            rec["eager_blocks"] = failed
        fell = f"; {len(failed)} run eagerly" if failed else ""
        log(f"compile {mode}: {len(regions)} blocks on this rank compiled in {seconds:.2f} s (the slowest rank; "
            f"a warm-up step on a validation batch){fell}; not counted as step time")
        return rec

    def skipped_samples(self) -> int:
        """Corrupt samples replaced so far (all ranks' when distributed: a collective)."""
        return self.batches.skipped

    def init_optimizer(self) -> None:
        tr = self.spec.training
        self.opt = make_optimizer(self.model.parameters(), tr.optimizer)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(tr.schedule, self.total_steps))

    def autocast_for(self, bf16: bool) -> Callable[[], contextlib.AbstractContextManager]:
        """The forward's context: bf16 autocast (weights, gradients and the optimizer stay
        float32), or nothing."""
        if not bf16:
            return contextlib.nullcontext
        return lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)

    def lr(self) -> float:
        return self.opt.param_groups[0]["lr"]

    # ---- checkpoints: one format (DCP), so any layout resumes any other ----
    ckpt_group = None  # the process group of asynchronous saves (ParallelTrainer makes one)

    def save_checkpoint(self, path: Path, extra: dict, asynchronous: bool = False):
        """The checkpoint of this rank's part; with `asynchronous`, written behind the next
        steps: returns the dist_checkpoint.PendingSave (None once written)."""
        state = {"scheduler": self.sched.state_dict(), "rng": rng_state(), **extra}
        if not torch.distributed.is_available():  # a torch without torch.distributed has no DCP
            from .folder import save_tensors

            path.mkdir(parents=True, exist_ok=True)
            save_tensors({"model": self.state_model.state_dict(), "optimizer": self.opt.state_dict(), **state},
                         path / "state.pt")
            return
        from . import dist_checkpoint

        if asynchronous:
            return dist_checkpoint.save_async(path, self.state_model, self.opt, state, write_extra=self.rank == 0,
                                              group=self.ckpt_group)
        dist_checkpoint.save(path, self.state_model, self.opt, state, write_extra=self.rank == 0)
        return None

    def load_checkpoint(self, path: Path) -> dict:
        """Model and optimizer through dist_checkpoint.load (DCP of any layout, or an older
        run's state.pt; tensors and plain values only), then the schedule and, in one
        process, the random streams. Returns the checkpoint's extra state (step, elapsed...)."""
        from . import dist_checkpoint

        from .distributed.tied import tie_classes

        aliases = {n: [m for m in names if m != n] for names in tie_classes(self.spec.model.get("ties") or {})
                   for n in names}
        state = dist_checkpoint.load(path, self.state_model, self.opt, aliases=aliases)
        self.sched.load_state_dict(state["scheduler"])
        if not self.distributed:  # (rank 0's streams are not another rank's: each goes on with its own)
            set_rng_state(state["rng"])
        return state


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
            with self.autocast():  # (bf16 as in training: the loss itself is computed in float32)
                out = forward(self.model, x)
            sums = [a + b for a, b in zip(sums, eval_sums(self.loss_kind, out, y, self.loss_options))]
        self.model.train()
        return self.eval_record(sums)

    def save_final(self, path: Path) -> None:
        save_tensors(self.model.state_dict(), path)
