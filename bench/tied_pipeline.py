"""A tied language model across pipeline stages (issue 43): for nanoGPT-style GPTs of 12 and
24 blocks whose token embedding and output head share one weight, the planner's predicted
step time and per-stage state memory at pp=2 and pp=4 against what Layerflow's runtime
measures on this machine (torchrun, gloo on the CPU), and the share of a step the tied
weight's gradient all-reduce takes (from the ranks' logs, engine/runtime/distributed/tied.py).

    python bench/tied_pipeline.py [--blocks 12 24] [--pp 2 4] [--steps 30]

Measured step time is the median of the logged steps after the first few (the CPU's
processes share 2 cores here: at pp=4 four ranks compete for them). Peak RSS is each
rank's resident memory, the interpreter and torch (about 300 MB) included; the planner
predicts what a rank holds for the model (parameters, gradients, optimizer state and
activations), so the two columns differ by that floor. The tied all-reduce's time is the
smallest of the ranks holding a copy: the stage that finishes its backward last (the
first) waits for no one in it, while the others' time includes waiting for that stage.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "models"))  # the GPT of the tests (nanoGPT's architecture)

import torch  # noqa: E402
from real_models import GPT  # noqa: E402

import layerflow as lf  # noqa: E402
from engine.interop import save_imported  # noqa: E402
from engine.interop.module.importer import from_module  # noqa: E402

MIB = 2 ** 20


def project(tmp: Path, blocks: int, steps: int) -> Path:
    torch.manual_seed(0)
    imp = from_module(GPT(vocab_size=2048, block_size=64, n_layer=blocks, n_head=4, n_embd=128).eval(), [[64]],
                      ["int64"])
    path = save_imported(imp, tmp / f"gpt{blocks}.lflow")
    p = lf.Project.load(path)
    p.training.batch_size = 16
    p.training.steps = steps
    p.training.log_interval = 1
    p.training.eval_interval = 10 ** 6
    p.training.checkpoint_interval = 10 ** 6
    p.training.optimizer.name = "adamw"
    p.save(path)
    return path


def measure(path: Path, pp: int, out: Path) -> dict:
    p = lf.Project.load(path)
    m = 2 * pp
    plan = p.plan(pp, pp=pp, microbatches=m)
    if not plan.ok:
        raise SystemExit(f"pp={pp}: {plan.errors}")
    tied = [c for c in plan.communication if "tied" in c.where]
    run = p.train(pp, pp=pp, microbatches=m, out=out)
    status = run.wait(timeout=3600)
    if status.state != "succeeded":
        raise SystemExit(f"pp={pp}: {status.state}: {status.error}")
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps_s = [16 / r["samples_per_s"] for r in recs if "samples_per_s" in r][3:]
    tied_s = []
    for log in sorted((out / "logs").glob("rank*.log")):
        hit = re.search(r"tied weights: (\d+) gradient all-reduces, ([0-9.]+) s", log.read_text())
        if hit:
            tied_s.append(float(hit.group(2)) / max(1, int(hit.group(1))))
    per_stage = {}
    for d in plan.devices:
        per_stage.setdefault(d.stage, d.memory)
    return {"pp": pp, "predicted_s": plan.predicted.step_s, "measured_s": statistics.median(steps_s),
            "predicted_mib": [per_stage[s].total_bytes / MIB for s in sorted(per_stage)],
            "state_mib": [per_stage[s].state_bytes / MIB for s in sorted(per_stage)],
            "rss_mib": json.loads((out / "peak_mem_per_rank.json").read_text()),
            "tied_s": min(tied_s) if tied_s else 0.0, "tied_bytes": tied[0].bytes_per_step if tied else 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, nargs="+", default=[12, 24])
    ap.add_argument("--pp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for blocks in args.blocks:
            path = project(Path(tmp), blocks, args.steps)
            for pp in args.pp:
                t = time.perf_counter()
                r = measure(path, pp, Path(tmp) / f"run-{blocks}-{pp}")
                rows.append({"blocks": blocks, **r})
                print(f"  {blocks} blocks, pp={pp}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    print("\n| GPT | pp | step predicted | step measured | state per stage, predicted (MiB) | all predicted "
          "(MiB) | peak RSS per rank (MiB) | tied all-reduce | its share |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        fmt = lambda xs: " / ".join(f"{x:.1f}" for x in xs)  # noqa: E731
        share = r["tied_s"] / r["measured_s"] if r["measured_s"] else 0.0
        print(f"| {r['blocks']} blocks | {r['pp']} | {r['predicted_s'] * 1e3:.1f} ms | {r['measured_s'] * 1e3:.1f} ms "
              f"| {fmt(r['state_mib'])} | {fmt(r['predicted_mib'])} | {fmt(r['rss_mib'])} "
              f"| {r['tied_s'] * 1e3:.2f} ms ({r['tied_bytes'] / 1e3:.0f} kB) | {share:.1%} |")


if __name__ == "__main__":
    main()
