"""The NCCL path on GPUs: DP, TP and PP, against single-GPU losses and a hand-written script.

    python bench/gpu_check.py [--hidden 4096] [--batch 512] [--steps 60]

Needs a machine with at least 2 CUDA GPUs (NCCL refuses two ranks on one GPU).
For each of DDP (dp=2), tensor parallel (tp=2: fc1 column-wise, fc2 row-wise) and
a 1F1B pipeline (pp=2, 4 micro-batches), it runs:
  - Layerflow's product path (planner -> prepare_run -> launch_local -> runtime,
    which picks nccl because GPUs are present),
  - the hand-written torch.distributed script of bench/dist_overhead.py (it also
    switches to nccl/cuda when GPUs are present),
and prints: losses against Layerflow's single-GPU run (max relative difference),
the throughput ratio Layerflow / hand-written (goal >= 0.95), the planner's
predicted step time against the measured one, and predicted per-rank memory
against torch.cuda.max_memory_allocated on each rank.

Status: written for this project's GPU check but not run in the session that
wrote it (no GPU was lent); the CPU twin, bench/dist_overhead.py, was run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import dist_overhead as bench  # noqa: E402


def gpu_device():
    """The planner's device for this GPU: a known kind when the name matches, else
    the GPU's real memory with H100-like speed."""
    from dataclasses import replace

    import torch

    from engine.cost import GPUS

    name = torch.cuda.get_device_name(0).lower()
    mem = torch.cuda.get_device_properties(0).total_memory
    for key, spec in GPUS.items():
        if key.split("-")[0] in name:
            return replace(spec, memory_bytes=mem)
    return replace(GPUS["h100-80gb"], name=name, memory_bytes=mem)


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        print(f"needs at least 2 CUDA GPUs for the NCCL checks; found {n}. Nothing run.")
        return 2
    device = gpu_device()
    from engine.runtime.train import run

    rows = []
    with tempfile.TemporaryDirectory(prefix="lf_gpu_check_") as tmpdir:
        tmp = Path(tmpdir)
        # the single-GPU reference: same project, one process
        from engine.run import prepare_run

        ref_dir = prepare_run(bench.project(args.hidden, args.batch, args.steps, pp=False), tmp / "single")
        run(ref_dir)
        _, ref_loss = bench.layerflow_times(ref_dir)
        configs = [("ddp", {"dp": 2, "data_parallel": "ddp"}, None, "ddp"),
                   ("tp", {"tp": 2}, {"fc1": "colwise", "fc2": "rowwise"}, "tp"),
                   ("1f1b", {"pp": 2, "schedule": "1f1b", "microbatches": 4}, None, "pp")]
        for name, placement, styles, hand_kind in configs:
            proj = bench.project(args.hidden, args.batch, args.steps, pp=name == "1f1b")
            d, plan = bench.layerflow_run(tmp, name, proj, placement, 2, device, styles)
            lf_dt, lf_loss = bench.layerflow_times(d)
            hand = bench.handwritten(tmp, hand_kind, d, 2)
            hand_dt = hand[0]["times"]  # rank 0's step periods, as Layerflow's are timed on rank 0
            lf_med, hd_med = statistics.median(lf_dt[bench.WARMUP:]), statistics.median(hand_dt[bench.WARMUP:])
            peaks = json.loads((d / "peak_mem_per_rank.json").read_text())
            rows.append({
                "config": f"{name} x2", "ratio": hd_med / lf_med, "lf_sps": args.batch / lf_med,
                "hand_sps": args.batch / hd_med, "pred_ms": plan.doc["predicted"]["step_s"] * 1e3,
                "meas_ms": lf_med * 1e3,
                "loss_vs_single": max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(lf_loss, ref_loss)),
                "mem": [(dv["memory"]["total_bytes"] / 2**20, peaks[dv["rank"]], hand[dv["rank"]]["peak_cuda_mb"])
                        for dv in plan.doc["devices"]],
            })
    print(f"{torch.cuda.get_device_name(0)} x{n}, NCCL; MLP 256-{args.hidden}-{args.hidden}-10, batch {args.batch}, "
          f"{args.steps} steps (median after {bench.WARMUP} warm-up)")
    print(f"{'config':<8} {'Layerflow/s':>12} {'hand/s':>10} {'ratio':>6} {'pred ms':>8} {'meas ms':>8} "
          f"{'loss vs 1 GPU':>13}")
    for r in rows:
        print(f"{r['config']:<8} {r['lf_sps']:>12.0f} {r['hand_sps']:>10.0f} {r['ratio']:>6.3f} {r['pred_ms']:>8.2f} "
              f"{r['meas_ms']:>8.2f} {r['loss_vs_single']:>13.1e}")
    print(f"\n{'config':<8} {'rank':>4} {'pred MiB':>9} {'Layerflow max_allocated MiB':>28} {'hand MiB':>9}")
    for r in rows:
        for rank, (pred, lf, hand) in enumerate(r["mem"]):
            print(f"{r['config']:<8} {rank:>4} {pred:>9.1f} {lf:>28.1f} {hand:>9.1f}")
    bad = [r["config"] for r in rows if r["loss_vs_single"] > 1e-3]
    if bad:
        print(f"losses differ from the single-GPU run by more than 1e-3 in: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
