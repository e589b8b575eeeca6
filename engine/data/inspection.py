"""What a data set holds, for the data panel and `data inspect`: samples per split, shapes
and dtypes, the task and its classes (with a histogram), a few examples (images both as
the model sees them in validation and augmented, token windows decoded as text), and the
loader's measured samples/s.

Quick at any size: nothing here scans a token file (its counts come from its size), and a
histogram reads at most HIST_ROWS labels (marked `sampled` when the set has more).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from engine.runtime.datasets import (
    CorruptSample,
    DataError,
    Source,
    StepLoader,
    open_source,
    sample_seed,
)
from engine.runtime.datasets.arrays import ArrayFile
from engine.runtime.datasets.base import check_found
from engine.runtime.datasets.images import IMAGE_EXTS, ImageFolder
from engine.runtime.datasets.shards import Shards
from engine.runtime.datasets.tables import Parquet
from engine.runtime.datasets.tokens import TokenFile

HIST_ROWS = 200_000


def inspect_source(source: dict, base_dir: Path | None = None, *, examples: int = 4, seconds: float = 1.5,
                   batch_size: int = 32, workers: int = 0, strict: bool = False) -> dict:
    """A report of one data set (training.dataset's JSON); DataError in one line if it
    cannot be read. Example tensors are numpy arrays; the rest is plain JSON. A corrupt
    sample met on the way is listed under "unreadable" (one line each, naming the file and
    sample) and passed over, as training does; strict=True raises it instead."""
    train = open_source(source, "train", base_dir)
    try:
        val = open_source(source, "val", base_dir)
        n_val = len(val)
    except DataError as e:  # a training set alone can still be looked at
        val, n_val = None, f"unreadable: {e}"
    info = {"kind": source.get("kind"), "path": str(train.path), "task": train.task,
            "samples": {"train": len(train), "val": n_val}, "spec": train.sample_spec(),
            "n_classes": train.n_classes}
    if isinstance(train, TokenFile):
        info.update(vocab_size=train.vocab_size, seq_len=train.seq_len, dtype=train.dtype.name,
                    tokens={"train": train.count, "val": val.count if val is not None else None},
                    text=decode_text(train, train.window(0)))
    else:
        names = class_names(train)
        if names:
            info["classes"] = names
        if train.task in ("classification", "multi_label"):
            info["histogram"] = histogram(train)
    bad: list[str] = []
    info["examples"] = example_samples(train, examples, strict=strict, unreadable=bad)
    info["throughput"] = throughput(train, batch_size, seconds, workers, strict=strict)
    bad += [m for m in info["throughput"].pop("skipped_files") if not any(b.startswith(m) for b in bad)]
    info["unreadable"] = bad
    return info


def class_names(src: Source) -> list[str] | None:
    if isinstance(src, ImageFolder):
        return list(src.classes)
    meta = src.path / "classes.json" if src.path.is_dir() else src.path.parent / "classes.json"
    if isinstance(src, (Shards, ArrayFile)) and meta.is_file():  # written by datapack
        d = json.loads(meta.read_text())
        return list(d["classes"] if isinstance(d, dict) else d)
    return None


def histogram(src: Source) -> dict:
    """{"counts": per class, "rows": labels read, "sampled": whether that is not all}."""
    n = len(src)
    if isinstance(src, (ImageFolder, Shards)):  # the labels are in memory already
        labels = src.labels if isinstance(src, ImageFolder) else src.labels[[src.rows.row(i) for i in range(n)]]
    else:  # read the first HIST_ROWS targets
        k = min(n, HIST_ROWS)
        labels = np.asarray([_label(src, i) for i in range(k)])
    if labels.ndim == 1:
        labels = labels.astype(np.int64)
        counts = np.bincount(labels[labels >= 0], minlength=src.n_classes or 0)
    else:  # multi-hot rows: how often each class is on
        counts = labels.sum(0)
    return {"counts": [int(c) for c in counts], "rows": len(labels), "sampled": bool(len(labels) < n)}


def _label(src: Source, i: int):
    if isinstance(src, ArrayFile):  # the target alone: no need to read x
        return src.y.read(src.rows.row(i), src._fd(src.y.file))
    return src.sample(i, None)[1].numpy()


def decode_text(src: TokenFile, window: np.ndarray) -> str | None:
    """A window as text: byte-level tokens directly, others through a tokenizer.json
    beside the files when the tokenizers package is there."""
    meta = src.path.parent / "meta.json"
    kind = json.loads(meta.read_text()).get("tokenizer") if meta.is_file() else None
    if kind == "byte" or (kind is None and src.vocab_size == 256):
        return bytes(np.asarray(window, dtype=np.uint8)).decode("utf-8", errors="replace")
    tj = src.path.parent / "tokenizer.json"
    if tj.is_file():
        try:
            from tokenizers import Tokenizer
        except ImportError:
            return None
        return Tokenizer.from_file(str(tj)).decode([int(t) for t in window])
    return None


def preview(x: torch.Tensor, src: Source) -> np.ndarray | None:
    """A normalised (C, H, W) image back as uint8 (H, W, C) for display."""
    t = getattr(src, "transform", None)
    if t is None or x.ndim != 3:
        return None
    a = (x.numpy().transpose(1, 2, 0) - t.add) / t.mul
    return np.clip(a + 0.5, 0, 255).astype(np.uint8)


def example_samples(src: Source, k: int, *, strict: bool = True, unreadable: list | None = None) -> list[dict]:
    """k samples spread over the split; a corrupt one (not strict) is noted in `unreadable`
    and left out."""
    out = []
    for i in np.unique(np.linspace(0, len(src) - 1, num=min(k, len(src))).astype(int)):
        try:
            x, y = src.sample(int(i), None)
        except CorruptSample as e:
            if strict:
                raise CorruptSample(f"{e} (sample {int(i)}; strict mode)") from None
            if unreadable is not None:
                unreadable.append(f"{e} (sample {int(i)})")
            continue
        ex = {"index": int(i), "where": src.where(int(i)), "y": y.numpy()}
        if isinstance(x, dict):
            ex["x"] = {c: v.numpy() for c, v in x.items()}
        else:
            ex["x"] = x.numpy()
        if isinstance(src, (ImageFolder, Shards)):
            xa, _ = src.sample(int(i), sample_seed(0, 0, int(i)))
            ex.update(x_augmented=xa.numpy(), image=preview(x, src), image_augmented=preview(xa, src))
        if isinstance(src, TokenFile):
            ex["text"] = decode_text(src, src.window(int(i)))
        out.append(ex)
    return out


def throughput(src: Source, batch_size: int, seconds: float, workers: int, strict: bool = False) -> dict:
    """Samples/s of the step loader over about `seconds` (its first batch timed apart)."""
    bs = max(1, min(batch_size, len(src)))
    loader = StepLoader(src, bs, 0, workers=workers, strict=strict)
    try:
        t0 = time.perf_counter()
        try:
            loader.batch(0)
        except RuntimeError as e:  # default_collate: samples of different shapes (lists of any length)
            if "stack expects each tensor to be equal size" not in str(e):
                raise
            hint = "; set seq_len (list columns are padded or truncated to it)" if isinstance(src, Parquet) else ""
            raise DataError(f"{src.path}: samples differ in shape and cannot be batched ({str(e).splitlines()[0]})"
                            f"{hint}") from None
        first = time.perf_counter() - t0
        steps, t1 = 0, time.perf_counter()
        while time.perf_counter() - t1 < seconds:
            steps += 1
            loader.batch(steps)
        dt = time.perf_counter() - t1
    finally:
        loader.close()
    return {"samples_per_s": round(steps * bs / max(dt, 1e-9), 1), "first_batch_s": round(first, 4),
            "batch_size": bs, "workers": workers, "skipped": loader.skipped,
            "skipped_files": list(loader.skipped_files)}


def inspect_text(info: dict) -> str:
    """The report as lines for the command line."""
    lines = [f"{info['kind']}: {info['path']}", f"  task {info['task']}, samples {info['samples']}"]
    spec = info["spec"]
    lines.append(f"  x {json.dumps(spec['x'])}  y {json.dumps(spec['y'])}")
    if "vocab_size" in info:
        lines.append(f"  vocabulary {info['vocab_size']} ({info['dtype']}), tokens {info['tokens']}, "
                     f"seq_len {info['seq_len']}")
        if info.get("text") is not None:
            lines.append(f"  first window: {info['text'][:200]!r}")
    elif info.get("n_classes"):
        names = info.get("classes") or [str(c) for c in range(info["n_classes"])]
        h = info.get("histogram")
        if h:
            pairs = ", ".join(f"{n} {c}" for n, c in zip(names, h["counts"]))
            lines.append(f"  {info['n_classes']} classes: {pairs}" + (" (first rows)" if h["sampled"] else ""))
    tp = info["throughput"]
    lines.append(f"  loader: {tp['samples_per_s']} samples/s ({tp['workers']} workers, batch {tp['batch_size']}), "
                 f"first batch {tp['first_batch_s']} s")
    return "\n".join(lines)



# ---- what a path holds, from its names (the data panel and `data inspect` without a kind) ----
_BY_EXT = {".bin": "token_file", ".tar": "shards", ".parquet": "parquet", ".arrow": "parquet", ".npz": "array",
           ".npy": "array"}


def _suffixes(folder: Path, most: int = 500) -> set[str]:
    """The file name endings among a folder's first `most` entries (a huge folder is not listed whole)."""
    out = set()
    with os.scandir(folder) as it:
        for k, e in enumerate(it):
            if k >= most:
                break
            if e.is_file() and not e.name.startswith("."):
                out.add(os.path.splitext(e.name)[1].lower())
    return out


def _subfolders(folder: Path, most: int = 500) -> list[Path]:
    with os.scandir(folder) as it:
        return [Path(e.path) for k, e in zip(range(most), it) if e.is_dir() and not e.name.startswith(".")]


def guess_kind(path: str | os.PathLike) -> str:
    """The kind (training.dataset.kind) of the data set at `path`, from file names alone:
    .bin token files, .tar shards (or a pattern like s-{000..009}.tar), .parquet/.arrow
    files, .npz or a folder of .npy, a folder of class folders of images. DataError in one
    line when it is none of them (text, .csv: pack them first)."""
    p = Path(os.path.expanduser(str(path)))
    if "{" in p.name and p.name.endswith(".tar"):
        return "shards"
    check_found(p)
    if p.is_file():
        kind = _BY_EXT.get(p.suffix.lower())
        if kind:
            return kind
        hint = ("pack it first: `data pack` makes .npy files of a .csv" if p.suffix.lower() == ".csv" else
                "pack it first: `data pack` makes token files of text" if p.suffix.lower() in (".txt", ".md", "")
                else "say which with --kind")
        raise DataError(f"{p}: not a data set read in place (.bin tokens, .tar shards, .parquet or .arrow, .npz); "
                        f"{hint}")
    if not p.is_dir():
        raise DataError(f"{p}: not a regular file or a folder")
    tops = [p] + [s for s in (p / "train", p / "val") if s.is_dir()]
    for top in tops:
        exts = _suffixes(top)
        for ext in (".bin", ".tar", ".parquet", ".arrow", ".npy"):
            if ext in exts:
                return _BY_EXT[ext]
    for top in tops:  # class folders of images; or a datasets save_to_disk layout (<split>/*.arrow)
        for sub in _subfolders(top):
            exts = _suffixes(sub)
            if exts & {".parquet", ".arrow"}:
                return "parquet"
            if exts & set(IMAGE_EXTS) or any(_suffixes(s) & set(IMAGE_EXTS) for s in _subfolders(sub, 20)):
                return "image_folder"
    raise DataError(f"{p}: no data set found here (class folders of .jpg/.png/.webp images, .bin token files, "
                    f".tar shards, .parquet/.arrow files or .npy arrays); say which with --kind, or pack it "
                    f"first with `data pack`")


def guess_columns(source: dict, base_dir: Path | None = None) -> dict:
    """Input and target columns of a Parquet/Arrow set that names none, from its schema:
    input_ids (and attention_mask) with label/labels as the target; else every numeric
    column but label/labels/target (tabular). {} when nothing fits."""
    from engine.runtime.datasets.base import resolve
    from engine.runtime.datasets.tables import Part, table_files

    root = resolve(source["path"], base_dir)
    files, _ = table_files(root, "train")
    if not files:
        return {}
    schema = Part(files[0], []).schema
    names = list(schema.names) if schema is not None else []
    target = next((n for n in ("label", "labels", "target", "y") if n in names), None)
    if "input_ids" in names:
        inputs = ["input_ids"] + (["attention_mask"] if "attention_mask" in names else [])
        return {"inputs": inputs, "target": target} if target else {"inputs": inputs, "task": "language_model"}
    if target is None:
        return {}
    import pyarrow as pa

    numeric = [f.name for f in schema if f.name != target and (pa.types.is_integer(f.type)
                                                              or pa.types.is_floating(f.type))]
    return {"inputs": numeric, "target": target} if numeric else {}
