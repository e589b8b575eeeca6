"""array (and npz): x and y arrays read in place from .npy files or an uncompressed .npz.

`path` is an .npz file or a folder of .npy files; the arrays are named x_train, y_train,
x_val, y_val (the split is theirs), or x and y (split every round(1/val_fraction)-th row,
base.RowSplit). Row i of an array is read with one pread at its byte offset: an .npy
file's data starts after its header, and a member of an .npz stored without compression
(np.savez) is an .npy file at a fixed offset inside the zip. A compressed member
(np.savez_compressed) under 64 MiB is decompressed into memory; a larger one is refused
with a line telling the user to convert it (`data pack`), since it cannot be read in place.

Kind npz (the project kind from before sets were read in place) is the same reader with
its own rules: x and y are split by a seeded shuffle (base.seeded_split, as it always
was), an integer y means classification, and a compressed member of any size is held in
memory (engine/data/describe.py bounds it when the run is built).

A batch of rows is read at once (read_batch: one fancy index into a memory map per
array), which the step loader prefers to sample-by-sample reading.
"""
from __future__ import annotations

import io
import os
import struct
import zipfile
from pathlib import Path

import numpy as np
import torch

from .base import (
    CorruptSample,
    DataError,
    RowSplit,
    Source,
    check_split,
    pread,
    resolve,
)

SMALL_COMPRESSED = 64 << 20  # bytes: a compressed .npz member up to this size is read into memory


class Rows:
    """Rows of one C-ordered array stored at a byte offset of a file (or held in memory)."""

    def __init__(self, file: Path, name: str, offset: int, dtype: np.dtype, shape: tuple, memory=None):
        self.file, self.name, self.offset = file, name, offset
        self.dtype, self.shape, self.memory = dtype, shape, memory
        self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def read(self, i: int, fd: int) -> np.ndarray:
        if self.memory is not None:
            return np.array(self.memory[i])
        raw = pread(fd, self.row_bytes, self.offset + i * self.row_bytes, lambda: f"{self.file} {self.name} row {i}")
        return np.frombuffer(raw, dtype=self.dtype).reshape(self.shape[1:]).copy()


def npy_header(f, file: Path, name: str) -> tuple[np.dtype, tuple, int]:
    """(dtype, shape, header length) of the .npy file that starts at f's position."""
    start = f.tell()
    try:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
    except ValueError as e:
        raise DataError(f"{file}: {name} is not a .npy array ({e})") from None
    if dtype.hasobject:
        raise DataError(f"{file}: {name} holds Python objects; only numeric arrays can be read")
    if fortran and len(shape) > 1:
        raise DataError(f"{file}: {name} is stored in Fortran order; save it with np.ascontiguousarray "
                        f"or run `data pack` on it")
    if not shape:
        raise DataError(f"{file}: {name} is a scalar, not an array of samples")
    return dtype, tuple(shape), f.tell() - start


def npz_members(file: Path, small_compressed: int = SMALL_COMPRESSED) -> dict[str, Rows]:
    out = {}
    try:
        zf = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"{file}: not a readable .npz ({e})") from None
    with zf, open(file, "rb") as raw:
        for info in zf.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if info.compress_type == zipfile.ZIP_STORED:
                # the member's bytes follow its local header: 30 bytes, the name, the extra field
                raw.seek(info.header_offset)
                local = raw.read(30)
                if local[:4] != b"PK\x03\x04":
                    raise DataError(f"{file}: member {name} has a damaged zip header")
                n_name, n_extra = struct.unpack("<HH", local[26:30])
                start = info.header_offset + 30 + n_name + n_extra
                raw.seek(start)
                dtype, shape, head = npy_header(raw, file, name)
                out[name] = Rows(file, name, start + head, dtype, shape)
            elif info.file_size <= small_compressed:
                with zf.open(info) as m:
                    arr = np.load(io.BytesIO(m.read()), allow_pickle=False)
                out[name] = Rows(file, name, 0, arr.dtype, arr.shape, memory=arr)
            else:
                raise DataError(f"{file}: member {name} is compressed ({info.file_size >> 20} MiB) and cannot be "
                                f"read in place; convert it with `layerflow data pack {file}` (or save it with np.savez)")
    return out


def npy_folder(folder: Path) -> dict[str, Rows]:
    out = {}
    for p in sorted(folder.glob("*.npy")):
        with open(p, "rb") as f:
            dtype, shape, head = npy_header(f, p, p.name)
        out[p.stem] = Rows(p, p.stem, head, dtype, shape)
    return out


class ArrayFile(Source):
    def __init__(self, settings: dict, split: str, base_dir: Path | None):
        check_split(split)
        self.split = split
        self.npz = settings.get("kind") == "npz"
        self.path = resolve(settings["path"], base_dir)
        if self.path.is_dir():
            arrays = npy_folder(self.path)
        elif self.path.suffix == ".npy":
            raise DataError(f"{self.path}: point path at the folder holding x.npy and y.npy "
                            f"(or x_train.npy, y_train.npy, x_val.npy, y_val.npy)")
        else:
            arrays = npz_members(self.path, small_compressed=1 << 62 if self.npz else SMALL_COMPRESSED)
        if f"x_{split}" in arrays and f"y_{split}" in arrays:
            self.x, self.y = arrays[f"x_{split}"], arrays[f"y_{split}"]
            self.rows = RowSplit(len(self.x), None, split)
        elif "x" in arrays and "y" in arrays:
            self.x, self.y = arrays["x"], arrays["y"]
            self.rows = RowSplit(len(self.x), float(settings.get("val_fraction") or 0.2), split,
                                 seed=int(settings.get("seed", 0)) if self.npz else None)
        else:
            raise DataError(f"{self.path}: no arrays x and y (or x_{split} and y_{split}); found "
                            f"{', '.join(sorted(arrays)) or 'none'}")
        if len(self.x) != len(self.y):
            raise DataError(f"{self.path}: {self.x.name} has {len(self.x)} rows, {self.y.name} {len(self.y)}")
        if len(self.rows) == 0:
            raise DataError(f"{self.path}: the {split} split has no rows")
        kind = self.y.dtype.kind
        if self.npz:  # (engine/data/describe.py's rule for an .npz, as before)
            self.task = "classification" if kind in "iu" else "regression"
        else:
            self.task = settings.get("task") or ("classification" if kind in "iub" and len(self.y.shape) == 1
                                                 else "regression")
        self.n_classes = settings.get("n_classes")
        if self.n_classes is None and self.task in ("classification", "multi_label"):
            self.n_classes = self._count_classes()

    def _count_classes(self) -> int:
        """max label + 1 (or the width of a multi-hot y), streamed in chunks: y stays on disk."""
        if self.task == "multi_label":
            return int(self.y.shape[1]) if len(self.y.shape) > 1 else 0
        if self.y.memory is not None:
            return int(self.y.memory.max()) + 1
        top, chunk = -1, max(1, (8 << 20) // max(self.y.row_bytes, 1))
        with open(self.y.file, "rb") as f:
            for lo in range(0, len(self.y), chunk):
                k = min(chunk, len(self.y) - lo)
                f.seek(self.y.offset + lo * self.y.row_bytes)
                top = max(top, int(np.fromfile(f, dtype=self.y.dtype, count=k).max()))
        return top + 1

    def __len__(self) -> int:
        return len(self.rows)

    def where(self, i: int) -> str:
        return f"{self.x.file} row {self.rows.row(i)}"

    def _fd(self, file: Path) -> int:
        fds = getattr(self, "_hfds", None)
        if fds is None or getattr(self, "_hpid", None) != os.getpid():
            fds = self._hfds = {}
            self._hpid = os.getpid()
        if file not in fds:
            fds[file] = os.open(file, os.O_RDONLY)
        return fds[file]

    def _map(self, rows: Rows) -> np.ndarray:
        """The array as a read-only memory map (or the array held in memory), per process."""
        if rows.memory is not None:
            return rows.memory
        maps = getattr(self, "_hmaps", None)
        if maps is None or getattr(self, "_hmpid", None) != os.getpid():
            maps = self._hmaps = {}
            self._hmpid = os.getpid()
        if rows.name not in maps:
            maps[rows.name] = np.memmap(rows.file, dtype=rows.dtype, mode="r", offset=rows.offset, shape=rows.shape)
        return maps[rows.name]

    def read_batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples `indices` stacked, as sample() gives them one by one (no augmentation
        here): one fancy index per array. A file cut short is a CorruptSample (the caller
        then reads sample by sample, which names the row)."""
        rows = np.fromiter((self.rows.row(int(i)) for i in indices), dtype=np.int64, count=len(indices))
        try:
            x, y = self._map(self.x)[rows], self._map(self.y)[rows]
        except (ValueError, OSError, IndexError) as e:
            raise CorruptSample(f"{self.path}: rows {rows.min()} to {rows.max()} are not readable ({e})") from None
        return torch.from_numpy(self._x_dtype(np.ascontiguousarray(x))), torch.from_numpy(self._y_dtype(y))

    def _x_dtype(self, x: np.ndarray) -> np.ndarray:
        if x.dtype.kind in "fb" and x.dtype != np.float32:  # models are float32
            return x.astype(np.float32)
        if x.dtype.kind in "iu" and x.dtype != np.int64:  # token ids: embeddings take int64
            return x.astype(np.int64)
        return x

    def _y_dtype(self, y: np.ndarray) -> np.ndarray:
        if self.task in ("classification", "language_model"):
            return y.astype(np.int64)
        if self.task in ("regression", "multi_label") and y.dtype != np.float32:
            return y.astype(np.float32)
        return np.ascontiguousarray(y)

    def sample(self, i: int, seed: int | None):
        r = self.rows.row(i)
        x = self.x.read(r, self._fd(self.x.file))
        y = self.y.read(r, self._fd(self.y.file))
        return torch.from_numpy(self._x_dtype(x)), torch.from_numpy(np.asarray(self._y_dtype(y)))
