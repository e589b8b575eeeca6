"""What Layerflow does on the GPUs of this machine, in one script (under 8 minutes on an H200).

    python bench/gpu_check.py               # on a machine with CUDA GPUs; the table also goes to $OUT/gpu_check.txt
    python bench/gpu_check.py --cpu-smoke   # the same checks, tiny, on the CPU (the test suite runs this)

On one GPU (bench/gpu_check_single.py):
  - a ResNet-50 (torchvision's layout, 224x224) and a GPT of ~92M parameters, written
    as their reference code writes them and imported with from_module, trained on the
    same batches from the same weights by Layerflow's runtime and by a plain hand-written
    loop, in fp32 and with bf16 autocast (placement.mixed_precision): step time,
    achieved TFLOP/s, the throughput ratio Layerflow / hand (goal >= 0.97), and how far
    their logged losses are apart (they must agree);
  - the runtime's DDP and FSDP2 wrapping (apply_dp) at world size 1 on nccl, losses
    against the plain loop;
  - every bundled example through the runtime;
  - peak memory (torch.cuda.max_memory_allocated) against the planner's parameters,
    gradients, optimizer state and activations, and the planner's step time against the
    measured one (goal: within 15%).
With two GPUs or more, also the NCCL checks: DDP (dp=2), tensor parallel (tp=2) and a
1F1B pipeline (pp=2) against the single-GPU losses and bench/dist_overhead.py's
hand-written torch.distributed script. With one GPU they are skipped (NCCL needs a GPU
per rank), and the table says so.

Issue 47's rows (a second table; --no-variants skips them):
  - training.compile off / blocks / whole on a 4-block GPT (bf16 on a GPU): ms/step, the
    speedup over eager, the losses against eager, the first compile's seconds;
  - placement.mixed_precision bf16 against float8 (torchao, tensorwise), eager and with
    blocks compiled; where float8 cannot run (compute capability below 8.9, no torchao)
    its rows say "refused: " and the run's own one-line reason;
  - each pipeline schedule (gpipe, 1f1b, interleaved1f1b, interleavedzb, zbv, dualpipev) at pp=2 under
    torchrun against one process: on GPUs 0 and 1 with NCCL where there are two, else on
    the CPU with gloo (the runtime puts rank r on GPU r; NCCL needs a GPU per rank).
The distributed trainer at world size 1 (bench/gpu_check_dist.py; issue 57), a third table:
ParallelTrainer and fit under torchrun with NCCL: fp32 (TF32) with a save and a resume from the
middle checkpoint, FSDP2 with cpu_offload and grad_clip in bf16, float8 with a checkpointed
block under FSDP2, bf16 autocast; a predicted / measured step time outside 0.5-2 is a PROBLEM.
`python bench/gpu_check.py --only-dist` runs it alone (about a minute on a GPU, estimated: four
launches of ~10 s and a resume); --no-dist leaves it out.
On an H100 they should add about 3 to 4 minutes (estimated, not yet measured on a GPU: the
compiles take most of it); with the first table's 8 minutes that passes 10, so a device
session with a 10-minute limit runs them as two calls: `--no-variants`, then `--only-variants`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "models"))  # real_models.py: the architectures as their reference code writes them

import dist_overhead as bench  # noqa: E402


def gpu_device():
    """The planner's device for this GPU: a known kind when the name matches, else
    the GPU's real memory with H100-like speed."""
    from dataclasses import replace

    import torch

    from engine.planning.cost import GPUS

    name = torch.cuda.get_device_name(0).lower()
    mem = torch.cuda.get_device_properties(0).total_memory
    for key, spec in GPUS.items():
        if key.split("-")[0] in name:
            return replace(spec, memory_bytes=mem)
    return replace(GPUS["h100-80gb"], name=name, memory_bytes=mem)


def nccl_checks(args, n: int, device) -> tuple[list[str], list[str]]:
    """DDP, TP and 1F1B over 2 GPUs against the single-GPU run: (table lines, problems)."""
    import torch

    from engine.runs.build import prepare_run
    from engine.runtime.train import run

    rows = []
    with tempfile.TemporaryDirectory(prefix="lf_gpu_check_") as tmpdir:
        tmp = Path(tmpdir)
        ref_dir = prepare_run(bench.project(args.hidden, args.batch, args.steps, pp=False), tmp / "single")
        run(ref_dir)
        _, ref_recs = bench.layerflow_times(ref_dir, args.batch)
        ref_loss = [r["loss"] for r in ref_recs if "loss" in r]
        configs = [("ddp", {"dp": 2, "data_parallel": "ddp"}, None, "ddp"),
                   ("tp", {"tp": 2}, {"fc1": "colwise", "fc2": "rowwise"}, "tp"),
                   ("1f1b", {"pp": 2, "schedule": "1f1b", "microbatches": 4}, None, "pp")]
        for name, placement, styles, hand_kind in configs:
            proj = bench.project(args.hidden, args.batch, args.steps, pp=name == "1f1b")
            d, plan = bench.layerflow_run(tmp, name, proj, placement, 2, device, styles)
            lf_dt, lf_recs = bench.layerflow_times(d, args.batch)
            lf_loss = [r["loss"] for r in lf_recs if "loss" in r]
            hand = bench.handwritten(tmp, hand_kind, d, 2)
            hand_dt = hand[0]["times"]  # rank 0's step periods, as Layerflow's are timed on rank 0
            lf_med, hd_med = statistics.median(lf_dt), statistics.median(hand_dt[bench.WARMUP:])
            peaks = json.loads((d / "peak_mem_per_rank.json").read_text())
            rows.append({
                "config": f"{name} x2", "ratio": hd_med / lf_med, "lf_sps": args.batch / lf_med,
                "hand_sps": args.batch / hd_med, "pred_ms": plan.doc["predicted"]["step_s"] * 1e3,
                "meas_ms": lf_med * 1e3,
                "loss_vs_single": max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(lf_loss, ref_loss)),
                "mem": [(dv["memory"]["total_bytes"] / 2**20, peaks[dv["rank"]], hand[dv["rank"]]["peak_cuda_mb"])
                        for dv in plan.doc["devices"]],
            })
    out = [f"NCCL, {torch.cuda.get_device_name(0)} x{n}: MLP 256-{args.hidden}-{args.hidden}-10, batch {args.batch}, "
           f"{args.steps} steps (median after {bench.WARMUP} warm-up)",
           f"{'config':<8} {'Layerflow/s':>12} {'hand/s':>10} {'ratio':>6} {'pred ms':>8} {'meas ms':>8} "
           f"{'loss vs 1 GPU':>13}"]
    for r in rows:
        out.append(f"{r['config']:<8} {r['lf_sps']:>12.0f} {r['hand_sps']:>10.0f} {r['ratio']:>6.3f} "
                   f"{r['pred_ms']:>8.2f} {r['meas_ms']:>8.2f} {r['loss_vs_single']:>13.1e}")
    out.append(f"{'config':<8} {'rank':>4} {'pred MiB':>9} {'Layerflow max_allocated MiB':>28} {'hand MiB':>9}")
    for r in rows:
        for rank, (pred, lf, hand) in enumerate(r["mem"]):
            out.append(f"{r['config']:<8} {rank:>4} {pred:>9.1f} {lf:>28.1f} {hand:>9.1f}")
    problems = [f"NCCL {r['config']}: losses differ from the single-GPU run by {r['loss_vs_single']:.1e}"
                for r in rows if r["loss_vs_single"] > 1e-3]
    return out, problems


def main(argv: list[str] | None = None) -> int:
    import os

    import torch

    import gpu_check_single as single

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run every one-device check, tiny, on the CPU (what the test suite runs)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 60; 8 with --cpu-smoke)")
    ap.add_argument("--hidden", type=int, default=4096, help="NCCL checks: the MLP's width")
    ap.add_argument("--batch", type=int, default=512, help="NCCL checks: the batch")
    ap.add_argument("--no-examples", action="store_true", help="skip the bundled examples")
    ap.add_argument("--no-variants", action="store_true",
                    help="skip issue 47's rows (compile modes, pipeline schedules, float8 against bf16)")
    ap.add_argument("--only-variants", action="store_true",
                    help="run issue 47's rows alone (no first table, examples or NCCL checks)")
    ap.add_argument("--no-dist", action="store_true", help="skip the distributed trainer at world size 1")
    ap.add_argument("--only-dist", action="store_true",
                    help="run the distributed trainer at world size 1 alone (issue 57: DDP, FSDP + offload + clip, "
                         "float8 + a checkpointed block, bf16, save and resume)")
    ap.add_argument("--dist-hidden", type=int, default=None, help="the distributed rows' MLP width (8192; 64 on the CPU)")
    ap.add_argument("--dist-batch", type=int, default=None, help="the distributed rows' batch (4096; 32 on the CPU)")
    args = ap.parse_args(argv)
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not args.cpu_smoke and n == 0:
        print("no CUDA GPU here: nothing run (bench/gpu_check.py --cpu-smoke runs the same checks, tiny, on the CPU)")
        return 2
    if args.cpu_smoke:
        from engine.planning.cost import local_cpu

        device, spec, steps = torch.device("cpu"), local_cpu(1), args.steps or 8
        single.LOG = 2
        what = f"CPU smoke ({os.cpu_count()} cores): tiny models, {steps} steps, a loss logged every {single.LOG}"
    else:
        torch.cuda.set_device(0)
        device, spec, steps = torch.device("cuda", 0), gpu_device(), args.steps or 60
        what = (f"{torch.cuda.get_device_name(0)} ({spec.memory_bytes / 2**30:.0f} GiB) x{n}, torch {torch.__version__}, "
                f"{steps} steps, timed after the first {single.LOG}")
    examples = [] if args.no_examples else sorted((ROOT / "resources" / "examples").glob("*.lflow"))
    lines = [what]
    t0 = time.perf_counter()
    only = args.only_variants or args.only_dist
    with tempfile.TemporaryDirectory(prefix="lf_gpu_check_") as tmpdir:
        rows = [] if only else single.run_single(Path(tmpdir), device, spec, args.cpu_smoke, steps, examples)
        variants, sched, sched_head = [], [], ""
        if not args.no_variants and not args.only_dist:
            variants = single.compile_and_float8_rows(Path(tmpdir), device, spec, args.cpu_smoke, steps)
            sched_head, sched = single.schedule_rows(Path(tmpdir), n, args.cpu_smoke, steps)
        dist_lines, dist_problems = [], []
        if not args.no_dist and not args.only_variants:
            import gpu_check_dist

            cuda = not args.cpu_smoke
            dist_lines, dist_problems = gpu_check_dist.run_dist(
                Path(tmpdir), cuda, args.steps or (40 if cuda else 8), args.dist_hidden or (8192 if cuda else 64),
                args.dist_batch or (4096 if cuda else 32), spec)
    if rows:
        lines += single.format_rows(rows)
    problems = [p for r in rows for p in r.problems]
    if variants:
        lines.append("compile modes, then float8 against bf16, on one device (speedup and loss diff against the "
                     "section's first row)")
        lines += single.format_variants(variants)
    if sched:
        lines.append(sched_head)
        lines += single.format_variants(sched)
    problems += [p for r in variants + sched for p in r.problems]
    timed = [r for r in rows if r.section in ("single", "example") and r.pred_ms and r.step_ms == r.step_ms]
    if timed:
        lines.append("predicted / measured step time: " + ", ".join(
            f"{r.name} {r.precision} {r.pred_ms / r.step_ms:.2f}" for r in timed))
    lines += dist_lines
    problems += dist_problems
    if only:
        pass
    elif args.cpu_smoke:
        lines.append("NCCL multi-rank checks: not run in the CPU smoke (bench/dist_overhead.py is their CPU twin)")
    elif n >= 2:
        more, bad = nccl_checks(args, n, gpu_device())
        lines += more
        problems += bad
    else:
        lines.append(f"NCCL multi-rank checks (DDP, TP, 1F1B over 2 ranks): skipped, {n} GPU here and NCCL needs one "
                     f"per rank")
    lines.append(f"took {time.perf_counter() - t0:.0f} s")
    lines += [f"PROBLEM: {p}" for p in problems]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_check.txt").write_text(text)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
