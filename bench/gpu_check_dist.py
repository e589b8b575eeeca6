"""The distributed trainer on one device (issue 57): ParallelTrainer and fit under torchrun at
world size 1, on NCCL where there is a GPU (gloo on the CPU smoke), with what the one-process
trainer never runs: the process group's collectives (log_sync, clipping, evaluation),
save_final, DCP with a process group, FSDP2's wrapping.

    ddp     fp32 (TF32), dp=1 (no DDP wrapper applies at dp=1: the trainer's collectives only);
            checkpointed every steps/2, then resumed from the middle checkpoint in a second
            launch: its losses after the resume must be the first run's
    fsdp    FSDP2 with cpu_offload and grad_clip, bf16 (its MixedPrecisionPolicy, the loss in
            float32): FSDP2 wraps at dp=1 when it offloads
    float8  torchao float8 (emulated on the CPU) with fc1/act1/fc2 checkpointed as one block
            (the region must call the Float8Linear layers), under FSDP2 with cpu_offload
    bf16    bf16 autocast, no FSDP

Each row: measured ms/step (median after the warm-up, from samples_per_s), the planner's
prediction, their ratio (predicted / measured; outside 0.5-2 a PROBLEM on a GPU), the first
and last loss, the peak memory. A failed run is a PROBLEM with its error line.

    torchrun --standalone --nproc-per-node 1 bench/gpu_check_dist.py --worker RUN_DIR [--resume]
is what each launch runs (parallel_trainer.run_distributed, as train.py does for world > 1).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WARMUP_STEPS = 5  # records at or before this step are not timed (first kernels, cuBLAS handles, allocator)
RATIO_OK = (0.5, 2.0)


def _project(hidden: int, batch: int, steps: int, log: int):
    """dist_overhead's MLP (256 -> hidden -> hidden -> 10), with a checkpoint halfway (the
    resume's) and logged every `log` steps."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from dist_overhead import project

    p = project(hidden, batch, steps, pp=False)
    p.training = p.training.model_copy(update={"checkpoint_interval": max(1, steps // 2), "log_interval": log})
    return p


CONFIGS = [  # name, placement, plan changes, training changes, checkpointed nodes
    ("ddp", {"data_parallel": "ddp"}, {}, {}, ()),
    ("fsdp", {"data_parallel": "fsdp", "mixed_precision": "bf16"}, {"data_parallel": "fsdp", "cpu_offload": True}, {"grad_clip": 1.0}, ()),
    ("float8", {"data_parallel": "fsdp", "mixed_precision": "float8"}, {"data_parallel": "fsdp", "cpu_offload": True}, {},
     ("fc1", "act1", "fc2")),
    ("bf16", {"data_parallel": "ddp", "mixed_precision": "bf16"}, {}, {}, ()),
]


def _launch(run_dir: Path, env: dict, resume: bool = False, timeout: float = 300) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           str(Path(__file__).resolve()), "--worker", str(run_dir), *(["--resume"] if resume else [])]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout[-2000:] + p.stderr[-4000:]


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _error(run_dir: Path, out: str) -> str:
    err = run_dir / "logs" / "rank0.error"
    if err.exists():
        return json.loads(err.read_text()).get("error", "?").splitlines()[0][:300]
    lines = [x for x in out.splitlines() if "Error" in x or "error" in x]
    return (lines[-1] if lines else out.strip().splitlines()[-1] if out.strip() else "no output")[:300]


def run_dist(tmp: Path, cuda: bool, steps: int, hidden: int, batch: int, device_spec) -> tuple[list[str], list[str]]:
    """The rows (table lines) and problems of the distributed trainer at world size 1."""
    from engine.planning.planner import make_plan
    from engine.runs.build import prepare_run

    log = 5 if cuda else 2
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if not cuda:
        from engine.runtime.float8 import EMULATE_ENV

        env.update({"OMP_NUM_THREADS": "1", EMULATE_ENV: "1"})  # (float8 emulated: the CPU has no float8 matmul)
    rows, problems = [], []
    for name, placement, plan_changes, training, ckpt in CONFIGS:
        proj = _project(hidden, batch, steps, log)
        for k, v in training.items():
            setattr(proj.training, k, v)
        for n in ckpt:
            proj.graph.set_placement(n, checkpoint=True)
        dev = device_spec
        if name == "float8" and not cuda:  # (the CPU smoke emulates float8: planned as for an H100)
            from engine.planning.cost import GPUS

            dev = GPUS["h100-80gb"]
        plan = make_plan(proj, 1, dev, placement=placement)
        if not plan.ok and name == "float8" and str(plan.errors[0]).startswith("placement.mixed_precision float8"):
            rows.append((name, None, None, None, None, f"refused: {plan.errors[0]}"[:160]))  # (this GPU cannot)
            continue
        if not plan.ok:
            problems.append(f"dist {name}: the planner refused it: {'; '.join(map(str, plan.errors))[:300]}")
            rows.append((name, None, None, None, None, f"refused by the planner: {plan.errors[0]}"[:120]))
            continue
        rp = {**plan.runtime_plan(), **plan_changes}
        d = prepare_run(proj, tmp / f"dist_{name}", placement=placement, plan=rp)
        t0 = time.perf_counter()
        code, out = _launch(d, env)
        wall = time.perf_counter() - t0
        if code != 0:
            why = _error(d, out)
            if name == "float8" and "placement.mixed_precision float8" in why:  # this GPU cannot: its own line
                rows.append((name, None, None, None, None, f"refused: {why}"[:160]))
                continue
            problems.append(f"dist {name}: the run failed: {why}")
            rows.append((name, None, None, None, None, f"FAILED: {why}"[:160]))
            continue
        recs = _records(d)
        losses = [r for r in recs if "loss" in r]
        times = [batch / r["samples_per_s"] for r in losses if r["step"] > WARMUP_STEPS and r.get("samples_per_s")]
        meas = statistics.median(times) if times else float("nan")
        pred = (rp.get("predicted") or {}).get("step_s")
        ratio = pred / meas if pred and meas == meas and meas > 0 else float("nan")
        peaks = json.loads((d / "peak_mem_per_rank.json").read_text()) if (d / "peak_mem_per_rank.json").exists() else [0]
        first, last = (losses[0]["loss"], losses[-1]["loss"]) if losses else (float("nan"),) * 2
        note = f"{wall:.0f} s launch"
        rank_log = (d / "logs" / "rank0.log").read_text() if (d / "logs" / "rank0.log").exists() else ""
        if name == "float8":
            import re

            m = re.search(r"float8 \w+( \(emulated\))?: (\d+) Linear layers in float8", rank_log)
            note += f"; {m.group(2) if m else 0} Linear in float8{m.group(1) or '' if m else ''}, fc1-fc2 one block"
        if not (d / "model.pt").exists():
            problems.append(f"dist {name}: no model.pt (save_final)")
        if not all(math.isfinite(r["loss"]) for r in losses) or not losses:
            problems.append(f"dist {name}: losses not finite: {[r['loss'] for r in losses][:6]}")
        elif last >= first:
            problems.append(f"dist {name}: the loss did not fall ({first:.4f} -> {last:.4f})")
        bad = ratio_problem(name, pred, meas) if cuda else None
        if bad:
            problems.append(bad)
        if name == "ddp":
            note += "; " + _resume_check(d, tmp, env, steps, problems)
        rows.append((name, meas * 1e3, pred * 1e3 if pred else None, ratio, (first, last, peaks[0]), note))
    backend = "NCCL" if cuda else "gloo (CPU smoke)"
    lines = [f"distributed trainer at world size 1 (torchrun, {backend}): MLP 256-{hidden}-{hidden}-10, batch {batch}, "
             f"{steps} steps, timed after step {WARMUP_STEPS}; ratio = predicted / measured"
             + ("" if cuda else " (not judged on the CPU)"),
             f"{'dist':<6} {'config':<7} {'ms/step':>9} {'pred ms':>9} {'ratio':>6} {'loss first':>10} {'last':>8} "
             f"{'peak MiB':>9}  notes"]
    for name, meas, pred, ratio, vals, note in rows:
        if meas is None:
            lines.append(f"{'dist':<6} {name:<7} {'-':>9} {'-':>9} {'-':>6} {'-':>10} {'-':>8} {'-':>9}  {note}")
            continue
        first, last, peak = vals
        lines.append(f"{'dist':<6} {name:<7} {meas:>9.2f} {pred if pred else float('nan'):>9.2f} {ratio:>6.2f} "
                     f"{first:>10.4f} {last:>8.4f} {peak:>9.1f}  {note}")
    return lines, problems


def ratio_problem(name: str, pred_s: float | None, meas_s: float) -> str | None:
    """The PROBLEM line of a predicted / measured step time outside RATIO_OK, else None."""
    if not pred_s or not meas_s or meas_s != meas_s or meas_s <= 0:
        return f"dist {name}: no step time to compare (predicted {pred_s}, measured {meas_s})"
    ratio = pred_s / meas_s
    if RATIO_OK[0] <= ratio <= RATIO_OK[1]:
        return None
    return (f"dist {name}: predicted / measured step time {ratio:.2f} (predicted {pred_s * 1e3:.2f} ms, measured "
            f"{meas_s * 1e3:.2f} ms) is outside {RATIO_OK[0]}-{RATIO_OK[1]}: the cost model (engine/planning/cost.py) "
            f"or the runtime is off")


def _resume_check(d: Path, tmp: Path, env: dict, steps: int, problems: list[str]) -> str:
    """The run resumed from its middle checkpoint in a second launch: the same losses after it."""
    half = max(1, steps // 2)
    r = tmp / "dist_ddp_resume"
    shutil.rmtree(r, ignore_errors=True)
    shutil.copytree(d, r, ignore=shutil.ignore_patterns("model.pt", "peak_mem_per_rank.json"))
    if not (r / "checkpoints" / f"step_{half}").exists():
        problems.append(f"dist ddp: no checkpoint step_{half} to resume from")
        return "resume: no checkpoint"
    (r / "checkpoints" / "latest").write_text(f"step_{half}")
    code, out = _launch(r, env, resume=True)
    if code != 0:
        problems.append(f"dist ddp resume: the run failed: {_error(r, out)}")
        return "resume FAILED"
    want = {x["step"]: x["loss"] for x in _records(d) if "loss" in x and x["step"] > half}
    got = {x["step"]: x["loss"] for x in _records(r) if "loss" in x and x["step"] > half}
    if sorted(got) != sorted(want) or not want:
        problems.append(f"dist ddp resume: logged steps {sorted(got)} after step {half}, the first run's {sorted(want)}")
        return "resume: steps differ"
    diff = max(abs(got[s] - want[s]) / max(abs(want[s]), 1e-12) for s in want)
    if diff > 1e-3:
        problems.append(f"dist ddp resume: losses after the resume differ from the first run's by {diff:.1e}")
    return f"save + resume at step {half}: losses within {diff:.1e}"


def _worker(argv: list[str]) -> int:
    from engine.runtime.parallel_trainer import run_distributed
    from engine.runtime.train import _exit_now

    status = run_distributed(argv[0], resume="--resume" in argv, restarts=False)
    _exit_now(0 if status.ok else 1)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        sys.exit(_worker(sys.argv[2:]))
    print(__doc__)
