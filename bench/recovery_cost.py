"""What recovering from a lost rank costs, and what a checkpoint blocks (issue 56).

    python bench/recovery_cost.py [--kills 2] [--widths 64,256]

1. Time lost per failure, locally: the digits MLP on 2 processes (torchrun, gloo), rank 1
   SIGKILLed after its second checkpoint, the run restarting by itself. Its parts:
   detection (the kill to the agent seeing it: torchrun's log line), restart (the failure
   to the next attempt being recorded: recovery.py's down_s, i.e. the agent stopping the
   group, the backoff, new processes importing torch, the rendezvous and the checkpoint's
   load), to the first step (from there to the attempt's first step), and redo (the steps
   after the checkpoint trained again, at the run's own step time).
2. What the steps wait for a checkpoint, synchronous against asynchronous
   (training.checkpoint_async), on the transformer example at two widths, one process:
   the runtime logs each save's blocking time.
Not a test: numbers depend on this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.project import Restarts, load_project  # noqa: E402
from engine.runs.build import prepare_run  # noqa: E402
from engine.runtime.records import RunStatus  # noqa: E402
from engine.runtime.recovery import read_attempts  # noqa: E402
from engine.runtime.train import run  # noqa: E402
from remote.launch.local import launch_local  # noqa: E402

EX = ROOT / "resources" / "examples"


def one_kill(tmp: Path, steps: int) -> dict:
    p = load_project(EX / "mlp_digits.lflow")
    p.training = p.training.model_copy(update={"steps": steps, "checkpoint_interval": steps // 10,
                                               "eval_interval": 10 ** 6, "log_interval": 1,
                                               "restarts": Restarts(backoff_s=0.5)})
    d = prepare_run(p, tmp / f"run{time.perf_counter_ns()}", placement={"dp": 2})
    job = launch_local(d, 2)
    target = 2 * (steps // 10) + 5
    while (RunStatus.read(d) or RunStatus()).step < target:
        time.sleep(0.02)
    killed = time.time()
    os.kill(job.rank_pid(1), signal.SIGKILL)
    if job.wait(timeout=600) != 0:
        raise SystemExit(job.describe_failure())
    recs = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    restart = next(r for r in recs if r.get("event") == "restart")
    attempt = read_attempts(d)[1]
    first = next(r for r in recs if "loss" in r and r["step"] == restart["step"] + 1)
    # step times of the unbroken stretch before the kill (metrics "time": seconds of training)
    times = [r["time"] for r in recs if "loss" in r and r["step"] <= attempt["after"]["step"]]
    step_s = statistics.median(b - a for a, b in zip(times, times[1:]))
    seen = _agent_saw(d, killed)
    return {"detection_s": seen - killed if seen else float("nan"), "down_s": restart["down_s"],
            "load_s": first["time"] - restart["time"],
            "redo_s": (attempt["after"]["step"] - restart["step"]) * step_s,
            "redo_steps": attempt["after"]["step"] - restart["step"],
            "total_s": (attempt["started"] - killed) + (first["time"] - restart["time"])
            + (attempt["after"]["step"] - restart["step"]) * step_s}


def _agent_saw(run_dir: Path, after: float) -> float | None:
    """When torchrun logged the failed worker (its log lines carry the time of day)."""
    text = (run_dir / "logs" / "launcher.log").read_text(errors="replace")
    for m in re.finditer(r"^E(\d{4}) (\d\d):(\d\d):(\d\d\.\d+) .*failed \(exitcode", text, re.M):
        h, mi, s = int(m.group(2)), int(m.group(3)), float(m.group(4))
        lt = time.localtime(after)
        t = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, h, mi, 0, 0, 0, -1)) + s
        if t >= after - 1:
            return t
    return None


def blocking(tmp: Path, width: int, asynchronous: bool, steps: int) -> float:
    p = load_project(EX / "transformer_synthetic.lflow")
    g = p.graph  # the example's width (64, its feed-forward 128), scaled
    g.set_param("embed", "embedding_dim", width)
    g.set_param("fc_in", "out_features", 2 * width)
    g.set_param("fc_out", "out_features", width)
    p.training = p.training.model_copy(update={"steps": steps, "checkpoint_interval": max(1, steps // 4),
                                               "eval_interval": 10 ** 6, "checkpoint_async": asynchronous})
    d = prepare_run(p, tmp / f"ck{width}{asynchronous}")
    if run(d).state != "succeeded":
        raise SystemExit(f"the width {width} run failed")
    waits = [float(m) for m in re.findall(r"the steps waited ([\d.]+) s", (d / "logs" / "rank0.log").read_text())]
    return statistics.median(waits)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--widths", default="64,256")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        rows = [one_kill(tmp, args.steps) for _ in range(args.kills)]
        print("| failure | detection | restart (to the attempt recorded) | then to its first step | redo | total lost |")
        print("|---|---|---|---|---|---|")
        for i, r in enumerate(rows, 1):
            print(f"| kill {i} | {r['detection_s']:.2f} s | {r['down_s']:.2f} s | {r['load_s']:.2f} s | "
                  f"{r['redo_s']:.2f} s ({r['redo_steps']} steps) | {r['total_s']:.2f} s |")
        print()
        print("| model | checkpoint, steps wait (sync) | (async) | ratio |")
        print("|---|---|---|---|")
        for w in (int(x) for x in args.widths.split(",")):
            s, a = blocking(tmp, w, False, 40), blocking(tmp, w, True, 40)
            print(f"| transformer example, width {w} | {s * 1e3:.1f} ms | {a * 1e3:.1f} ms | {s / a:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
