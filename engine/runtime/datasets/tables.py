"""parquet: Parquet files, and Arrow IPC files as the Hugging Face datasets library writes
them (save_to_disk: <split>/data-00000-of-00001.arrow), read a row group at a time.

`path` is one file or a folder of them. Splits: train/ and val/ (or validation/, test/)
subfolders, or files whose names start with train and val/validation/test (the hub's
data/train-00000-of-00001.parquet), or else every round(1/val_fraction)-th row is
validation (base.RowSplit). Only the row group of a sample is decoded, only its
`inputs` and `target` columns, and a small LRU cache keeps the last few groups: random
access over files with huge row groups is slow (write them with row groups of a few
thousand rows, or pack them to arrays). Arrow files are memory-mapped, so their record
batches are read without a copy.

x: one input column gives its value; several scalar columns give one float32 vector
(tabular data); otherwise a dict {column: tensor} (e.g. input_ids + attention_mask).
A list-valued column becomes a sequence, truncated or padded (pad_id) to seq_len when set.
pyarrow is imported inside functions: see base.need.
"""
from __future__ import annotations

import os
import re
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from .base import CorruptSample, DataError, RowSplit, Source, check_split, need, resolve

EXTS = (".parquet", ".arrow")
VAL_NAMES = ("val", "valid", "validation", "test")
CACHE_GROUPS = 4


def _pa():
    return need("pyarrow", "parquet", "pyarrow")


def table_files(root: Path, split: str) -> tuple[list[Path], bool]:
    """(this split's files, whether they still need a RowSplit)."""
    if root.is_file():
        return [root], True
    files = sorted(p for p in root.rglob("*") if p.suffix in EXTS and p.is_file())
    if not files:
        raise DataError(f"{root}: no .parquet or .arrow files here")

    def split_of(p: Path) -> str | None:
        for part in p.relative_to(root).parts:  # a folder or a file name prefix says the split
            head = re.split(r"[-_.]", part.lower())[0]
            if head == "train":
                return "train"
            if head in VAL_NAMES:
                return "val"
        return None

    tagged = {p: split_of(p) for p in files}
    if any(s == "train" for s in tagged.values()) and any(s == "val" for s in tagged.values()):
        return [p for p in files if tagged[p] == split], False
    return files, True


class Part:
    """One file: its row groups (Parquet) or record batches (Arrow), opened lazily."""

    def __init__(self, file: Path, columns: list[str]):
        pa = _pa()
        self.file, self.arrow = file, file.suffix == ".arrow"
        try:
            if self.arrow:
                batches = self._batches()
                schema = batches[0].schema if batches else None
                self.group_rows = [b.num_rows for b in batches]
            else:
                pq = need("pyarrow.parquet", "parquet", "pyarrow")
                meta = pq.ParquetFile(file, memory_map=True).metadata
                schema = meta.schema.to_arrow_schema()
                self.group_rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        except (pa.ArrowException, OSError) as e:
            raise DataError(f"{file}: not a readable {'Arrow' if self.arrow else 'Parquet'} file "
                            f"({str(e).splitlines()[0]})") from None
        names = list(schema.names) if schema is not None else []
        for c in columns:
            if c not in names:
                raise DataError(f"{file}: no column {c!r} (it has {', '.join(names) or 'none'})")
        self.schema = schema

    def _batches(self):
        pa = _pa()
        source = pa.memory_map(str(self.file))
        try:  # the IPC file format (random access) or the stream format datasets writes
            reader = pa.ipc.open_file(source)
            return [reader.get_batch(i) for i in range(reader.num_record_batches)]
        except pa.ArrowInvalid:
            source.seek(0)
            return list(pa.ipc.open_stream(source))

    def read(self, g: int, columns: list[str]):
        """The record batch of group g (only `columns`). Handles opened by another process
        (a DataLoader worker forked after the parent read) are not reused."""
        if getattr(self, "_hpid", None) != os.getpid():
            self._hbatches = self._hpq = None
            self._hpid = os.getpid()
        if self.arrow:
            if getattr(self, "_hbatches", None) is None:
                self._hbatches = self._batches()  # zero-copy views of the memory map
            return self._hbatches[g].select(columns)
        if getattr(self, "_hpq", None) is None:
            self._hpq = need("pyarrow.parquet", "parquet", "pyarrow").ParquetFile(self.file, memory_map=True)
        # no Arrow thread pool: one row group is small, and pools do not survive a fork
        return self._hpq.read_row_group(g, columns=columns, use_threads=False)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_h") and k != "schema"}


def decode_column(arr, file: Path, name: str):
    """A column of one group as ("flat", values) or ("list", offsets, values), numpy."""
    pa = _pa()
    if hasattr(arr, "combine_chunks"):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        if pa.types.is_fixed_size_list(t):
            k = t.list_size
            offsets = np.arange(arr.offset, arr.offset + len(arr) + 1, dtype=np.int64) * k
        else:
            offsets = np.asarray(arr.offsets, dtype=np.int64)
        values = arr.values
        if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_boolean(values.type)):
            raise DataError(f"{file}: column {name!r} holds lists of {values.type}; only numbers can be read")
        return ("list", offsets, values.to_numpy(zero_copy_only=False), arr.is_null().to_numpy(zero_copy_only=False))
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        raise DataError(f"{file}: column {name!r} holds {t}; only numbers and lists of numbers can be read "
                        f"(tokenize text first)")
    return ("flat", arr.to_numpy(zero_copy_only=False), arr.is_null().to_numpy(zero_copy_only=False))


def _as_model_dtype(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return a.astype(np.int64, copy=False)
    return a.astype(np.float32, copy=False)


class Parquet(Source):
    def __init__(self, settings: dict, split: str, base_dir: Path | None):
        check_split(split)
        self.split = split
        root = resolve(settings["path"], base_dir)
        self.inputs = list(settings.get("inputs") or [])
        self.target = settings.get("target")
        self.task = settings.get("task") or "classification"
        if not self.inputs:
            raise DataError(f"{root}: parquet needs inputs (the names of the input columns)")
        if self.target is None and self.task != "language_model":
            raise DataError(f"{root}: parquet needs target (the name of the target column)")
        self.columns = list(dict.fromkeys(self.inputs + ([self.target] if self.target else [])))
        self.seq_len = settings.get("seq_len")
        self.pad_id = int(settings.get("pad_id", 0))
        files, needs_split = table_files(root, split)
        if not files:
            raise DataError(f"{root}: no {split} files among its .parquet/.arrow files")
        self.path = root
        self.parts = [Part(f, self.columns) for f in files]
        sizes = [n for p in self.parts for n in p.group_rows]
        self.where_group = [(pi, g) for pi, p in enumerate(self.parts) for g in range(len(p.group_rows))]
        self.starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.rows = RowSplit(int(self.starts[-1]), float(settings.get("val_fraction") or 0.1) if needs_split else None,
                             split)
        if len(self.rows) == 0:
            raise DataError(f"{root}: the {split} split has no rows")
        self.n_classes = settings.get("n_classes") or settings.get("vocab_size")
        if self.n_classes is None and self.task == "classification":
            self.n_classes = self._count_classes()
        if self.task == "multi_label" and not self.n_classes:
            raise DataError(f"{root}: a multi_label target needs n_classes")

    def _count_classes(self) -> int:
        """max target + 1: from the Parquet statistics where written, else one pass over the
        target column alone, a group at a time."""
        top = -1
        for pi, g in self.where_group:
            part = self.parts[pi]
            stats = None
            if not part.arrow:
                pq = need("pyarrow.parquet", "parquet", "pyarrow")
                md = pq.ParquetFile(part.file).metadata.row_group(g)
                col = [md.column(c) for c in range(md.num_columns) if md.column(c).path_in_schema == self.target]
                stats = col[0].statistics if col and col[0].is_stats_set else None
            if stats is not None and stats.has_min_max and isinstance(stats.max, (int, np.integer)):
                top = max(top, int(stats.max))
            else:
                kind, *data = decode_column(part.read(g, [self.target]).column(0), part.file, self.target)
                vals = data[1] if kind == "list" else data[0]
                if len(vals):
                    top = max(top, int(np.nanmax(vals)))
        return top + 1

    def __len__(self) -> int:
        return len(self.rows)

    def sample_spec(self) -> dict:
        """The first sample's shapes, after checking that a list column without seq_len
        holds sequences of one length in the first row group (a batch cannot stack 12 and
        40 values; the runtime would fail at its first batch)."""
        if not self.seq_len:
            cols = self._group(0)
            fixed = self.inputs + ([self.target] if self.target and self.task != "multi_label" else [])
            for c in fixed:  # (a multi_label target's label lists become one multi-hot width)
                col = cols[c]
                lengths = np.diff(col[1])[~col[-1]] if col[0] == "list" else []
                if len(lengths) > 1:
                    if lengths.min() != lengths.max():
                        raise DataError(f"{self.parts[0].file}: column {c!r} holds sequences of {int(lengths.min())} "
                                        f"to {int(lengths.max())} values; set seq_len to cut and pad them to one "
                                        f"length")
        return super().sample_spec()

    def _locate(self, i: int) -> tuple[int, int, int]:
        row = self.rows.row(i)
        k = int(np.searchsorted(self.starts, row, side="right")) - 1
        return k, row - int(self.starts[k]), row

    def where(self, i: int) -> str:
        k, r, row = self._locate(i)
        pi, g = self.where_group[k]
        return f"{self.parts[pi].file} row {row - int(self.starts[k]) + sum(self.parts[pi].group_rows[:g])}"

    def _group(self, k: int) -> dict:
        cache = getattr(self, "_hcache", None)
        if cache is None or getattr(self, "_hpid", None) != os.getpid():
            cache = self._hcache = OrderedDict()
            self._hpid = os.getpid()
        if k in cache:
            cache.move_to_end(k)
            return cache[k]
        pi, g = self.where_group[k]
        part = self.parts[pi]
        pa = _pa()
        try:
            batch = part.read(g, self.columns)
        except (pa.ArrowException, OSError) as e:
            raise CorruptSample(f"{part.file}: row group {g} is not readable ({str(e).splitlines()[0]})") from None
        cols = {c: decode_column(batch.column(j), part.file, c) for j, c in enumerate(self.columns)}
        cache[k] = cols
        if len(cache) > CACHE_GROUPS:
            cache.popitem(last=False)
        return cols

    def _value(self, col, r: int, name: str, i: int) -> np.ndarray:
        if col[-1][r]:
            raise CorruptSample(f"{self.where(i)}: column {name!r} is null")
        if col[0] == "flat":
            return np.asarray(col[1][r])
        offsets, values = col[1], col[2]
        return values[offsets[r]:offsets[r + 1]]

    def _fit(self, seq: np.ndarray, length: int, pad: int) -> np.ndarray:
        if len(seq) >= length:
            return seq[:length]
        return np.concatenate([seq, np.full(length - len(seq), pad, dtype=seq.dtype)])

    def sample(self, i: int, seed: int | None):
        k, r, _ = self._locate(i)
        cols = self._group(k)
        vals = {c: self._value(cols[c], r, c, i) for c in self.inputs}
        if self.task == "language_model" and self.target is None:
            seq = _as_model_dtype(vals[self.inputs[0]])
            if self.seq_len:
                seq = self._fit(seq, int(self.seq_len) + 1, self.pad_id)
            y = torch.from_numpy(seq[1:].copy())
            if self.seq_len and len(vals[self.inputs[0]]) < int(self.seq_len) + 1:
                y[max(len(vals[self.inputs[0]]) - 1, 0):] = -100  # padding is not a target
            return torch.from_numpy(seq[:-1].copy()), y
        if self.seq_len:
            vals = {c: self._fit(v, int(self.seq_len), self.pad_id) if v.ndim else v for c, v in vals.items()}
        if len(self.inputs) == 1:
            v = _as_model_dtype(vals[self.inputs[0]])
            x = torch.from_numpy(v.reshape(1) if v.ndim == 0 else v.copy())
        elif all(v.ndim == 0 for v in vals.values()):  # tabular: one feature vector
            x = torch.from_numpy(np.array([float(v) for v in vals.values()], dtype=np.float32))
        else:
            x = {c: torch.from_numpy(_as_model_dtype(np.atleast_1d(v)).copy()) for c, v in vals.items()}
        y = self._value(cols[self.target], r, self.target, i)
        if self.task == "multi_label" and y.ndim == 1 and y.dtype.kind in "iu":
            hot = np.zeros(int(self.n_classes), np.float32)  # label indices -> multi-hot
            hot[y[(y >= 0) & (y < hot.size)]] = 1
            y = hot
        elif self.task in ("classification", "language_model"):
            y = y.astype(np.int64)
        else:
            y = y.astype(np.float32)
        return x, torch.from_numpy(np.array(y))
