"""Layerflow's data loader against a hand-written PyTorch DataLoader, and its memory at
two data sizes.

1. Samples/s (per wall second, and per CPU second of the process and its workers, which
   a shared machine's load disturbs less) of engine/runtime/datasets' StepLoader and of
   a plain torch DataLoader doing the same work on the same files with the same number
   of workers: an image
   folder of generated JPEGs at 64 px and at 224 px (decode, random resized crop, flip,
   normalise), and token windows from a token file (nanoGPT's np.memmap get_batch, as a
   Dataset). Goal: ratio >= 0.95.
2. Resident memory (RSS) of a process reading batches of token windows from a generated
   1 GB and a 10 GB token file, and its time to the first batch. Goal: within 10% of each
   other; first batch < 2 s. The files are written in chunks into a temporary folder that
   is deleted afterwards (11 GB of disk for a while).

    python bench/data_throughput.py [--quick] [--no-memory] [--workers 0 2]
"""
from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader, Dataset, RandomSampler  # noqa: E402

from engine.runtime.datasets import StepLoader, open_source  # noqa: E402

MEAN_T = torch.tensor((0.485, 0.456, 0.406)).view(3, 1, 1)
STD_T = torch.tensor((0.229, 0.224, 0.225)).view(3, 1, 1)


# ---- generated data ------------------------------------------------------------------
def make_jpegs(root: Path, n: int, size: int, classes: int = 10) -> None:
    rng = np.random.default_rng(0)
    for k in range(n):
        d = root / f"c{k % classes}"
        d.mkdir(parents=True, exist_ok=True)
        # smooth noise compresses like a photo more than white noise does
        small = rng.integers(0, 255, (size // 8 + 1, size // 8 + 1, 3), dtype=np.uint8)
        Image.fromarray(small).resize((size, size), Image.BILINEAR).save(d / f"{k:06d}.jpg", quality=90)


def make_tokens(path: Path, n_bytes: int, chunk: int = 256 << 20) -> None:
    """Random uint16 tokens written a chunk at a time (memory stays at one chunk)."""
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        left = n_bytes // 2
        while left:
            k = min(left, chunk // 2)
            rng.integers(0, 50257, k, dtype=np.uint16).tofile(f)
            left -= k


# ---- the hand-written side -----------------------------------------------------------
class PlainImages(Dataset):
    """What one writes with PIL and torch alone: ImageFolder's file list, RandomResizedCrop's
    box, a flip, normalisation."""

    def __init__(self, root: Path, size: int):
        classes = sorted(p.name for p in root.iterdir())
        self.items = [(p, c) for c, name in enumerate(classes) for p in sorted((root / name).glob("*.jpg"))]
        self.size = size

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label = self.items[i]
        with Image.open(path) as im:
            im = im.convert("RGB")
        W, H = im.size
        box = (0, 0, W, H)
        for _ in range(10):
            area = W * H * random.uniform(0.08, 1.0)
            ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
            w, h = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
            if 0 < w <= W and 0 < h <= H:
                top, left = random.randint(0, H - h), random.randint(0, W - w)
                box = (left, top, left + w, top + h)
                break
        im = im.resize((self.size, self.size), Image.BILINEAR, box=box)
        if random.random() < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        # torchvision's ToTensor and Normalize, in torch
        x = torch.from_numpy(np.array(im, dtype=np.uint8)).permute(2, 0, 1).contiguous()
        x = x.float().div_(255).sub_(MEAN_T).div_(STD_T)
        return x, label


class PlainTokens(Dataset):
    """nanoGPT's get_batch as a Dataset: windows of an np.memmap."""

    def __init__(self, path: Path, seq_len: int):
        self.path, self.T = path, seq_len
        self.n = (path.stat().st_size // 2 - 1) // seq_len

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        m = np.memmap(self.path, dtype=np.uint16, mode="r")
        w = torch.from_numpy(m[i * self.T:i * self.T + self.T + 1].astype(np.int64))
        return w[:-1], w[1:]


# ---- timing --------------------------------------------------------------------------
def cpu_seconds() -> float:
    """CPU time of this process and its live children (the DataLoader workers)."""
    procs = [psutil.Process()]
    procs += procs[0].children(recursive=True)
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def timed(next_batch, steps: int, batch: int) -> tuple[float, float]:
    """(samples per wall second, samples per CPU second) over `steps` batches. The second
    is what the work costs, which a busy machine changes much less than the first."""
    c, t = cpu_seconds(), time.perf_counter()
    for _ in range(steps):
        next_batch()
    dt, dc = time.perf_counter() - t, cpu_seconds() - c
    return steps * batch / dt, steps * batch / max(dc, 1e-9)


def rate_plain(ds: Dataset, batch: int, workers: int, steps: int) -> tuple[float, float]:
    dl = DataLoader(ds, batch_size=batch, sampler=RandomSampler(ds, num_samples=(steps + 2) * batch),
                    num_workers=workers, drop_last=True,
                    prefetch_factor=2 if workers else None, persistent_workers=workers > 0)
    it = iter(dl)
    next(it), next(it)  # workers started, queues full
    return timed(lambda: next(it), steps, batch)  # the workers stop when `it` goes


def rate_layerflow(settings: dict, batch: int, workers: int, steps: int) -> tuple[float, float]:
    loader = StepLoader(open_source(settings, "train", None), batch, 0, workers=workers, prefetch=2)
    loader.batch(0), loader.batch(1)
    step = iter(range(2, steps + 2))
    out = timed(lambda: loader.batch(next(step)), steps, batch)
    loader.close()
    return out


def compare(name: str, plain: Dataset, settings: dict, batch: int, workers: int, steps: int, repeats: int):
    a, b = [], []
    for r in range(repeats):  # alternated, and in turn first, so drift in the machine's load hits both
        runs = [lambda: b.append(rate_plain(plain, batch, workers, steps)),
                lambda: a.append(rate_layerflow(settings, batch, workers, steps))]
        for run in runs if r % 2 == 0 else runs[::-1]:
            run()
    lf, pt = statistics.median(x[0] for x in a), statistics.median(x[0] for x in b)
    lfc, ptc = statistics.median(x[1] for x in a), statistics.median(x[1] for x in b)
    print(f"| {name:<26} | {workers:>7} | {lf:>12,.0f} | {pt:>12,.0f} | {lf / pt:>5.2f} "
          f"| {lfc:>9,.0f} | {ptc:>9,.0f} | {lfc / ptc:>5.2f} |", flush=True)


# ---- memory --------------------------------------------------------------------------
READER = r"""
import sys, time, psutil, numpy as np
sys.path.insert(0, {root!r})
from engine.runtime.datasets import StepLoader, open_source
t0 = time.perf_counter()  # after importing torch: what the data costs
src = open_source({{"kind": "token_file", "path": {path!r}, "seq_len": 1024, "vocab_size": 50257}}, "train", None)
loader = StepLoader(src, 16, 0, workers=0)
loader.batch(0)
first = time.perf_counter() - t0
for s in range(1, {steps}):
    x, y = loader.batch(s)
print(first, psutil.Process().memory_info().rss)
"""


def memory(sizes_gb: list[float], steps: int) -> None:
    root = str(Path(__file__).resolve().parents[1])
    print("\n| token file | RSS after reading | open + first batch (s) |\n|---|---|---|")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        rss = {}
        for gb in sizes_gb:
            folder = Path(tmp) / f"{gb}gb"
            folder.mkdir()
            path = folder / "train.bin"
            make_tokens(path, int(gb * (1 << 30)))
            code = READER.format(root=root, path=str(folder), steps=steps)
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            first, r = out.split()
            rss[gb] = int(r)
            print(f"| {gb:g} GB | {int(r) / 2**20:,.0f} MiB | {float(first):.3f} |", flush=True)
            path.unlink()  # free the disk before the next size
        lo, hi = min(rss.values()), max(rss.values())
        print(f"\nRSS spread between sizes: {100 * (hi - lo) / lo:.1f}% ({steps} batches of 16 x 1024 tokens)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer images and steps")
    ap.add_argument("--no-memory", action="store_true", help="skip the 1 GB / 10 GB memory runs")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    q = args.quick
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start\n")
    print("| data                       | workers | Layerflow /s | DataLoader/s | ratio "
          "| LF /CPU s | DL /CPU s | ratio |")
    print("|----------------------------|---------|--------------|--------------|-------"
          "|-----------|-----------|-------|")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for size, n in ((64, 400 if q else 2000), (224, 150 if q else 600)):
            make_jpegs(tmp / f"img{size}", n, size)
            settings = {"kind": "image_folder", "path": str(tmp / f"img{size}"), "image_size": size,
                        "val_fraction": 0.01}
            batch = 32
            steps = 2 * (n // batch)  # two epochs
            for w in args.workers:
                compare(f"JPEG {size} px ({n} files)", PlainImages(tmp / f"img{size}", size), settings, batch, w,
                        steps, args.repeats)
        (tmp / "tok").mkdir()
        make_tokens(tmp / "tok" / "train.bin", 64 << 20)
        make_tokens(tmp / "tok" / "val.bin", 1 << 20)
        settings = {"kind": "token_file", "path": str(tmp / "tok"), "seq_len": 1024, "vocab_size": 50257}
        for w in args.workers:
            compare("tokens 1024 x 16 (64 MB)", PlainTokens(tmp / "tok" / "train.bin", 1024), settings, 16, w,
                    100 if q else 400, args.repeats)
    if not args.no_memory:
        memory([1, 10] if not q else [0.25, 1], 200 if q else 1000)


if __name__ == "__main__":
    main()
