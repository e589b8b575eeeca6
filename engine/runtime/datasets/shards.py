"""shards: WebDataset-style tar shards, for sets of many small files.

A shard is a plain tar whose members are <key>.<ext>, grouped by key: an image (jpg, png,
webp) or an array (.npy) for x, and .cls, .txt or .json for the label (an integer, or
{"label": n}). `path` is a folder of *.tar, one .tar, or a brace pattern such as
data/shard-{000000..000099}.tar; splits are train*/val* shards or train/ and val/
folders when present, else every round(1/val_fraction)-th sample (base.RowSplit).

Random access comes from an index built once per shard by walking its 512-byte tar
headers (seeking over the data, so a 1 GB shard costs a few thousand small reads): for
each sample the byte offset and size of its x and its label. The index (a few int64 per
sample) is kept in memory and pickled into DataLoader workers; samples are then read with
one pread each.
"""
from __future__ import annotations

import io
import json
import os
import re
import tarfile
from pathlib import Path

import numpy as np
import torch

from .base import CorruptSample, DataError, RowSplit, Source, check_split, pread, resolve
from .images import IMAGE_EXTS, ImageTransform

X_EXTS = tuple(e[1:] for e in IMAGE_EXTS) + ("npy",)
Y_EXTS = ("cls", "txt", "json")


def expand_braces(pattern: str) -> list[str]:
    """WebDataset's shard-{000..009}.tar: the zero padding of the first bound is kept."""
    m = re.search(r"\{(\d+)\.\.(\d+)\}", pattern)
    if not m:
        return [pattern]
    lo, hi = m.group(1), m.group(2)
    width = len(lo) if lo.startswith("0") else 0
    return [s for k in range(int(lo), int(hi) + 1)
            for s in expand_braces(pattern[:m.start()] + str(k).zfill(width) + pattern[m.end():])]


def shard_files(path: str, base_dir: Path | None, split: str) -> tuple[list[Path], bool]:
    """(this split's shards, whether they still need a RowSplit); a missing shard of a
    pattern is an error naming it."""
    if "{" in path:
        names = expand_braces(path)
        files = [Path(os.path.expanduser(n)) if Path(os.path.expanduser(n)).is_absolute() or base_dir is None
                 else Path(base_dir) / n for n in names]
        for f in files:
            if not f.is_file():
                raise DataError(f"{f}: missing shard ({len(files)} named by {path})")
        return files, True
    root = resolve(path, base_dir)
    if root.is_file():
        return [root], True
    if (root / "train").is_dir() and (root / "val").is_dir():
        files = sorted((root / split).glob("*.tar"))
        if not files:
            raise DataError(f"{root / split}: no .tar shards here")
        return files, False
    files = sorted(root.glob("*.tar"))
    if not files:
        raise DataError(f"{root}: no .tar shards here")
    tagged = [f for f in files if f.name.lower().startswith(split)]
    other = [f for f in files if f.name.lower().startswith("val" if split == "train" else "train")]
    if tagged and other:
        return tagged, False
    return files, True


def index_shard(file: Path, shard: int) -> tuple[list[tuple], list[int]]:
    """Rows (shard, x offset, x size, x ext, y offset, y size, y ext) and the labels read
    on the way, for every complete key of one shard."""
    try:
        tf = tarfile.open(file, mode="r:")  # plain tar: headers are read, data is seeked over
    except (tarfile.TarError, OSError) as e:
        raise DataError(f"{file}: not a readable tar shard ({e})") from None
    groups: dict[str, dict] = {}
    order: list[str] = []
    with tf, open(file, "rb") as raw:
        try:
            for m in tf:
                if not m.isfile():
                    continue
                base = os.path.basename(m.name)
                key, _, ext = base.partition(".")
                key = os.path.join(os.path.dirname(m.name), key)
                ext = ext.lower()
                if key not in groups:
                    groups[key] = {}
                    order.append(key)
                if ext in X_EXTS:
                    groups[key]["x"] = (m.offset_data, m.size, X_EXTS.index(ext))
                elif ext in Y_EXTS:
                    raw.seek(m.offset_data)
                    groups[key]["y"] = (m.offset_data, m.size, Y_EXTS.index(ext), raw.read(m.size))
        except (tarfile.TarError, OSError) as e:
            raise DataError(f"{file}: damaged tar shard after {len(order)} samples ({e})") from None
    rows, labels = [], []
    for key in order:
        g = groups[key]
        if "x" not in g or "y" not in g:
            continue  # a key without an input or a label is not a sample
        x, y = g["x"], g["y"]
        rows.append((shard, x[0], x[1], x[2], y[0], y[1], y[2]))
        labels.append(parse_label(y[3], Y_EXTS[y[2]], f"{file} {key}"))
    return rows, labels


def parse_label(raw: bytes, ext: str, where: str) -> int:
    try:
        text = raw.decode("utf-8").strip()
        if ext == "json":
            v = json.loads(text)
            v = v.get("label", v.get("cls")) if isinstance(v, dict) else v
            return int(v)
        return int(text)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise CorruptSample(f"{where}: label {raw[:40]!r} is not an integer class") from None


class Shards(Source):
    task = "classification"

    def __init__(self, settings: dict, split: str, base_dir: Path | None):
        check_split(split)
        self.split = split
        self.files, needs_split = shard_files(str(settings["path"]), base_dir, split)
        self.path = self.files[0].parent
        self.transform = ImageTransform(settings, "shards")
        rows, labels = [], []
        for k, f in enumerate(self.files):
            r, lab = index_shard(f, k)
            rows += r
            labels += lab
        if not rows:
            raise DataError(f"{self.path}: no samples in {len(self.files)} shard(s) (members <key>.jpg|png|webp|npy "
                            f"with <key>.cls|txt|json)")
        self.index = np.asarray(rows, dtype=np.int64)  # (n, 7)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.rows = RowSplit(len(self.index), float(settings.get("val_fraction") or 0.1) if needs_split else None,
                             split)
        if len(self.rows) == 0:
            raise DataError(f"{self.path}: the {split} split has no samples")
        self.n_classes = int(settings.get("n_classes") or int(self.labels.max()) + 1)

    def __len__(self) -> int:
        return len(self.rows)

    def where(self, i: int) -> str:
        r = self.rows.row(i)
        return f"{self.files[int(self.index[r, 0])]} sample {r}"

    def _fd(self, shard: int) -> int:
        fds = getattr(self, "_hfds", None)
        if fds is None or getattr(self, "_hpid", None) != os.getpid():
            fds = self._hfds = {}
            self._hpid = os.getpid()
        if shard not in fds:
            fds[shard] = os.open(self.files[shard], os.O_RDONLY)
        return fds[shard]

    def sample(self, i: int, seed: int | None):
        r = self.rows.row(i)
        shard, xo, xs, xe = (int(v) for v in self.index[r, :4])
        data = pread(self._fd(shard), xs, xo, lambda: self.where(i))
        if X_EXTS[xe] == "npy":
            try:
                a = np.load(io.BytesIO(data), allow_pickle=False)
            except (ValueError, OSError, EOFError) as e:
                raise CorruptSample(f"{self.where(i)}: not a readable .npy ({e})") from None
            x = torch.from_numpy(a.astype(np.float32) if a.dtype.kind in "fb" else a.astype(np.int64))
        else:
            x = self.transform(data, seed, lambda: self.where(i))
        return x, torch.tensor(int(self.labels[r]))
