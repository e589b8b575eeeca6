"""The device mesh: pp x dp x tp ranks (ParallelDims checks their product is the world),
and the process group a rank joins under torchrun."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


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


def init_distributed() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        backend = "cpu:gloo,cuda:nccl"  # nccl for tensors, gloo for the CPU-side objects
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        if restart == 0:
            dist.init_process_group(backend=backend)
        else:
            # after torchrun restarted the workers the agent's store still holds the last
            # attempt's keys: gloo then read a peer's old address at once and failed
            # ("connectFullMesh failed ... Connection refused") before the peer wrote its new
            # one. Each attempt gets keys of its own.
            store, rank, world = next(dist.rendezvous("env://"))
            dist.init_process_group(backend=backend, store=dist.PrefixStore(f"layerflow/attempt{restart}/", store),
                                    rank=rank, world_size=world)
    return device
