"""training.compile on CPU: steps/s of eager, whole and blocks (issue 47, item 1).

The real runtime: a prepared run folder trained by engine/runtime/train.py with
training.compile off, whole and blocks, interleaved (drift hits every mode alike), best of
N. Steps/s are read from the run's own metrics (the first records' warm-up left out);
the compile's seconds from its {"event": "compiled"} record (the first compile of the
process is the coldest: inductor's imports and the C compiler; later ones hit inductor's
graph cache on disk).

    python bench/compile_speed.py [--steps 200] [--repeats 3] [--threads 1] [--gpt-blocks 4]

Measured on this 2-core machine (1 thread, best of 2, 60 steps, load average about 1;
torch 2.13 CPU, inductor with gcc), steps/s compiled / eager:

    MLP 256-512x3-10, batch 128         whole 0.97   blocks 0.78
    ResNet example                      whole 0.86   blocks 0.60
    GPT 12 blocks 128-wide, T 64, b 16  whole 1.06   blocks 1.03

A compiled call costs about 150 us more than the eager one here (dynamo's guards,
AOTAutograd's autograd.Function, inductor's wrapper), per block, forward and backward:
small models on a CPU pay it in every block; blocks of milliseconds (a GPU's) do not
notice it. First compile of the 12-block GPT with inductor's cache empty: blocks 31 s,
whole 43 s (14 regions: the first, 14 s, includes inductor's start; identical blocks hit the
cache the first one filled).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "models"))  # the GPT of the tests (nanoGPT's architecture)

import torch  # noqa: E402

from engine.project import Project, load_project  # noqa: E402
from engine.runs.build import prepare_run  # noqa: E402
from engine.runtime.train import run  # noqa: E402
from engine.runs.tail import read_metrics  # noqa: E402

MODES = ("off", "whole", "blocks")


def mlp(steps: int) -> Project:
    from train_overhead import mlp_project

    return mlp_project(512, steps)


def gpt(tmp: Path, blocks: int):
    from engine.interop import save_imported
    from engine.interop.module.importer import from_module
    from real_models import GPT

    torch.manual_seed(0)
    imp = from_module(GPT(vocab_size=2048, block_size=64, n_layer=blocks, n_head=4, n_embd=128).eval(), [[64]],
                      ["int64"])
    path = save_imported(imp, tmp / f"gpt{blocks}.lflow")

    def make(steps: int) -> Project:
        p = load_project(path)
        p.training.batch_size = 16
        p.training.optimizer.name = "adamw"
        return p

    return make


def example(name: str):
    def make(steps: int) -> Project:
        return load_project(ROOT / "resources" / "examples" / f"{name}.lflow")

    return make


def measure(project: Project, tmp: Path, mode: str, steps: int) -> tuple[float, float | None]:
    """(steps/s of the loop, seconds of the first compile or None)."""
    tr = project.training
    tr.steps, tr.epochs, tr.compile = steps, None, mode
    tr.eval_interval = tr.checkpoint_interval = 10 ** 6
    tr.log_interval = None
    rd = prepare_run(project, tmp / f"run{time.perf_counter_ns()}")
    run(rd)
    recs = read_metrics(rd / "metrics.jsonl")
    compiled = next((r["seconds"] for r in recs if r.get("event") == "compiled"), None)
    recs = [r for r in recs if "loss" in r and r["step"] > 3]
    return (recs[-1]["step"] - recs[0]["step"]) / (recs[-1]["time"] - recs[0]["time"]), compiled


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gpt-blocks", type=int, default=4)
    ap.add_argument("--models", default="mlp,gpt,resnet")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        models = {"mlp": ("MLP 256-512x3-10, batch 128", mlp),
                  "gpt": (f"GPT {args.gpt_blocks} blocks 128-wide, T 64, batch 16", gpt(tmp, args.gpt_blocks)),
                  "resnet": ("ResNet example (resnet_synthetic)", example("resnet_synthetic")),
                  "transformer": ("transformer example", example("transformer_synthetic"))}
        for key in args.models.split(","):
            name, make = models[key]
            rate = {m: [] for m in MODES}
            comp = {m: [] for m in MODES}
            for _ in range(args.repeats):
                for m in MODES:
                    r, c = measure(make(args.steps), tmp, m, args.steps)
                    rate[m].append(r)
                    if c is not None:
                        comp[m].append(c)
            best = {m: max(v) for m, v in rate.items()}  # best of N: other load only slows a run down
            rows.append((name, best, comp))
            print(f"{name}: " + ", ".join(f"{m} {best[m]:.1f} steps/s" for m in MODES), flush=True)
    print(f"\n{'model':42} {'eager st/s':>10} {'whole st/s':>10} {'ratio':>6} {'blocks st/s':>11} {'ratio':>6} "
          f"{'compile s whole':>16} {'compile s blocks':>17}")
    for name, best, comp in rows:
        cw = "/".join(f"{c:.1f}" for c in comp["whole"])
        cb = "/".join(f"{c:.1f}" for c in comp["blocks"])
        print(f"{name:42} {best['off']:10.1f} {best['whole']:10.1f} {best['whole'] / best['off']:6.3f} "
              f"{best['blocks']:11.1f} {best['blocks'] / best['off']:6.3f} {cw:>16} {cb:>17}")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores, {args.threads} thread(s); best of "
          f"{args.repeats}, {args.steps} steps each; compile s: each repeat's first compile, in order")


if __name__ == "__main__":
    main()
