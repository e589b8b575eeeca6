"""token_file: flat binary token files, as nanoGPT's prepare.py and llm.c write them.

A folder with train.bin and val.bin (or one .bin whose last val_fraction of tokens is
the validation split). Tokens are uint16 or uint32 with no header (nanoGPT), or follow
llm.c's header of 256 int32 (magic 20240520, version 1 = uint16, 2 = uint32, then the
token count). Sample i is the non-overlapping window tokens[i*T : i*T + T + 1]: x is its
first T tokens, y the last T (the next token of each position), both int64.

Windows are read with one pread each rather than through np.memmap: a memory map counts
every page a long run has touched in the process's resident memory, so memory would grow
with the data set; pread leaves caching to the OS page cache, shared by all ranks.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from .base import DataError, Source, check_split, pread, resolve

LLMC_MAGIC = 20240520
LLMC_HEADER = 256 * 4
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def bin_files(path: Path, split: str) -> tuple[Path, bool]:
    """(the file of this split, whether it is one file to split by val_fraction)."""
    if path.is_file():
        return path, True
    named = path / f"{split}.bin"
    if named.is_file():
        return named, False
    other = "val" if split == "train" else "train"
    if (path / f"{other}.bin").is_file():
        raise DataError(f"{path}: has {other}.bin but no {split}.bin")
    bins = sorted(path.glob("*.bin"))
    if len(bins) == 1:
        return bins[0], True
    if not bins:
        raise DataError(f"{path}: no .bin token file here (train.bin and val.bin, or one .bin)")
    raise DataError(f"{path}: {len(bins)} .bin files and no train.bin; name them train.bin and val.bin "
                    f"or point path at one of them")


def read_meta(file: Path) -> dict:
    """meta.json beside the token files: {"dtype", "vocab_size", "tokenizer"} (datapack writes it)."""
    meta = file.parent / "meta.json"
    if not meta.is_file():
        return {}
    try:
        d = json.loads(meta.read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{meta}: not readable JSON ({e})") from None
    if not isinstance(d, dict):
        raise DataError(f"{meta}: must hold a JSON object")
    return d


def layout(file: Path, dtype: str | None) -> tuple[int, np.dtype, int]:
    """(byte offset of the first token, token dtype, token count) of a .bin file."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(LLMC_HEADER)
    if len(head) == LLMC_HEADER:
        h = np.frombuffer(head, dtype="<i4", count=3)
        if h[0] == LLMC_MAGIC:  # llm.c: the header says the dtype and the count
            if h[1] not in (1, 2):
                raise DataError(f"{file}: llm.c header version {h[1]} is not 1 (uint16) or 2 (uint32)")
            dt = np.dtype(np.uint16 if h[1] == 1 else np.uint32)
            if size < LLMC_HEADER + int(h[2]) * dt.itemsize:
                raise DataError(f"{file}: the llm.c header says {h[2]} tokens, the file holds "
                                f"{(size - LLMC_HEADER) // dt.itemsize}")
            return LLMC_HEADER, dt, int(h[2])
    dt = np.dtype(DTYPES.get(dtype or "uint16", np.uint16))
    if size % dt.itemsize:
        raise DataError(f"{file}: {size} bytes is not a whole number of {dt.name} tokens; check dtype")
    return 0, dt, size // dt.itemsize


class TokenFile(Source):
    task = "language_model"

    def __init__(self, settings: dict, split: str, base_dir: Path | None):
        check_split(split)
        root = resolve(settings["path"], base_dir)
        self.split = split
        self.path, one_file = bin_files(root, split)
        meta = read_meta(self.path)
        self.seq_len = int(settings.get("seq_len", 256))
        vocab = settings.get("vocab_size") or meta.get("vocab_size")
        if not vocab:
            raise DataError(f"{self.path}: the vocabulary size is unknown; set vocab_size "
                            f"(50257 for GPT-2 tokens) or put a meta.json beside it")
        self.n_classes = self.vocab_size = int(vocab)
        self.offset, self.dtype, count = layout(self.path, settings.get("dtype") or meta.get("dtype"))
        start = 0
        if one_file:  # the tail is validation: text stays contiguous in both splits
            n_val = int(round(count * float(settings.get("val_fraction") or 0.1)))
            start, count = (count - n_val, n_val) if split == "val" else (0, count - n_val)
        self.start, self.count = start, count
        self.n = max(0, (count - 1) // self.seq_len)
        if self.n == 0:
            raise DataError(f"{self.path}: the {split} split has {count} tokens, fewer than one window of "
                            f"seq_len + 1 = {self.seq_len + 1}")

    def __len__(self) -> int:
        return self.n

    def where(self, i: int) -> str:
        return f"{self.path} window {i} (token {self.start + i * self.seq_len})"

    def _fd(self) -> int:
        fd = getattr(self, "_hfd", None)
        if fd is None or getattr(self, "_hpid", None) != os.getpid():
            fd = self._hfd = os.open(self.path, os.O_RDONLY)
            self._hpid = os.getpid()
        return fd

    def window(self, i: int) -> np.ndarray:
        """Tokens [i*T, i*T + T + 1) of this split, as stored."""
        if not 0 <= i < self.n:
            raise IndexError(f"window {i} of {self.n}")
        T, item = self.seq_len, self.dtype.itemsize
        first = self.start + i * T
        raw = pread(self._fd(), (T + 1) * item, self.offset + first * item, lambda: self.where(i))
        w = np.frombuffer(raw, dtype=self.dtype.newbyteorder("<"))
        top = int(w.max())
        if top >= self.vocab_size:
            pos = first + int(np.argmax(w >= self.vocab_size))
            raise DataError(f"{self.path}: token {int(w[pos - first])} at position {pos} is beyond the "
                            f"vocabulary ({self.vocab_size}); set vocab_size or check dtype")
        return w

    def sample(self, i: int, seed: int | None):
        w = torch.from_numpy(self.window(i).astype(np.int64))
        return w[:-1], w[1:]  # (T,), (T,): y is x shifted by one token

    def sample_spec(self) -> dict:
        t = {"shape": [self.seq_len], "dtype": "int64"}
        return {"x": t, "y": dict(t)}

    def __del__(self):
        fd = getattr(self, "_hfd", None)
        if fd is not None and getattr(self, "_hpid", None) == os.getpid():
            try:
                os.close(fd)
            except OSError:
                pass
