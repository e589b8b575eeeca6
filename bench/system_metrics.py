"""What each rank's system-metrics sampler (engine/runtime/sysmetrics.py) costs the training:
steps/s of a small single-process training (the digits MLP of resources/examples) with the
sampler off, at its default period (5 s) and at 20 times that rate (0.25 s), and with the
TensorBoard event files on (rank 0's, when tensorboard is installed). Runs alternate, in
this process, `--repeats` times each; the table gives the median steps/s of the timed
part (metrics.jsonl's step records after the first second: the warm-up and the first
logs left out) and its ratio to the sampler off, and the ratio of the fastest runs (on a
shared machine the least disturbed); then one sample's own cost, timed directly.

    python bench/system_metrics.py [--steps 6000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.project import load_project
from engine.runs.build import prepare_run
from engine.runtime.sysmetrics import PERIOD_ENV, read_system
from engine.runtime.tensorboard import ENV as TB_ENV
from engine.runtime.train import run
from engine.runs.tail import read_metrics

CASES = [  # (name, sampler period, TensorBoard files)
    ("sampler off", "0", "0"),
    ("sampler every 5 s (default)", "5", "0"),
    ("sampler every 0.25 s", "0.25", "0"),
    ("sampler 5 s + TensorBoard", "5", "1"),
]


def steps_per_s(run_dir: Path, skip_s: float = 1.0) -> float:
    recs = [r for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r and "time" in r]
    timed = [r for r in recs if r["time"] >= skip_s] or recs
    a, b = timed[0], timed[-1]
    return (b["step"] - a["step"]) / max(b["time"] - a["time"], 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    project = load_project(ROOT / "resources" / "examples" / "mlp_digits.lflow")
    project.training.steps = args.steps
    project.training.eval_interval = args.steps  # the steps alone (one evaluation at the end)
    project.training.checkpoint_interval = args.steps
    got: dict[str, list[float]] = {name: [] for name, _, _ in CASES}
    samples: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name, period, tb in CASES[rep % len(CASES):] + CASES[:rep % len(CASES)]:  # (each first in turn)
                os.environ[PERIOD_ENV], os.environ[TB_ENV] = period, tb
                rd = prepare_run(project, Path(tmp) / f"{rep}-{len(samples)}-{period}-{tb}")
                assert run(rd).state == "succeeded"
                got[name].append(steps_per_s(rd))
                samples[name] = sum(len(v) for v in read_system(rd).values())
    # one sample's own cost, timed directly (what the thread spends each period)
    import time

    from engine.runtime.sysmetrics import SystemSampler

    sampler = SystemSampler(tmp, 0, time.perf_counter, lambda: 0, period=1.0)
    n = 2000
    t = time.perf_counter()
    for _ in range(n):
        sampler.sample()
    per_sample_us = (time.perf_counter() - t) / n * 1e6
    base = statistics.median(got[CASES[0][0]])
    print(f"digits MLP, {args.steps} steps, median of {args.repeats} runs each (single process, CPU)")
    best = max(got[CASES[0][0]])
    print(f"{'case':<30} {'steps/s':>9} {'min':>9} {'max':>9} {'ratio':>7} {'ratio max':>10} {'samples/run':>12}")
    for name, _, _ in CASES:
        v = got[name]
        med = statistics.median(v)
        print(f"{name:<30} {med:>9.0f} {min(v):>9.0f} {max(v):>9.0f} {med / base:>7.3f} {max(v) / best:>10.3f}"
              f" {samples[name]:>12}")
    print("(ratio: of the medians; ratio max: of the fastest runs, the least disturbed by other load)")
    print(f"one sample (os.times, /proc/self/status, the JSON line's dict): {per_sample_us:.1f} us; every 5 s that is "
          f"{per_sample_us / 5e6:.1e} of one core, every 0.25 s {per_sample_us / 0.25e6:.1e}")


if __name__ == "__main__":
    main()
