"""Checkpoints through torch.distributed.checkpoint (DCP).

DCP stores every tensor under its fully qualified name (node id + parameter name:
the same in every layout, since pipeline stages keep the model's names) together
with how it was sharded. Loading asks each rank for the tensors *it* holds, in
*its* layout, and DCP reads the right slices: a checkpoint saved with dp=2 loads
with pp=2, with tp=2, or in one process without any process group.

    checkpoints/step_N/.metadata, __*_*.distcp   model + optimizer (DCP)
    checkpoints/step_N/extra.pt                  scheduler, RNG, step, metrics offset (rank 0)

Both trainers write this one format (the single-process one without a process group);
runs written before that hold checkpoints/step_N/state.pt (plain torch.save), which
`load` reads too, so such a run can still be resumed, on one process or several.

A run folder travels (fetched from a cluster, shared by a colleague), so nothing in a
checkpoint may run code when it is read: `load` is the one reader, and it unpickles
nothing but tensors and plain values. extra.pt and state.pt load with
`weights_only=True` (numpy's RNG state is written as a tensor; older files' ndarray is
let through by exactly the numpy globals that rebuild one); DCP's .metadata goes
through an unpickler that knows only DCP's metadata classes, torch sizes, dtypes and
layouts, and the values DCP keeps as bytes load with `weights_only=True` too (torch's
own reader and planner unpickle both without a check). Anything else is refused with
UnsafeCheckpoint, one line naming the file.
"""
from __future__ import annotations

import contextlib
import errno
import io
import os
import pickle
import re
import shutil
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

EXTRA = "extra.pt"


class UnsafeCheckpoint(ValueError):
    """A checkpoint file that names Python objects beyond tensors and plain values (which
    could run code when unpickled) or that cannot be read as a checkpoint; never loaded."""


def is_dcp(path: Path) -> bool:
    return (Path(path) / ".metadata").exists()


def save(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, extra: dict, *, write_extra: bool) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    msd, osd = get_state_dict(model, optimizer)
    try:
        with _alone():
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path), no_dist=not dist.is_initialized())
    except CheckpointException as exc:
        full = _disk_full(exc, path)
        if full is not None:  # the run ends as "disk full" with its latest whole checkpoint named
            raise full from exc
        raise
    if write_extra:
        from .loop import save_tensors

        save_tensors(_encoded(extra), path / EXTRA)  # (a full disk: OSError ENOSPC, not torch's "unexpected pos")
    if dist.is_initialized():
        dist.barrier()  # `latest` may name this folder only once every rank has written


class PendingSave:
    """A checkpoint being written behind the training steps (save_async): its tensors were
    copied when it started; `done` says whether the files are whole, `wait` blocks until
    they are (and raises what the save raised, a full disk as OSError(ENOSPC))."""

    def __init__(self, path: Path, future):
        self.path, self.future, self.started = Path(path), future, time.perf_counter()

    def done(self) -> bool:
        return self.future.done()

    def then(self, fn) -> PendingSave:
        """`fn()` run by a thread of its own once the files are whole (and only if the save
        succeeded); done() and wait() then cover both."""
        import concurrent.futures
        import threading

        first, after = self.future, concurrent.futures.Future()

        def go() -> None:
            try:
                first.result()
                fn()
            except BaseException as exc:  # noqa: BLE001  (wait() raises it in the loop's thread)
                after.set_exception(exc)
            else:
                after.set_result(None)

        threading.Thread(target=go, name="layerflow-checkpoint-after", daemon=True).start()
        self.future = after
        return self

    def wait(self) -> None:
        try:
            self.future.result()
        except CheckpointException as exc:
            full = _disk_full(exc, self.path)
            if full is not None:
                raise full from exc
            raise


def save_async(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, extra: dict, *, write_extra: bool,
               group=None) -> PendingSave:
    """save's format, written by a thread while training goes on (torch.distributed.checkpoint
    async_save: the state is staged, copied to host memory, before this returns). `group`: a
    process group of its own for the writers' collectives (never the one the steps use: two
    threads on one gloo group interleave their messages). The small extra state is written now."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    msd, osd = get_state_dict(model, optimizer)
    if write_extra:
        from .loop import save_tensors

        save_tensors(_encoded(extra), path / EXTRA)
    if not dist.is_initialized():  # (its writer thread warns outside _alone too)
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
    with _alone():
        future = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=str(path), process_group=group,
                                no_dist=not dist.is_initialized())
    future = getattr(future, "upload_completion", future)  # (an AsyncSaveResponse with an async stager)
    return PendingSave(path, future)


@contextlib.contextmanager
def _alone():
    """DCP warns on every save and load without a process group; one process is meant here."""
    with warnings.catch_warnings():
        if not dist.is_initialized():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


def _disk_full(exc: CheckpointException, path: Path) -> OSError | None:
    """The full disk behind a failed DCP save, as OSError(ENOSPC). DCP gathers every rank's
    failure into one CheckpointException: a rank that failed opening a file says ENOSPC;
    one that failed inside torch.save says only "unexpected pos" (torch's zip writer loses
    the errno), so that one counts as a full disk when the disk has (almost) no room left."""
    failures = getattr(exc, "failures", {}) or {}
    for err in (v[0] if isinstance(v, tuple) else v for v in failures.values()):
        seen = set()
        while err is not None and id(err) not in seen:
            seen.add(id(err))
            if isinstance(err, OSError) and err.errno in DISK_FULL:
                return OSError(err.errno, os.strerror(err.errno), err.filename or str(path))
            err = err.__cause__ or err.__context__
    if any("unexpected pos" in str(v[0] if isinstance(v, tuple) else v) for v in failures.values()):
        try:
            free = shutil.disk_usage(path).free
        except OSError:
            return None
        if free < 1 << 20:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return None


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
         aliases: dict[str, list[str]] | None = None) -> dict:
    """Fill model and optimizer from a DCP or a single-process checkpoint; returns
    the extra state (step, scheduler, rng...). Reads tensors and plain values only:
    UnsafeCheckpoint for a file that holds anything else. aliases: a tied parameter's
    other names (runtime/tied.py): its optimizer state is read under whichever name the
    checkpoint has it (one process keeps it under the first name only, a pipeline stage
    under its own)."""
    path = Path(path)
    if is_dcp(path):
        meta = read_metadata(path / ".metadata")  # checked here, before DCP reads it on its own
        msd, osd = get_state_dict(model, optimizer)
        renamed = _aliased_optim_state(osd, set(meta.state_dict_metadata), aliases or {})
        own = [list(g["params"]) for g in osd.get("param_groups", [])]  # this model's names, whoever wrote the file
        state = {"model": msd, "optim": osd}
        try:
            with _alone():
                dcp.load(state, storage_reader=_SafeReader(path), planner=_SafePlanner(path),
                         no_dist=not dist.is_initialized())
        except CheckpointException as exc:
            refused = _refusal(exc)
            if refused is not None:
                raise refused from None
            raise
        for mine, theirs in renamed.items():  # back under this model's names
            state["optim"]["state"][mine] = state["optim"]["state"].pop(theirs)
        for g, names in zip(state["optim"].get("param_groups", []), own):
            g["params"] = names
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        return _decoded(_load_tensors(path / EXTRA))
    single = path / "state.pt"
    if not single.exists():
        raise FileNotFoundError(f"{path} holds no checkpoint (neither .metadata nor state.pt)")
    state = _decoded(_load_tensors(single))
    _load_full(model, optimizer, state["model"], state["optimizer"])
    return state


def _aliased_optim_state(osd: dict, saved: set[str], aliases: dict[str, list[str]]) -> dict[str, str]:
    """Move the optimizer state of a parameter the checkpoint holds under another of its
    names to that name (DCP reads by key); returns {this model's name: the checkpoint's}."""
    renamed: dict[str, str] = {}
    if not aliases:
        return renamed
    have = {k[len("optim.state."):].rsplit(".", 1)[0] for k in saved if k.startswith("optim.state.")}
    for fqn in list(osd.get("state", {})):
        if fqn in have:
            continue
        other = next((a for a in aliases.get(fqn, []) if a not in osd["state"] and a in have), None)
        if other is not None:
            osd["state"][other] = osd["state"].pop(fqn)
            renamed[fqn] = other
    return renamed


# ----- reading without running anything ---------------------------------------------
def check_latest(run_dir: Path) -> None:
    """The run folder's latest checkpoint read as `load` reads it, without a model (its
    .metadata, extra.pt or state.pt): what the command line asks before it starts a
    resume on any number of processes, so a refusal is one line, before anything runs."""
    marker = Path(run_dir) / "checkpoints" / "latest"
    name = marker.read_text().strip() if marker.is_file() else ""
    path = Path(run_dir) / "checkpoints" / name
    if not name or not path.is_dir():
        return  # nothing to resume from: the loop says so
    if is_dcp(path):
        read_metadata(path / ".metadata")
        if (path / EXTRA).is_file():
            _load_tensors(path / EXTRA)
    elif (path / "state.pt").is_file():
        _load_tensors(path / "state.pt")


def _numpy_globals() -> list:
    """What rebuilds an ndarray (the RNG state older checkpoints hold), and nothing else."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return [(_reconstruct, "numpy._core.multiarray._reconstruct"),
            (_reconstruct, "numpy.core.multiarray._reconstruct"),
            (np.ndarray, "numpy.ndarray"), (np.dtype, "numpy.dtype"),
            type(np.dtype(np.uint32))]  # the keys' dtype (numpy.dtypes.UInt32DType), whose state is set


def _load_tensors(file: Path):
    """torch.load with weights_only=True (plus numpy's ndarray for older RNG states)."""
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise _unsafe(file, _globals_named(file, exc)) from None
    except (RuntimeError, EOFError, ValueError, zipfile.BadZipFile, KeyError) as exc:  # truncated, not torch at all
        raise UnsafeCheckpoint(f"{file}: cannot read it as a checkpoint: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def _unsafe(file: Path, names: list[str]) -> UnsafeCheckpoint:
    what = f" ({', '.join(names[:5])})" if names else ""
    return UnsafeCheckpoint(
        f"{file}: not loaded: it holds Python objects{what} that a checkpoint never needs and that would run "
        "code when read; this run folder is not trusted (copied from elsewhere, or altered): resume from "
        "a checkpoint Layerflow wrote, or start the run again")


def _globals_named(file: Path, exc: Exception) -> list[str]:
    """The globals a refused file names (read from its opcodes, nothing run)."""
    from .model import pickled_globals

    allowed = {g[1] for g in _numpy_globals() if isinstance(g, tuple)}
    names = [g for g in pickled_globals(file, limit=10) if g not in allowed]
    return names or re.findall(r"GLOBAL ([\w.]+)", str(exc))[:1]  # (else the unpickler's own words)


def _encoded(extra: dict) -> dict:
    """extra.pt as tensors and plain values: numpy's RNG state (a tuple with an ndarray)
    becomes a dict with a tensor (Python's is a tuple of ints already)."""
    rng = extra.get("rng")
    if not isinstance(rng, dict) or not isinstance(rng.get("numpy"), tuple):
        return extra
    name, keys, pos, has_gauss, cached = rng["numpy"]
    numpy_state = {"algorithm": str(name), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                   "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return {**extra, "rng": {**rng, "numpy": numpy_state}}


def _decoded(state: dict) -> dict:
    """_encoded undone: numpy's RNG state as np.random.set_state takes it."""
    rng = state.get("rng") if isinstance(state, dict) else None
    if isinstance(rng, dict) and isinstance(rng.get("numpy"), dict):
        n = rng["numpy"]
        keys = np.asarray(n["keys"].numpy(), dtype=np.uint32)
        rng = {**rng, "numpy": (n["algorithm"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"])}
        state = {**state, "rng": rng}
    return state


def _metadata_globals() -> dict[tuple[str, str], object]:
    """The globals a DCP .metadata may name: DCP's own metadata records (dataclasses and
    enums), torch.Size, dtypes, layouts and memory formats, and the checkpoint's path."""
    import dataclasses
    import enum
    import importlib
    import pathlib

    out: dict[tuple[str, str], object] = {}
    for mod_name in ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
                     "torch.distributed.checkpoint.planner"):
        mod = importlib.import_module(mod_name)
        for name, obj in vars(mod).items():
            if isinstance(obj, type) and obj.__module__ == mod_name and (
                    dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
                out[(mod_name, name)] = obj
    for name, obj in vars(torch).items():
        if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
            out[("torch", name)] = obj
    out[("torch", "Size")] = torch.Size
    out[("torch.serialization", "_get_layout")] = torch.serialization._get_layout  # a layout by its name
    for cls in (pathlib.PosixPath, pathlib.PurePosixPath, pathlib.WindowsPath, pathlib.PureWindowsPath):
        out[("pathlib", cls.__name__)] = cls
    out[("collections", "OrderedDict")] = __import__("collections").OrderedDict
    return out


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, allowed: dict):
        super().__init__(file)
        self.allowed = allowed
        self.refused: list[str] = []

    def find_class(self, module: str, name: str):
        obj = self.allowed.get((module, name))
        if obj is None:
            self.refused.append(f"{module}.{name}")
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a checkpoint's metadata")
        return obj

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent ids are not allowed in a checkpoint's metadata")


def read_metadata(file: Path):
    """A DCP .metadata, unpickled knowing only DCP's metadata types (UnsafeCheckpoint for
    anything else); the data files it names must be plain names inside its folder."""
    from torch.distributed.checkpoint.metadata import Metadata

    file = Path(file)
    data = file.read_bytes()
    u = _MetadataUnpickler(io.BytesIO(data), _metadata_globals())
    try:
        md = u.load()
    except pickle.UnpicklingError:
        raise _unsafe(file, u.refused) from None
    except Exception as exc:  # noqa: BLE001 - truncated, or records of the wrong shape
        raise UnsafeCheckpoint(f"{file}: cannot read it as a checkpoint's metadata: {type(exc).__name__}: {exc}") from None
    if not isinstance(md, Metadata) or not isinstance(md.state_dict_metadata, dict):
        raise UnsafeCheckpoint(f"{file}: cannot read it as a checkpoint's metadata (it holds a {type(md).__name__})")
    for info in (md.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or not rel or rel in (".", "..") or "/" in rel or "\\" in rel or "\0" in rel:
            raise UnsafeCheckpoint(f"{file}: names a data file outside its folder ({rel!r}); not loaded")
    return md


class _SafeReader(FileSystemReader):
    """DCP's file reader with its metadata read by read_metadata."""

    def read_metadata(self, *args, **kwargs):
        from torch.distributed.checkpoint.metadata import StorageMeta

        rank = kwargs.get("rank")
        md = read_metadata(Path(self._get_metadata_path(rank)))
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


class _SafePlanner(DefaultLoadPlanner):
    """DCP's planner, with the values it keeps as bytes (an optimizer's lr, betas, step
    counts) loaded with weights_only=True."""

    def __init__(self, where: Path):
        super().__init__()
        self.where = where

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            names = re.findall(r"GLOBAL ([\w.]+)", str(exc))[:1]
            raise _unsafe(Path(f"{self.where} (its value {read_item.dest_index.fqn})"), names) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def _refusal(exc: CheckpointException) -> UnsafeCheckpoint | None:
    """The UnsafeCheckpoint behind a failed DCP load (DCP gathers every rank's failure)."""
    failures = getattr(exc, "failures", {}) or {}
    for err in (v[0] if isinstance(v, tuple) else v for v in failures.values()):
        seen = set()
        while err is not None and id(err) not in seen:
            seen.add(id(err))
            if isinstance(err, UnsafeCheckpoint):
                return err
            err = err.__cause__ or err.__context__
    return None


def _load_full(model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict, optim_sd: dict) -> None:
    """A whole-model state (trainer.Trainer's) into this rank's part of the model.

    torch.optim keys state by parameter index in the single-process model's order
    (= the full model's named_parameters order); DCP's state_dict API wants names."""
    names = [k for k in model_sd if not _is_buffer_name(k, model_sd)]
    mine = set(get_model_state_dict(model).keys())
    by_name_state = {names[i]: s for i, s in optim_sd["state"].items() if names[i] in mine}
    group = dict(optim_sd["param_groups"][0])
    group["params"] = [n for n in names if n in mine]
    osd = {"state": by_name_state, "param_groups": [group]}
    msd = {k: v for k, v in model_sd.items() if k in mine}
    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd, options=opts)


def _is_buffer_name(name: str, sd: dict) -> bool:
    """BatchNorm running stats and counters are in state_dict but have no optimizer state."""
    return name.endswith(("running_mean", "running_var", "num_batches_tracked"))


def full_model_state(model: nn.Module, *, keep: bool = True, gather_group=None) -> dict | None:
    """The whole model's state_dict as plain CPU tensors (what model.pt holds whatever the
    layout), on the ranks that `keep` it; None on the others.

    One tensor at a time: a sharded one (FSDP2, TP: a DTensor) is gathered whole on the
    device, copied to the host by the ranks that keep it and dropped by the others, so no
    rank ever holds more than one whole tensor beyond what it keeps, and only the keeping
    ranks hold the model in host memory, once. `gather_group` (a pipeline: each stage's
    keeping rank holds its stage only): a gloo group over which the stages' parts go to
    global rank 0, which returns them all (the others return None). Before, every rank
    gathered the whole model and then all-gathered every rank's copy: world x model
    bytes of host memory on each rank."""
    from torch.distributed.tensor import DTensor

    # the layout's own state (no gathering yet), under the model's names (DDP's module.
    # prefix, compile's and checkpointing's wrappers taken off)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
    part: dict = {}
    for k in list(state):
        v = state.pop(k)
        if isinstance(v, DTensor):
            v = v.full_tensor()  # (a collective over the tensor's mesh: every rank of it, in this order)
        if keep:
            part[k] = v.detach().to("cpu")
        del v
    if gather_group is None or not dist.is_initialized() or dist.get_world_size() == 1:
        return part if keep else None
    rank = dist.get_rank()
    parts: list | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(part if keep else None, parts, dst=0, group=gather_group)
    if rank != 0:
        return None
    full: dict = {}
    for p in parts:
        full.update(p or {})
    return full


def load_into_single(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """A DCP checkpoint into one process holding the whole model (no process group)."""
    return load(path, model, optimizer)
