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

The same consent covers the files a project reads from outside its own folder (a data
set or weights at `/home/me/.ssh/...` or `../../secret.npz`): each is one more entry,
`file:/resolved/path`, in the set the user agrees to. Files inside the project's folder
(symlinks resolved) need none.
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
# The GUI (engine code never sets these): what the user draws or types themselves may run;
# what came in a project file they refused to trust may not, for the rest of the process
# (a refused node pasted into another project stays refused).
_INTERACTIVE = False
_REFUSED: set[str] = set()


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


def outside_files(project) -> list[str]:
    """The data and weights files a saved project names outside its own folder (resolved)."""
    if project.path is None:
        return []  # a diagram not saved yet is the user's own: the files are the ones they picked
    home = project.directory.resolve()
    named = [project.weights, getattr(project.training.dataset, "path", None)]
    out = set()
    for rel in named:
        if not rel:
            continue
        p = project.resolve_path(str(rel)).resolve()
        if not p.is_relative_to(home):
            out.add(str(p))
    return sorted(out)


def needs_consent(project) -> list[str]:
    """What of a project runs only with the user's consent: its code paths and its files
    outside its folder (as `file:PATH`)."""
    return code_paths(project.graph) + [f"file:{p}" for p in outside_files(project)]


def split(paths: Iterable[str]) -> tuple[list[str], list[str]]:
    """needs_consent's entries as (code paths, file paths), for listing them to the user."""
    paths = list(paths)
    return ([p for p in paths if not p.startswith("file:")],
            [p.removeprefix("file:") for p in paths if p.startswith("file:")])


def check_file(project, path, field: str) -> None:
    """Refuse to read a file outside the project's folder unless the user consented."""
    from engine.files import ProjectError

    if project.path is None:
        return
    p = Path(path).resolve()
    if p.is_relative_to(project.directory.resolve()) or allowed(f"file:{p}"):
        return
    raise ProjectError(f"{field}: {p} is outside the project's folder ({project.directory.resolve()}); Layerflow "
                       f"reads it only with your consent: `python main.py trust {project.path.name}`, or --trust "
                       "on the command, or Yes when the app asks")


def allowed(path: str) -> bool:
    return is_torch_layer(path) or path in _ALLOWED.get() or (_INTERACTIVE and path not in _REFUSED)


def consented(project) -> bool:
    """Everything of this project that needs consent may run in this process."""
    return all(allowed(p) for p in needs_consent(project))


def interactive() -> None:
    """This process is the user's editor: their own edits may run; only what a project file
    brought and the user refused to trust may not (see refuse / allow_in_process)."""
    global _INTERACTIVE
    _INTERACTIVE = True


def refuse(paths: Iterable[str]) -> None:
    """The user declined to trust these (opened from a project file): never run them here."""
    _REFUSED.update(paths)


def allow_in_process(paths: Iterable[str]) -> None:
    """The user trusted these after all (the GUI's prompt)."""
    _REFUSED.difference_update(paths)


def reset_process() -> None:
    """Back to a process that runs nothing without consent (tests that share a worker)."""
    global _INTERACTIVE
    _INTERACTIVE = False
    _REFUSED.clear()


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
    from engine.files import atomic_write

    data = _read()
    data[_key(project_path)] = fingerprint(paths)
    store = _store()
    store.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(store, json.dumps(data, indent=1, sort_keys=True).encode())


@contextlib.contextmanager
def as_consented(project) -> Iterator[None]:
    """Run a block with the project's code allowed if (and only if) the user trusted it."""
    paths = needs_consent(project)
    ok = project.path is not None and paths and is_trusted(project.path, paths)
    with allowing(paths if ok else ()):
        yield
