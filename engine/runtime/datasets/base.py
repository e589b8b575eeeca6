"""What every format shares: the error type, the Source interface, splits and seeds.

A Source is a map-style view of one split of a data set that reads in place: it holds
paths, offsets and small indexes, never the samples, and opens its files lazily in
whichever process uses it (so it pickles cheaply into DataLoader workers, which each
open their own file handles after fork or spawn).
"""
from __future__ import annotations

import errno
import importlib
import os
from pathlib import Path

import numpy as np
import torch

TASKS = ("classification", "regression", "language_model", "multi_label")


class DataError(ValueError):
    """Bad input, in one line naming the file (and the sample index or row) at fault."""


class CorruptSample(DataError):
    """One sample that cannot be read (an undecodable image, a truncated record): the
    loader skips it and counts it unless it is strict."""


def need(module: str, fmt: str, package: str):
    """Import an optional package inside a function: the runtime stays importable on a
    node with only torch and numpy, and only the formats that need it fail."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DataError(f"{fmt} needs {package} on this node: pip install {package.lower()}") from None


def check_found(p: Path, error=DataError) -> None:
    """`p` is there and can be reached: else `error` in one line, "nothing found" for a
    missing path, the reason for one that cannot be reached (a symlink loop, which
    Path.exists calls missing, or a folder one may not enter)."""
    try:
        os.stat(p)
    except FileNotFoundError:
        raise error(f"{p}: nothing found at this path") from None
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.errno == errno.ELOOP:
            why += " (a symbolic link in the path leads back to itself; remove the link or use another path)"
        raise error(f"{p}: cannot read: {why}") from None
    except ValueError as exc:  # a NUL byte in the path
        raise error(f"{p}: {exc}") from None


def resolve(path: str | os.PathLike, base_dir: Path | None) -> Path:
    """A project-relative path made absolute (project files name data relative to themselves)."""
    p = Path(os.path.expanduser(str(path)))
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    check_found(p)
    return p


class Source:
    """One split of a data set. Subclasses set task, n_classes and path and implement
    __len__, sample and where."""

    task: str = "classification"
    n_classes: int | None = None  # classes, or the vocabulary size of a language model
    path: Path
    split: str = "train"

    def __len__(self) -> int:
        raise NotImplementedError

    def sample(self, i: int, seed: int | None) -> tuple[torch.Tensor | dict, torch.Tensor]:
        """(x, y) of sample i; seed None means no augmentation (validation)."""
        raise NotImplementedError

    def where(self, i: int) -> str:
        """The file (and row) sample i comes from, for messages."""
        return f"{self.path} sample {i}"

    def sample_spec(self) -> dict:
        """{"x": {"shape", "dtype"} or {name: {"shape", "dtype"}}, "y": {"shape", "dtype"}},
        read from the first sample (every sample of a split has the same shapes)."""
        if len(self) == 0:
            raise DataError(f"{self.path}: the {self.split} split has no samples")
        x, y = self.sample(0, None)
        return {"x": spec_of(x), "y": spec_of(y)}

    # Sources hold lazily opened handles in attributes starting with "_h": not pickled
    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_h")}

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, split={self.split!r}, n={len(self)})"


def spec_of(v) -> dict:
    if isinstance(v, dict):
        return {k: spec_of(t) for k, t in v.items()}
    return {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}


def _mix(z: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread hash of a 64-bit integer."""
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


MASK64 = (1 << 64) - 1


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The augmentation seed of one sample: a function of (run seed, epoch, sample index)
    only, so every data-parallel layout and a resumed run augment it the same way. (A hash
    in Python integers: numpy's SeedSequence costs 30 us, a tenth of decoding a small JPEG.)"""
    return _mix(_mix(_mix(seed & MASK64) ^ (epoch & MASK64)) ^ (index & MASK64))


def seeded_split(n: int, val_fraction: float, seed: int):
    """(train rows, val rows) of n: a shuffle by seed, round(n * val_fraction) (at least 1)
    of them for validation. Kind npz's split (and a CSV's), here and in engine/data/describe.py."""
    perm = np.random.default_rng(seed + 7919).permutation(n)
    n_val = max(1, int(round(n * val_fraction)))
    return perm[n_val:], perm[:n_val]


class RowSplit:
    """A deterministic train/val split of n rows that needs no stored index: every m-th
    row (m = round(1 / val_fraction)) is validation, so a file sorted by class still gives
    both splits every class. Maps a split's index to the row in the file. With a seed, the
    split is seeded_split's shuffle instead (an index of 8 bytes a row): kind npz's."""

    def __init__(self, n: int, val_fraction: float | None, split: str, seed: int | None = None):
        self.n, self.split = n, split
        self.m = 0 if not val_fraction else max(2, int(round(1 / val_fraction)))
        self.rows = None
        if seed is not None and val_fraction:
            train, val = seeded_split(n, val_fraction, seed)
            self.rows = val if split == "val" else train

    def __len__(self) -> int:
        if self.rows is not None:
            return len(self.rows)
        if not self.m:
            return self.n
        n_val = self.n // self.m
        return n_val if self.split == "val" else self.n - n_val

    def row(self, i: int) -> int:
        if self.rows is not None:
            return int(self.rows[i])
        if not self.m:
            return i
        if self.split == "val":
            return i * self.m + self.m - 1
        block, off = divmod(i, self.m - 1)
        return block * self.m + off


def pread(fd: int, size: int, offset: int, where) -> bytes:
    """Exactly size bytes at offset, or CorruptSample (a truncated file) naming where() (a
    callable, so the message costs nothing on the path that needs none)."""
    b = os.pread(fd, size, offset)
    if len(b) != size:
        raise CorruptSample(f"{where()}: truncated ({len(b)} of {size} bytes at offset {offset})")
    return b


def check_split(split: str) -> None:
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', not {split!r}")
