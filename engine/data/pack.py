"""Packing data into the formats the runtime reads in place (engine/runtime/datasets/).

    pack_text(files, out)        text -> train.bin, val.bin, meta.json (nanoGPT's layout)
    pack_shards(folder, out, n)  an image folder -> tar shards of n samples
    pack_array(npz_or_csv, out)  a compressed .npz or a .csv -> .npy files read in place

Everything streams (a chunk at a time: a 50 GB corpus needs no 50 GB of memory) and is
written under a temporary name, then renamed: a run never sees half a file, and an
interrupted pack leaves the old output as it was. progress(done, total) is called as
work is done (bytes or files, whichever the packer counts).
"""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import struct
import tarfile
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np

from engine.runtime.datasets.base import DataError, need
from engine.runtime.datasets.images import class_folders, list_images

Progress = Optional[Callable[[int, int], None]]
CHUNK = 4 << 20  # bytes read at a time


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextmanager
def _writing(final: Path):
    """An OSError met while `final` is written under its temporary name (a full disk: the
    write itself carries no file name) names `final`, the file the user asked for: one
    line, `<final>: No space left on device (the disk is full; ...)`. Errors that name
    another file (an input being read) keep their own name."""
    try:
        yield
    except OSError as e:
        named = None if e.filename is None else Path(os.fsdecode(e.filename))
        if named is None or named == _tmp(final) or named == final:
            raise OSError(e.errno, e.strerror or str(e), str(final)) from None
        raise


def _publish(pairs: Iterable[tuple[Path, Path]]) -> None:
    """Rename finished temporary files onto their names (each rename is atomic)."""
    for tmp, final in pairs:
        os.replace(tmp, final)


def _inputs(inputs: list[Path]) -> list[Path]:
    files = [Path(p) for p in inputs]
    if not files:
        raise DataError("pack_text: no input files")
    for f in files:
        if not f.is_file():
            raise DataError(f"{f}: not a file")
    return files


# ---- text -> tokens ------------------------------------------------------------------
def _text_chunks(files: list[Path], progress: Progress, split_lines: bool):
    """Chunks of bytes of every file in turn, cut at line ends when a tokenizer reads them
    (so no token straddles two chunks)."""
    total, done = sum(f.stat().st_size for f in files), 0
    for f in files:
        rest = b""
        with open(f, "rb") as fh:
            while True:
                block = fh.read(CHUNK)
                if not block:
                    break
                done += len(block)
                block = rest + block
                cut = block.rfind(b"\n") + 1 if split_lines else len(block)
                if cut == 0:  # one long line: keep reading until it ends
                    rest = block
                    continue
                rest = block[cut:]
                yield block[:cut]
                if progress:
                    progress(done, total)
        if rest:
            yield rest
    if progress:
        progress(total, total)


def pack_text(inputs: list[Path], out_dir: Path, tokenizer: Path | None = None, val_fraction: float = 0.1,
              progress: Progress = None) -> dict:
    """Tokenize text files into out_dir/train.bin and val.bin (the last val_fraction of the
    tokens) plus meta.json. Byte-level by default (vocabulary 256, uint16); with a
    tokenizer.json (Hugging Face tokenizers), its vocabulary and uint16 or uint32. Returns
    meta.json's content."""
    files = _inputs(inputs)
    if not 0 < val_fraction < 1:
        raise DataError(f"val_fraction: {val_fraction} must be between 0 and 1")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        tk = need("tokenizers", "a tokenizer file", "tokenizers")
        try:
            tok = tk.Tokenizer.from_file(str(tokenizer))
        except Exception as e:  # tokenizers raises its own Exception subclass for a bad file
            raise DataError(f"{tokenizer}: not a readable tokenizer.json ({str(e).splitlines()[0]})") from None
        vocab = int(tok.get_vocab_size())
        encode = lambda b: tok.encode(b.decode("utf-8", errors="replace"), add_special_tokens=False).ids  # noqa: E731
    else:
        vocab = 256
        encode = lambda b: np.frombuffer(b, dtype=np.uint8)  # noqa: E731
    dtype = np.dtype(np.uint16 if vocab <= 1 << 16 else np.uint32)
    train, val = out / "train.bin", out / "val.bin"
    t_train, t_val = _tmp(train), _tmp(val)
    try:
        n = 0
        with _writing(train), open(t_train, "wb") as f:  # every token first; the tail moves to val.bin below
            for chunk in _text_chunks(files, progress, split_lines=tokenizer is not None):
                ids = np.asarray(encode(chunk), dtype=dtype)
                f.write(ids.tobytes())  # (not tofile: its short write says no errno, so not "disk full")
                n += len(ids)
        n_val = int(round(n * val_fraction))
        if n - n_val < 2 or n_val < 2:
            raise DataError(f"{files[0]}: {n} tokens are too few to split with val_fraction {val_fraction}")
        with _writing(val), open(t_train, "r+b") as src, open(t_val, "wb") as dst:
            src.seek((n - n_val) * dtype.itemsize)
            shutil.copyfileobj(src, dst, CHUNK)
            src.truncate((n - n_val) * dtype.itemsize)
        meta = {"dtype": dtype.name, "vocab_size": vocab, "tokens": {"train": n - n_val, "val": n_val},
                "tokenizer": "byte" if tokenizer is None else "tokenizer.json",
                "sources": [f.name for f in files]}
        pairs = [(t_train, train), (t_val, val)]
        if tokenizer is not None and Path(tokenizer).resolve() != (out / "tokenizer.json").resolve():
            with _writing(out / "tokenizer.json"):
                shutil.copyfile(tokenizer, _tmp(out / "tokenizer.json"))
            pairs.append((_tmp(out / "tokenizer.json"), out / "tokenizer.json"))
        with _writing(out / "meta.json"):
            _tmp(out / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        pairs.append((_tmp(out / "meta.json"), out / "meta.json"))
        _publish(pairs)
        return meta
    finally:
        for t in (t_train, t_val, _tmp(out / "meta.json"), _tmp(out / "tokenizer.json")):
            t.unlink(missing_ok=True)


# ---- image folder -> tar shards ------------------------------------------------------
def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = len(data), 0o644, 0  # mtime 0: the same folder packs to the same bytes
    tf.addfile(ti, io.BytesIO(data))


def pack_shards(image_folder: Path, out_dir: Path, shard_size: int = 1000, progress: Progress = None) -> dict:
    """An image folder (root/<class>/*, or root/train/<class> and root/val/<class>) as
    WebDataset-style tar shards of shard_size samples: <key>.<ext> holds the image's bytes
    as they are (no re-encoding), <key>.cls its class index; classes.json names the
    classes. Shards are train-NNNNNN.tar and val-NNNNNN.tar, or data-NNNNNN.tar for a
    folder without splits (the reader then splits by val_fraction)."""
    root = Path(image_folder)
    if not root.is_dir():
        raise DataError(f"{root}: not a folder")
    if shard_size < 1:
        raise DataError(f"shard_size: {shard_size} must be at least 1")
    splits = [("train", root / "train"), ("val", root / "val")] \
        if (root / "train").is_dir() and (root / "val").is_dir() else [("data", root)]
    classes = class_folders(splits[0][1])
    if not classes:
        raise DataError(f"{splits[0][1]}: no class folders")
    work = []
    for name, top in splits:
        for c, cls in enumerate(classes):
            found = list_images(top / cls) if (top / cls).is_dir() else []
            if not found and name != "val":
                raise DataError(f"{top / cls}: empty class folder (no .jpg, .png or .webp images)")
            work += [(name, top / cls / f, c) for f in found]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    written, pending, done = [], [], 0
    try:
        for name, _ in splits:
            items = [w for w in work if w[0] == name]
            for s in range(0, len(items), shard_size):
                final = out / f"{name}-{s // shard_size:06d}.tar"
                tmp = _tmp(final)
                pending.append(tmp)
                with _writing(final), tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tf:
                    for k, (_, path, c) in enumerate(items[s:s + shard_size], start=s):
                        ext = path.suffix.lower().lstrip(".").replace("jpeg", "jpg")
                        _add(tf, f"{k:09d}.{ext}", path.read_bytes())
                        _add(tf, f"{k:09d}.cls", str(c).encode())
                        done += 1
                        if progress:
                            progress(done, len(work))
                written.append((tmp, final))
            counts[name] = len(items)
        meta = {"classes": classes, "samples": counts, "shard_size": shard_size}
        t = _tmp(out / "classes.json")
        pending.append(t)
        with _writing(out / "classes.json"):
            t.write_text(json.dumps(meta, indent=1))
        written.append((t, out / "classes.json"))
        _publish(written)
        return meta
    finally:
        for t in pending:
            t.unlink(missing_ok=True)


# ---- .npz / .csv -> .npy -------------------------------------------------------------
def npy_header(dtype: np.dtype, shape: tuple, size: int = 128) -> bytes:
    """A version 1.0 .npy header of a fixed size, so it can be written before the row count
    is known and rewritten after (spaces pad it, as numpy's own headers)."""
    d = repr({"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
              "shape": tuple(int(s) for s in shape)}).encode("latin1")
    pad = size - 10 - len(d) - 1
    if pad < 0:
        raise ValueError(f"shape {shape} does not fit a {size}-byte .npy header")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", size - 10) + d + b" " * pad + b"\n"


def _npz_to_npy(src: Path, out: Path, progress: Progress) -> dict:
    try:
        zf = zipfile.ZipFile(src)
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"{src}: not a readable .npz ({e})") from None
    shapes, pairs = {}, []
    total = sum(i.file_size for i in zf.infolist())
    done = 0
    try:
        with zf:
            for info in zf.infolist():
                name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                final = out / f"{name}.npy"
                tmp = _tmp(final)
                pairs.append((tmp, final))
                with zf.open(info) as m:  # decompressed as it is read
                    version = np.lib.format.read_magic(m)
                    shape, fortran, dtype = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                             else np.lib.format.read_array_header_2_0)(m)
                    if dtype.hasobject:
                        raise DataError(f"{src}: member {name} holds Python objects; only numeric arrays can be packed")
                    with _writing(final), open(tmp, "wb") as f:
                        if fortran and len(shape) > 1:  # rare: transposed in memory, once
                            arr = np.frombuffer(m.read(), dtype=dtype).reshape(shape, order="F")
                            np.save(f, np.ascontiguousarray(arr))
                        else:
                            f.write(npy_header(dtype, shape))
                            shutil.copyfileobj(m, f, CHUNK)
                shapes[name] = list(shape)
                done += info.file_size
                if progress:
                    progress(done, total)
        _publish(pairs)
    finally:
        for t, _ in pairs:
            t.unlink(missing_ok=True)
    return shapes


def _csv_to_npy(src: Path, out: Path, target: str | int, header: bool, progress: Progress) -> dict:
    """x.npy (float32, every column but the target) and y.npy (int64 class indices when
    every target is an integer or a class name, else float32), a block of rows at a time.
    Class names become indices in the order met, named in classes.json."""
    total = src.stat().st_size
    x_final, y_final, c_final = out / "x.npy", out / "y.npy", out / "classes.json"
    tx, ty, t_raw, tc = _tmp(x_final), _tmp(y_final), _tmp(out / "y.raw"), _tmp(c_final)
    labels: dict[str, int] = {}
    n, width, t = 0, None, None
    try:
        with _writing(x_final), open(src, newline="") as fh, open(tx, "wb") as fx, open(t_raw, "wb") as fr:
            rows = csv.reader(fh)
            names = next(rows, None) if header else None
            fx.write(b"\0" * 128)  # the header, written once the row count is known
            xs: list[list[float]] = []
            ys: list[float] = []
            for line_no, row in enumerate(rows, start=2 if header else 1):
                if not row:
                    continue
                if width is None:
                    width = len(row)
                    if isinstance(target, str):
                        if not names or target not in names:
                            raise DataError(f"{src}: no column {target!r} in its header")
                        t = names.index(target)
                    else:
                        t = target % width
                if len(row) != width:
                    raise DataError(f"{src}: row {line_no} has {len(row)} columns, the first has {width}")
                try:
                    xs.append([float(v) for k, v in enumerate(row) if k != t])
                except ValueError:
                    raise DataError(f"{src}: row {line_no} has a value that is not a number") from None
                label = row[t].strip()
                if labels or (n + len(ys) == 0 and not _is_number(label)):
                    ys.append(labels.setdefault(label, len(labels)))  # class names
                else:
                    try:
                        ys.append(float(label))
                    except ValueError:
                        raise DataError(f"{src}: row {line_no}: target {label!r} is not a number") from None
                if len(xs) >= 65536:
                    fx.write(np.asarray(xs, dtype=np.float32).tobytes())
                    fr.write(np.asarray(ys, dtype=np.float64).tobytes())
                    n += len(xs)
                    xs.clear()
                    ys.clear()
                    if progress:
                        progress(fh.tell(), total)
            fx.write(np.asarray(xs, dtype=np.float32).reshape(-1, (width or 1) - 1).tobytes())
            fr.write(np.asarray(ys, dtype=np.float64).tobytes())
            n += len(xs)
            if not n:
                raise DataError(f"{src}: no rows")
            fx.seek(0)
            fx.write(npy_header(np.float32, (n, width - 1)))
        # y: integers (or class names) -> int64, anything else float32; streamed from y.raw
        raw = np.memmap(t_raw, dtype=np.float64, mode="r")
        whole = all(np.all(raw[i:i + CHUNK] == np.round(raw[i:i + CHUNK])) for i in range(0, n, CHUNK))
        ydt = np.dtype(np.int64 if whole else np.float32)
        with _writing(y_final), open(ty, "wb") as fy:
            fy.write(npy_header(ydt, (n,)))
            for i in range(0, n, CHUNK):
                fy.write(raw[i:i + CHUNK].astype(ydt).tobytes())
        del raw
        pairs = [(tx, x_final), (ty, y_final)]
        if labels:
            with _writing(c_final):
                tc.write_text(json.dumps(list(labels)))
            pairs.append((tc, c_final))
        _publish(pairs)
        if progress:
            progress(total, total)
        return {"x": [n, width - 1], "y": [n]}
    finally:
        for f in (tx, ty, t_raw, tc):
            f.unlink(missing_ok=True)


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def pack_array(npz_or_csv: Path, out_dir: Path, *, target: str | int = -1, header: bool = True,
               progress: Progress = None) -> dict:
    """An .npz (compressed or not) or a .csv as .npy files in out_dir that the `array`
    kind reads in place: an .npz's members keep their names; a .csv gives x.npy and y.npy
    (target: the label column, by name or index). Returns {name: shape}."""
    src = Path(npz_or_csv)
    if not src.is_file():
        raise DataError(f"{src}: not a file")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if src.suffix.lower() == ".npz":
        return _npz_to_npy(src, out, progress)
    if src.suffix.lower() == ".csv":
        return _csv_to_npy(src, out, target, header, progress)
    raise DataError(f"{src}: pack_array takes an .npz or a .csv file")

