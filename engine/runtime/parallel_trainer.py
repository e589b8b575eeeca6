"""The distributed trainer: one process per rank under torchrun.

ParallelTrainer is a BaseTrainer (trainer.py), as the one-process Trainer is, so the same
`fit` loop (loop.py) drives both. It reads the plan that engine/planning/planner.py wrote
into run.json (spec.RunSpec.plan) and has distributed/parallelize.py build its stage;
everything distributed is PyTorch's own engine (DeviceMesh, DTensor, tensor.parallel,
fully_shard, DDP, distributed.pipelining), in distributed/. `run_distributed` is what
every rank runs (train.py calls it under torchrun).
"""
from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from . import dist_checkpoint
from .batches import chunks, forward, rows, to_device
from .folder import CHECKPOINTS, latest_checkpoint, save_tensors, write_failure
from .loop import fit
from .elastic import fit_world
from .plan import V_SHAPED
from .records import RankError, RunStatus
from .recovery import Decision, decide, give_up
from .spec import RunSpec
from .distributed.stages import top_blocks
from .steps import compute_loss, eval_sums, peak_mem_mb, seed_all
from .trainer import BaseTrainer
from .distributed.ckpt_share import CheckpointSharing
from .distributed.data_parallel import BF16_MODES, average_grads, dp_by_hand, grad_sync, wraps_dp
from .distributed.mesh import ParallelDims, build_mesh, device_memory, init_distributed
from .distributed.parallelize import complete_plan, parallelize
from .distributed.pipeline import by_node_id, forward_only_schedule, infer_stage_shapes, local_stages, make_schedule


class ParallelTrainer(BaseTrainer):
    """One rank of a distributed run; every rank builds one."""

    distributed = True

    def __init__(self, run_dir: Path, spec: RunSpec, device: torch.device):
        super().__init__(run_dir, spec, device)
        full = self.build_model()
        self.rank, world = dist.get_rank(), dist.get_world_size()
        if spec.training.checkpoint_async:  # the writers' collectives on a group of their own (save_async)
            self.ckpt_group = dist.new_group(backend="gloo")
        # run folders on several nodes (SSH): each checkpoint whole in rank 0's (ckpt_share.py)
        self.sharing = CheckpointSharing(run_dir)
        self.share_group = (self.ckpt_group or dist.new_group(backend="gloo")) if self.sharing.needed else None
        # the world this start got (torchrun --nnodes MIN:MAX may start it on fewer or more
        # devices than planned): the data axis takes it, the global batch stays (elastic.py)
        self.resize = fit_world(complete_plan(spec.plan, full, world), world, self.batch_size,
                                predicted_step_s=spec.predicted.step_s, peak_bytes=spec.predicted.peak_bytes,
                                device_bytes=device_memory(device))
        self.plan = plan = self.resize.plan
        # micro-batches per step and replica: training.grad_accumulation times what a smaller
        # data axis needs (a pipeline takes them as more micro-batches instead)
        self.accumulate = spec.training.grad_accumulation * (self.resize.accumulation if plan.pp == 1 else 1)
        if plan.pp > 1 and spec.training.grad_accumulation > 1:
            raise ValueError(f"training.grad_accumulation {spec.training.grad_accumulation} with a pipeline: set it "
                             f"to 1 and raise placement.microbatches (the pipeline cuts the batch itself)")
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
        if self.local_batch % self.accumulate:
            raise ValueError(f"a replica's batch ({self.local_batch}: training.batch_size {self.batch_size} / dp "
                             f"{dims.dp}) does not split into {self.accumulate} equal micro-batches "
                             f"(training.grad_accumulation); change batch_size or grad_accumulation")
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
                                          and not (wraps_dp(plan) and plan.data_parallel == "fsdp"))

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
        if self.schedule is None and self.accumulate == 1:
            with self.autocast():
                loss = compute_loss(self.loss_kind, forward(self.model, x), y, self.loss_options)
            loss.backward()
            local = loss.detach()
        elif self.schedule is None:  # equal micro-batches, one optimizer step; gradients synced on the last
            k = self.accumulate
            for i, (xm, ym) in enumerate(zip(chunks(x, k), y.chunk(k))):
                with grad_sync(self.model, i == k - 1), self.autocast():
                    loss = compute_loss(self.loss_kind, forward(self.model, xm), ym, self.loss_options) / k
                loss.backward()
                local = loss.detach() if local is None else local + loss.detach()
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
        whether any rank was asked to stop, and how (the ranks' stop codes added: a signal
        reaches ranks at different moments);
        the ranks' mean step time). Every rank gets the same numbers, so all take the same
        next log step."""
        counts = self.is_last and self.tp_rank == 0  # one rank per replica adds its loss
        t = torch.stack([loss_sum.double() * (1.0 if counts else 0.0),
                         torch.tensor(float(stop), dtype=torch.float64, device=self.device),  # (a stop code: loop.StopSignal)
                         torch.tensor(step_s, dtype=torch.float64, device=self.device)])
        own = float(loss_sum.item()) if self.is_last else None
        dist.all_reduce(t)
        total, stop_any, mean_s = t.tolist()
        return total / self.dims.dp, own, stop_any, mean_s / dist.get_world_size()

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
            # the norms where the gradients are (FSDP2's cpu_offload keeps them on the host),
            # the sum on this rank's device, where its collectives run (NCCL on GPUs)
            part = sum(torch.stack([n.float() for n in torch._foreach_norm(ts)]).pow(2).sum().to(self.device)
                       for ts in _by_device(tensors).values())
            for d in dims:
                dist.all_reduce(part, group=mesh.get_group(d))
            sq += part
            local_grads += tensors
        if self.dims.pp > 1:
            dist.all_reduce(sq, group=self.mesh["pp"].get_group())
        coef = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)  # torch's clip_grad_norm_ formula
        # as torch's clip_grad_norm_: each device's gradients scaled by the coefficient on that device
        for dev, ts in _by_device(local_grads + scaled_only).items():
            torch._foreach_mul_(ts, coef.to(dev))

    @torch.no_grad()
    def evaluate(self) -> dict:
        """The validation set, each replica on its share of each batch (the rows a training
        step gives it), the sums added over the replicas: a dp-th of the work and of the
        activations per rank. (Before, every replica ran the whole set: dp times the work.)"""
        self.model.eval()
        sums = [0.0] * 5
        lo, share = self.dp_rank * self.local_batch, self.local_batch
        # every replica runs a forward for every batch, even one whose share is empty (FSDP's
        # all-gathers and TP's collectives need every rank); a pipeline was shaped for a
        # replica's batch: a short share is padded, the padding dropped
        need = share if self.schedule is not None else 1
        for xb, yb in self.data.val_batches(self.batch_size):
            n = rows(xb)
            a, b = min(lo, n), min(lo + share, n)
            k = b - a
            x, y = _take(xb, a, b), yb[a:b]
            if k < need:
                x, y = _pad(x, _take(xb, 0, 1), need - k), _pad(y, yb[:1], need - k)
            x, y = to_device(x, self.device), y.to(self.device)
            with self.autocast():  # (bf16 as in training: what fits there fits here, and the numbers are its)
                if self.schedule is None:
                    out = forward(self.model, x)
                elif self.eval_schedule is not None:  # (forward only: no loss, no targets)
                    out = self.eval_schedule.step(*((x,) if self.is_first else ()))
                else:  # the last stage computes the schedule's loss too, so it needs targets
                    args = (x,) if self.is_first else ()
                    out = self.schedule.eval(*args, target=y if self.is_last else None)
            if k and out is not None and (self.schedule is None or self.is_last):
                sums = [a_ + b_ for a_, b_ in zip(sums, eval_sums(self.loss_kind, out[:k], y[:k], self.loss_options))]
        self.model.train()
        if self.schedule is not None:
            self.after_pipeline_eval()
        # the replicas' sums added (one rank per replica: tp peers hold the same numbers)
        mine = self.is_last and self.tp_rank == 0
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
        t[self.rank] = max(peak_mem_mb(self.device), getattr(self, "peak_seen_mb", 0.0))  # (the steps' peak)
        dist.all_reduce(t)
        return [round(float(v), 1) for v in t]

    def save_checkpoint(self, path: Path, extra: dict, asynchronous: bool = False):
        """BaseTrainer's, then (run folders on several nodes) the other folders' parts sent to
        rank 0's, before `latest` names it: behind the steps too, for an asynchronous save."""
        pending = super().save_checkpoint(path, extra, asynchronous)
        if not self.sharing.needed:
            return pending
        if pending is None:
            self.sharing.gather(path, self.share_group)
            return None
        return pending.then(lambda: self.sharing.gather(path, self.share_group))

    def share_latest(self) -> None:
        """Before a resume: every run folder gets rank 0's latest checkpoint."""
        if self.sharing.needed:
            ckpt = latest_checkpoint(self.run_dir) if self.rank == 0 else None
            self.sharing.spread(self.run_dir / CHECKPOINTS, ckpt.name if ckpt else None, self.share_group)

    def save_final(self, path: Path) -> None:
        """model.pt, from rank 0: each stage gathered whole (one tensor at a time) on its first
        replica's first tp rank only, then, in a pipeline, the stages sent to rank 0 over gloo."""
        keep = self.dp_rank == 0 and self.tp_rank == 0
        group = None
        if self.dims.pp > 1:  # (every rank is here: fit calls save_final on all of them)
            group = self.ckpt_group or self.share_group or dist.new_group(backend="gloo")
        full = dist_checkpoint.full_model_state(self.state_model, keep=keep, gather_group=group)
        if self.rank == 0:
            save_tensors(full, path)


def _take(x, a: int, b: int):
    """Rows a:b of a batch's inputs (a tensor, or a dict of them)."""
    return {k: v[a:b] for k, v in x.items()} if isinstance(x, dict) else x[a:b]


def _pad(x, filler, n: int):
    """x with n more rows, copies of filler's one row (a tensor, or a dict of them)."""
    if isinstance(x, dict):
        return {k: _pad(v, filler[k], n) for k, v in x.items()}
    return torch.cat([x, filler[:1].expand(n, *filler.shape[1:])])


def _by_device(tensors: list[torch.Tensor]) -> dict[torch.device, list[torch.Tensor]]:
    """Tensors grouped by device (the multi-tensor kernels take one device per call)."""
    out: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        out.setdefault(t.device, []).append(t)
    return out


def _ended(run_dir: Path) -> bool:
    """status.json already says how the run ended (fit's own record, with its step)."""
    st = RunStatus.read(run_dir)
    return st is not None and st.done


def run_distributed(run_dir: str | Path, *, resume: bool = False, restarts: bool = True) -> RunStatus:
    """Every rank runs this; rank 0 writes metrics and status (loop.fit). `restarts`: this
    start may be a restart by torchrun's agent (training.restarts): rank 0 decides from the
    run folder whether to go on and from which checkpoint (recovery.decide), and every rank
    follows (their folders may differ: one per node over SSH)."""
    run_dir = Path(run_dir)
    (run_dir / "logs").mkdir(exist_ok=True)
    spec = RunSpec.load(run_dir)
    try:  # (first: it may number the ranks again, in node order; a failure is logged below)
        device, failed = init_distributed(), None
    except Exception as exc:
        device, failed = None, exc
    rank = int(os.environ.get("RANK", 0))
    with open(run_dir / "logs" / f"rank{rank}.log", "a") as logf:
        def log(msg: str) -> None:
            logf.write(msg.rstrip() + "\n")
            logf.flush()

        try:
            if failed is not None:
                raise failed
            attempt = None
            if restarts:
                attempt, resume = agreed_start(run_dir, spec, resume)
                if attempt.stop:
                    if rank == 0:
                        give_up(run_dir, attempt, spec.total_steps, log)
                    return RunStatus(state="failed", error=f"stopped restarting: {attempt.stop}")
                time.sleep(attempt.wait_s)
            seed_all(spec.training.seed)
            trainer = ParallelTrainer(run_dir, spec, device)
            log(f"rank {rank}: pp {trainer.pp_rank}/{trainer.dims.pp} dp {trainer.dp_rank}/{trainer.dims.dp} "
                f"tp {trainer.tp_rank}/{trainer.dims.tp} on {device}")
            if trainer.resize.changed:
                log(f"rank {rank}: {trainer.resize.describe()}")
            if resume:
                trainer.share_latest()
            status = fit(trainer, run_dir, resume=resume, writes_metrics=rank == 0, log=log, attempt=attempt)
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


def agreed_start(run_dir: Path, spec: RunSpec, resume: bool) -> tuple[Decision, bool]:
    """Rank 0's decision (go on or stop, the backoff) and whether to resume, on every rank:
    only rank 0's folder holds the run's lineage and `latest`."""
    box: list = [None]
    if dist.get_rank() == 0:
        d = decide(run_dir, spec.training.restarts.max_restarts, spec.training.restarts.backoff_s)
        box = [(d, resume or (d.attempt > 0 and latest_checkpoint(run_dir) is not None))]
    dist.broadcast_object_list(box, src=0)
    decision, resume = box[0]
    return decision, resume
