"""Consent before a project's code runs.

A project file can name Python code: a Custom node's `path` ('package.module:Class')
is imported and called. Loading, validating, summarising, drawing and planning a
project must never run that code on their own, since projects travel (git,
colleagues, downloaded examples). So a Custom path is imported only when

- it is a torch.nn layer class (`torch.nn:Hardswish`): torch's own code, or
- the user consented to this project's exact set of code paths, once, remembered in
  their config folder (never in the project): `layerflow trust PROJECT`, `--trust`
  on any command, or the GUI's prompt. A changed set of paths asks again.

Generic Op nodes (engine/runtime/ops.py) name only ATen operators and need no consent.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from contextvars import ContextVar
from pathlib import Path
from typing import Iterable, Iterator

_ALLOWED: ContextVar[frozenset[str]] = ContextVar("layerflow_allowed_code", default=frozenset())
_PROCESS: set[str] = set()  # consented in this process (the GUI; its worker threads see it too)


def config_home() -> Path:
    """$LAYERFLOW_CONFIG_DIR when set (tests), else the platform's user config folder."""
    env = os.environ.get("LAYERFLOW_CONFIG_DIR") or os.environ.get("LAYERFLOW_HOME")
    if env:
        return Path(env)
    from platformdirs import user_config_dir

    return Path(user_config_dir("layerflow", appauthor=False))


def is_torch_layer(path: str) -> bool:
    """'torch.nn:Name' naming an nn.Module class of torch.nn (checked without importing anything)."""
    mod, _, attr = path.partition(":")
    if mod != "torch.nn" or not attr.isidentifier():
        return False
    import torch.nn as nn

    obj = getattr(nn, attr, None)
    return isinstance(obj, type) and issubclass(obj, nn.Module)


def code_paths(graph) -> list[str]:
    """The import paths of a diagram that would run code not from torch."""
    paths = {str(n.params.get("path") or "") for n in graph.nodes.values() if n.type == "Custom"}
    return sorted(p for p in paths if p and not is_torch_layer(p))


def allowed(path: str) -> bool:
    return is_torch_layer(path) or path in _ALLOWED.get() or path in _PROCESS


def allow_in_process(paths: Iterable[str]) -> None:
    """The project open in this process (the GUI) may run these paths, and only these:
    opening another project replaces them (call with nothing to allow nothing)."""
    _PROCESS.clear()
    _PROCESS.update(paths)


@contextlib.contextmanager
def allowing(paths: Iterable[str]) -> Iterator[None]:
    """Within this block, these code paths may be imported and run."""
    token = _ALLOWED.set(_ALLOWED.get() | frozenset(paths))
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def _store() -> Path:
    return config_home() / "trust.json"


def _key(project_path: str | os.PathLike) -> str:
    return str(Path(project_path).resolve())


def fingerprint(paths: Iterable[str]) -> str:
    return hashlib.sha256(json.dumps(sorted(set(paths))).encode()).hexdigest()


def _read() -> dict:
    try:
        data = json.loads(_store().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def is_trusted(project_path: str | os.PathLike, paths: Iterable[str]) -> bool:
    """The user consented to exactly these code paths for this project file."""
    paths = list(paths)
    return not paths or _read().get(_key(project_path)) == fingerprint(paths)


def trust(project_path: str | os.PathLike, paths: Iterable[str]) -> None:
    """Remember the user's consent (written atomically to their config folder)."""
    from engine.project import atomic_write

    data = _read()
    data[_key(project_path)] = fingerprint(paths)
    store = _store()
    store.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(store, json.dumps(data, indent=1, sort_keys=True).encode())


@contextlib.contextmanager
def as_consented(project) -> Iterator[None]:
    """Run a block with the project's code allowed if (and only if) the user trusted it."""
    paths = code_paths(project.graph)
    ok = project.path is not None and paths and is_trusted(project.path, paths)
    with allowing(paths if ok else ()):
        yield
