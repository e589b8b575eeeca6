"""The idle share of each pipeline schedule, measured, against the planner's formula.

    python bench/pipeline_bubble.py [--pp 2 4] [--microbatches 8] [--ms 2] [--steps 6]

Every schedule Layerflow offers runs the same model under torchrun (gloo, CPU), one
process per pipeline rank: 4*pp layers, each a fixed cost of --ms milliseconds for its
forward, as much for its input gradient and as much for its weight gradient (the
zero-bubble papers' balanced case T_F = T_B = T_W). The cost is a sleep, so compute
dominates whatever the machine's core count: 4 ranks on 2 cores still show the
schedule's own timing. GPipe and 1F1B run one stage of 4 layers per rank; the looped
(interleaved 1F1B, interleaved zero bubble) and V-shaped schedules (ZB-V, DualPipeV)
two stages of 2 layers, placed by runtime/plan.py's stage_rank as the runtime places
them, built by the runtime's own make_schedule.

Every rank does the same work per step, m * 4 layers * 3 costs; busy is the time a rank
measured inside them (mean over ranks), the measured bubble 1 - busy / the step's wall
time (the slowest rank's; communication and the schedule's own Python count as bubble).
The formula column is engine/planning/cost.py's bubble_fraction, what the plan shows.
Not a test: timings depend on the machine's load.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.runtime.plan import SCHEDULES  # noqa: E402  (the standard library only)

WIDTH, ROWS = 16, 4  # rows per micro-batch: the tensors are tiny, the sleeps are the work


def _worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage

    from engine.runtime.distributed.pipeline import make_schedule
    from engine.runtime.plan import MULTI_STAGE, rank_stages

    seconds = args.ms / 1000
    busy = [0.0]  # this rank's seconds in the layers' costs (sleeps overshoot: measured, not assumed)

    def cost() -> None:
        t = time.perf_counter()
        time.sleep(seconds)
        busy[0] += time.perf_counter() - t

    class Sleep(torch.autograd.Function):
        """Identity that costs `seconds` in forward (when fwd) and in backward."""

        @staticmethod
        def forward(ctx, x, fwd: bool):
            if fwd:
                cost()
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            cost()
            return g, None

    class Layer(nn.Module):
        """F: a sleep in forward; I: the same on the input's gradient path; W: on the
        weight's only (a zero-bubble schedule runs it in its weight pass)."""

        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.eye(WIDTH) + 0.01 * torch.randn(WIDTH, WIDTH))

        def forward(self, x):
            return torch.tanh(Sleep.apply(x, True) @ Sleep.apply(self.w, False))

    dist.init_process_group("gloo")
    rank, pp = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    out = {}
    for name in args.schedules:
        v = 2 if name in MULTI_STAGE else 1
        n_stages, per_stage = v * pp, 4 // v
        mine = rank_stages(name, pp, n_stages, rank)
        mods = {s: nn.Sequential(*[Layer() for _ in range(per_stage)]) for s in mine}
        stages = [PipelineStage(mods[s], s, n_stages, torch.device("cpu")) for s in mine]
        sched = make_schedule(name, stages, n_stages, pp, args.microbatches, lambda o, y: ((o - y) ** 2).mean())
        x = torch.randn(args.microbatches * ROWS, WIDTH)
        y = torch.zeros_like(x)
        holds_first, holds_last = 0 in mine, n_stages - 1 in mine
        rows = []
        for step in range(args.steps + 1):  # the first step sets the stages up: not timed
            dist.barrier()
            busy[0] = 0.0
            t0 = time.perf_counter()
            sched.step(*((x,) if holds_first else ()), target=y if holds_last else None, losses=[])
            wall = torch.tensor(time.perf_counter() - t0)
            dist.all_reduce(wall, op=dist.ReduceOp.MAX)  # the step ends when the last rank is done
            work = torch.tensor(busy[0])
            dist.all_reduce(work)
            if step:
                rows.append((float(wall), float(work) / pp))
        wall = statistics.median(w for w, _ in rows)
        out[name] = {"step_s": wall, "busy_s": statistics.median(b for _, b in rows)}
    if rank == 0:
        Path(args.out).write_text(json.dumps(out))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--ms", type=float, default=2.0, help="each layer's forward, input- and weight-gradient cost")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per schedule (median)")
    ap.add_argument("--schedules", nargs="+", default=list(SCHEDULES))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return _worker(args)
    from engine.planning.cost import bubble_fraction
    from engine.runtime.plan import MULTI_STAGE

    m = args.microbatches
    print(f"pipeline bubble: {m} micro-batches, 4*pp layers of {args.ms:g} ms each for forward, input and "
          f"weight gradient (torchrun, gloo, CPU)")
    print(f"{'schedule':<16} {'pp':>3} {'stages':>6} {'step ms':>8} {'busy ms':>8} {'bubble':>7} {'formula':>8}")
    for pp in args.pp:
        with tempfile.TemporaryDirectory() as tmp:
            res = Path(tmp) / "out.json"
            env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
            r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                str(pp), __file__, "--worker", "--out", str(res), "--microbatches", str(m),
                                "--ms", str(args.ms), "--steps", str(args.steps), "--schedules", *args.schedules],
                               capture_output=True, text=True, env=env, cwd=ROOT)
            if r.returncode:
                print(f"pp={pp}: torchrun failed ({r.returncode})\n{r.stderr[-3000:]}")
                continue
            times = json.loads(res.read_text())
        for name in args.schedules:
            v = 2 if name in MULTI_STAGE else 1
            step_ms, busy = times[name]["step_s"] * 1e3, times[name]["busy_s"] * 1e3
            formula = bubble_fraction(pp, m, v, name)
            print(f"{name:<16} {pp:>3} {v * pp:>6} {step_ms:>8.1f} {busy:>8.1f} {1 - busy / step_ms:>7.1%} "
                  f"{formula:>8.1%}")


if __name__ == "__main__":
    main()
