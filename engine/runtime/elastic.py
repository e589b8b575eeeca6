"""A run that goes on with the devices it got: the plan re-laid for the world of this start.

torchrun's elastic agent (`--nnodes MIN:MAX`, c10d rendezvous) starts the workers again on
the nodes that are left when one is gone, and on more when one comes back: WORLD_SIZE then
is not the world run.json was planned for. `fit_world` lays the plan out again for it:

    pp and tp stay        (the pipeline's stages and the tensor-parallel shards are the
                           planner's choice for the model; a checkpoint loads under any layout)
    dp = world / (pp x tp)  the data axis takes what is left
    the global batch stays  training.batch_size is the batch of a step, a function of
                           (seed, step); each replica reads batch_size / dp of it, in `k`
                           equal micro-batches (gradient accumulation; a pipeline: k times the
                           micro-batches), so a device holds the activations it held before
                           and the trajectory is the one of the unbroken run
    memory                 what the planner predicted per device (run.json predicted.peak_bytes)
                           grows by what the data axis no longer shares (FSDP's parameter,
                           gradient and optimizer shards); a layout whose predicted peak no
                           longer fits the device's memory is refused before it starts, and
                           the run waits for devices (see ElasticError)
    step time              predicted to grow as the work per replica (k times the micro-batches)

Standard library only, and the spec's own types (it ships to the nodes).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .plan import RunPlan


class ElasticError(ValueError):
    """The devices of this start cannot run the plan; the message says why and what would."""


@dataclass
class Resize:
    planned: RunPlan  # the plan run.json holds (the world it was planned for)
    plan: RunPlan  # the plan this start runs
    accumulation: int  # the factor a replica's micro-batches grow by (1: none; a pipeline: its micro-batches)
    predicted_step_s: float | None  # the planner's figure for the planned world ...
    new_step_s: float | None  # ... and what it becomes on this world
    peak_bytes: int | None  # the predicted peak per device on this world

    @property
    def changed(self) -> bool:
        return self.plan.world != self.planned.world

    def record(self) -> dict:
        """What attempts.jsonl keeps of it (and status / the runs table show)."""
        out = {"planned_world": self.planned.world, "world": self.plan.world,
               "from": layout_of(self.planned), "to": layout_of(self.plan), "accumulation": self.accumulation}
        if self.predicted_step_s is not None:
            out["predicted_step_s"] = [round(self.predicted_step_s, 6), round(self.new_step_s, 6)]
        if self.peak_bytes is not None:
            out["peak_bytes"] = self.peak_bytes
        return out

    def describe(self) -> str:
        a, b = self.planned, self.plan
        line = (f"{b.world} processes instead of the planned {a.world}: dp {a.dp} -> {b.dp}, "
                f"{self.accumulation} micro-batch(es) per replica keep the global batch")
        if self.predicted_step_s is not None:
            line += f"; predicted step {self.predicted_step_s * 1e3:.1f} ms -> {self.new_step_s * 1e3:.1f} ms"
        return line


def layout_of(plan: RunPlan) -> dict:
    return {"pp": plan.pp, "dp": plan.dp, "tp": plan.tp}


def accumulation_for(batch_size: int, old_dp: int, new_dp: int, microbatches: int = 1) -> int:
    """Micro-batches per replica on `new_dp` replicas so none is larger than a replica's
    share on `old_dp` (its memory): the smallest k with batch/new_dp split in k equal parts
    (times the pipeline's micro-batches) of at most batch/old_dp."""
    local = batch_size // new_dp
    old_local = batch_size // old_dp
    k = max(1, math.ceil(local / old_local))
    while local % (k * microbatches):
        k += 1
    return k


def fit_world(plan: RunPlan, world: int, batch_size: int, *, predicted_step_s: float | None = None,
              peak_bytes: int | None = None, state_bytes: int | None = None,
              device_bytes: int | None = None) -> Resize:
    """The plan for `world` processes (see the module's docstring). `state_bytes`: the
    parameter, gradient and optimizer bytes per device the planner predicted (FSDP: those
    shrink with dp; else replicated); `device_bytes`: what one device has (None: not checked)."""
    group = plan.pp * plan.tp
    if world % group or world < group:
        raise ElasticError(f"{world} process(es) cannot run pp={plan.pp} x tp={plan.tp}: the data axis needs a "
                           f"multiple of {group}; the run waits for devices (or plan it again for {world})")
    dp = world // group
    if batch_size % dp:
        raise ElasticError(f"training.batch_size {batch_size} does not split over dp={dp} (the {world} process(es) "
                           f"left); the run waits for devices (or set batch_size to a multiple of {dp})")
    if dp == plan.dp:
        return Resize(plan, plan, 1, predicted_step_s, predicted_step_s, peak_bytes)
    m = plan.microbatches if plan.pp > 1 else 1
    k = accumulation_for(batch_size, plan.dp, dp, m)
    new = dataclasses.replace(plan, dp=dp, mesh=None)
    if dp == 1:
        new.data_parallel = "none"
    elif plan.data_parallel == "none":
        new.data_parallel = "ddp"
    if plan.pp > 1:
        new.microbatches = plan.microbatches * k
    step_s = None if predicted_step_s is None else predicted_step_s * (batch_size / dp) / (batch_size / plan.dp)
    peak = peak_bytes
    if peak_bytes is not None and state_bytes and plan.data_parallel == "fsdp":
        peak = int(peak_bytes + state_bytes * (plan.dp / dp - 1))  # each shard grows as dp shrinks
    if peak is not None and device_bytes is not None and peak > device_bytes:
        raise ElasticError(f"dp={dp} needs about {peak / 2**30:.1f} GiB per device (the shards the lost devices "
                           f"held); the device has {device_bytes / 2**30:.1f} GiB: the run waits for devices "
                           f"(or plan it again with activation checkpointing or CPU offload)")
    return Resize(plan, new, k, predicted_step_s, step_s, peak)
