"""Pipelining: which stages a pp rank runs, torch.distributed.pipelining's schedule over them,
the forward-only schedule evaluation needs, and the first call that learns the stages'
shapes without touching BatchNorm statistics or random streams."""
from __future__ import annotations

from torch import nn
from ..steps import left_as_it_was
from ..plan import V_SHAPED, RunPlan, rank_stages, stage_rank


def local_stages(plan: RunPlan, pp_rank: int) -> list[int]:
    """The pipeline stages this pp rank runs: its own, or with a looped schedule every
    pp-th one (rank r holds stages r, r+pp, r+2pp...)."""
    if plan.pp == 1:
        return [0]
    return rank_stages(plan.schedule, plan.pp, len(plan.stages), pp_rank)


MULTI_SCHEDULES = {"interleaved1f1b": "ScheduleInterleaved1F1B", "interleavedzb": "ScheduleInterleavedZeroBubble",
                   "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}


def make_schedule(name: str, stages: list, n_stages: int, pp: int, m: int, loss_fn):
    """torch.distributed.pipelining's schedule of that name over this rank's stages."""
    from torch.distributed import pipelining as pl

    if name in V_SHAPED and n_stages != 2 * pp:
        raise ValueError(f"the plan has {n_stages} stages for pp={pp}; schedule {name} runs exactly two per rank "
                         f"({2 * pp} stages)")
    if name in MULTI_SCHEDULES:
        return getattr(pl, MULTI_SCHEDULES[name])(stages, m, loss_fn=loss_fn)
    if n_stages != pp:
        raise ValueError(f"the plan has {n_stages} stages for pp={pp}; one stage per rank needs schedule gpipe or "
                         f"1f1b, several need {', '.join(MULTI_SCHEDULES)}")
    return (pl.ScheduleGPipe if name == "gpipe" else pl.Schedule1F1B)(stages[0], m, loss_fn=loss_fn)


def forward_only_schedule(name: str, stages: list, n_stages: int, pp: int, m: int):
    """A forward-only schedule over the same stages, for evaluation, where the schedule's own
    eval() cannot run: torch 2.13's V-shaped schedules (ZBV, DualPipeV) keep their backward
    actions in eval() and fail on them. Every rank runs its stages in order, all m micro-batches
    each (GPipe's forward), lowered with torch's own pass that adds the sends and receives.
    Uses the schedule runtime's internals (_PipelineScheduleRuntime, _Action): torch has no
    public way to give a schedule its own action list without its backward."""
    from torch.distributed.pipelining import schedules as S

    ev = S._PipelineScheduleRuntime(stages, m)  # (its constructor gives the stages a looped mapping)
    mapping = {s: stage_rank(name, pp, s) for s in range(n_stages)}
    ev.stage_index_to_group_rank = mapping
    for st in stages:
        st.stage_index_to_group_rank = mapping
    fwd = S._ComputationType.FORWARD
    actions = {r: S._add_unshard_reshard([S._Action(s, fwd, k) for s in rank_stages(name, pp, n_stages, r)
                                          for k in range(m)]) for r in range(pp)}
    ev.pipeline_order_with_comms = S._add_send_recv(actions, stage_to_rank=mapping.__getitem__,
                                                    num_stages=n_stages)
    return ev


def infer_stage_shapes(schedule, modules: list[nn.Module], args: tuple, target) -> None:
    """torch.distributed.pipelining learns what passes between stages by running
    every stage once in training mode on its first call (later stages on empty
    tensors): BatchNorm would count that run in its running statistics (NaN past the
    first stage) and Dropout would draw from the random stream. Make that first call
    on a real batch, then undo everything it changed: buffers, random streams, grads."""
    with left_as_it_was(modules):
        schedule.step(*args, target=target, losses=[], return_outputs=False)


def by_node_id(modules: list[nn.Module]) -> nn.Module:
    """A root holding this rank's layers under their node ids (DDP's wrapper left out):
    its state_dict keys are the full model's, whatever the layout, for DCP."""
    root = nn.Module()
    for m in modules:
        inner = m.module if hasattr(m, "module") and isinstance(m, nn.parallel.DistributedDataParallel) else m
        for name, child in inner.named_children():
            root.add_module(name, child)
    return root
