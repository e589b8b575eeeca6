"""The cost model: how long a step takes and what it moves, from counts alone.

Numbers are deliberately simple so that a person can check them by hand: a
roofline on FLOPs, a memory-bound pass for the optimizer step, alpha-beta on
messages. The planner uses them to compare layouts, and bench/dist_overhead.py
prints predicted against measured. This machine's CPU is not guessed: local_cpu()
times a small training step (an MLP block's forward+backward, then Adam's update)
once, in about 50 ms with the thread count the workers use, and keeps the figures
per process and in Layerflow's cache folder.
"""
from __future__ import annotations

import functools
import json
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from engine.runtime.plan import V_SHAPED, ZERO_BUBBLE, rank_stages

# Bytes per element of a float32 tensor (parameters, grads, optimizer state).
FLOAT_BYTES = 4


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    memory_bytes: int  # what one rank may use
    flops_per_s: float  # sustained FLOP/s of one rank on a layer's forward + backward
    link_bytes_per_s: float  # bandwidth between two ranks
    latency_s: float = 20e-6  # per message
    # bytes of parameters + gradients + optimizer state one rank's optimizer step gets
    # through per second (a memory-bound pass); None: the step is not modelled
    update_bytes_per_s: float | None = None
    # host <-> device copies (FSDP2's CPU offload): PCIe on a GPU, a memory copy on a CPU
    host_bytes_per_s: float = 25e9
    # FLOP/s by placement.mixed_precision ("none", "bf16", "float8") where it differs from
    # flops_per_s: a GPU's float32 matmuls run on TF32 tensor cores (the runtime turns TF32
    # on: engine/runtime/steps.py matmul_precision), at half its bf16 rate; empty: one rate
    precision_flops: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)

    def at_precision(self, mixed_precision: str | None) -> "DeviceSpec":
        """This device with flops_per_s the rate of `mixed_precision` (precision_flops)."""
        rate = dict(self.precision_flops).get(mixed_precision or "none")
        return self if rate is None or rate == self.flops_per_s else replace(self, flops_per_s=rate)


def _meminfo_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30


# ----- this machine's CPU, measured --------------------------------------------------
def cache_dir() -> Path:
    """Where measurements are kept: $LAYERFLOW_CACHE_DIR, else $LAYERFLOW_CONFIG_DIR
    (tests point it at a temporary folder), else the platform's user cache folder."""
    env = os.environ.get("LAYERFLOW_CACHE_DIR") or os.environ.get("LAYERFLOW_CONFIG_DIR")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("layerflow", appauthor=False))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def worker_threads() -> int:
    """Intra-op threads of a local torchrun worker: remote/launch/local.py passes
    OMP_NUM_THREADS on, defaulting it to 1."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS") or 1))
    except ValueError:
        return 1


METHOD = "mlp-block+adam/2"  # what measure_cpu times: a new method does not reuse old figures


def _cpu_key(threads: int) -> str:
    import platform

    import torch

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    return f"{model} | {_cores()} cores | torch {torch.__version__} | {threads} threads | {METHOD}"


def measure_cpu(threads: int, reps: int = 3) -> dict:
    """Times a training step of a block from the middle of a network, with `threads`
    intra-op threads: forward+backward of Linear 512 -> 1024 -> ReLU -> Linear 1024
    -> 512 on a batch of 128 (FLOPs counted as the planner counts them, 3 x forward),
    then torch's Adam update of its 2**20 weights as it runs on CPU (functional
    torch.optim.adam.adam, per tensor; the Adam class would import torch._dynamo,
    seconds). The best of `reps` steps after a warm-up: the machine's speed, not its
    neighbours' load at that moment. The caller's thread count, RNG and grad mode
    are left as they were."""
    import torch
    from torch.nn.functional import linear, relu
    from torch.optim.adam import adam

    # one thread runs on this one: count its CPU time, which other processes' load does not stretch
    clock = time.thread_time if threads == 1 else time.perf_counter
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.full((128, 512), 0.5, requires_grad=True)
        ws = [torch.full((1024, 512), 0.01, requires_grad=True), torch.full((512, 1024), 0.01, requires_grad=True)]
        m1, m2 = [torch.zeros_like(w) for w in ws], [torch.zeros_like(w) for w in ws]
        steps = [torch.tensor(0.0) for _ in ws]
        fb = up = math.inf
        for i in range(reps + 1):
            x.grad = ws[0].grad = ws[1].grad = None
            t0 = clock()
            with torch.enable_grad():
                linear(relu(linear(x, ws[0])), ws[1]).square().mean().backward()
            t1 = clock()
            with torch.no_grad():
                adam(ws, [w.grad for w in ws], m1, m2, [], steps, foreach=False, amsgrad=False, beta1=0.9,
                     beta2=0.999, lr=1e-3, weight_decay=0.0, eps=1e-8, maximize=False)
            t2 = clock()
            if i:  # the first one is a warm-up: allocations, kernel choice
                fb, up = min(fb, t1 - t0), min(up, t2 - t1)
    finally:
        torch.set_num_threads(prev)
    return {"flops_per_s": 3 * 2 * 2 * 128 * 512 * 1024 / fb, "update_bytes_per_s": 16 * 2**20 / up}


FIGURES = ("flops_per_s", "update_bytes_per_s")
SAMPLES = 3  # processes that measure (the best figures kept) before the cached ones are final


def _valid(rec) -> bool:
    return isinstance(rec, dict) and all(isinstance(rec.get(k), (int, float)) and math.isfinite(rec[k]) and rec[k] > 0
                                         for k in FIGURES)


@functools.lru_cache(maxsize=None)
def cpu_calibration(threads: int) -> dict:
    """measure_cpu(threads), once per process, kept in cache_dir()/cpu_calibration.json
    under the CPU model, core count, torch version and thread count. The first
    SAMPLES processes each measure and keep the best figures so far (a busy moment
    only slows one measurement); later ones read the file. Delete it to measure again."""
    key = _cpu_key(threads)
    path = cache_dir() / "cpu_calibration.json"
    try:
        known = json.loads(path.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    old = known.get(key) if _valid(known.get(key)) else None
    if old and old.get("samples", 0) >= SAMPLES:
        return {k: float(old[k]) for k in FIGURES}
    new = measure_cpu(threads)
    if old:
        new = {k: max(float(old[k]), new[k]) for k in FIGURES}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # (a thread of its own too)
        tmp.write_text(json.dumps({**known, key: {**new, "samples": (old or {}).get("samples", 0) + 1}}, indent=1))
        os.replace(tmp, path)  # atomic: test workers may calibrate at the same time
    except OSError:
        pass  # a read-only home: measure again next time
    return new


def local_cpu(nproc: int = 1, threads: int | None = None) -> DeviceSpec:
    """One of nproc CPU processes of this machine, each with `threads` intra-op
    threads (default: what local workers get): memory shared by the processes,
    compute and optimizer rates measured (cpu_calibration), and scaled down when
    nproc x threads oversubscribes the cores.

    The link is loopback gloo between two processes, measured on a 2-core machine:
    all-reduce of 1-16 MB alone runs at 0.9-1.7 GB/s (bytes each rank sends), but
    inside DDP's backward, where gloo's copies and sums share the cores with the
    backward pass, the same 5 MB all-reduce takes 0.4-0.6 GB/s; the step pays the
    latter. Small messages take 60-120 us (all-reduce: two ring steps)."""
    threads = threads or worker_threads()
    cal = cpu_calibration(threads)
    share = min(1.0, _cores() / (max(1, nproc) * threads))
    return DeviceSpec("cpu", _meminfo_bytes() // max(1, nproc), flops_per_s=cal["flops_per_s"] * share,
                      link_bytes_per_s=0.5e9, latency_s=60e-6, update_bytes_per_s=cal["update_bytes_per_s"] * share,
                      host_bytes_per_s=cal["update_bytes_per_s"] * share)


def optimizer_slots(name: str, momentum: float = 0.0) -> int:
    """float32 tensors the optimizer keeps per parameter: Adam and AdamW two (exp_avg,
    exp_avg_sq), SGD one momentum buffer, none without momentum. The planner's memory
    figure and auto-placement's both count with this."""
    if name in ("adam", "adamw"):
        return 2
    return 1 if momentum > 0 else 0


# name -> memory, dense bf16 FLOP/s at a realistic 40% of peak, NVLink/PCIe bandwidth, latency, and
# the optimizer step's rate: fused Adam moves 28 bytes per 16 of state, at ~70% of HBM bandwidth (~0.4 x HBM)
# host link: PCIe 4.0 x16 (A100, RTX 4090) or 5.0 x16 (H100, H200) at ~80% of its 32 / 64 GB/s
# one rate per precision (dense tensor-core peaks, NVIDIA's data sheets, at the same 40%):
#   none    float32 weights, matmuls in TF32: A100 156, H100/H200 495, RTX 4090 82.6 TFLOP/s
#   bf16    A100 312, H100/H200 989, RTX 4090 165 (float32 accumulation)
#   float8  priced as bf16: torchao's float8 speeds up the eligible Linear matmuls only (the
#           rest runs in bf16, and every cast costs a pass), so the whole step is not at the
#           float8 peak (H100 1979); measured step times calibrate it (engine/runs/calibration.py)
PRECISION_PEAKS = {  # name -> (TF32, bf16) dense peak FLOP/s
    "a100-80gb": (156e12, 312e12), "h100-80gb": (494.7e12, 989e12), "h200": (494.7e12, 989e12),
    "rtx4090": (82.6e12, 165.2e12),
}


def _gpu(name, memory, link, latency, update, host) -> DeviceSpec:
    tf32, bf16 = (0.4 * r for r in PRECISION_PEAKS[name])
    return DeviceSpec(name, memory, bf16, link, latency, update, host,
                      precision_flops=(("none", tf32), ("bf16", bf16), ("float8", bf16)))


GPUS = {
    "a100-80gb": _gpu("a100-80gb", 80 * 2**30, 200e9, 10e-6, 0.4 * 2.0e12, 25e9),
    "h100-80gb": _gpu("h100-80gb", 80 * 2**30, 300e9, 10e-6, 0.4 * 3.35e12, 50e9),
    "h200": _gpu("h200", 141 * 2**30, 300e9, 10e-6, 0.4 * 4.8e12, 50e9),
    "rtx4090": _gpu("rtx4090", 24 * 2**30, 25e9, 15e-6, 0.4 * 1.0e12, 25e9),
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
    """Alpha-beta: the bytes each rank sends (ring factor, collective_bytes) over the
    link, plus one latency per ring step (all-reduce: 2(n-1), all-gather and
    reduce-scatter: n-1, send/recv: 1) for each of `messages` calls."""
    if n <= 1 and op != "send/recv":
        return 0.0
    steps = 2 * (n - 1) if op == "all-reduce" else max(1, n - 1)
    return collective_bytes(op, nbytes, n) / dev.link_bytes_per_s + messages * steps * dev.latency_s


def bubble_fraction(pp: int, m: int, v: int = 1, schedule: str = "1f1b") -> float:
    """Idle share of a GPipe or 1F1B pipeline: (p-1)/(m+p-1). 1F1B has the same
    bubble as GPipe; it only holds fewer micro-batches' activations. Interleaved
    1F1B with v stages per rank shrinks it to (p-1)/(v*m+p-1). Zero-bubble schedules
    fill it with weight-gradient work: a third of it is left (forward, input gradient
    and weight gradient taking a third each: ZB-H1's (p-1)/(3vm+p-1)). The V-shaped ones
    (ZB-V, DualPipeV; v=2) leave none once there are 2p micro-batches: ZB-V's bubble is
    (p-1)(T_F+T_B-2T_W), zero when the three are equal (Qi et al., Zero Bubble Pipeline
    Parallelism, sec. 6), DualPipe's (p/2-1)(T_F&B+T_B-3T_W) likewise."""
    if pp <= 1:
        return 0.0
    return (pp - 1) * drain_factor(schedule, pp, m) / (v * m + pp - 1)


def drain_factor(schedule: str, pp: int, m: int) -> float:
    """The share of the fill-and-drain time a schedule leaves idle (1F1B's is 1)."""
    if schedule in V_SHAPED and m >= 2 * pp:
        return 0.0
    if schedule in ZERO_BUBBLE:
        return 1 / 3
    return 1.0


def step_time(stage_flops: list[float], m: int, dev: DeviceSpec, comm_s: float, v: int = 1,
              state_bytes: list[float] | None = None, drain: float = 1.0) -> dict:
    """Predicted seconds per step, for ranks running in parallel.

    compute: pipeline rank r (all its v stages) takes t_r = flops_r / m per micro-batch.
      The slowest rank works through all m; the others add their part of the fill and
      drain, one v-th of their time each: m * max(t) + (sum(t) - max(t)) / v. Equal
      stages give (v*m + p - 1) slots of t/v, i.e. the bubble (p-1)/(v*m+p-1); a light
      last stage adds only its own share. drain: the share of that fill and drain a
      zero-bubble schedule leaves idle (drain_factor).
    update: the optimizer step of the rank with the most state (state_bytes: params +
      grads + optimizer state per pipeline rank), a memory-bound pass.
    comm: communication not overlapped (on CPU, gloo competes with compute for cores)."""
    t = [f / max(1, m) / dev.flops_per_s for f in stage_flops] or [0.0]
    compute = m * max(t) + drain * (sum(t) - max(t)) / max(1, v)
    update = max(state_bytes) / dev.update_bytes_per_s if state_bytes and dev.update_bytes_per_s else 0.0
    return {"compute_s": compute, "update_s": update, "comm_s": comm_s, "step_s": compute + update + comm_s}


# ----- what each rank holds and computes --------------------------------------------
@dataclass
class Memory:
    """Bytes one rank holds. Parameters, gradients and optimizer state are exact (they
    follow torch.chunk, as DTensor Shard and FSDP2 split); activations are an estimate."""
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    offloaded: bool = False  # FSDP2's CPU offload: parameters, gradients, optimizer state in host memory

    @property
    def state_bytes(self) -> int:
        """What the optimizer step goes through: parameters, gradients, optimizer state."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def host_bytes(self) -> int:
        """What the rank keeps in host memory instead of on its device (CPU offload)."""
        return self.state_bytes if self.offloaded else 0

    @property
    def total_bytes(self) -> int:
        """What the device holds: activations, and the state unless it is offloaded."""
        return self.state_bytes - self.host_bytes + self.activations_bytes

    def to_json(self) -> dict:
        return {**asdict(self), "host_bytes": self.host_bytes, "total_bytes": self.total_bytes}


@dataclass
class RankLoad:
    """One rank's share of the model: where it sits on the mesh, what it holds and computes."""
    rank: int
    stage: int  # its pipeline rank (its first stage)
    stages: list[int]  # every stage it runs (several under interleaved 1F1B)
    dp_rank: int
    tp_rank: int
    memory: Memory
    flops_per_step: float
    params: int  # parameter elements it holds

    def to_json(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "memory"}, "memory": self.memory.to_json()}


@dataclass
class Prediction:
    """The predicted step (seconds) and the largest rank's memory."""
    step_s: float
    compute_s: float
    update_s: float
    comm_s: float
    peak_bytes_max: int
    calibrated_step_s: float | None = None  # step_s corrected by a run's measured pace (engine/runs/calibration.py)

    def to_json(self) -> dict:
        d = asdict(self)
        if d["calibrated_step_s"] is None:
            del d["calibrated_step_s"]
        return d


def chunk_len(size: int, n: int, i: int) -> int:
    """Length of piece i when torch.chunk cuts `size` into n (DTensor Shard, FSDP2)."""
    c = math.ceil(size / n) if n > 0 else size
    return max(0, min(c, size - i * c))


def param_shards(ntype: str, style: str | None, pname: str) -> int | None:
    """Which dimension of a parameter TP splits (None: replicated); the layer's TPRule says."""
    from engine.diagram.catalog import get_layer

    spec = get_layer(ntype)
    rule = spec.tp_rule(style) if spec and style else None
    return rule.shard_dim(pname) if rule else None


def output_bytes(compiled, n: str) -> int:
    info = compiled.nodes[n].out
    return info.nbytes() if info else 0


def top_blocks(graph) -> dict[str, str | None]:
    """node id -> its top-level block (None: in none), as the runtime reads it from the run spec."""
    return {n: (node.group.split("/")[0] if node.group else None) for n, node in graph.nodes.items()}


def kept_outputs(compiled, ids, ckpt) -> set[str]:
    """The nodes of `ids` whose outputs autograd keeps for backward: all but those inside a
    checkpointed region (engine/runtime/distributed/stages.py checkpoint_regions, the runtime's own
    cut); a region keeps the outputs it hands to a node after it. So a layer checkpointed
    alone keeps its output (the next layer holds it), and a block frees its inside."""
    if not ckpt:
        return set(ids)
    from engine.runtime.distributed.stages import checkpoint_regions

    graph = compiled.graph
    pos = {n: i for i, n in enumerate(compiled.order)}
    calls = sorted((n for n in ids if graph.nodes[n].type not in ("Input", "Output")), key=lambda n: pos.get(n, 0))
    regions = checkpoint_regions(calls, ckpt, top_blocks(graph))
    if not regions:
        return set(ids)
    region_of = {n: i for i, r in enumerate(regions) for n in r}
    succ: dict[str, list[str]] = {}
    for e in graph.edges:
        if e.src in region_of:
            succ.setdefault(e.src, []).append(e.dst)
    return {n for n in ids if n not in region_of or any(region_of.get(d) != region_of[n] for d in succ.get(n, ()))}


def activation_bytes(compiled, ids, layout, tp, local_b, m, pp, s, schedule, ckpt) -> int:
    """Estimate: every layer's output is kept for backward but those recomputed inside a
    checkpointed region (kept_outputs), for as many micro-batches as the schedule holds at
    once: all m under GPipe, at most pp - s under 1F1B, pp per stage under ZB-H1 and ZB-V
    (over a rank's two V stages, the paper's p M_B), pp + 1 under DualPipeV.
    layout: node -> its output's Layout on tp."""
    per_sample = 0
    kept = kept_outputs(compiled, ids, ckpt)
    for n in ids:
        if n not in kept:
            continue
        b = output_bytes(compiled, n)
        lay = layout.get(n)
        if lay is not None and lay.is_shard:
            b //= tp
        per_sample += b
    if pp == 1 or schedule in ("gpipe", "interleaved1f1b"):
        in_flight = m
    elif schedule == "1f1b":
        in_flight = min(m, pp - s)
    elif schedule == "dualpipev":  # one micro-batch more than 1F1B (DualPipe's PP+1)
        in_flight = min(m, pp + 1)
    else:  # zero bubble holds what 1F1B's first stage holds (ZB-H1's and ZB-V's memory, the paper's)
        in_flight = min(m, pp)
    return per_sample * (local_b // max(1, m)) * in_flight


def rank_loads(compiled, stages: list[list[str]], styles: dict[str, str], layout: dict, *, pp: int, dp: int,
               tp: int, microbatches: int, batch_size: int, schedule: str, fsdp: bool, optimizer: str,
               momentum: float = 0.0, checkpointed: frozenset | set = frozenset(),
               cpu_offload: bool = False) -> list[RankLoad]:
    """Every rank's memory and FLOPs per step, in rank order (rank = (s*dp + d)*tp + t, as
    runtime/distributed/mesh.py's init_device_mesh lays them out). stages: node ids per stage (stage
    s runs on pipeline rank s % pp); styles: node -> tp style; layout: node -> output Layout.
    A checkpointed node costs its forward once more (4 x forward instead of 3 x);
    cpu_offload moves the state (parameters, gradients, optimizer) to host memory."""
    from engine.diagram.catalog import get_layer

    graph, meta = compiled.graph, compiled.module
    slots = optimizer_slots(optimizer, momentum)
    local_b = batch_size // max(1, dp)
    loads = []
    for s in range(pp):
        mine = rank_stages(schedule, pp, len(stages), s)  # this pipeline rank's stages
        ids = [n for st in mine for n in stages[st]]
        acts = sum(activation_bytes(compiled, stages[st], layout, tp, local_b, microbatches, pp, st, schedule,
                                    checkpointed) for st in mine)
        flops = sum((4.0 if n in checkpointed else 3.0) * compiled.nodes[n].flops / (tp if n in styles else 1)
                    for n in ids) * local_b
        for d in range(dp):
            for t in range(tp):
                params = tensors = 0
                seen: set[int] = set()  # a tied parameter is held once
                for n in ids:
                    if get_layer(graph.nodes[n].type).kind == "function":  # no parameters
                        continue
                    for pname, p in meta.get_submodule(n).named_parameters():
                        if id(p) in seen:
                            continue
                        seen.add(id(p))
                        shape = list(p.shape)
                        dim = param_shards(graph.nodes[n].type, styles.get(n), pname)
                        if dim is not None:
                            shape[dim] = chunk_len(shape[dim], tp, t)
                        if fsdp:
                            shape[0] = chunk_len(shape[0], dp, d)
                        params += math.prod(shape)
                        tensors += 1
                mem = Memory(params * FLOAT_BYTES, params * FLOAT_BYTES,
                             slots * params * FLOAT_BYTES + (tensors * 4 if optimizer != "sgd" else 0), acts,
                             offloaded=cpu_offload)
                loads.append(RankLoad((s * dp + d) * tp + t, s, mine, d, t, mem, flops, params))
    return loads


def offload_time(loads: list[RankLoad], device: DeviceSpec) -> float:
    """Seconds per step FSDP2's CPU offload adds: each offloaded rank copies its parameter
    shards to the device and its gradient shards back, over the host link (the most any rank moves)."""
    return max(((x.memory.params_bytes + x.memory.grads_bytes) / device.host_bytes_per_s
                for x in loads if x.memory.offloaded), default=0.0)


def predict(loads: list[RankLoad], comm_s: float, microbatches: int, device: DeviceSpec, pp: int,
            stages_per_rank: int = 1, schedule: str = "1f1b") -> Prediction:
    """The step time (step_time over each pipeline rank's FLOPs and optimizer state, plus the
    host copies of CPU offload, counted with communication) and the peak memory."""
    comm_s = comm_s + offload_time(loads, device)
    stage_flops, state = [0.0] * pp, [0] * pp  # per pipeline rank: the most any of its ranks does and holds
    for x in loads:
        stage_flops[x.stage] = max(stage_flops[x.stage], x.flops_per_step)
        state[x.stage] = max(state[x.stage], x.memory.state_bytes)
    t = step_time(stage_flops, microbatches, device, comm_s, stages_per_rank, state_bytes=state,
                  drain=drain_factor(schedule, pp, microbatches))
    return Prediction(t["step_s"], t["compute_s"], t["update_s"], t["comm_s"],
                      max((x.memory.total_bytes for x in loads), default=0))


__all__ = ["Memory", "RankLoad", "Prediction", "rank_loads", "predict", "offload_time", "activation_bytes", "kept_outputs", "top_blocks", "chunk_len", "param_shards",
           "DeviceSpec", "local_cpu", "cpu_calibration", "measure_cpu", "cache_dir", "worker_threads",
           "device_from_name", "collective_bytes", "comm_time", "bubble_fraction", "drain_factor", "step_time", "FLOAT_BYTES", "GPUS"]
