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
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

EXTRA = "extra.pt"


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

        save_tensors(extra, path / EXTRA)  # (a full disk: OSError ENOSPC, not torch's "unexpected pos")
    if dist.is_initialized():
        dist.barrier()  # `latest` may name this folder only once every rank has written


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


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Fill model and optimizer from a DCP or a single-process checkpoint; returns
    the extra state (step, scheduler, rng...)."""
    path = Path(path)
    if is_dcp(path):
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd}
        with _alone():
            dcp.load(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        return torch.load(path / EXTRA, map_location="cpu", weights_only=False)
    single = path / "state.pt"
    if not single.exists():
        raise FileNotFoundError(f"{path} holds no checkpoint (neither .metadata nor state.pt)")
    state = torch.load(single, map_location="cpu", weights_only=False)
    _load_full(model, optimizer, state["model"], state["optimizer"])
    return state


def _load_full(model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict, optim_sd: dict) -> None:
    """A whole-model state (train.Trainer's) into this rank's part of the model.

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


def full_model_state(model: nn.Module) -> dict:
    """The whole model's state_dict on every rank (pipeline stages' parts gathered),
    as plain CPU tensors: what model.pt holds whatever the layout."""
    # (cpu_offload=True would hand the whole state to global rank 0 only, which holds no later stage)
    part = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    part = {k: v.detach().cpu() for k, v in part.items()}
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return part
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, part)
    full: dict = {}
    for p in parts:
        full.update(p)
    return full


def load_into_single(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """A DCP checkpoint into one process holding the whole model (no process group)."""
    return load(path, model, optimizer)
