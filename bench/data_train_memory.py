"""Memory of a real data-parallel training run as its data set grows, and what the run folder
costs: the same small language model trained by Layerflow (layerflow API, torchrun, dp=2 on
this machine's CPU, gloo) on a generated 1 GB and 10 GB token file read in place.

Reported per size: peak resident memory of each rank (the runtime's peak_mem_per_rank.json:
ru_maxrss, which counts the pages of the token file each rank touched), the run folder's
size without its checkpoints (nothing of the data set is copied into it), time to the first
logged step and the run's wall time. Goal (issue 41): each rank's memory within 10% between
1 GB and 10 GB; the run folder the same size at both.

Before issue 41 a token set could only be an in-memory array: 10 GB on each of the two
ranks, and a copy in every run folder.

    python bench/data_train_memory.py [--sizes 1 10] [--steps 60]

The token files are written into a temporary folder ($BENCH_TMP or the system's) and
deleted afterwards (11 GB of disk for a while).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import layerflow as lf  # noqa: E402

VOCAB = 4096


def make_tokens(folder: Path, n_bytes: int, chunk: int = 256 << 20) -> None:
    """train.bin of n_bytes random uint16 tokens (written a chunk at a time), a small val.bin
    and meta.json."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    with open(folder / "train.bin", "wb") as f:
        left = n_bytes // 2
        while left:
            k = min(left, chunk // 2)
            rng.integers(0, VOCAB, k, dtype=np.uint16).tofile(f)
            left -= k
    rng.integers(0, VOCAB, 1 << 16, dtype=np.uint16).tofile(folder / "val.bin")
    (folder / "meta.json").write_text(json.dumps({"vocab_size": VOCAB, "dtype": "uint16"}))


def project(data: Path, steps: int) -> lf.Project:
    p = lf.Project.new("lm", dataset={"kind": "token_file", "path": str(data), "seq_len": 128},
                       steps=steps, batch_size=16, log_interval=5, eval_interval=10 ** 6,
                       checkpoint_interval=10 ** 6, optimizer={"name": "adamw", "lr": 3e-3})
    x = p.add("Input", id="tokens", shape=[128], dtype="int64")
    h = p.add("Embedding", x, id="embed", num_embeddings=VOCAB, embedding_dim=64)
    h = p.add("GELU", p.add("Linear", h, id="hidden", out_features=128))
    p.add("Output", p.add("Linear", h, id="lm_head", out_features=VOCAB), loss="cross_entropy")
    return p


def folder_bytes(run_dir: Path) -> int:
    return sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file() and "checkpoints" not in f.parts)


def measure(tmp: Path, gb: float, steps: int) -> dict:
    data = tmp / f"tokens-{gb:g}gb"
    t = time.perf_counter()
    make_tokens(data, int(gb * (1 << 30)))
    written = time.perf_counter() - t
    p = project(data, steps)
    t0 = time.perf_counter()
    run = p.train(nproc=2, out=tmp / f"run-{gb:g}gb")
    first = None
    for rec in run.metrics(follow=True, poll_s=0.05, timeout=1800):
        if first is None and "loss" in rec:
            first = time.perf_counter() - t0
    status = run.wait(timeout=1800)
    wall = time.perf_counter() - t0
    if status.state != "succeeded":
        raise SystemExit(f"{gb} GB: the run ended {status.state}: {status.error}\n{run.logs()[-2000:]}")
    peaks = json.loads((run.dir / "peak_mem_per_rank.json").read_text())
    spec = json.loads((run.dir / "run.json").read_text())
    return {"gb": gb, "written_s": written, "peaks": peaks, "run_bytes": folder_bytes(run.dir),
            "first_s": first, "wall_s": wall, "steps": steps, "source": spec["data"]["source"]["kind"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 10], help="token file sizes in GB")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        for gb in args.sizes:
            rows.append(measure(Path(tmp), gb, args.steps))
            r = rows[-1]
            print(f"  {gb:g} GB: written in {r['written_s']:.0f} s, trained {r['steps']} steps in {r['wall_s']:.1f} s",
                  file=sys.stderr)
    print("\n| token file | peak RSS rank 0 (MiB) | peak RSS rank 1 (MiB) | run folder (no checkpoints) "
          "| first step (s) | run wall (s) |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['gb']:g} GB | {r['peaks'][0]:.0f} | {r['peaks'][1]:.0f} | {r['run_bytes'] / 1e3:.1f} kB "
              f"| {r['first_s']:.1f} | {r['wall_s']:.1f} |")
    if len(rows) >= 2:
        lo, hi = rows[0], rows[-1]
        ratio = max(hi["peaks"]) / max(lo["peaks"])
        print(f"\nlargest rank's peak RSS, {hi['gb']:g} GB / {lo['gb']:g} GB: {ratio:.2f} (goal: at most 1.10)")


if __name__ == "__main__":
    main()
