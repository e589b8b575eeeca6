"""The device mesh: pp x dp x tp ranks (ParallelDims checks their product is the world),
and the process group a rank joins under torchrun."""
from __future__ import annotations

import os
import sys
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


NODE_ENV = "LAYERFLOW_NODE"  # this node's place in its job (the node scripts set it): the ranks follow it


def node_ordered_rank(store, rank: int, world: int) -> int:
    """This worker's rank with the ranks numbered by (node, local rank). torchrun numbers
    the nodes of each round in its rendezvous' own order (host names, pids), so rank 0 may
    land on any node, and on another one after a node joins; the run's lineage (metrics,
    attempts, the checkpoints made whole) lives in rank 0's folder, which must stay node
    0's: the node that hosts the rendezvous and never leaves an elastic job. Without
    $LAYERFLOW_NODE (one machine): torchrun's rank."""
    node = os.environ.get(NODE_ENV)
    if node is None or world == 1:
        return rank
    store.set(f"layerflow/place/{rank}", f"{int(node)} {int(os.environ.get('LOCAL_RANK', 0))}")
    places = sorted((tuple(map(int, store.get(f"layerflow/place/{r}").decode().split())), r) for r in range(world))
    return [r for _, r in places].index(rank)


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


SOCKET_ENVS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def socket_ifname(addr: str, port: int = 29500) -> str | None:
    """The name of this host's network interface that talks to `addr` (IPv4): the one that
    holds it (the first node: the rendezvous address is its own), else the one the kernel
    routes to it through (a UDP connect sends nothing). None where it cannot tell.
    Standard library only: preflight (remote/preflight.py) runs this very function on
    every node."""
    import fcntl
    import socket
    import struct

    try:
        ip = socket.getaddrinfo(addr, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((ip, port))
            local = s.getsockname()[0]
    except (OSError, IndexError):
        return None
    named = {}
    for _, name in socket.if_nameindex():
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # SIOCGIFADDR: the interface's IPv4
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            named[socket.inet_ntoa(packed[20:24])] = name
        except OSError:
            continue
    return named.get(ip) or named.get(local)


def _rdzv_endpoint() -> str | None:
    """The rendezvous address torchrun's agent (this worker's parent) was started with:
    --rdzv-endpoint HOST:PORT (the profile's rdzv_address or first host). MASTER_ADDR is no
    substitute: it is node 0's host name, which its own /etc/hosts often maps to 127.0.1.1."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    for i, a in enumerate(args):
        for flag in ("--rdzv-endpoint", "--rdzv_endpoint"):
            if a == flag and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
    return None


def _split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
    return host.strip("[]"), int(port) if port.isdigit() else 29500


def set_socket_ifname(env=os.environ) -> str | None:
    """Several nodes: gloo (object collectives, barriers, CPU tensors beside NCCL) and NCCL's
    bootstrap bind to the interface that reaches the rendezvous address, unless the profile's
    env already names one (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME: the one named is used for
    both). Without it gloo takes the interface of the host name, which may be loopback or a
    management network the other nodes cannot reach. Returns a line for the run log; None
    on one node. (`env` other than os.environ: a test's, LAYERFLOW_RDZV_ENDPOINT standing in
    for the agent's --rdzv-endpoint.)"""
    try:
        several = int(env.get("WORLD_SIZE", "1")) > int(env.get("LOCAL_WORLD_SIZE") or env.get("WORLD_SIZE", "1"))
    except ValueError:
        several = False
    if not several:
        return None
    given = {k: env[k] for k in SOCKET_ENVS if env.get(k)}
    if len(given) == len(SOCKET_ENVS):
        return "network interfaces from the profile's env: " + ", ".join(f"{k}={v}" for k, v in given.items())
    # the launcher's (remote/launch: the node scripts export it), else the agent's own argument
    endpoint = env.get("LAYERFLOW_RDZV_ENDPOINT") or (_rdzv_endpoint() if env is os.environ else None)
    host, port = _split_endpoint(endpoint) if endpoint else (env.get("MASTER_ADDR", ""), 29500)
    name = socket_ifname(host, port) if host else None
    if name == "lo" and not host.startswith("127."):  # a host name its own node maps to 127.0.1.1
        name = None
    if name is None:
        return (f"no network interface found for the rendezvous address {host or '?'}: gloo and NCCL choose "
                f"their own (set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME in the profile's env)")
    for k in SOCKET_ENVS:  # (one the profile sets is kept: NCCL's may be a list or a prefix, gloo's may not)
        env.setdefault(k, name)
    return (f"network interface {name} (reaches the rendezvous address {host}): "
            + ", ".join(f"{k}={env[k]}" + (" (the profile's)" if k in given else "") for k in SOCKET_ENVS))


def init_distributed() -> torch.device:
    cuda_device_order()
    net = set_socket_ifname()  # (before the process group: gloo and NCCL read them when it starts)
    if net and int(os.environ.get("RANK", "0")) % int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1) == 0:
        print(f"layerflow: {net}", file=sys.stderr, flush=True)  # (each node's first rank, in the job's log)
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
            store = generation_store(store, world)
            rank = node_ordered_rank(store, rank, world)
            os.environ["RANK"] = str(rank)
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world)
    return device
