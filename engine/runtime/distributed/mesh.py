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


def generation_store(store, world: int):
    """The store under a prefix of this start's own, the same on every rank of it. The
    agents' restart counts cannot be it: a node that joins (or comes back) has an agent of
    its own whose count starts at 0. Instead every worker counts its arrival; the workers
    of one start arrive after all of the start before them (the agents stop every worker
    before the next rendezvous completes), so arrival n belongs to the start whose first
    arrival is the largest at or below n, and each start's first arrival says its size."""
    n = store.add("layerflow/arrivals", 1)
    store.set(f"layerflow/arrival/{n}", str(world))
    first = 1
    while True:
        size = int(store.get(f"layerflow/arrival/{first}"))
        if n < first + size:
            return dist.PrefixStore(f"layerflow/start{first}/", store)
        first += size


def device_memory(device: torch.device) -> int | None:
    """What one device of this kind has (bytes); None on the CPU (not checked)."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory


def cuda_device_order() -> None:
    """CUDA numbers GPUs as nvidia-smi does, by PCI bus id (its default, FASTEST_FIRST, may
    not): cuda:LOCAL_RANK is then the GPU preflight checked for that rank
    (remote/preflight.py rank_gpus). Read by CUDA when it starts: call before any CUDA call.
    A setting of the user's own is kept."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")


def init_distributed() -> torch.device:
    cuda_device_order()
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        backend = "cpu:gloo,cuda:nccl"  # nccl for tensors, gloo for the CPU-side objects
    else:
        device, backend = torch.device("cpu"), "gloo"
    from ..steps import set_matmul_precision

    set_matmul_precision(device)  # (TF32 on a GPU)
    if not dist.is_initialized():
        if "TORCHELASTIC_RUN_ID" not in os.environ:  # (not under torchrun: env:// as given)
            dist.init_process_group(backend=backend)
        else:
            # after torchrun restarted the workers, its store still holds the last start's
            # keys: gloo then read a peer's old address at once and failed ("connectFullMesh
            # failed ... Connection refused") before the peer wrote its new one. Each start
            # (generation) of the workers gets keys of its own (generation_store).
            store, rank, world = next(dist.rendezvous("env://"))
            dist.init_process_group(backend=backend, store=generation_store(store, world),
                                    rank=rank, world_size=world)
    return device
