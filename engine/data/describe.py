"""What a run's data is, when it is prepared (engine/runs/build.py build_run).

Two kinds of data set:
  - read in place (image folders, token files, Parquet/Arrow, .npz/.npy, tar shards;
    engine/data/sources.py): the run records a reference (the settings with an absolute
    path, and a fingerprint of the files), never a copy; every rank reads its share
    (engine/runtime/datasets/). `describe` opens it here only to check it against the
    diagram (shapes, classes), reading one sample.
  - made whole here (synthetic sets, scikit-learn's digits, a CSV): small by
    construction, written into the run folder as data.npz (so cluster nodes need
    neither scikit-learn nor the user's CSV). Synthetic sets are a function of their
    seed alone. The user's .npz (kind npz) is checked whole here too, but the run
    references it where it lies (the runtime loads it whole; kind array reads in place).
"""
from __future__ import annotations

import csv
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from typing import TYPE_CHECKING

from engine.data.sources import (IN_PLACE_KINDS, CsvFile, Digits, NpzFile, SyntheticClassification, SyntheticImages,
                                 SyntheticRegression, SyntheticSequence)
from engine.files import ProjectError, real_path, stat_input
from engine.runtime.datasets.base import seeded_split

if TYPE_CHECKING:  # a type only: the project holds its data settings, so data/ sits below it
    from engine.project import Project


@dataclass
class Arrays:
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    task: str  # classification | regression
    n_classes: int | None = None

    def save(self, path: Path) -> None:
        np.savez(path, x_train=self.x_train, y_train=self.y_train, x_val=self.x_val, y_val=self.y_val)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


def _split(x: np.ndarray, y: np.ndarray, val_fraction: float, seed: int, task: str, n_classes=None) -> Arrays:
    train, val = seeded_split(len(x), val_fraction, seed)
    if len(train) < 1:
        raise ProjectError(f"training.dataset: {len(x)} samples leave nothing to train on with val_fraction "
                           f"{val_fraction}")
    return Arrays(x[train], y[train], x[val], y[val], task, n_classes)


def _classification(d: SyntheticClassification) -> Arrays:
    rng = np.random.default_rng(d.seed)
    centers = rng.normal(size=(d.n_classes, d.n_features)) * 1.5
    y = rng.integers(0, d.n_classes, size=d.n_samples)
    x = centers[y] + d.noise * rng.normal(size=(d.n_samples, d.n_features))
    return _split(x.astype(np.float32), y.astype(np.int64), d.val_fraction, d.seed, "classification", d.n_classes)


def _regression(d: SyntheticRegression) -> Arrays:
    rng = np.random.default_rng(d.seed)
    x = rng.normal(size=(d.n_samples, d.n_features))
    w1 = rng.normal(size=(d.n_features, 32)) / np.sqrt(d.n_features)
    w2 = rng.normal(size=(32, d.n_targets)) / np.sqrt(32)
    y = np.tanh(x @ w1) @ w2 + d.noise * rng.normal(size=(d.n_samples, d.n_targets))
    return _split(x.astype(np.float32), y.astype(np.float32), d.val_fraction, d.seed, "regression")


def _sequence(d: SyntheticSequence) -> Arrays:
    """Each class prefers its own slice of the vocabulary: token i of a sequence comes
    from the class's slice with probability 1/2, else from the whole vocabulary."""
    rng = np.random.default_rng(d.seed)
    if d.task == "next_token":
        return _next_token(d, rng)
    y = rng.integers(0, d.n_classes, size=d.n_samples)
    width = max(1, d.vocab_size // d.n_classes)
    own = (y[:, None] * width + rng.integers(0, width, size=(d.n_samples, d.seq_len))) % d.vocab_size
    anyt = rng.integers(0, d.vocab_size, size=(d.n_samples, d.seq_len))
    x = np.where(rng.random((d.n_samples, d.seq_len)) < 0.5, own, anyt)
    return _split(x.astype(np.int64), y.astype(np.int64), d.val_fraction, d.seed, "classification", d.n_classes)


def _next_token(d: SyntheticSequence, rng) -> Arrays:
    """Sequences of a seeded random Markov chain (each token has 2 likely successors);
    the target of position t is token t + 1, so a language model can learn it."""
    succ = rng.integers(0, d.vocab_size, size=(d.vocab_size, 2))
    seq = np.empty((d.n_samples, d.seq_len + 1), dtype=np.int64)
    seq[:, 0] = rng.integers(0, d.vocab_size, size=d.n_samples)
    for t in range(d.seq_len):
        pick = succ[seq[:, t], rng.integers(0, 2, size=d.n_samples)]
        noise = rng.integers(0, d.vocab_size, size=d.n_samples)
        seq[:, t + 1] = np.where(rng.random(d.n_samples) < 0.9, pick, noise)
    return _split(seq[:, :-1], seq[:, 1:], d.val_fraction, d.seed, "classification", d.vocab_size)


def _images(d: SyntheticImages) -> Arrays:
    """One smooth random template per class plus noise."""
    rng = np.random.default_rng(d.seed)
    yy, xx = np.meshgrid(np.linspace(0, 1, d.height), np.linspace(0, 1, d.width), indexing="ij")
    templates = np.zeros((d.n_classes, d.channels, d.height, d.width))
    for c in range(d.n_classes):
        for ch in range(d.channels):
            fx, fy, ph = rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0), rng.uniform(0, 2 * np.pi)
            templates[c, ch] = np.sin(2 * np.pi * (fx * xx + fy * yy) + ph)
    y = rng.integers(0, d.n_classes, size=d.n_samples)
    x = templates[y] + d.noise * rng.normal(size=(d.n_samples, d.channels, d.height, d.width))
    return _split(x.astype(np.float32), y.astype(np.int64), d.val_fraction, d.seed, "classification", d.n_classes)


def _digits(d: Digits) -> Arrays:
    from sklearn.datasets import load_digits  # ships with scikit-learn: no download

    ds = load_digits()
    x = (ds.data / 16.0).astype(np.float32)
    if d.image:
        x = x.reshape(-1, 1, 8, 8)
    return _split(x, ds.target.astype(np.int64), d.val_fraction, d.seed, "classification", 10)


def _task_of(y: np.ndarray) -> tuple[str, int | None]:
    if np.issubdtype(y.dtype, np.integer):
        return "classification", int(y.max()) + 1 if y.size else 0
    return "regression", None


# ----- bounds of a set made whole here ----------------------------------------------------
DEFAULT_MAX_DATA_MB = 2048  # a set made whole in memory (and copied into the run folder)
CSV_FIELD_LIMIT = 1 << 20  # characters in one CSV field (the csv module's default is 128 KiB)


def max_data_bytes() -> int:
    """Bytes a data set made whole here may hold: $LAYERFLOW_MAX_DATA_MB, else 2 GB."""
    try:
        mb = float(os.environ.get("LAYERFLOW_MAX_DATA_MB", DEFAULT_MAX_DATA_MB))
    except ValueError:
        mb = DEFAULT_MAX_DATA_MB
    return int((mb if mb > 0 else DEFAULT_MAX_DATA_MB) * 2 ** 20)


_PACK = "or pack the set to .npy with `layerflow data pack` and read it in place, kind 'array'"


def _check_bytes(nbytes: int, what: str, field: str = "training.dataset", instead: str = _PACK) -> None:
    most = max_data_bytes()
    if nbytes > most:
        raise ProjectError(f"{field}: {what} would take {nbytes / 2 ** 30:,.1f} GB in memory, more than the limit of "
                           f"{most / 2 ** 30:,.1f} GB for a data set made whole here (raise it with "
                           f"LAYERFLOW_MAX_DATA_MB, {instead})")


def synthetic_bytes(d) -> int | None:
    """Bytes the arrays of a synthetic set hold once made (float32 samples, int64 labels
    and tokens; generating them takes a few times that for a moment); None for files."""
    if isinstance(d, SyntheticClassification):
        return d.n_samples * (d.n_features * 4 + 8)
    if isinstance(d, SyntheticRegression):
        return d.n_samples * (d.n_features + d.n_targets) * 4
    if isinstance(d, SyntheticSequence):
        return d.n_samples * (d.seq_len + 1) * 8 * 2
    if isinstance(d, SyntheticImages):
        return d.n_samples * (d.channels * d.height * d.width * 4 + 8)
    return None


def check_synthetic(d) -> None:
    """Refuse synthetic sizes whose arrays would not fit (1e7 samples x 1e5 features: 8 TB),
    naming the fields, before anything is allocated."""
    n = synthetic_bytes(d)
    if n is None:
        return
    sizes = {k: v for k, v in d.model_dump().items()
             if k in ("n_samples", "n_features", "n_targets", "seq_len", "channels", "height", "width")}
    _check_bytes(n, f"{d.kind} of {', '.join(f'{k}={v:,}' for k, v in sizes.items())}",
                 instead=f"or lower {' or '.join(sizes)}")


def _npy_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array's shape and dtype in an .npz, from its header alone (nothing is unpacked):
    a header that claims more than its member holds, or pickled objects, are refused."""
    import zipfile

    out = {}
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            if not info.filename.endswith(".npy"):
                continue
            name = info.filename[:-4]
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(f)
            if dtype.hasobject:
                raise ProjectError(f"training.dataset.path: {path}: array '{name}' holds Python objects (pickled), "
                                   "which are never read; save arrays of numbers (np.savez with numeric arrays)")
            nbytes = math.prod(shape) * dtype.itemsize
            if nbytes > info.file_size:
                raise ProjectError(f"training.dataset.path: {path}: array '{name}' claims shape {list(shape)} "
                                   f"({nbytes:,} bytes) but its member holds {info.file_size:,} bytes; the file is "
                                   "damaged or not what it says")
            out[name] = (shape, dtype)
    return out


def _npz(d: NpzFile, path: Path) -> Arrays:
    import zipfile

    try:
        headers = _npy_headers(path)
    except ProjectError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError) as exc:
        raise ProjectError(f"training.dataset.path: cannot read {path}: {exc}") from None
    keys = set(headers)
    wanted = ["x_train", "y_train", "x_val", "y_val"] if {"x_train", "y_train", "x_val", "y_val"} <= keys else ["x", "y"]
    _check_bytes(sum(math.prod(headers[k][0]) * headers[k][1].itemsize for k in wanted if k in headers),
                 f"{path} unpacked", "training.dataset.path")
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ProjectError(f"training.dataset.path: cannot read {path}: {exc}") from None
    try:
        return _npz_arrays(d, path, z, keys)
    except ProjectError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ProjectError(f"training.dataset.path: cannot read {path}: {exc}") from None


def _npz_arrays(d: NpzFile, path: Path, z, keys: set) -> Arrays:
    if {"x_train", "y_train", "x_val", "y_val"} <= keys:
        task, nc = _task_of(z["y_train"])
        return Arrays(z["x_train"], z["y_train"], z["x_val"], z["y_val"], task, nc)
    if {"x", "y"} <= keys:
        x, y = z["x"], z["y"]
        if len(x) != len(y):
            raise ProjectError(f"training.dataset.path: {path}: x has {len(x)} rows but y has {len(y)}")
        task, nc = _task_of(y)
        return _split(x, y, d.val_fraction, d.seed, task, nc)
    raise ProjectError(f"training.dataset.path: {path} holds {sorted(keys)}; expected x and y (or x_train, y_train, x_val, y_val)")


def _csv(d: CsvFile, path: Path) -> Arrays:
    _check_bytes(os.path.getsize(path) * 8, f"{path} (read as numbers)", "training.dataset.path")
    old_limit = csv.field_size_limit(CSV_FIELD_LIMIT)
    rows: list[list[str]] = []
    reader = None
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            rows.extend(reader)
    except OSError as exc:
        raise ProjectError(f"training.dataset.path: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raw = path.read_bytes()
        try:
            raw.decode("utf-8")
            at, line = 0, len(rows) + 1
        except UnicodeDecodeError as exc:
            at, line = raw[exc.start], raw.count(b"\n", 0, exc.start) + 1
        raise ProjectError(f"training.dataset.path: {path} is not UTF-8 text (line {line} holds byte {at:#04x}); "
                           "a CSV file holds text: give a CSV, or an .npz for arrays") from None
    except csv.Error as exc:
        line = reader.line_num if reader is not None else len(rows) + 1
        raise ProjectError(f"training.dataset.path: {path}: line {line}: {exc} (a field holds at most "
                           f"{CSV_FIELD_LIMIT:,} characters and no NUL byte)") from None
    finally:
        csv.field_size_limit(old_limit)
    header = rows.pop(0) if d.header and rows else None
    rows = [r for r in rows if r]
    if not rows:
        raise ProjectError(f"training.dataset.path: {path} has no data rows")
    if isinstance(d.target, str):
        if not header or d.target not in header:
            raise ProjectError(f"training.dataset.target: column '{d.target}' is not in the header of {path}")
        t = header.index(d.target)
    else:
        t = d.target % len(rows[0])
    xs, ys = [], []
    for i, r in enumerate(rows, start=2 if header else 1):
        if len(r) != len(rows[0]):
            raise ProjectError(f"{path}: line {i} has {len(r)} columns, expected {len(rows[0])}")
        try:
            xs.append([float(v) for j, v in enumerate(r) if j != t])
            ys.append(r[t])
        except ValueError as exc:
            raise ProjectError(f"{path}: line {i}: {exc}") from None
    x = np.asarray(xs, dtype=np.float32)
    if d.task == "classification":
        labels = sorted(set(ys), key=lambda s: (len(s), s))
        try:  # numeric labels keep their numeric order
            labels = sorted(set(ys), key=float)
        except ValueError:
            pass
        index = {lab: k for k, lab in enumerate(labels)}
        y = np.asarray([index[v] for v in ys], dtype=np.int64)
        return _split(x, y, d.val_fraction, d.seed, "classification", len(labels))
    try:
        y = np.asarray([float(v) for v in ys], dtype=np.float32)[:, None]
    except ValueError as exc:
        raise ProjectError(f"{path}: target column is not numeric: {exc}") from None
    return _split(x, y, d.val_fraction, d.seed, "regression")


def _checked(a: Arrays, path: str) -> Arrays:
    """A user's arrays hold numbers, one label or target per sample, no negative class."""
    where = f"training.dataset.path: {path}"
    for name in ("x_train", "y_train", "x_val", "y_val"):
        v = getattr(a, name)
        if v.ndim == 0:
            raise ProjectError(f"{where}: {name} is a single value, not one entry per sample")
        if v.dtype.kind not in "biuf":
            raise ProjectError(f"{where}: {name} holds {v.dtype} values; it must hold numbers (integers or floats)")
        if v.dtype.kind == "f" and not np.isfinite(v).all():
            raise ProjectError(f"{where}: {name} holds NaN or infinite values")
    for x, y, part in ((a.x_train, a.y_train, "train"), (a.x_val, a.y_val, "val")):
        if len(x) != len(y):
            raise ProjectError(f"{where}: x_{part} has {len(x)} samples but y_{part} has {len(y)}")
        if x.ndim < 2 and x.size:
            raise ProjectError(f"{where}: x_{part} has shape {list(x.shape)}; give one row of features per sample")
    if a.task == "classification" and (a.y_train.size and a.y_train.min() < 0 or a.y_val.size and a.y_val.min() < 0):
        low = min(a.y_train.min() if a.y_train.size else 0, a.y_val.min() if a.y_val.size else 0)
        raise ProjectError(f"{where}: class labels must be 0 or more, but the smallest is {low}")
    return a


def sample_shape(d) -> tuple[list[int], str] | None:
    """(shape of one sample, dtype) of a data set, from its settings alone (nothing is
    read or generated); None for files, whose shape is known only once read."""
    if isinstance(d, (SyntheticClassification, SyntheticRegression)):
        return [d.n_features], "float32"
    if isinstance(d, SyntheticSequence):
        return [d.seq_len], "int64"
    if isinstance(d, SyntheticImages):
        return [d.channels, d.height, d.width], "float32"
    if isinstance(d, Digits):
        return ([1, 8, 8] if d.image else [64]), "float32"
    return None


def load_arrays(project: Project) -> Arrays:
    d = project.training.dataset
    check_synthetic(d)
    if isinstance(d, SyntheticClassification):
        return _classification(d)
    if isinstance(d, SyntheticRegression):
        return _regression(d)
    if isinstance(d, SyntheticSequence):
        return _sequence(d)
    if isinstance(d, SyntheticImages):
        return _images(d)
    if isinstance(d, Digits):
        return _digits(d)
    if isinstance(d, NpzFile):
        return _checked(_npz(d, project.input_file(d.path, "training.dataset.path")), d.path)
    if isinstance(d, CsvFile):
        return _checked(_csv(d, project.input_file(d.path, "training.dataset.path")), d.path)
    raise ProjectError(f"training.dataset: unknown kind {getattr(d, 'kind', d)!r}")


# ----- what the diagram is checked against -------------------------------------------
@dataclass
class DataInfo:
    """A data set as the builder checks it against the diagram: one sample's shape and
    dtype, the task, classes (or vocabulary), split sizes; `source` and `fingerprint` for
    a set read in place (None: `arrays`, made whole here)."""
    sample_shape: tuple[int, ...]
    x_dtype: str  # numpy/torch dtype name of an input sample: float32, int64, ...
    task: str
    n_classes: int | None
    n_train: int
    n_val: int
    max_token: int | None = None  # largest id of an integer input, where known without a scan
    inputs: dict | None = None  # several named inputs (tokens + attention mask): {name: (shape, dtype)}
    source: dict | None = None
    fingerprint: dict | None = None
    arrays: Arrays | None = None
    target_shape: tuple[int, ...] | None = None  # one sample's target ((): a label; (T,): one per position)


def source_settings(project: Project) -> dict | None:
    """training.dataset's settings as the runtime reads them (runtime/datasets open_source),
    its path absolute, when the set is read in place; None for sets made whole here. A
    path outside the project's folder needs the user's consent (engine/trust.py): a
    project file must not make Layerflow read, and upload, what the user did not choose."""
    from engine import trust

    d = project.training.dataset
    if d.kind not in IN_PLACE_KINDS:  # (an "npz" is made whole, as before; kind "array" reads one in place)
        return None
    settings = d.model_dump(mode="json")
    path = project.resolve_path(settings["path"])
    trust.check_file(project, path, "training.dataset.path")
    mode = stat_input(path, "training.dataset.path").st_mode  # missing, or a symlink loop: named
    if not stat.S_ISDIR(mode) and not stat.S_ISREG(mode):  # a FIFO would block the reader, a device never end
        raise ProjectError(f"training.dataset.path: {path} is not a regular file or a folder")
    settings["path"] = str(real_path(path))
    return settings


def describe_source(settings: dict, *, with_fingerprint: bool = True) -> DataInfo:
    """Open both splits of a set read in place and read one sample (nothing else is read;
    the fingerprint reads each file's first and last 64 KiB)."""
    from engine.runtime.datasets import DataError, fingerprint, open_source

    try:
        train, val = open_source(settings, "train"), open_source(settings, "val")
        spec = train.sample_spec()
        fp = fingerprint(settings) if with_fingerprint else None
    except DataError as exc:
        raise ProjectError(f"training.dataset: {exc}") from None
    except OSError as exc:
        raise ProjectError(f"training.dataset.path: {settings['path']}: {exc.strerror or exc}") from None
    x = spec["x"]
    if "shape" not in x:  # several named inputs: each feeds the Input node of its name
        first = next(iter(x.values()))
        return DataInfo(tuple(first["shape"]), first["dtype"], train.task, train.n_classes, len(train), len(val),
                        None, {k: (tuple(v["shape"]), v["dtype"]) for k, v in x.items()}, settings, fp,
                        target_shape=tuple(spec["y"]["shape"]))
    return DataInfo(tuple(x["shape"]), x["dtype"], train.task, train.n_classes, len(train), len(val),
                    None, None, settings, fp, target_shape=tuple(spec["y"]["shape"]))


def describe(project: Project) -> DataInfo:
    """The project's data set, checked and described (ProjectError names the field). The
    user's .npz (kind npz) is read in place like kind array: scanned here in chunks (never
    whole), then referenced where it lies (the run folder holds no copy; a deploy uploads
    it once, by fingerprint)."""
    settings = source_settings(project)
    if settings is not None:
        return describe_source(settings)
    d = project.training.dataset
    if isinstance(d, NpzFile):
        return _describe_npz(project, d)
    return info_of(load_arrays(project))


SCAN_BYTES = 64 << 20  # an .npz is checked this much at a time


def _describe_npz(project: Project, d: NpzFile) -> DataInfo:
    """Kind npz read in place: the headers checked (no pickles, no claims past the file),
    compressed members (held whole on every rank) bounded as a set made whole is, then
    every array scanned a chunk at a time for what a run cannot take (values that are
    not finite, negative class labels), and the largest token id found."""
    import zipfile

    from engine import trust

    field = "training.dataset.path"
    path = project.resolve_path(d.path)
    trust.check_file(project, path, field)
    if not stat.S_ISREG(stat_input(path, field).st_mode):
        raise ProjectError(f"{field}: {path} is not a regular file (a device, FIFO or folder is never read)")
    try:
        headers = _npy_headers(path)
        with zipfile.ZipFile(path) as z:
            packed = sum(math.prod(headers[i.filename[:-4]][0]) * headers[i.filename[:-4]][1].itemsize
                         for i in z.infolist() if i.compress_type != zipfile.ZIP_STORED and i.filename[:-4] in headers)
    except ProjectError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError) as exc:
        raise ProjectError(f"{field}: cannot read {path}: {exc}") from None
    for name, (shape, dtype) in headers.items():
        if name in ("x", "y", "x_train", "y_train", "x_val", "y_val") and dtype.kind not in "biuf":
            raise ProjectError(f"{field}: {path}: {name} holds {dtype} values; it must hold numbers (integers or floats)")
        if name.startswith("x") and len(shape) < 2:
            raise ProjectError(f"{field}: {path}: {name} has shape {list(shape)}; give one row of features per sample")
    _check_bytes(packed, f"{path}'s compressed arrays, unpacked (each rank holds them)", field,
                 instead="or save it with np.savez (not compressed), whose arrays are read in place")
    settings = {**d.model_dump(mode="json"), "path": str(real_path(path))}
    info = describe_source(settings)
    info.max_token = _scan_npz(settings, path, info.task)
    return info


def _scan_npz(settings: dict, path: Path, task: str) -> int | None:
    """Checks every value of the arrays a run reads, a chunk at a time; the largest integer
    input (token id), or None for float inputs."""
    from engine.runtime.datasets import DataError, open_source

    where = f"training.dataset.path: {path}"
    top, seen = None, set()
    try:
        for split in ("train", "val"):
            src = open_source(settings, split)
            for rows, is_y in ((src.x, False), (src.y, True)):
                if rows.name in seen:
                    continue
                seen.add(rows.name)
                a = src._map(rows)
                step = max(1, SCAN_BYTES // max(1, rows.row_bytes))
                for lo in range(0, len(a), step):
                    chunk = np.asarray(a[lo:lo + step])
                    if chunk.dtype.kind == "f" and not np.isfinite(chunk).all():
                        raise ProjectError(f"{where}: {rows.name} holds NaN or infinite values")
                    if is_y and task == "classification" and chunk.size and chunk.min() < 0:
                        raise ProjectError(f"{where}: class labels must be 0 or more, but {rows.name} holds "
                                           f"{chunk.min()}")
                    if not is_y and chunk.dtype.kind in "iu" and chunk.size:
                        top = max(top or 0, int(chunk.max()))
    except DataError as exc:
        raise ProjectError(f"training.dataset: {exc}") from None
    except OSError as exc:
        raise ProjectError(f"{where}: {exc.strerror or exc}") from None
    return top


def info_of(a: Arrays) -> DataInfo:
    top = None
    if a.x_train.dtype.kind in "iu":  # token ids: the largest must fit every Embedding
        top = max(int(a.x_train.max()) if a.x_train.size else 0, int(a.x_val.max()) if a.x_val.size else 0)
    return DataInfo(a.sample_shape, str(a.x_train.dtype), a.task, a.n_classes, len(a.x_train), len(a.x_val),
                    top, arrays=a, target_shape=tuple(a.y_train.shape[1:]))
