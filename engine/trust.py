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

A run folder (a copy fetched from a cluster, or one a colleague shared) is opened as a
project is: the code its ranks would build (run.json's model, and its project.lflow
snapshot) runs on resume only with the same kind of consent (`check_run_folder`).
Its checkpoints hold tensors and plain values only; engine/runtime/dist_checkpoint.py
refuses one that holds anything else, consent or not.

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

from engine.errors import LayerflowError
from engine.files import real_path


class NotTrusted(LayerflowError):
    """A project or run folder whose own code (or files outside its folder) would run or
    be read without the user's consent; the message names them and how to consent."""


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
    home = real_path(project.directory)
    named = [project.weights, getattr(project.training.dataset, "path", None)]
    out = set()
    for rel in named:
        if not rel:
            continue
        p = real_path(project.resolve_path(str(rel)))
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
    p = real_path(path)
    if p.is_relative_to(real_path(project.directory)) or allowed(f"file:{p}"):
        return
    raise ProjectError(f"{field}: {p} is outside the project's folder ({real_path(project.directory)}); Layerflow "
                       f"reads it only with your consent: `python main.py trust {project.path.name}`, or --trust "
                       "on the command, or Yes when the app asks")


def allowed(path: str) -> bool:
    return is_torch_layer(path) or path in _ALLOWED.get() or (_INTERACTIVE and path not in _REFUSED)


def missing(paths: Iterable[str], *, interactive: bool = True) -> list[str]:
    """The entries of `paths` that may not run in this process now. interactive=False
    counts only the consent given for this command (`allowing`: trust, --trust,
    --trust-once), not the editor's "what I draw is mine" (a screenshot, which builds
    the editor's window, asks before the window makes the process interactive)."""
    out = []
    for p in paths:
        ok = allowed(p) if interactive else (is_torch_layer(p) or p in _ALLOWED.get())
        if not ok:
            out.append(p)
    return out


def _listed(paths: Iterable[str]) -> str:
    code, files = split(paths)
    parts = []
    if code:
        parts.append("imports code of its own (" + ", ".join(code) + ")")
    if files:
        parts.append("reads files outside its folder (" + ", ".join(files) + ")")
    return " and ".join(parts)


def require_consent(project, doing: str = "this") -> None:
    """Refuse, in one line (NotTrusted), a project whose code or outside files the user
    has not consented to for this command; what the command line asks before a command
    that would run them without a check of its own (`screenshot` builds the editor)."""
    paths = missing(needs_consent(project), interactive=False)
    if not paths:
        return
    name = str(project.path) if project.path is not None else project.name
    raise NotTrusted(f"{name} {_listed(paths)}; {doing} runs it only once you trust the project: "
                     f"`python main.py trust {name}`, or --trust on the command")


# ----- run folders ----------------------------------------------------------------
def run_folder_paths(run_dir: str | os.PathLike) -> list[str]:
    """The code a run folder's ranks would import (Custom nodes of run.json's model, what
    the runtime builds) and the Custom paths of its project.lflow snapshot (what a
    resume with a new placement compiles). Its data and weights were copied into the
    folder when it was made (data.npz, weights.pt): no file outside it is read.
    Both files are scanned as plain JSON, every object of type Custom wherever it sits:
    nothing of the folder is built or validated before the user agrees."""
    from engine.files import ProjectError

    paths: set[str] = set()
    for f in (Path(run_dir) / "run.json", Path(run_dir) / "project.lflow"):
        try:
            doc = json.loads(f.read_bytes())
        except FileNotFoundError:
            continue
        except (OSError, ValueError, RecursionError) as exc:
            raise ProjectError(f"{f}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
        paths.update(_custom_paths_in(doc))
    return sorted(p for p in paths if not is_torch_layer(p))


def _custom_paths_in(doc) -> set[str]:
    """The `params.path` of every {"type": "Custom", ...} object in a JSON document
    (walked without recursion: a hostile file may nest deep)."""
    found, stack = set(), [doc]
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            if obj.get("type") == "Custom":
                params = obj.get("params")
                path = params.get("path") if isinstance(params, dict) else None
                if path:
                    found.add(str(path))
            stack.extend(obj.values())
        elif isinstance(obj, list):
            stack.extend(obj)
    return found


def _run_key(run_dir: str | os.PathLike) -> str:
    """A run folder's entry in trust.json (beside the project files' own)."""
    return "run:" + str(Path(run_dir).resolve())


def trust_run_folder(run_dir: str | os.PathLike, paths: Iterable[str] | None = None) -> list[str]:
    """Remember the user's consent to a run folder's code (`trust RUN_DIR`, --trust)."""
    paths = run_folder_paths(run_dir) if paths is None else list(paths)
    if paths:
        _remember(_run_key(run_dir), paths)
    return paths


def check_run_folder(run_dir: str | os.PathLike, *, given: bool = False, once: bool = False) -> list[str]:
    """The gate before a run folder's code runs (resume): refuse, in one line (NotTrusted),
    one whose run.json or project.lflow names code the user has not consented to. Consent
    is this process's (the project's own, allowed for this command; the editor's), or
    the run folder's, remembered by `trust RUN_DIR` or given now (`given`, --trust;
    `once`, --trust-once: for this command only). A changed set of imports asks again.
    Returns the paths consented to: run the block that compiles the folder's project
    under `allowing(paths)`."""
    paths = run_folder_paths(run_dir)
    todo = missing(paths)
    if not todo or once:
        return paths
    if given:
        return trust_run_folder(run_dir, paths)
    if _read().get(_run_key(run_dir)) == fingerprint(paths):
        return paths
    raise NotTrusted(f"run folder {run_dir} {_listed(todo)}, which runs only once you trust it: "
                     f"`python main.py trust {run_dir}`, or --trust on the command")


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
    _remember(_key(project_path), paths)


def _remember(key: str, paths: Iterable[str]) -> None:
    from engine.files import atomic_write

    data = _read()
    data[key] = fingerprint(paths)
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
