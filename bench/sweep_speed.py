"""A sweep's queue against running its runs one after another (issue 44).

    python bench/sweep_speed.py [--runs 8] [--steps 300]

The digits MLP example over `runs` learning rates, run twice by the real queue
(remote/sweep_queue.py SweepRunner, each run its own training process): once one run at a
time, once as many at once as the cores allow (the queue's default). Prints the wall time
of each and their ratio; each run's own steps/s shows what sharing the cores cost it.
Not a test: numbers depend on this machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.project import load_project, save_project  # noqa: E402
from engine.runs.history import runs_table  # noqa: E402
from engine.runs.sweep import default_parallel  # noqa: E402
from remote.sweep_queue import SweepRunner  # noqa: E402


def sweep_once(project, runs: int, steps: int, parallel: int, out: Path) -> tuple[float, list[dict]]:
    lrs = [round(1e-3 * 1.6 ** i, 6) for i in range(runs)]
    runner = SweepRunner(project, {"parameters": {"training.optimizer.lr": lrs}, "steps": steps},
                         parallel=parallel, runs_dir=out)
    t = time.perf_counter()
    done = runner.run()
    wall = time.perf_counter() - t
    bad = [r for r in done if r.state != "succeeded"]
    if bad:
        raise SystemExit(f"run {bad[0].index + 1}: {bad[0].state}: {bad[0].note}")
    return wall, runs_table(out, sweep=runner.id)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    auto = default_parallel([1])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        p = load_project(ROOT / "resources" / "examples" / "mlp_digits.lflow")
        p.training.eval_interval = 10 ** 6
        p.training.checkpoint_interval = 10 ** 6
        save_project(p, tmp / "mlp.lflow")
        p = load_project(tmp / "mlp.lflow")
        rows = []
        for parallel in (1, auto):
            wall, table = sweep_once(p, args.runs, args.steps, parallel, tmp / f"runs-{parallel}")
            rates = [r["samples_per_s"] for r in table if r["samples_per_s"]]
            rows.append((parallel, wall, statistics.median(rates) if rates else float("nan")))
    base = rows[0][1]
    print(f"\n{args.runs} runs of the digits MLP, {args.steps} steps each, {os.cpu_count()} cores\n")
    print("| runs at once | sweep wall time | against one at a time | median samples/s of a run |")
    print("|---|---|---|---|")
    for parallel, wall, rate in rows:
        print(f"| {parallel} | {wall:.1f} s | {base / wall:.2f}x | {rate:.0f} |")


if __name__ == "__main__":
    main()
