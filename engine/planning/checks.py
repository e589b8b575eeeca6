"""The planner's checks of a placement against the project: each returns messages that
state the numbers and the setting to change (errors stop a run; warnings explain why
its losses will differ from one process's, or where it wastes time).

Stage checks live with the cut (engine/planning/partition.py), tensor-parallel ones with the
layout (engine/planning/tp_layout.py); these are the ones about the placement as a whole.
"""
from __future__ import annotations

from engine.diagram.compile import CompileResult
from engine.planning.cost import DeviceSpec, RankLoad
from engine.diagram.catalog import get_layer
from engine.project import Placement
from engine.units import gib


def check_placement(placement: Placement, *, microbatches: int, batch_size: int, nproc: int) -> list[str]:
    """pp*dp*tp against the processes, the schedule's micro-batches, DDP beside TP, the batch's split."""
    pp, dp, tp = placement.pp, placement.dp, placement.tp
    world, m, B = placement.world, microbatches, batch_size
    errors = []
    if world != nproc:
        errors.append(f"placement pp={pp} x dp={dp} x tp={tp} = {world} processes, but {nproc} are available; "
                      f"set placement pp/dp/tp so that pp*dp*tp = {nproc}, or run with --nproc {world}")
    if pp > 1 and placement.schedule == "1f1b" and m < pp:
        errors.append(f"placement.schedule 1f1b needs placement.microbatches >= stages, but microbatches is {m} and "
                      f"pp is {pp}; raise placement.microbatches to {pp} (or leave it unset: the planner picks it), or choose gpipe")
    if dp > 1 and tp > 1 and placement.data_parallel == "ddp":
        errors.append(f"data_parallel ddp with tp={tp}: torch's DDP swaps tensor-parallel DTensor parameters for "
                      f"local ones, which breaks optimizer state and distributed checkpoints; set "
                      f"placement.data_parallel to fsdp (FSDP2 shards on the dp axis over TP's DTensors)")
    if B % (dp * m):
        good = (B // (dp * m) + 1) * dp * m
        errors.append(f"training.batch_size {B} is not divisible by dp={dp} x microbatches={m} = {dp * m}; "
                      f"set batch_size to a multiple of {dp * m} (e.g. {good}) or change dp/microbatches")
    return errors


def check_accumulation(placement: Placement, grad_accumulation: int) -> list[str]:
    if grad_accumulation > 1 and placement.world > 1:
        return [f"training.grad_accumulation {grad_accumulation} runs in one process only, but the plan uses "
                f"{placement.world} processes; set it to 1 (a pipeline cuts the batch into placement.microbatches itself)"]
    return []


def generic_op_warnings(compiled: CompileResult, tp: int) -> list[str]:
    graph = compiled.graph
    generic = [n for n in compiled.order if graph.nodes[n].type == "Op"]
    if tp > 1 and generic:
        return [f"{len(generic)} generic Op node(s) ({', '.join(generic[:5])}{', ...' if len(generic) > 5 else ''}) "
                f"run replicated on every tensor-parallel rank: the planner does not split ATen calls it has no "
                f"rule for (their inputs are gathered first)"]
    return []


def batch_warnings(compiled: CompileResult, placement: Placement, *, microbatches: int, batch_size: int) -> list[str]:
    """Layers whose result depends on the batch they see (BatchNorm's statistics,
    Dropout's masks): under dp, tp or micro-batches their losses are not one process's.
    And micro-batches asked for where there is no pipeline to cut them (pp=1: ignored)."""
    graph = compiled.graph
    dp, tp, m, B = placement.dp, placement.tp, microbatches, batch_size
    local_b, mb = B // max(1, dp), B // max(1, dp * m)
    warnings = []
    if placement.pp == 1 and (placement.microbatches or 1) > 1:
        warnings.append(f"placement.microbatches {placement.microbatches} is ignored: micro-batches cut a pipeline's "
                        f"batch, and placement.pp is 1 (each step takes the whole batch of {B}); to add up gradients "
                        f"over parts of the batch in one process set training.grad_accumulation (train --accumulate "
                        f"N), else leave placement.microbatches unset")
    for n in compiled.order:
        ntype = graph.nodes[n].type
        spec = get_layer(ntype)
        if ntype in ("Input", "Output") or not (spec and spec.batch_dependent):
            continue
        if ntype.startswith("BatchNorm"):
            if dp > 1 and not placement.sync_batchnorm:
                warnings.append(f"node '{n}' ({ntype}): statistics come from each replica's {local_b} samples, not "
                                f"the global batch of {B}, under dp={dp}, so losses differ from one process; fix: set "
                                f"placement.sync_batchnorm (statistics over the data axis: torch's SyncBatchNorm "
                                f"on GPUs, an all-reduce on CPU)")
            if m > 1:
                warnings.append(f"node '{n}' ({ntype}): statistics come from micro-batches of {mb} samples under "
                                f"microbatches={m}; fix: compare against one process with training.grad_accumulation"
                                f"={m} (train --accumulate {m}), or set placement.microbatches to 1 (pp=1)")
        elif ntype == "Dropout" and (dp > 1 or tp > 1 or m > 1) and compiled.nodes[n].params.get("p", 0) > 0:
            warnings.append(f"node '{n}' (Dropout): masks come from each rank's own random stream, so losses are "
                            f"not the single-process ones; fix: compare with p=0, or accept statistically equal runs")
    return warnings


def check_float8(placement: Placement, device: DeviceSpec) -> list[str]:
    """placement.mixed_precision float8 on the plan's device: one error naming the device
    where it cannot run (engine/runtime/float8.py plan_problem: the CPU, a GPU below compute
    capability 8.9, tensor parallelism). Under emulation (LAYERFLOW_FLOAT8_EMULATE=1, the
    CPU tests and dry runs) the device is not asked; tp still is."""
    if placement.mixed_precision != "float8":
        return []
    from engine.runtime.float8 import TP_PROBLEM, emulated, plan_problem

    if emulated():
        return [TP_PROBLEM.format(tp=placement.tp)] if placement.tp > 1 else []
    problem = plan_problem(device.name, placement.tp)
    return [problem] if problem else []


def check_memory(loads: list[RankLoad], device: DeviceSpec, savings=None) -> list[str]:
    """The first rank that does not fit its device, with what it holds (and what the
    planner's memory savings, engine/planning/planner.py MemorySavings, already turned on)."""
    for x in loads:
        mem = x.memory
        if mem.total_bytes > device.memory_bytes:
            tried = f" even with {savings.describe()}" if savings is not None and savings.chosen else ""
            where = " (held in host memory: CPU offload)" if mem.offloaded else ""
            return [f"rank {x.rank} (stage {x.stage}) needs {gib(mem.total_bytes)} (parameters "
                    f"{gib(mem.params_bytes)}, gradients {gib(mem.grads_bytes)}, optimizer "
                    f"{gib(mem.optimizer_bytes)}{where}, activations {gib(mem.activations_bytes)}) but a "
                    f"{device.name} device has {gib(device.memory_bytes)}{tried}; raise pp or tp, use "
                    f"data_parallel fsdp, or raise microbatches"]
    return []


def schedule_warnings(placement: Placement, microbatches: int) -> list[str]:
    pp, dp = placement.pp, placement.dp
    if pp > 1 and dp > 1 and placement.data_parallel == "fsdp" and placement.reshard_after_forward:
        return [f"FSDP with reshard_after_forward under pp={pp}: parameters are gathered again for every one "
                f"of the {microbatches} micro-batches; set placement.reshard_after_forward to false to gather once "
                f"per step"]
    return []


def stage_warnings(graph, placement: Placement) -> list[tuple[str, str]]:
    """(node, message) for each node left on a stage a one-stage placement ignores (under
    pp > 1 the cut refuses a stage beyond pp: engine/planning/partition.py)."""
    if placement.pp > 1:
        return []
    return [(n, f"node '{n}' ({node.type}): stage {node.stage} is ignored: placement.pp is 1, so everything runs "
                f"as one stage; set its stage to auto or raise placement.pp to {node.stage + 1}")
            for n, node in graph.nodes.items() if node.stage is not None and node.stage >= 1]


__all__ = ["stage_warnings", "check_placement", "check_accumulation", "batch_warnings", "generic_op_warnings", "check_memory",
           "schedule_warnings"]
