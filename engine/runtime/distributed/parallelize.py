"""One rank's stage, parallelized as the plan says:

    mesh (pp x dp x tp)  ->  this rank's pipeline stage (an fx graph cut from the model,
    skips carried through)  ->  tensor parallel (DTensor styles per layer)  ->  data
    parallel (FSDP2 or DDP)  ->  PipelineStage + schedule (pipeline.py, in the trainer)

The order matters: TP turns parameters into DTensors over the tp sub-mesh, and FSDP2/DDP
must wrap what TP produced (FSDP2 then shards those DTensors on the dp axis too: 2-D
parallelism). The pipeline stage wraps the finished module last, since PipelineStage
knows how to defer DDP/FSDP gradient sync to the last micro-batch.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from ..plan import RunPlan
from .data_parallel import apply_dp, wraps_dp
from .stages import apply_checkpointing, build_stage_module, even_stages
from .tensor_parallel import apply_tp


def parallelize(full: nn.Module, plan: RunPlan, mesh: DeviceMesh, device: torch.device,
                stage_index: int | None = None, compile_model=None,
                blocks: dict[str, str | None] | None = None) -> nn.Module:
    """One of this rank's stages (the whole model without pipelining), parallelized as the plan
    says. compile_model (training.compile: BaseTrainer.compile_model) runs after tensor
    parallelism and activation checkpointing, before FSDP/DDP wrap the module (torchtitan's order)."""
    ckpt = set(plan.checkpoint)
    if plan.pp > 1:
        mod = build_stage_module(full, plan.stages, stage_index, ckpt, blocks)
    else:
        mod = apply_checkpointing(full, ckpt, blocks)
    # FSDP2 moves each unit's parameters to the device as it shards them (one unit whole at a
    # time); moving the stage first would put the whole model on every rank's device before
    # the sharding (and, with cpu_offload, copy it back again). Everything else moves now.
    if not (wraps_dp(plan) and plan.data_parallel == "fsdp"):
        mod.to(device)
    mod.train()
    if plan.sync_batchnorm and plan.dp > 1:
        # batch statistics over the whole data-parallel batch (torch's SyncBatchNorm on GPUs,
        # sync_bn.py's all-reduce version on CPU, where torch has none)
        from ..sync_bn import convert_sync_batchnorm

        mod = convert_sync_batchnorm(mod, mesh["dp"].get_group(), device)
    if plan.tp > 1:
        apply_tp(mod, mesh["tp"], plan.tp_plan)
    if compile_model is not None:
        mod = compile_model(mod)
    if wraps_dp(plan):
        mod = apply_dp(mod, mesh["dp"], plan.data_parallel, plan.reshard_after_forward, plan.mixed_precision,
                       plan.cpu_offload)
    return mod


def complete_plan(plan: RunPlan, gm: nn.Module, world: int) -> RunPlan:
    """The plan as the ranks run it: a pipeline without stages (run.json written without a
    planner's plan) cut evenly; a plan of one process started on `world` processes (plain
    `--nproc N`, nothing else said) data parallel over them."""
    plan = dataclasses.replace(plan)
    if plan.pp > 1 and not plan.stages:
        plan.stages = even_stages(gm, plan.pp)
    if plan.world == 1 and world > 1:
        plan.dp = world
        if plan.data_parallel == "none":
            plan.data_parallel = "ddp"
    return plan
