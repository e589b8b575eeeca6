"""Data parallelism over the dp sub-mesh: FSDP2 (fully_shard, one unit per layer, bf16 policy
and CPU offload) or DDP; a pipeline's DDP gradients averaged by hand (dp_by_hand)."""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from ..plan import RunPlan


# the mixed_precision values whose weights compute in bf16: float8 converts most Linear
# layers (float8.py) and leaves the rest, the head and the norms, to bf16 as bf16 does
BF16_MODES = ("bf16", "float8")


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


@contextlib.contextmanager
def grad_sync(model: nn.Module, sync: bool):
    """Gradient accumulation's micro-batches: only the last one's backward syncs gradients
    over the data axis (DDP's no_sync; FSDP2's set_requires_gradient_sync, whose sharded
    gradients are then reduced once for the sum of all micro-batches)."""
    if sync:
        yield
    elif hasattr(model, "no_sync"):  # DDP
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:  # one replica, or nothing to sync
        yield


def wraps_dp(plan: RunPlan) -> bool:
    """Whether parallelize() wraps a stage in DDP/FSDP2: over dp > 1 replicas; and FSDP2 with
    cpu_offload at dp=1 too, whose offload is a memory saving of its own on one device (it
    was dropped there without a word). Not a pipeline's DDP (dp_by_hand)."""
    if dp_by_hand(plan):
        return False
    return plan.dp > 1 or (plan.data_parallel == "fsdp" and plan.cpu_offload)


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
