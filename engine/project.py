"""Project files: versioned JSON holding the diagram, training settings and placement.

Validated on load (pydantic models; messages name the path of the bad field, e.g.
`training.optimizer.lr: must be greater than 0`), saved atomically (temp file,
fsync, rename) with sorted keys so files diff well in git. `load_project` raises
ProjectError and nothing else, whatever the bytes.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import ConfigDict, Field, ValidationError, model_validator

from engine.data.sources import _DATASET_KINDS, Dataset, LoaderSettings, SyntheticClassification
from engine.files import ProjectError, atomic_write, clear_stale_temps  # noqa: F401  (the first two are part of this module's API)
from engine.diagram.graph import TP_STYLES, Graph, GraphError
from engine.schema import Strict

FORMAT_VERSION = 1
SUFFIX = ".lflow"


# ----- training ---------------------------------------------------------------
class Optimizer(Strict):
    name: Literal["sgd", "adam", "adamw"] = "adam"
    lr: float = Field(1e-3, gt=0, le=100)
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.0, ge=0, lt=1)  # SGD only
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)  # Adam/AdamW


class Schedule(Strict):
    name: Literal["constant", "cosine", "step"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    step_size: int = Field(100, ge=1)  # step schedule: decay every step_size steps
    gamma: float = Field(0.5, gt=0, le=1)  # step schedule: factor per decay
    min_lr_ratio: float = Field(0.0, ge=0, le=1)  # cosine: floor as a fraction of lr


class Restarts(Strict):
    """What a run does when a rank fails or hangs (engine/runtime/recovery.py): it resumes
    from its latest checkpoint by itself, up to max_restarts times (torchrun's
    --max-restarts), waiting backoff_s before the first restart and twice as long before
    each next one (at most 60 s); the same error twice at the same step stops it at once.
    A rank with no step for hang_timeout_s (None: 30 times the measured step time, at
    least 120 s) is treated as failed."""

    max_restarts: int = Field(3, ge=0, le=100)
    backoff_s: float = Field(2.0, ge=0, le=600, allow_inf_nan=False)
    hang_timeout_s: Optional[float] = Field(None, gt=0, le=86_400, allow_inf_nan=False)


class Training(Strict):
    dataset: Dataset = Field(default_factory=lambda: SyntheticClassification(kind="synthetic_classification"), discriminator="kind")
    optimizer: Optimizer = Field(default_factory=Optimizer)
    schedule: Schedule = Field(default_factory=Schedule)
    batch_size: int = Field(64, ge=1, le=1_000_000)
    steps: Optional[int] = Field(200, ge=1)  # total optimizer steps; None: use epochs
    epochs: Optional[int] = Field(None, ge=1)
    eval_interval: int = Field(50, ge=1)  # steps between evaluations
    checkpoint_interval: int = Field(100, ge=1)  # steps between checkpoints
    # steps between two metrics records (the loss averaged over them, kept on the device in
    # between: no host sync, no collective on other steps); None: as many as fill about a
    # quarter of a second, from 1 (slow steps) to 100 (fast ones), so logging costs < 1%
    log_interval: Optional[int] = Field(None, ge=1)
    seed: int = Field(0, ge=0, le=2 ** 31 - 1)  # numpy and torch take it; so does a spin box
    grad_clip: Optional[float] = Field(None, gt=0)
    # micro-batches per optimizer step in one process: the batch is cut into this many equal
    # parts, their gradients add up, one step (what a pipeline's micro-batches do)
    grad_accumulation: int = Field(1, ge=1)
    loader: LoaderSettings = Field(default_factory=LoaderSettings)  # how ranks read a data set read in place
    # checkpoints kept: the last keep_checkpoints (None: all) and the best by best_metric
    # (val_acc: highest; val_loss, loss: lowest), never the one a run resumed from
    keep_checkpoints: Optional[int] = Field(3, ge=1)
    best_metric: Literal["val_loss", "val_acc", "loss"] = "val_loss"
    # torch.compile of the model (engine/runtime/compiling.py): off; blocks (one compile per
    # block, as torchtitan compiles each transformer block); whole. The first compile's time
    # is logged and left out of the step time; a block that fails to compile runs eagerly
    compile: Literal["off", "blocks", "whole"] = "off"
    restarts: Restarts = Field(default_factory=Restarts)  # after a failed or hung rank (above)
    # checkpoints written behind the training steps (torch.distributed.checkpoint's async
    # save: the steps wait only while the state is copied to host memory; one save in flight)
    checkpoint_async: bool = False

    def warnings(self) -> list[str]:
        """Settings that are valid but almost surely a mistake (a run with them trains to
        nothing, yet 'succeeds'): one line each, naming the field."""
        out = []
        o = self.optimizer
        if o.weight_decay > 1 or o.lr * o.weight_decay >= 1:
            high = "far above the usual 0 to 0.1" if o.weight_decay > 1 else f"too much at lr {o.lr:g}"
            out.append(f"training.optimizer.weight_decay: {o.weight_decay:g} is {high}: each "
                       f"step shrinks every weight by lr x weight_decay = {o.lr * o.weight_decay:.3g} of itself"
                       + (" (more than all of it: the weights diverge or vanish)" if o.lr * o.weight_decay >= 1 else "")
                       + "; lower it")
        return out

    @model_validator(mode="after")
    def _length(self) -> "Training":
        if self.steps is None and self.epochs is None:
            raise ValueError("set either steps or epochs")
        if self.batch_size % self.grad_accumulation:
            raise ValueError(f"training.batch_size {self.batch_size} is not divisible by training.grad_accumulation "
                             f"{self.grad_accumulation}; change one of them")
        return self


# ----- placement (engine/planning/planner.py reads it) ---------------------------------
MAX_PROCESSES = 65_536  # pp x dp x tp: beyond any cluster, and small enough to list every rank


class PlacementError(ProjectError):
    """A placement value the model refuses, in one line that names the setting
    (`field`: "placement.dp", or "placement" when the fields together are at fault)
    and the limit it broke."""

    def __init__(self, message: str, field: str = "placement"):
        super().__init__(message)
        self.field = field


class Placement(Strict):
    """The project's distributed settings: the mesh (pp x dp x tp) and how it runs.

    Always valid: every assignment is validated (and an assignment the model refuses
    leaves the placement as it was), and the one way to a changed copy is `derive`,
    which validates too; both raise PlacementError. (A node's own stage and TP style are
    its NodeAssignment, engine/diagram/graph.py.)"""

    model_config = ConfigDict(extra="forbid", strict=False, validate_assignment=True)

    pp: int = Field(1, ge=1, le=MAX_PROCESSES)
    dp: int = Field(1, ge=1, le=MAX_PROCESSES)
    tp: int = Field(1, ge=1, le=MAX_PROCESSES)
    data_parallel: Literal["ddp", "fsdp"] = "ddp"
    reshard_after_forward: bool = True  # FSDP2: free gathered params after forward
    # None: as the planner chooses (at least one per pipeline stage, dividing the batch)
    microbatches: int | None = Field(None, ge=1, le=MAX_PROCESSES)
    # interleavedzb: interleaved zero bubble (ZB1P; the weight gradient fills the bubble);
    # zbv, dualpipev: V-shaped, two stages per rank (rank r holds stages r and 2pp-1-r)
    schedule: Literal["gpipe", "1f1b", "interleaved1f1b", "interleavedzb", "zbv", "dualpipev"] = "1f1b"
    # float8: torchao's float8 training (GPUs of compute capability 8.9+; refused elsewhere with the reason)
    mixed_precision: Literal["none", "bf16", "float8"] = "none"
    sync_batchnorm: bool = False
    # auto: where a layout does not fit the device, the planner turns on activation checkpointing
    # (the nodes that free most memory per recomputed FLOP), then FSDP2's CPU offload; off: never.
    # A node's own `checkpoint: true` always checkpoints it, either way.
    memory_savings: Literal["auto", "off"] = "auto"

    @model_validator(mode="after")
    def _world(self) -> "Placement":
        if self.world > MAX_PROCESSES:
            raise ValueError(f"pp x dp x tp = {self.world:,} processes; at most {MAX_PROCESSES:,}: lower "
                             f"placement.pp, dp or tp (now {self.pp} x {self.dp} x {self.tp})")
        return self

    @property
    def world(self) -> int:
        """Processes the mesh takes: pp x dp x tp."""
        return self.pp * self.dp * self.tp

    def derive(self, **changes: Any) -> "Placement":
        """A copy with these fields changed, validated as a project file's placement is;
        PlacementError names the field and the limit (the placement itself is left alone)."""
        try:
            return Placement.model_validate({**self.model_dump(), **changes})
        except ValidationError as exc:
            raise placement_error(exc, changes) from None

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> "Placement":
        """pydantic's copy; with `update`, `derive` (pydantic's own would skip validation)."""
        copied = super().model_copy(deep=deep)
        return copied.derive(**update) if update else copied

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in type(self).model_fields:
            return super().__setattr__(name, value)
        old = self.__dict__.get(name)
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            self.__dict__[name] = old  # the model validator runs with the new value in place: put the old one back
            raise placement_error(exc, {name: value}) from None

    @classmethod
    def bounds(cls, name: str) -> tuple[int | None, int | None]:
        """(least, most) a numeric field takes, from its Field(ge=, le=) (what a spin box offers)."""
        lo = hi = None
        for m in cls.model_fields[name].metadata:
            lo = getattr(m, "ge", lo)
            hi = getattr(m, "le", hi)
        return lo, hi

    @classmethod
    def choices(cls, name: str) -> tuple[str, ...]:
        """The values a Literal field takes (what a combo box offers)."""
        from typing import get_args

        return tuple(get_args(cls.model_fields[name].annotation))


def placement_error(exc: ValidationError, changes: dict[str, Any]) -> PlacementError:
    """The first of pydantic's errors as one line that names placement.<field>."""
    err = exc.errors(include_url=False)[0]
    loc = err.get("loc") or ()
    msg = err["msg"].removeprefix("Value error, ")
    msg = (msg[0].lower() + msg[1:]).replace("input should be", "must be") if msg else msg
    if loc:  # one field at fault: its name, its limit (pydantic's message), the value refused
        field = f"placement.{loc[0]}"
        got = f", not {err['input']!r}" if err["type"] != "extra_forbidden" else ""
        return PlacementError(f"{field}: {msg}{got}", field)
    mesh = [k for k in ("pp", "dp", "tp") if k in changes]
    field = f"placement.{mesh[0]}" if len(mesh) == 1 else "placement"
    said = ", ".join(f"{k}={changes[k]!r}" for k in mesh)
    return PlacementError(f"{field}: {msg}" if len(mesh) == 1 else f"placement{' ' + said if said else ''}: {msg}",
                          field)


class _NodeModel(Strict):
    # (a position that is not finite is the graph's to name, with the node: Graph.from_dict)
    model_config = ConfigDict(allow_inf_nan=True)

    id: str
    type: str
    params: dict[str, Any] = Field(default_factory=dict)
    pos: tuple[float, float] = (0.0, 0.0)
    stage: Optional[int] = Field(None, ge=0)
    tp: Optional[Literal[TP_STYLES]] = None  # type: ignore[valid-type]
    checkpoint: bool = False
    group: Optional[str] = None  # editor block: its path, "layer1/layer1.0" for a block inside layer1
    scope: Optional[list[tuple[str, str]]] = None  # imported: module path and type, outside in


class _EdgeModel(Strict):
    src: str
    src_port: str = "out"
    dst: str
    dst_port: str = "in"


class _DiagramModel(Strict):
    nodes: list[_NodeModel] = Field(default_factory=list)
    edges: list[_EdgeModel] = Field(default_factory=list)
    collapsed: list[str] = Field(default_factory=list)  # blocks shown as one card in the editor
    ties: dict[str, str] = Field(default_factory=dict)  # shared parameters: "node.param" -> "node.param"
    layout: Optional[Literal["hierarchy"]] = None  # laid out again on collapse/expand (imported models)
    unfolded: list[str] = Field(default_factory=list)  # runs of identical blocks shown block by block
    direction: Literal["LR", "TB"] = "LR"  # data flows left to right or top down on the canvas


@dataclass
class Conflict:
    """Both sides changed `where` differently. The merged project holds `ours` (for a node
    one side removed and the other changed: the changed node, so that nothing is lost);
    engine/diff.py's resolve_conflict(project, i, side) puts that side's value; a side without
    the key holds diff.UNSET.
    where: node:ID:FIELD (params.KEY, id, type, stage, ...), node:ID (the whole node:
    removed on one side and changed on the other, or added on both), input:ID.PORT, or
    setting:PATH."""

    where: str
    what: str
    base: Any
    ours: Any
    theirs: Any

    def to_dict(self) -> dict:
        return {"where": self.where, "what": self.what, "base": copy.deepcopy(self.base),
                "ours": copy.deepcopy(self.ours), "theirs": copy.deepcopy(self.theirs)}


class _ConflictModel(Strict):
    """A field both sides of a merge changed (engine/diff.py): the project holds ours."""

    where: str = Field(min_length=1)
    what: str = ""
    base: Any = None
    ours: Any = None
    theirs: Any = None


class _ProjectModel(Strict):
    format_version: int
    name: str = "untitled"
    description: str = ""
    diagram: _DiagramModel = Field(default_factory=_DiagramModel)
    training: Training = Field(default_factory=Training)
    placement: Placement = Field(default_factory=Placement)
    cluster: Optional[str] = None  # name of a cluster profile (never the profile itself)
    weights: Optional[str] = None  # weights file beside the project (imported models)
    conflicts: list[_ConflictModel] = Field(default_factory=list)  # left by a merge, until resolved
    left_out: list[str] = Field(default_factory=list)  # what an import left out of the diagram, one line each


@dataclass(frozen=True)
class ProjectEvent:
    """`what` ("training" or "placement") was replaced: old and new values."""
    what: str
    old: Any
    new: Any


class Project:
    """A diagram plus its settings. `graph` is the live model the GUI edits (it emits
    GraphEvents); replacing `training` or `placement` emits a ProjectEvent to the
    project's subscribers, so every view follows an edit, whoever made it (an undo
    command, a merge resolution, a script)."""

    def __init__(self, graph: Graph | None = None, *, name: str = "untitled", description: str = "",
                 training: Training | None = None, placement: Placement | None = None,
                 cluster: str | None = None, weights: str | None = None, path: Path | None = None,
                 conflicts: list[Conflict] | None = None, left_out: list[str] | None = None):
        self._subscribers: list = []
        self.graph = graph or Graph()
        self.name = name
        self.description = description
        self._training = training or Training()
        self._placement = placement or Placement()
        self.cluster = cluster
        self.weights = weights
        self.path = Path(path) if path else None
        # merge conflicts not yet resolved (engine/diff.py)
        self.conflicts: list[Conflict] = list(conflicts or [])
        # what the import this project came from left out of its diagram and why (training-only
        # heads, calls no output reads), one line each: `summary` shows them under its total
        self.left_out: list[str] = list(left_out or [])
        # (real path, digest) of the bytes load_project read or save_project wrote: save_project's check
        self._read_digest: tuple[str, str] | None = None

    # ----- events -----------------------------------------------------------------
    def subscribe(self, callback) -> None:
        """callback(ProjectEvent) after `training` or `placement` is replaced."""
        self._subscribers.append(callback)

    def unsubscribe(self, callback) -> None:
        if callback in self._subscribers:
            self._subscribers.remove(callback)

    def _emit(self, what: str, old, new) -> None:
        if old == new:
            return
        ev = ProjectEvent(what, old, new)
        for cb in list(self._subscribers):
            cb(ev)

    @property
    def training(self) -> Training:
        return self._training

    @training.setter
    def training(self, value: Training) -> None:
        old, self._training = self._training, value
        self._emit("training", old, value)

    @property
    def placement(self) -> Placement:
        return self._placement

    @placement.setter
    def placement(self, value: Placement) -> None:
        old, self._placement = self._placement, value
        self._emit("placement", old, value)

    @property
    def directory(self) -> Path:
        return self.path.parent if self.path else Path.cwd()

    def input_file(self, rel: str, field: str) -> Path:
        """A data or weights file named by the project: a regular file (not a FIFO or a
        device), at most $LAYERFLOW_MAX_INPUT_MB megabytes, inside the project's folder unless
        the user consented (engine/trust.py); else ProjectError naming `field`."""
        from engine import trust

        path = self.resolve_path(rel)
        trust.check_file(self, path, field)
        return checked_input(path, field)

    def resolve_path(self, rel: str) -> Path:
        """A path written in the project (data set, weights), relative to its folder."""
        p = Path(rel).expanduser()
        return p if p.is_absolute() else self.directory / p

    def to_dict(self) -> dict:
        d = {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "description": self.description,
            "diagram": self.graph.to_dict(),
            # fields added later are written only when set: files from before them stay byte-identical
            "training": self.training.model_dump(mode="json", exclude=self._defaults_left_out()),
            "placement": self.placement.model_dump(mode="json"),
            "cluster": self.cluster,
            "weights": self.weights,
        }
        if self.conflicts:  # written only while there are some: other files stay byte-identical
            d["conflicts"] = [c.to_dict() for c in self.conflicts]
        if self.left_out:  # only imports that left something out have it
            d["left_out"] = list(self.left_out)
        return d

    def _defaults_left_out(self) -> dict:
        out: dict = {}
        if self.training.grad_accumulation == 1:
            out["grad_accumulation"] = True
        if self.training.loader == LoaderSettings():
            out["loader"] = True
        if self.training.keep_checkpoints == 3:
            out["keep_checkpoints"] = True
        if self.training.best_metric == "val_loss":
            out["best_metric"] = True
        if self.training.compile == "off":
            out["compile"] = True
        if self.training.restarts == Restarts():
            out["restarts"] = True
        if not self.training.checkpoint_async:
            out["checkpoint_async"] = True
        if getattr(self.training.dataset, "task", None) == "classify":
            out["dataset"] = {"task"}
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Any, source: str = "project") -> "Project":
        if not isinstance(data, dict):
            raise ProjectError(f"{source}: the file must hold a JSON object, not {type(data).__name__}")
        version = data.get("format_version")
        if version is None:
            raise ProjectError(f"{source}: format_version is missing (is this a Layerflow project?)")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ProjectError(f"{source}: format_version must be a positive integer, not {version!r}")
        if version > FORMAT_VERSION:
            raise ProjectError(f"{source}: format_version {version} is newer than this Layerflow reads ({FORMAT_VERSION}); update Layerflow")
        try:
            m = _ProjectModel.model_validate(data)
        except ValidationError as exc:
            raise ProjectError(_format_validation(source, exc)) from None
        except (ValueError, TypeError, RecursionError) as exc:  # pydantic internals on odd input
            raise ProjectError(f"{source}: {exc}") from None
        try:
            graph = Graph.from_dict(m.diagram.model_dump(mode="python"))
        except GraphError as exc:
            raise ProjectError(f"{source}: diagram: {exc}") from None
        return cls(graph, name=m.name, description=m.description, training=m.training,
                   placement=m.placement, cluster=m.cluster, weights=m.weights,
                   conflicts=[Conflict(**c.model_dump(mode="json")) for c in m.conflicts], left_out=m.left_out)

    def copy(self) -> "Project":
        p = Project.from_dict(json.loads(self.dumps()))
        p.path = self.path
        return p


def _format_validation(source: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors(include_url=False):
        loc = ""
        for part in err["loc"]:
            if isinstance(part, int):
                loc += f"[{part}]"
            elif part in _DATASET_KINDS:  # pydantic puts the union member's tag in the path
                continue
            else:
                loc += ("." if loc else "") + str(part)
        msg = err["msg"]
        msg = msg[0].lower() + msg[1:] if msg else msg
        msg = msg.replace("input should be", "must be").replace("value error, ", "")
        lines.append(f"{loc or '(top level)'}: {msg}".replace("\n", " "))
    more = f"; and {len(lines) - 6} more" if len(lines) > 6 else ""
    return f"{source}: " + "; ".join(lines[:6]) + more  # one line, every field at fault named


def loads_project(text: str | bytes, source: str = "project") -> Project:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProjectError(f"{source}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProjectError(f"{source}: not valid JSON text: {exc}") from None
    if _SURROGATE.search(text if isinstance(text, str) else text.decode("utf-8", "surrogatepass")):
        where = _lone_surrogate(data)
        if where is not None:
            raise ProjectError(f"{source}: {where}: holds a lone surrogate (\\ud800-\\udfff alone), which is no "
                               "character and cannot be written to a file or a folder name; remove it")
    return Project.from_dict(data, source)


_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}|[\ud800-\udfff]")


def _lone_surrogate(data: Any) -> str | None:
    """The path ('name', 'diagram.nodes[2].params.label') of the first text in `data`
    that UTF-8 cannot hold; without recursion (a file may nest values 10^5 deep)."""
    stack = [(data, "")]
    while stack:
        v, where = stack.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                path = f"{where}.{k}" if where else str(k)
                if isinstance(k, str) and not _encodes(k):
                    return f"{where or '(top level)'}: key {k!r}"
                stack.append((x, path))
        elif isinstance(v, list):
            stack.extend((x, f"{where}[{i}]") for i, x in enumerate(v))
        elif isinstance(v, str) and not _encodes(v):
            return where or "(top level)"
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def load_project(path: str | os.PathLike) -> Project:
    """The project in `path`, remembering what was read: save_project refuses to write over
    the file if it changed since (another command, the editor), rather than lose that edit."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ProjectError(f"{path}: cannot read: {exc.strerror or exc}") from None
    p = loads_project(raw, str(path))
    clear_stale_temps(os.path.realpath(path))  # what a save killed half-way left beside it (a dead writer's)
    p.path = path
    p._read_digest = (os.path.realpath(path), _digest(raw))
    return p


# ----- edits never lost ----------------------------------------------------------------
EDIT_LOCK_TIMEOUT_S = 60.0
_LOCKS: dict[str, Any] = {}  # one FileLock per project file in this process: re-entered, never self-blocked


def _digest(raw: bytes) -> str:
    import hashlib

    return hashlib.sha256(raw).hexdigest()


def _lock_for(path: Path):
    """The edit lock of a project file, held while it is read, changed and written: a file
    in this user's runtime folder named by a digest of the file's real path (nothing is
    added beside the project, in a repository or next to a device)."""
    from filelock import FileLock

    key = os.path.realpath(path)
    if key not in _LOCKS:
        name = _digest(key.encode("utf-8", "surrogateescape"))[:40]
        _LOCKS[key] = FileLock(str(_lock_folder() / f"{name}.lock"), timeout=EDIT_LOCK_TIMEOUT_S)
    return _LOCKS[key]


def _lock_folder() -> Path:
    """$XDG_RUNTIME_DIR/layerflow-locks, else TMP/layerflow-locks-UID: a folder of this
    user's alone (one someone else made, or a link, is not used: the config folder is)."""
    import stat as _stat
    import tempfile

    uid = os.getuid() if hasattr(os, "getuid") else 0
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(runtime) / "layerflow-locks" if runtime else Path(tempfile.gettempdir()) / f"layerflow-locks-{uid}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
        if _stat.S_ISDIR(st.st_mode) and (not hasattr(os, "getuid") or st.st_uid == uid):
            return folder
    except OSError:
        pass
    from engine.trust import config_home

    folder = config_home() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def editing(path: str | os.PathLike):
    """Hold the project file's edit lock around a read-modify-write, so that two commands
    editing one file take turns and neither edit is lost:

        with editing(path):
            project = load_project(path)
            ...                        # change it
            save_project(project)
    """
    from filelock import Timeout

    try:
        lock = _lock_for(Path(path))
        lock.acquire()
    except Timeout:
        raise ProjectError(f"{path}: another command or the editor has been changing this file for "
                           f"{EDIT_LOCK_TIMEOUT_S:.0f} s; try again when it is done") from None
    except OSError as exc:  # a folder we may not write: no lock file, but also no write to come
        from engine.files import os_error_text

        raise ProjectError(f"{path}: cannot lock it for editing: {os_error_text(exc)}") from None
    try:
        yield
    finally:
        lock.release()


DEFAULT_MAX_INPUT_MB = 16_384


def checked_input(path: Path, field: str) -> Path:
    import stat as _stat

    try:
        st = os.stat(path)
    except OSError as exc:  # missing, a symlink loop (with what to do), no permission
        from engine.files import os_error_text

        raise ProjectError(f"{field}: cannot read {path}: {os_error_text(exc)}") from None
    if not _stat.S_ISREG(st.st_mode):
        raise ProjectError(f"{field}: {path} is not a regular file (a device, FIFO or folder is never read)")
    try:
        limit_mb = float(os.environ.get("LAYERFLOW_MAX_INPUT_MB", DEFAULT_MAX_INPUT_MB))
    except ValueError:
        limit_mb = DEFAULT_MAX_INPUT_MB
    if st.st_size > limit_mb * 2 ** 20:
        raise ProjectError(f"{field}: {path} is {st.st_size / 2 ** 20:,.0f} MB, more than the limit of {limit_mb:,.0f} MB "
                           "(raise it with the environment variable LAYERFLOW_MAX_INPUT_MB)")
    return path


def weights_name(project_path: str | Path) -> str:
    """NAME.weights.pt beside NAME.lflow (relative, so the pair moves together)."""
    p = Path(project_path)
    stem = p.name[: -len(p.suffix)] if p.suffix else p.name
    return f"{stem}.weights.pt"


def save_project(project: Project, path: str | os.PathLike | None = None) -> Path:
    """Write the project to `path` (default: the file it came from), atomically, under the
    file's edit lock. Writing back over the file it was loaded from is refused when that
    file changed since it was read (ProjectError, one line): the other edit is kept."""
    target = Path(path) if path else project.path
    if target is None:
        raise ProjectError("the project has no file yet: give a path")
    data = project.dumps().encode("utf-8")
    with editing(target):
        read_from, read = getattr(project, "_read_digest", None) or (None, None)
        if read is not None and read_from == os.path.realpath(target):  # (recovered content: read elsewhere)
            try:
                now = _digest(target.read_bytes())
            except FileNotFoundError:
                now = read  # deleted since: writing it back loses nothing
            except OSError:
                now = read  # (atomic_write names what is wrong with the file)
            if now != read:
                raise ProjectError(f"{target}: changed on disk since it was read (another command or the editor "
                                   "saved it); this edit is not written, so that one is not lost: load it again and "
                                   "redo the edit, or save this one as another file")
        atomic_write(target, data)
    project.path = target
    project._read_digest = (os.path.realpath(target), _digest(data))
    return target
