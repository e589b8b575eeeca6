"""The cost model: how long a step takes and what it moves, from counts alone.

Numbers are deliberately simple (a roofline on FLOPs, alpha-beta on messages) so
that a person can check them by hand; the planner uses them to compare layouts,
and bench/dist_overhead.py prints predicted against measured.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass

# Bytes per element of a float32 tensor (parameters, grads, optimizer state).
FLOAT_BYTES = 4


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    memory_bytes: int  # what one rank may use
    flops_per_s: float  # sustained training FLOP/s of one rank
    link_bytes_per_s: float  # bandwidth between two ranks
    latency_s: float = 20e-6  # per message

    def to_dict(self) -> dict:
        return asdict(self)


def _meminfo_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30


def local_cpu(nproc: int = 1) -> DeviceSpec:
    """One CPU process of this machine: memory shared by nproc processes; about 15
    GFLOP/s for one thread on fp32 matmuls (bench/dist_overhead.py measured it);
    loopback gloo at roughly 1 GB/s."""
    return DeviceSpec("cpu", _meminfo_bytes() // max(1, nproc), flops_per_s=1.5e10, link_bytes_per_s=1e9, latency_s=50e-6)


GPUS = {  # name -> (memory, dense bf16/tf32 FLOP/s at a realistic 40% of peak, NVLink/PCIe bandwidth)
    "a100-80gb": DeviceSpec("a100-80gb", 80 * 2**30, 0.4 * 312e12, 200e9, 10e-6),
    "h100-80gb": DeviceSpec("h100-80gb", 80 * 2**30, 0.4 * 989e12, 300e9, 10e-6),
    "h200": DeviceSpec("h200", 141 * 2**30, 0.4 * 989e12, 300e9, 10e-6),
    "rtx4090": DeviceSpec("rtx4090", 24 * 2**30, 0.4 * 165e12, 25e9, 15e-6),
}


def device_from_name(name: str | None, nproc: int = 1) -> DeviceSpec:
    if not name or name == "cpu":
        return local_cpu(nproc)
    key = name.lower()
    if key not in GPUS:
        raise ValueError(f"unknown device '{name}'; known: cpu, {', '.join(GPUS)}")
    return GPUS[key]


# ----- collective costs (ring algorithms) ------------------------------------------
def collective_bytes(op: str, nbytes: int, n: int) -> float:
    """Bytes each rank sends for a collective over n ranks on a tensor of nbytes."""
    if n <= 1:
        return 0.0
    if op == "all-reduce":
        return 2 * (n - 1) / n * nbytes
    if op in ("all-gather", "reduce-scatter"):
        return (n - 1) / n * nbytes
    return float(nbytes)  # send/recv


def comm_time(op: str, nbytes: int, n: int, dev: DeviceSpec, messages: int = 1) -> float:
    if n <= 1 and op != "send/recv":
        return 0.0
    steps = 2 * (n - 1) if op == "all-reduce" else max(1, n - 1)
    return collective_bytes(op, nbytes, n) / dev.link_bytes_per_s + messages * steps * dev.latency_s


def bubble_fraction(pp: int, m: int, v: int = 1) -> float:
    """Idle share of a GPipe or 1F1B pipeline: (p-1)/(m+p-1). 1F1B has the same
    bubble as GPipe; it only holds fewer micro-batches' activations. Interleaved
    1F1B with v stages per rank shrinks it to (p-1)/(v*m+p-1)."""
    return (pp - 1) / (v * m + pp - 1) if pp > 1 else 0.0


def step_time(stage_flops: list[float], m: int, dev: DeviceSpec, comm_s: float, v: int = 1) -> dict:
    """Predicted seconds per step: the slowest rank sets the pipeline's pace,
    (v*m + p - 1) slots of one stage's micro-batch, plus communication not overlapped."""
    p = len(stage_flops)
    per_slot = max(stage_flops) / max(1, m * v) / dev.flops_per_s
    compute = per_slot * (v * m + p - 1) if p > 1 else max(stage_flops) / dev.flops_per_s
    return {"compute_s": compute, "comm_s": comm_s, "step_s": compute + comm_s}


__all__ = ["DeviceSpec", "local_cpu", "device_from_name", "collective_bytes", "comm_time",
           "bubble_fraction", "step_time", "FLOAT_BYTES", "GPUS"]
