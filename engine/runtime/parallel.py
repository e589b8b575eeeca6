"""The distributed trainer: one process per rank under torchrun.

    parallelize():  mesh (pp x dp x tp)  ->  this rank's pipeline stage (an fx graph
                    cut from the model, skips carried through)  ->  tensor parallel
                    (DTensor styles per layer)  ->  data parallel (FSDP2 or DDP)
                    ->  PipelineStage + GPipe / 1F1B schedule

The order matters: TP turns parameters into DTensors over the tp sub-mesh, and
FSDP2/DDP must wrap what TP produced (FSDP2 then shards those DTensors on the dp
axis too: 2-D parallelism). The pipeline stage wraps the finished module last,
since PipelineStage knows how to defer DDP/FSDP gradient sync to the last
micro-batch.

Everything here is PyTorch's own engine (DeviceMesh, DTensor, tensor.parallel,
fully_shard, DDP, distributed.pipelining); this file only decides what goes where,
reading the plan that engine/planning/planner.py wrote into run.json (spec.RunSpec.plan).
ParallelTrainer is a BaseTrainer (trainer.py), as the single-process Trainer (train.py)
is, so the same `fit` loop (loop.py) drives both.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard

from . import dist_checkpoint
from .batches import forward, rows, to_device
from .folder import save_tensors, write_failure
from .loop import fit
from .plan import V_SHAPED, Layout, RunPlan, TPEntry, rank_stages, stage_rank
from .records import RankError, RunStatus
from .spec import RunSpec
from .distributed.stages import apply_checkpointing, build_stage_module, even_stages, top_blocks
from .steps import compute_loss, eval_sums, peak_mem_mb, seed_all
from .trainer import BaseTrainer

# the mixed_precision values whose weights compute in bf16: float8 converts most Linear
# layers (float8.py) and leaves the rest, the head and the norms, to bf16 as bf16 does
BF16_MODES = ("bf16", "float8")


# ----- the mesh ---------------------------------------------------------------
@dataclass(frozen=True)
class ParallelDims:
    pp: int
    dp: int
    tp: int
    world: int

    def __post_init__(self) -> None:
        n = self.pp * self.dp * self.tp
        if n != self.world:
            raise ValueError(f"placement pp={self.pp} x dp={self.dp} x tp={self.tp} needs {n} processes but "
                             f"{self.world} were started; launch with --nproc {n} or change placement.pp/dp/tp")


def build_mesh(dims: ParallelDims, device_type: str) -> DeviceMesh:
    """Ranks are laid out pp-major, tp-minor (rank = (pp_i * dp + dp_i) * tp + tp_i), so
    tensor-parallel peers, which talk most, are neighbours (same host on clusters)."""
    return init_device_mesh(device_type, (dims.pp, dims.dp, dims.tp), mesh_dim_names=("pp", "dp", "tp"))


# ----- tensor parallel ----------------------------------------------------------
def placement(layout: Layout):
    """A plan's layout as a DTensor placement (a layer hands on Shard(d) or Replicate())."""
    if layout.kind == "replicate":
        return Replicate()
    if layout.kind == "shard":
        return Shard(layout.dim)
    raise ValueError(f"layout {layout} is not one a layer hands on (Shard(d) or Replicate())")


def tp_module_plan(tp_plan: dict[str, TPEntry], present: set[str]) -> dict:
    """The plan's per-node entries -> a parallelize_module plan for the layers this
    stage holds. Tensors pass between layers as local pieces; each entry's input and
    output say which piece (engine/planning/planner.py tp_layouts). MultiheadAttention
    'colwise' shards heads: q/k/v column-wise, out row-wise; its input is made a
    DTensor once for all three. 'sequence' norms run on their Shard(1) tokens; a
    'replicate' entry is a layer outside TP at the sequence region's edge: it gathers
    its input and/or keeps its chunk of the tokens."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                                   PrepareModuleOutput, RowwiseParallel, SequenceParallel)

    out: dict = {}
    for nid, e in tp_plan.items():
        if nid not in present:
            continue
        style, given, made = e.style, placement(e.input), placement(e.output)
        if e.type == "MultiheadAttention" and style == "colwise":
            out[nid] = PrepareModuleInput(input_layouts=(given,), desired_input_layouts=(Replicate(),),
                                          use_local_output=False)
            for sub in ("q", "k", "v"):
                out[f"{nid}.{sub}"] = ColwiseParallel()
            out[f"{nid}.out"] = RowwiseParallel(output_layouts=made)
        elif style == "colwise":
            out[nid] = ColwiseParallel(input_layouts=given, output_layouts=made)
        elif style == "rowwise":
            out[nid] = RowwiseParallel(input_layouts=given, output_layouts=made)
        elif style == "sequence":
            out[nid] = SequenceParallel(use_local_output=True)
        elif style == "replicate":  # gather the tokens coming in, keep this rank's chunk going out
            gather = {"input_layouts": (given,), "desired_input_layouts": (Replicate(),)}
            chunk = {"output_layouts": (Replicate(),), "desired_output_layouts": (made,)}
            if given != Replicate() and made != Replicate():
                out[nid] = PrepareModuleInputOutput(**gather, use_local_input=True, **chunk)
            elif given != Replicate():
                out[nid] = PrepareModuleInput(**gather, use_local_output=True)
            elif made != Replicate():
                out[nid] = PrepareModuleOutput(**chunk)
        else:
            raise ValueError(f"node '{nid}': tensor-parallel style '{style}' is not run by this runtime; "
                             f"set it to colwise, rowwise, sequence or replicate")
    return out


def apply_tp(module: nn.Module, tp_mesh: DeviceMesh, tp_plan: dict[str, TPEntry]) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    plan = tp_module_plan(tp_plan, {n for n, _ in module.named_children()})
    if plan:
        parallelize_module(module, tp_mesh, plan)


# ----- data parallel ------------------------------------------------------------
def float32_norm_units(module: nn.Module, dp_mesh: DeviceMesh, reshard_after_forward: bool,
                       offload_policy=None) -> set[int]:
    """Under FSDP's bf16 policy every BatchNorm (at any depth) becomes an FSDP unit of its
    own that keeps float32: its running statistics are float32 and torch's batch_norm
    takes no bf16 weights beside them. The unit casts its input up and its output back
    to bf16, so the layers around it see bf16 as they would without it. Returns their ids."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    keep = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=torch.bfloat16)
    units = set()
    for sub in module.modules():
        if sub is not module and isinstance(sub, nn.modules.batchnorm._BatchNorm) \
                and any(True for _ in sub.parameters(recurse=False)):
            fully_shard(sub, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=keep,
                        **({"offload_policy": offload_policy} if offload_policy is not None else {}))
            units.add(id(sub))
    return units


def apply_dp(module: nn.Module, dp_mesh: DeviceMesh, kind: str, reshard_after_forward: bool = True,
             mixed_precision: str = "none", cpu_offload: bool = False) -> nn.Module:
    """DDP, or FSDP2 with one unit per layer; cpu_offload (FSDP2 only): the sharded
    parameters, their gradients and the optimizer state live in host memory, copied to
    the device for each unit's all-gather and back after its reduce-scatter."""
    if cpu_offload and kind != "fsdp":
        raise ValueError(f"cpu_offload needs data_parallel fsdp, not '{kind}'")
    if kind == "fsdp":
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if mixed_precision in BF16_MODES else MixedPrecisionPolicy()
        # pinned host memory only where there is a GPU to copy to (pinning needs CUDA)
        offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy()
        norms = float32_norm_units(module, dp_mesh, reshard_after_forward, offload) \
            if mixed_precision in BF16_MODES else set()
        # One FSDP unit per layer: its parameters are gathered just before it runs
        # and freed after, so only one layer is ever whole at a time.
        # A parameter shared by two layers (tied weights) is sharded once, by the root.
        owners: dict[int, int] = {}
        for child in module.children():
            for p in child.parameters():
                owners[id(p)] = owners.get(id(p), 0) + 1
        for child in module.children():
            ps = list(child.parameters())
            if id(child) not in norms and ps and all(owners[id(p)] == 1 for p in ps):
                fully_shard(child, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp,
                            offload_policy=offload)
        fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp,
                    offload_policy=offload)
        return module
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        if any(hasattr(p, "device_mesh") for p in module.parameters()):
            raise ValueError("data_parallel ddp does not combine with tensor parallel (DDP swaps DTensor "
                             "parameters for local ones, breaking checkpoints); set placement.data_parallel to fsdp")
        # gradients live in DDP's buckets: no second copy of them
        return DDP(module, process_group=dp_mesh.get_group(), gradient_as_bucket_view=True)
    raise ValueError(f"data_parallel '{kind}' is not ddp or fsdp")


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
    mod.to(device).train()
    if plan.sync_batchnorm and plan.dp > 1:
        # batch statistics over the whole data-parallel batch (torch's SyncBatchNorm on GPUs,
        # sync_bn.py's all-reduce version on CPU, where torch has none)
        from .sync_bn import convert_sync_batchnorm

        mod = convert_sync_batchnorm(mod, mesh["dp"].get_group(), device)
    if plan.tp > 1:
        apply_tp(mod, mesh["tp"], plan.tp_plan)
    if compile_model is not None:
        mod = compile_model(mod)
    if plan.dp > 1 and not dp_by_hand(plan):
        mod = apply_dp(mod, mesh["dp"], plan.data_parallel, plan.reshard_after_forward, plan.mixed_precision,
                       plan.cpu_offload)
    return mod


def dp_by_hand(plan: RunPlan) -> bool:
    """DDP inside a pipeline stage fails at its second step (its first-iteration bucket
    rebuild counts every micro-batch's gradients: an internal assert in torch's reducer),
    so a pipeline's data parallelism of kind ddp averages the stage's gradients itself,
    in one all-reduce after the schedule's backward (ParallelTrainer.average_over_dp)."""
    return plan.pp > 1 and plan.dp > 1 and plan.data_parallel == "ddp"


@torch.no_grad()
def average_grads(params: list[nn.Parameter], group, n: int) -> None:
    """Every gradient averaged over a process group of n ranks, in one flat all-reduce."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= n
    torch._foreach_copy_(grads, [v.view_as(g) for v, g in zip(flat.split([g.numel() for g in grads]), grads)])


def infer_stage_shapes(schedule, modules: list[nn.Module], args: tuple, target) -> None:
    """torch.distributed.pipelining learns what passes between stages by running
    every stage once in training mode on its first call (later stages on empty
    tensors): BatchNorm would count that run in its running statistics (NaN past the
    first stage) and Dropout would draw from the random stream. Make that first call
    on a real batch, then undo everything it changed: buffers, random streams, grads."""
    buffers = [(b, b.detach().clone()) for m in modules for b in m.buffers()]
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    schedule.step(*args, target=target, losses=[], return_outputs=False)
    with torch.no_grad():
        for b, saved in buffers:
            b.copy_(saved)
    torch.set_rng_state(rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state_all(cuda_rng)
    for m in modules:
        m.zero_grad(set_to_none=True)


def by_node_id(modules: list[nn.Module]) -> nn.Module:
    """A root holding this rank's layers under their node ids (DDP's wrapper left out):
    its state_dict keys are the full model's, whatever the layout, for DCP."""
    root = nn.Module()
    for m in modules:
        inner = m.module if hasattr(m, "module") and isinstance(m, nn.parallel.DistributedDataParallel) else m
        for name, child in inner.named_children():
            root.add_module(name, child)
    return root


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


# ----- the trainer ----------------------------------------------------------------
class ParallelTrainer(BaseTrainer):
    """One rank of a distributed run; every rank builds one."""

    distributed = True

    def __init__(self, run_dir: Path, spec: RunSpec, device: torch.device):
        super().__init__(run_dir, spec, device)
        if spec.training.grad_accumulation > 1:
            raise ValueError(f"training.grad_accumulation {spec.training.grad_accumulation} runs in one process "
                             f"only; set it to 1 (a pipeline cuts the batch into placement.microbatches itself)")
        full = self.build_model()
        self.rank, world = dist.get_rank(), dist.get_world_size()
        self.plan = plan = complete_plan(spec.plan, full, world)
        dims = ParallelDims(plan.pp, plan.dp, plan.tp, world)
        self.dims = dims
        self.mesh = build_mesh(dims, device.type)
        self.pp_rank = self.mesh["pp"].get_local_rank()
        self.dp_rank = self.mesh["dp"].get_local_rank()
        self.tp_rank = self.mesh["tp"].get_local_rank()
        m = plan.microbatches if dims.pp > 1 else 1
        if self.batch_size % (dims.dp * m):
            raise ValueError(f"training.batch_size {self.batch_size} is not divisible by dp={dims.dp} x "
                             f"microbatches={m}; change batch_size or placement.microbatches")
        self.local_batch = self.batch_size // dims.dp
        # this replica's share of every global batch, all it reads (tp peers read the same)
        lo = self.dp_rank * self.local_batch
        self.open_data((lo, lo + self.local_batch), local_world=int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        self.stage_ids = local_stages(plan, self.pp_rank)
        blocks = top_blocks(spec.model["nodes"])  # checkpointing's regions end where a block does
        self.parts = [parallelize(full, plan, self.mesh, device, i, self.compile_model, blocks) for i in self.stage_ids]
        self.model = self.parts[0] if len(self.parts) == 1 else by_node_id(self.parts)
        # a weight tied across stages (embedding and head): a copy on each, gradients summed
        from .distributed.tied import TiedWeights, setup as tied_setup

        self.tied = tied_setup(spec.model.get("ties") or {}, plan.stages, dims.pp, dims.dp, dims.tp, self.rank,
                               self.parts, plan.schedule) if dims.pp > 1 else TiedWeights()
        self.state_model = by_node_id(self.parts) if dims.pp > 1 or plan.checkpoint else self.model
        self.init_optimizer()
        self.schedule = self.eval_schedule = None
        n_stages = len(plan.stages) if dims.pp > 1 else 1
        self.is_first = 0 in self.stage_ids  # holds stage 0 (it reads the inputs)
        self.is_last = n_stages - 1 in self.stage_ids  # holds the last stage (the loss)
        if dims.pp > 1:
            from torch.distributed.pipelining import PipelineStage

            group = self.mesh["pp"].get_group()
            stages = [PipelineStage(part, i, n_stages, device, group=group) for part, i in zip(self.parts, self.stage_ids)]
            loss_fn = lambda out, y: compute_loss(self.loss_kind, out, y, self.loss_options)  # noqa: E731
            self.schedule = make_schedule(plan.schedule, stages, n_stages, dims.pp, m, loss_fn)
            if plan.schedule in V_SHAPED:
                self.eval_schedule = forward_only_schedule(plan.schedule, stages, n_stages, dims.pp, m)
        self.microbatches = m
        self._shapes_known = False  # see infer_stage_shapes
        # bf16 (and float8, whose unconverted layers run in bf16): FSDP2 casts through its
        # MixedPrecisionPolicy; everything else autocasts the forward
        self.autocast = self.autocast_for(plan.mixed_precision in BF16_MODES
                                          and not (dims.dp > 1 and plan.data_parallel == "fsdp"))

    # ---- one step ----
    def train_step(self, step: int) -> torch.Tensor:
        """One optimizer step; this replica's loss (0 off the last stage) stays on the device:
        log_sync reads it, with one collective, only at log steps."""
        x = y = None
        if self.schedule is None or self.is_first or self.is_last:  # a middle stage reads nothing
            x, y = self.batches.batch(step)
            x, y = to_device(x, self.device), to_device(y, self.device)
        self.opt.zero_grad(set_to_none=True)
        local = None
        if self.schedule is None:
            with self.autocast():
                loss = compute_loss(self.loss_kind, forward(self.model, x), y, self.loss_options)
            loss.backward()
            local = loss.detach()
        else:
            losses: list[torch.Tensor] = []
            args = (x,) if self.is_first else ()
            if not self._shapes_known:
                with self.autocast():
                    infer_stage_shapes(self.schedule, self.parts, args, y if self.is_last else None)
                self._shapes_known = True
            with self.autocast():
                self.schedule.step(*args, target=y if self.is_last else None, losses=losses, return_outputs=False)
            if self.is_last:  # equal micro-batches: the mean of their means is the batch mean
                local = torch.stack([loss.detach() for loss in losses]).mean()
            if dp_by_hand(self.plan):
                average_grads(list(self.model.parameters()), self.mesh["dp"].get_group(), self.dims.dp)
            self.tied.sync_grads()
        if self.grad_clip:
            self._clip(float(self.grad_clip))
        self.opt.step()
        self.sched.step()
        return local.float() if local is not None else torch.zeros((), device=self.device)

    def log_sync(self, loss_sum: torch.Tensor, stop: bool, step_s: float) -> tuple[float, float | None, bool, float]:
        """At a log step, one all-reduce for all of it: (the loss summed over the steps since
        the last log, as the whole batch's mean; this replica's own part, on the last stage;
        whether any rank was asked to stop (SIGTERM reaches ranks at different moments);
        the ranks' mean step time). Every rank gets the same numbers, so all take the same
        next log step."""
        counts = self.is_last and self.tp_rank == 0  # one rank per replica adds its loss
        t = torch.stack([loss_sum.double() * (1.0 if counts else 0.0),
                         torch.tensor(1.0 if stop else 0.0, dtype=torch.float64, device=self.device),
                         torch.tensor(step_s, dtype=torch.float64, device=self.device)])
        own = float(loss_sum.item()) if self.is_last else None
        dist.all_reduce(t)
        total, stop_any, mean_s = t.tolist()
        return total / self.dims.dp, own, stop_any > 0, mean_s / dist.get_world_size()

    def skipped_samples(self) -> int:
        """Every replica's count, once (tp peers and a pipeline's two reading ends read the same samples)."""
        mine = self.batches.skipped if self.tp_rank == 0 and (self.schedule is None or self.is_first) else 0
        t = torch.tensor(float(mine), dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return int(t.item())

    @torch.no_grad()
    def _clip(self, max_norm: float) -> None:
        """Clip by the norm over the whole model, as the single-process loop does, with
        torch's multi-tensor kernels and no host sync. Gradients are grouped by how they
        are laid out: a sharded one (TP, FSDP2) adds its pieces' squares over the mesh
        dims it is split on, a replicated one counts once, stages add theirs over pp."""
        groups: dict[tuple, list[torch.Tensor]] = {}
        elsewhere = self.tied.not_counted  # a tied weight's copy counted on another stage: scaled, not counted
        scaled_only: list[torch.Tensor] = []
        for p in self.model.parameters():
            g = p.grad
            if g is None:
                continue
            if id(p) in elsewhere:
                scaled_only.append(g.to_local() if hasattr(g, "to_local") else g)
                continue
            if hasattr(g, "to_local"):
                dims = tuple(d for d, pl in enumerate(g.placements) if pl.is_shard() or pl.is_partial())
                groups.setdefault((id(g.device_mesh), dims), [g.device_mesh]).append(g.to_local())
            else:
                groups.setdefault((None, ()), [None]).append(g)
        sq = torch.zeros((), dtype=torch.float32, device=self.device)
        local_grads: list[torch.Tensor] = []
        for (_, dims), (mesh, *tensors) in groups.items():
            part = torch.stack([n.float() for n in torch._foreach_norm(tensors)]).pow(2).sum()
            for d in dims:
                dist.all_reduce(part, group=mesh.get_group(d))
            sq += part
            local_grads += tensors
        if self.dims.pp > 1:
            dist.all_reduce(sq, group=self.mesh["pp"].get_group())
        coef = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)  # torch's clip_grad_norm_ formula
        torch._foreach_mul_(local_grads + scaled_only, coef)

    @torch.no_grad()
    def evaluate(self) -> dict:
        self.model.eval()
        sums = [0.0] * 5
        bs = self.local_batch if self.schedule is not None else self.batch_size  # (what training fits)
        for x, y in self.data.val_batches(bs):
            k = rows(x)
            if self.schedule is not None and k < bs:  # the pipeline was shaped for bs rows: pad, then drop
                pad = bs - k
                x = torch.cat([x, x[:1].expand(pad, *x.shape[1:])])
                y = torch.cat([y, y[:1].expand(pad, *y.shape[1:])])
            x, y = to_device(x, self.device), y.to(self.device)
            if self.schedule is None:
                out = forward(self.model, x)
            elif self.eval_schedule is not None:  # (forward only: no loss, no targets)
                out = self.eval_schedule.step(*((x,) if self.is_first else ()))
            else:  # the last stage computes the schedule's loss too, so it needs targets
                args = (x,) if self.is_first else ()
                out = self.schedule.eval(*args, target=y if self.is_last else None)
            y = y[:k]
            if out is not None and (self.schedule is None or self.is_last):
                sums = [a + b for a, b in zip(sums, eval_sums(self.loss_kind, out[:k], y, self.loss_options))]
        self.model.train()
        if self.schedule is not None:
            self.after_pipeline_eval()
        # every replica evaluated the whole set: take one replica's numbers
        mine = self.is_last and self.tp_rank == 0 and self.dp_rank == 0
        t = torch.tensor(sums if mine else [0.0] * 5, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return self.eval_record(t.tolist())

    def after_pipeline_eval(self) -> None:
        """Evaluation set the stages up for forward only (receive buffers without gradients):
        the training schedule sets them up again at its next step, which runs every stage
        once in training mode; the next step therefore goes through infer_stage_shapes,
        which undoes what that run changes (BatchNorm statistics, random streams). A separate
        forward-only schedule shares the stages without knowing of the other's set-up, so
        both forget theirs (their private flags: torch has no public reset)."""
        self._shapes_known = False
        if self.eval_schedule is not None:
            for sched in (self.schedule, self.eval_schedule):
                sched._stages_forward_initialized = sched._stages_backward_initialized = False

    def peak_mem_per_rank(self) -> list[float]:
        t = torch.zeros(dist.get_world_size(), dtype=torch.float64, device=self.device)
        t[self.rank] = peak_mem_mb(self.device)
        dist.all_reduce(t)
        return [round(float(v), 1) for v in t]

    def save_final(self, path: Path) -> None:
        full = dist_checkpoint.full_model_state(self.state_model)
        if self.rank == 0:
            save_tensors(full, path)


# ----- entry under torchrun ---------------------------------------------------------
def init_distributed() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        backend = "cpu:gloo,cuda:nccl"  # nccl for tensors, gloo for the CPU-side objects
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return device


def _ended(run_dir: Path) -> bool:
    """status.json already says how the run ended (fit's own record, with its step)."""
    st = RunStatus.read(run_dir)
    return st is not None and st.done


def run_distributed(run_dir: str | Path, *, resume: bool = False) -> dict:
    """Every rank runs this; rank 0 writes metrics and status (loop.fit)."""
    run_dir = Path(run_dir)
    rank = int(os.environ.get("RANK", 0))
    (run_dir / "logs").mkdir(exist_ok=True)
    spec = RunSpec.load(run_dir)
    with open(run_dir / "logs" / f"rank{rank}.log", "a") as logf:
        def log(msg: str) -> None:
            logf.write(msg.rstrip() + "\n")
            logf.flush()

        try:
            device = init_distributed()
            seed_all(spec.training.seed)
            trainer = ParallelTrainer(run_dir, spec, device)
            log(f"rank {rank}: pp {trainer.pp_rank}/{trainer.dims.pp} dp {trainer.dp_rank}/{trainer.dims.dp} "
                f"tp {trainer.tp_rank}/{trainer.dims.tp} on {device}")
            status = fit(trainer, run_dir, resume=resume, writes_metrics=rank == 0, log=log)
            peaks = trainer.peak_mem_per_rank()
            if trainer.tied.copies:
                log(f"tied weights: {trainer.tied.calls} gradient all-reduces, {trainer.tied.seconds:.4f} s")
            if rank == 0:
                log("peak memory per rank (MB): " + ", ".join(map(str, peaks)))
                (run_dir / "peak_mem_per_rank.json").write_text(json.dumps(peaks))
            dist.barrier()  # no rank tears its process group down while another still talks to it
            return status
        except BaseException as exc:
            log(traceback.format_exc())
            # the launcher reports the first rank that failed: the time says which
            err = RankError(rank, time.time(), f"{type(exc).__name__}: {exc}")
            (run_dir / "logs" / f"rank{rank}.error").write_text(json.dumps(err.to_json()))
            if rank == 0 and not _ended(run_dir):  # fit() already wrote the step it reached
                write_failure(run_dir, spec.total_steps, err.error)
            raise
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
