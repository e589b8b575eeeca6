"""The one-device half of bench/gpu_check.py: what a single GPU (or, with --cpu-smoke,
the CPU) does with Layerflow's runtime. Imported by gpu_check.py; not a script.

For a real architecture (written as its reference code writes it, tests/models/
real_models.py), imported with `from_module`, it trains the same weights on the same
batches twice: with Layerflow's runtime (engine/runtime/train.py, in this process)
and with a plain loop a person writes by hand around the original nn.Module. Both
keep the loss on the device between log steps, so the ratio compares the loops, not
their logging. Each bundled example runs through the runtime alone. The runtime's
`apply_dp` (DDP and FSDP2) runs at world size 1 on the same model.
"""
from __future__ import annotations

import copy
import gc
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

LOG = 10  # training.log_interval of every run here (the hand loop reports the same windows); 2 in the smoke


@dataclass
class Row:
    """One measured run."""
    section: str
    name: str
    precision: str
    step_ms: float
    tflops: float | None = None  # achieved: 3 x forward FLOPs x batch / step time
    ratio: float | None = None  # Layerflow's steps/s over the hand loop's
    match: float | None = None  # max relative difference of the logged losses against the reference
    pred_ms: float | None = None  # the planner's step time for this device
    peak_mib: float | None = None  # torch.cuda.max_memory_allocated
    pred_mib: dict = field(default_factory=dict)  # the planner's memory: params, grads, optimizer, activations, total
    losses: list = field(default_factory=list)  # logged means, first to last
    problems: list = field(default_factory=list)


def cuda_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def windows(records: list[dict]) -> list[tuple[int, int]]:
    """(first step, last step), 1-based, of each logged loss of a run's metrics."""
    return [(r["step"] - r.get("steps", 1) + 1, r["step"]) for r in records if "loss" in r]


def rel_diff(a: list[float], b: list[float]) -> float:
    if len(a) != len(b) or not a:
        return math.inf
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def check_losses(row: Row) -> None:
    v = row.losses
    if not v or not all(math.isfinite(x) for x in v):
        row.problems.append(f"{row.name} {row.precision}: losses not finite: {v[:4]}...")
    elif len(v) > 1 and not v[-1] < v[0]:
        row.problems.append(f"{row.name} {row.precision}: loss did not fall ({v[0]:.4f} -> {v[-1]:.4f})")


# ----- Layerflow's side --------------------------------------------------------------
def layerflow(project, tmp: Path, tag: str, device: torch.device, spec, steps: int, precision: str,
              compile_mode: str = "off") -> tuple[Row, Path]:
    """Train `project` with the runtime in this process; the row and the run folder.
    `precision`: fp32, bf16 or float8 (placement.mixed_precision); `compile_mode`: training.compile."""
    from engine.diagram.compile import compile_graph
    from engine.planning.planner import make_plan
    from engine.runs.build import prepare_run
    from engine.runtime.train import run
    from engine.runs.tail import read_metrics

    project = project.copy()
    project.placement.mixed_precision = precision if precision in ("bf16", "float8") else "none"
    tr = project.training
    tr.compile = compile_mode
    tr.log_interval, tr.eval_interval, tr.checkpoint_interval = LOG, 10**9, 10**9
    plan = make_plan(project, 1, device=spec)
    mem = plan.doc["devices"][0]["memory"] if plan.ok else {}
    rd = prepare_run(project, tmp / tag, steps=steps)
    reset_peak(device)
    status = run(rd)
    peak = peak_mib(device)
    recs = [r for r in read_metrics(rd / "metrics.jsonl") if "loss" in r]
    row = Row("single", project.name, precision, step_ms=math.nan, peak_mib=peak,
              pred_ms=plan.doc["predicted"]["step_s"] * 1e3 if plan.ok else None,
              pred_mib={k.replace("_bytes", ""): v / 2**20 for k, v in mem.items()},
              losses=[r["loss"] for r in recs])
    if status.state != "succeeded":
        row.problems.append(f"{project.name} {precision}: the run {status.state}: {status.error}")
        return row, rd
    timed = [r for r in recs if r["step"] > LOG]  # from the end of the first window: warm-up excluded
    if len(timed) >= 2:
        dt = (timed[-1]["time"] - timed[0]["time"]) / (timed[-1]["step"] - timed[0]["step"])
        row.step_ms = dt * 1e3
        flops = compile_graph(project.graph).total_flops
        row.tflops = 3 * flops * tr.batch_size / dt / 1e12
    check_losses(row)
    return row, rd


# ----- the hand-written side -----------------------------------------------------------
def hand_loop(model: torch.nn.Module, run_dir: Path, device: torch.device, precision: str, steps: int,
              marks: list[tuple[int, int]]) -> tuple[float, list[float], float | None]:
    """The loop a person writes: Adam, the run's batches, autocast for bf16, the loss kept
    on the device. Returns (seconds per step after the first window, the mean loss of each
    of `marks`' windows, peak MiB)."""
    from engine.runtime.batches import Batches, load_npz

    spec = json.loads((run_dir / "run.json").read_text())
    tr = spec["training"]
    data = load_npz(run_dir)
    batches = Batches(data["x_train"], data["y_train"], int(tr["batch_size"]), int(tr["seed"]))
    opt_cfg = tr["optimizer"]
    cls = torch.optim.AdamW if opt_cfg["name"] == "adamw" else torch.optim.Adam
    model = model.to(device).train()
    opt = cls(model.parameters(), lr=opt_cfg["lr"], betas=tuple(opt_cfg["betas"]), weight_decay=opt_cfg["weight_decay"])
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    losses = []
    reset_peak(device)
    t0 = None
    for step in range(steps):
        if step == LOG:
            cuda_sync(device)
            t0 = time.perf_counter()
        x, y = batches.batch(step)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with amp:
            out = model(x)
            loss = F.cross_entropy(out.flatten(0, -2), y.flatten()) if out.dim() > 2 else F.cross_entropy(out, y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().float())
    cuda_sync(device)
    dt = (time.perf_counter() - t0) / (steps - LOG) if t0 is not None else math.nan
    per_step = torch.stack(losses).double().cpu().tolist()
    means = [sum(per_step[a - 1:b]) / (b - a + 1) for a, b in marks]
    return dt, means, peak_mib(device)


def world_one(kind: str, source: torch.nn.Module, run_dir: Path, device: torch.device, precision: str,
              steps: int, marks, reference: list[float]) -> Row:
    """The runtime's apply_dp (DDP or FSDP2) on the model at world size 1: the code path
    a data-parallel run takes, on this device's backend (nccl on CUDA, gloo on CPU)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from engine.runtime.distributed.data_parallel import apply_dp

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                            **({"device_id": device} if device.type == "cuda" else {}))
    try:
        mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp",))
        model = copy.deepcopy(source).to(device)
        model = apply_dp(model, mesh["dp"], kind, True, "bf16" if precision == "bf16" else "none")
        # FSDP casts through its policy; DDP's forward autocasts in the loop
        dt, means, peak = hand_loop(model, run_dir, device, "fp32" if kind == "fsdp" else precision, steps, marks)
        # drop DDP's reducer while the group still lives: freed after it (holding the GIL) it
        # would destroy the group and join gloo's thread, which waits for the GIL to free its
        # last finished work (a deadlock, seen once in CI-sized runs)
        dist.barrier()
        time.sleep(0.05)  # GIL released: gloo's thread frees the barrier's work now, not during the join
        del model
        gc.collect()
    finally:
        dist.destroy_process_group()
    row = Row("world 1", f"{kind} x1", precision, step_ms=dt * 1e3, peak_mib=peak, losses=means,
              match=rel_diff(means, reference))
    check_losses(row)
    return row


# ----- the models ---------------------------------------------------------------------
def architectures(smoke: bool, memory_bytes: int) -> list[dict]:
    """A ResNet-50 and a GPT of ~100M parameters, batch sized to the device; tiny with --cpu-smoke."""
    from real_models import GPT, ResNet50

    if smoke:
        return [dict(name="resnet50", make=lambda: ResNet50(width=4, num_classes=10), shape=[3, 32, 32],
                     dtype="float32", batch=8, samples=64),
                dict(name="gpt", make=lambda: GPT(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=16),
                     shape=[16], dtype="int64", batch=8, samples=64)]
    big = memory_bytes >= 64 * 2**30
    return [dict(name="resnet50", make=lambda: ResNet50(width=64, num_classes=1000), shape=[3, 224, 224],
                 dtype="float32", batch=128 if big else 32, samples=(128 if big else 32) * 2),
            # GPT-2 small's shape with a vocabulary of 8,192: 12 x 7.1M + embeddings = ~92M parameters
            dict(name="gpt-92m", make=lambda: GPT(vocab_size=8192, block_size=256, n_layer=12, n_head=12, n_embd=768),
                 shape=[256], dtype="int64", batch=32 if big else 8, samples=(32 if big else 8) * 4)]


def imported(arch: dict, tmp: Path):
    """(the source module, its Layerflow project): from_module, saved with its weights."""
    from engine.interop import save_imported
    from engine.interop.module.importer import from_module
    from engine.project import load_project

    torch.manual_seed(0)
    source = arch["make"]().eval()
    imp = from_module(source, [arch["shape"]], [arch["dtype"]], name=arch["name"])
    project = load_project(save_imported(imp, tmp / f"{arch['name']}.lflow"))
    project.name = arch["name"]
    tr = project.training
    tr.batch_size = arch["batch"]
    tr.dataset.n_samples = arch["samples"]
    tr.optimizer.lr = 1e-3 if arch["dtype"] == "float32" else 3e-4
    return source, project


def run_single(tmp: Path, device: torch.device, spec, smoke: bool, steps: int, examples: list[Path]) -> list[Row]:
    from engine.project import load_project

    rows: list[Row] = []
    mem = spec.memory_bytes
    for arch in architectures(smoke, mem):
        source, project = imported(arch, tmp)
        for precision in ("fp32", "bf16"):
            row, rd = layerflow(project, tmp, f"{arch['name']}_{precision}", device, spec, steps, precision)
            marks = windows([r for r in map(json.loads, (rd / "metrics.jsonl").read_text().splitlines())])
            dt, means, hpeak = hand_loop(copy.deepcopy(source), rd, device, precision, steps, marks)
            row.ratio = dt * 1e3 / row.step_ms if row.step_ms == row.step_ms else None
            row.match = rel_diff(row.losses, means)
            tol = 1e-3 if precision == "fp32" else 5e-2
            if not row.match <= tol:
                row.problems.append(f"{arch['name']} {precision}: Layerflow's losses differ from the hand loop's by "
                                    f"{row.match:.2e} (more than {tol:g})")
            rows.append(row)
            rows.append(Row("hand", arch["name"], precision, step_ms=dt * 1e3, peak_mib=hpeak, losses=means,
                            tflops=row.tflops * row.step_ms / (dt * 1e3) if row.tflops else None))
            # FSDP's bf16 policy casts the weights, autocast does not: the two bf16 trajectories part
            # by 0.1 at most on a GPU; on a CPU, whose bf16 kernels differ from one CPU to the next,
            # the tiny smoke models part by up to 0.15 (seen) and the check asks only that it runs sanely
            bf16_tol = 0.1 if device.type == "cuda" else 0.3
            for kind in ("ddp", "fsdp"):
                rows.append(world_one(kind, source, rd, device, precision, steps, marks, means))
                if not rows[-1].match <= (1e-4 if precision == "fp32" else bf16_tol):
                    rows[-1].problems.append(f"{kind} at world size 1 ({arch['name']} {precision}): losses differ "
                                             f"from the plain loop's by {rows[-1].match:.2e}")
    for path in examples:
        project = load_project(path)
        row, _ = layerflow(project, tmp, f"example_{path.stem}", device, spec, steps, "fp32")
        row.section, row.name = "example", path.stem
        rows.append(row)
    return rows


def mib(v: float) -> str:
    return f"{v:.0f}" if v >= 10 else f"{v:.2g}"


def format_rows(rows: list[Row]) -> list[str]:
    def f(v, fmt):
        return "" if v is None or v != v else format(v, fmt)

    out = [f"{'section':<8} {'model':<22} {'prec':<5} {'ms/step':>8} {'TFLOP/s':>8} {'LF/hand':>7} {'loss diff':>9} "
           f"{'pred ms':>8} {'peak MiB':>9} {'pred MiB (params/grads/optim/acts = total)':>44}"]
    for r in rows:
        pm = r.pred_mib
        pred = "/".join(mib(pm[k]) for k in ("params", "grads", "optimizer", "activations")) + \
            f" = {mib(pm['total'])}" if pm else ""
        out.append(f"{r.section:<8} {r.name:<22} {r.precision:<5} {f(r.step_ms, '8.2f'):>8} {f(r.tflops, '8.2f'):>8} "
                   f"{f(r.ratio, '7.3f'):>7} {f(r.match, '9.1e'):>9} {f(r.pred_ms, '8.2f'):>8} "
                   f"{f(r.peak_mib, '9.0f'):>9} {pred:>44}")
    return out


# ----- issue 47's rows: compile modes, pipeline schedules, float8 -----------------------
VARIANT_STEPS = 30  # steps of each run below on a GPU (timed after the first LOG)


@dataclass
class Variant:
    """One run of a setting against its section's first row (the baseline)."""
    section: str
    config: str
    precision: str
    step_ms: float
    speedup: float | None = None  # the baseline's ms/step over this one's
    match: float | None = None  # max relative difference of the logged losses against the baseline's
    note: str = ""
    problems: list = field(default_factory=list)


def variant_gpt(smoke: bool) -> dict:
    """A GPT whose widths are multiples of 16 (float8 converts its Linears; the head stays):
    4 blocks of 512 on a GPU (compiles in about a minute), 2 of 32 in the smoke."""
    from real_models import GPT

    if smoke:
        return dict(name="gpt", make=lambda: GPT(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32),
                    shape=[16], dtype="int64", batch=8, samples=64)
    return dict(name="gpt-4x512", make=lambda: GPT(vocab_size=8192, block_size=256, n_layer=4, n_head=8, n_embd=512),
                shape=[256], dtype="int64", batch=32, samples=128)


def _compile_note(rd: Path) -> str:
    rec = next((r for r in map(json.loads, (rd / "metrics.jsonl").read_text().splitlines())
                if r.get("event") == "compiled"), None)
    if rec is None:
        return ""
    eager = f", {len(rec['eager_blocks'])} eager" if rec.get("eager_blocks") else ""
    return f"compiled {rec['blocks']} block(s) in {rec['seconds']:.1f} s{eager}"


def _against(row: Row, base: Row | None, section: str, config: str, note: str, tol: float) -> Variant:
    v = Variant(section, config, row.precision, row.step_ms, note=note, problems=list(row.problems))
    if base is not None and row is not base:
        v.speedup = base.step_ms / row.step_ms if row.step_ms == row.step_ms else None
        v.match = rel_diff(row.losses, base.losses)
        if not v.match <= tol:
            v.problems.append(f"{section} {config}: losses differ from {base.name}'s baseline by {v.match:.2e} "
                              f"(more than {tol:g})")
    return v


def compile_and_float8_rows(tmp: Path, device: torch.device, spec, smoke: bool, steps: int) -> list[Variant]:
    """training.compile off / blocks / whole, then placement.mixed_precision bf16 against
    float8 (eager and with blocks compiled, what makes float8 pay), on one GPT. Where
    float8 cannot run the row says "refused: <the run's own line>"; in the CPU smoke it
    runs emulated (torchao's float8 casts, high-precision matmuls) when torchao is there."""
    import os

    from engine.runtime import float8

    steps = steps if smoke else min(steps, VARIANT_STEPS)
    arch = variant_gpt(smoke)
    _, project = imported(arch, tmp)
    prec = "fp32" if smoke else "bf16"
    out: list[Variant] = []
    base = None
    for mode in ("off", "blocks", "whole"):
        row, rd = layerflow(project, tmp, f"v_compile_{mode}", device, spec, steps, prec, mode)
        base = base or row
        # inductor reorders reductions (float32: ~1e-6); in bf16 it keeps some intermediates in float32
        out.append(_against(row, base, "compile", f"{arch['name']} {mode}", _compile_note(rd),
                            1e-3 if prec == "fp32" else 5e-2))
    emulate = smoke and float8.has_torchao()
    problem = None if emulate else float8.device_problem(device)
    row, _ = layerflow(project, tmp, "v_bf16", device, spec, steps, "bf16")
    base = row
    out.append(_against(row, base, "float8", f"{arch['name']} bf16", "the baseline", 0))
    for mode in ("off", "blocks"):
        config = f"{arch['name']} float8{' + blocks' if mode != 'off' else ''}"
        if problem:
            out.append(Variant("float8", config, "float8", math.nan, note=f"refused: {problem}"))
            continue
        if emulate:
            os.environ[float8.EMULATE_ENV] = "1"
        try:
            row, rd = layerflow(project, tmp, f"v_float8_{mode}", device, spec, steps, "float8", mode)
        finally:
            os.environ.pop(float8.EMULATE_ENV, None)
        note = "emulated on the CPU (no speed)" if emulate else float8.DEFAULT_RECIPE
        extra = _compile_note(rd)
        # float8 (e4m3, 3 mantissa bits) against bf16: the trajectories stay within 10% over these steps
        out.append(_against(row, base, "float8", config, f"{note}{'; ' + extra if extra else ''}", 0.1))
    return out


def schedule_project(hidden: int, batch: int, steps: int):
    """An MLP of 4 Linear layers (the planner cuts it into 2 stages, or 4 for the interleaved
    schedules), no BatchNorm or Dropout: a pipeline gives one process's losses."""
    from engine.diagram.graph import Graph
    from engine.project import Optimizer, Project, Training
    from engine.data.sources import SyntheticClassification

    g = Graph()
    g.add_node("Input", {"shape": [64]}, id="x")
    prev = "x"
    for i in range(1, 5):
        g.add_node("Linear", {"out_features": hidden if i < 4 else 10}, id=f"fc{i}")
        g.connect(prev, "out", f"fc{i}", "in")
        prev = f"fc{i}"
        if i < 4:
            g.add_node("ReLU", {}, id=f"act{i}")
            g.connect(prev, "out", f"act{i}", "in")
            prev = f"act{i}"
    g.add_node("Output", {"loss": "cross_entropy"}, id="out")
    g.connect(prev, "out", "out", "in")
    tr = Training(dataset=SyntheticClassification(kind="synthetic_classification", n_samples=batch * 8, n_features=64,
                                                   n_classes=10, noise=4.0),
                  batch_size=batch, steps=steps, eval_interval=10**9, checkpoint_interval=10**9, log_interval=LOG,
                  optimizer=Optimizer(name="adam", lr=1e-3))
    return Project(g, name="sched_mlp", training=tr)


def schedule_rows(tmp: Path, n_gpus: int, smoke: bool, steps: int) -> tuple[str, list[Variant]]:
    """Each pipeline schedule at pp=2 (torchrun, 2 processes) against one process on the
    same device kind: losses (they must agree) and ms/step over 1F1B's. With 2 GPUs or
    more the ranks use NCCL on GPUs 0 and 1; with one GPU or none they run on the CPU with
    gloo (the runtime puts rank r on GPU r, and NCCL needs a GPU per rank), which still
    checks each schedule's path and measures its bubble against 1F1B's."""
    from engine.planning.planner import make_plan
    from engine.runs.build import prepare_run
    from engine.runs.tail import read_metrics
    from remote.launch.local import launch_local

    on_gpu = n_gpus >= 2
    env = None if on_gpu else {"CUDA_VISIBLE_DEVICES": ""}
    hidden, batch = (64, 16) if smoke else (1024, 256)
    steps = steps if smoke else min(steps, VARIANT_STEPS)
    where = "GPUs 0-1, nccl" if on_gpu else "CPU, gloo"

    def launch(tag: str, nproc: int, placement: dict | None) -> Row:
        proj = schedule_project(hidden, batch, steps)
        kw = {}
        if placement:
            plan = make_plan(proj, nproc, placement=placement)
            if not plan.ok:
                return Row("schedule", tag, "fp32", math.nan, problems=[f"pp=2 {tag}: not planned: {plan.errors[0]}"])
            kw = dict(placement=placement, plan=plan.runtime_plan())
        rd = prepare_run(proj, tmp / f"sched_{tag}", **kw)
        job = launch_local(rd, nproc, env=env, torchrun=nproc > 1)
        if job.wait(timeout=300) != 0:
            return Row("schedule", tag, "fp32", math.nan, problems=[f"pp=2 {tag}: {job.describe_failure()}"])
        recs = [r for r in read_metrics(rd / "metrics.jsonl") if "loss" in r]
        timed = [batch / r["samples_per_s"] for r in recs if r["step"] > LOG]
        row = Row("schedule", tag, "fp32", statistics_median(timed) * 1e3 if timed else math.nan,
                  losses=[r["loss"] for r in recs])
        check_losses(row)
        return row

    single = launch("one process", 1, None)
    out = [_against(single, None, "schedule", "1 process", "the losses' reference", 0)]
    from engine.runtime.plan import SCHEDULES

    rows = {s: launch(s, 2, {"pp": 2, "schedule": s, "microbatches": 4}) for s in SCHEDULES}
    for s, row in rows.items():
        v = _against(row, single, "schedule", f"pp2 {s}", "", 1e-3)
        v.speedup = rows["1f1b"].step_ms / row.step_ms if row.step_ms == row.step_ms else None
        out.append(v)
    return f"pipeline schedules at pp=2 ({where}): MLP 64-{hidden}x3-10, batch {batch}, 4 micro-batches, " \
           f"{steps} steps; speedup against 1f1b, loss diff against one process", out


def statistics_median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def format_variants(rows: list[Variant]) -> list[str]:
    def f(v, fmt):
        return "" if v is None or v != v else format(v, fmt)

    out = [f"{'section':<8} {'config':<28} {'prec':<6} {'ms/step':>8} {'speedup':>7} {'loss diff':>9}  note"]
    for r in rows:
        out.append(f"{r.section:<8} {r.config:<28} {r.precision:<6} {f(r.step_ms, '8.2f'):>8} {f(r.speedup, '7.3f'):>7} "
                   f"{f(r.match, '9.1e'):>9}  {r.note}")
    return out
