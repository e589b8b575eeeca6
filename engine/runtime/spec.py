"""The run spec: everything a rank reads from RUN_DIR/run.json, typed, versioned, checked
when read.

One builder writes it (engine/runs/build.py `build_run`, from a project + its layout + the
overrides of a CLI flag, an API call or the editor's Run button); the launchers (local,
SSH, Slurm), the run list and every rank read it back with `RunSpec.load`, which names
the field at fault (`run.json training.batch_size: ...`), as `RunPlan.from_json` does.

    RunSpec
      model       the compiled diagram (engine/diagram/compile.py's spec; runtime/model.py builds it)
      training    TrainingSpec: optimizer, schedule, batch size, intervals, seed, clipping
      plan        RunPlan (runtime/plan.py): pp x dp x tp, schedule, stages, TP, precision
      data        DataRef: where the samples are and what they are
      predicted   what the planner predicted for a step (engine/runs/calibration.py compares)

The layout (pp, dp, tp, precision...) lives in the plan only; a run of one process has
the plan pp = dp = tp = 1. run.json files written before this spec had a version (v1)
carry the layout twice ("placement" and "plan", the plan null for one process) and are
read as the same spec. Imports only the standard library: it runs on bare GPU nodes.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from .plan import MIXED_PRECISION, PlanError, RunPlan

SPEC_VERSION = 2  # run.json's "version"; a newer one is refused with the version it needs
SPEC_FILE = "run.json"


class SpecError(PlanError):
    """A run.json the runtime cannot read; the message names the field."""


# ----- field readers: each names run.json's field at fault --------------------------
def _at(where: str, key: str) -> str:
    """`run.json training.batch_size`: the file, a space, then the field's dotted path."""
    return f"{where} {key}" if where.endswith(".json") else f"{where}.{key}"


def _obj(d, where: str) -> dict:
    if not isinstance(d, dict):
        raise SpecError(f"{where}: expected an object, not {type(d).__name__}")
    return d


def _int(d: dict, key: str, where: str, default=None, least: int | None = None, optional: bool = False):
    v = d.get(key, default)
    if v is None and optional:
        return None
    if type(v) is not int or (least is not None and v < least):
        more = f" >= {least}" if least is not None else ""
        raise SpecError(f"{_at(where, key)}: {v!r} is not an integer{more}")
    return v


def _num(d: dict, key: str, where: str, default=None, optional: bool = False):
    v = d.get(key, default)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SpecError(f"{_at(where, key)}: {v!r} is not a finite number")
    return float(v)


def _bool(d: dict, key: str, where: str, default: bool) -> bool:
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise SpecError(f"{_at(where, key)}: {v!r} is not true or false")
    return v


def _str(d: dict, key: str, where: str, default=None, options: tuple | None = None, optional: bool = False):
    v = d.get(key, default)
    if v is None and optional:
        return None
    if not isinstance(v, str) or (options is not None and v not in options):
        want = f"one of {', '.join(options)}" if options else "text"
        raise SpecError(f"{_at(where, key)}: {v!r} is not {want}")
    return v


def _unknown(d: dict, known, where: str) -> None:
    extra = sorted(set(d) - set(known))
    if extra:
        raise SpecError(f"{where}: unknown field {extra[0]!r}")


# ----- the parts ------------------------------------------------------------------
@dataclass(frozen=True)
class OptimizerSpec:
    name: str = "adam"  # sgd, adam, adamw
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.0  # SGD
    betas: tuple[float, float] = (0.9, 0.999)  # Adam, AdamW

    @classmethod
    def from_json(cls, d, where: str) -> OptimizerSpec:
        d = _obj(d, where)
        _unknown(d, {f.name for f in fields(cls)}, where)
        betas = d.get("betas", (0.9, 0.999))
        if (not isinstance(betas, (list, tuple)) or len(betas) != 2
                or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas)):
            raise SpecError(f"{where}.betas: {betas!r} is not two numbers")
        return cls(_str(d, "name", where, "adam", ("sgd", "adam", "adamw")), _num(d, "lr", where, 1e-3),
                   _num(d, "weight_decay", where, 0.0), _num(d, "momentum", where, 0.0),
                   (float(betas[0]), float(betas[1])))


@dataclass(frozen=True)
class ScheduleSpec:
    name: str = "constant"  # constant, cosine, step
    warmup_steps: int = 0
    step_size: int = 100  # step: decay every step_size steps
    gamma: float = 0.5  # step: factor per decay
    min_lr_ratio: float = 0.0  # cosine: the floor, as a fraction of lr

    @classmethod
    def from_json(cls, d, where: str) -> ScheduleSpec:
        d = _obj(d, where)
        _unknown(d, {f.name for f in fields(cls)}, where)
        return cls(_str(d, "name", where, "constant", ("constant", "cosine", "step")),
                   _int(d, "warmup_steps", where, 0, 0), _int(d, "step_size", where, 100, 1),
                   _num(d, "gamma", where, 0.5), _num(d, "min_lr_ratio", where, 0.0))


@dataclass(frozen=True)
class RestartSpec:
    """training.restarts (engine/project.py Restarts; engine/runtime/recovery.py)."""
    max_restarts: int = 3
    backoff_s: float = 2.0
    hang_timeout_s: float | None = None

    @classmethod
    def from_json(cls, d, where: str) -> RestartSpec:
        d = _obj(d, where)
        _unknown(d, {f.name for f in fields(cls)}, where)
        return cls(_int(d, "max_restarts", where, 3, 0), _num(d, "backoff_s", where, 2.0),
                   _num(d, "hang_timeout_s", where, None, optional=True))


BEST_METRICS = ("val_loss", "val_acc", "loss")  # val_acc: higher is better; the losses: lower
COMPILE_MODES = ("off", "blocks", "whole")  # training.compile (runtime/compiling.py MODES)


@dataclass(frozen=True)
class TrainingSpec:
    """The project's training settings as a rank uses them (engine/project.py Training
    validated them; the data set's settings are kept as they were, for the record)."""
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    schedule: ScheduleSpec = field(default_factory=ScheduleSpec)
    batch_size: int = 64  # the global batch of one optimizer step
    eval_interval: int = 50
    checkpoint_interval: int = 100
    log_interval: int | None = None  # None: from the step time (runtime/loop.py)
    seed: int = 0
    grad_clip: float | None = None
    grad_accumulation: int = 1
    steps: int | None = None  # as the project said; the run's own count is RunSpec.total_steps
    epochs: int | None = None
    dataset: dict = field(default_factory=dict)  # the project's dataset settings (shown, not read)
    keep_checkpoints: int | None = 3  # the last N checkpoints are kept (and the best); None: all
    best_metric: str = "val_loss"  # what makes a checkpoint the best (loop.py CheckpointPolicy)
    compile: str = "off"  # torch.compile: off, blocks (one per block), whole (runtime/compiling.py)
    restarts: RestartSpec = field(default_factory=RestartSpec)  # after a failed or hung rank (recovery.py)
    checkpoint_async: bool = False  # checkpoints written behind the steps (loop.py Checkpointer)

    @classmethod
    def from_json(cls, d, where: str) -> TrainingSpec:
        d = _obj(d, where)
        _unknown(d, {f.name for f in fields(cls)}, where)
        return cls(OptimizerSpec.from_json(d.get("optimizer", {}), f"{where}.optimizer"),
                   ScheduleSpec.from_json(d.get("schedule", {}), f"{where}.schedule"),
                   _int(d, "batch_size", where, 64, 1), _int(d, "eval_interval", where, 50, 1),
                   _int(d, "checkpoint_interval", where, 100, 1),
                   _int(d, "log_interval", where, None, 1, optional=True), _int(d, "seed", where, 0, 0),
                   _num(d, "grad_clip", where, None, optional=True), _int(d, "grad_accumulation", where, 1, 1),
                   _int(d, "steps", where, None, 1, optional=True), _int(d, "epochs", where, None, 1, optional=True),
                   _obj(d.get("dataset", {}), f"{where}.dataset"),
                   _int(d, "keep_checkpoints", where, 3, 1, optional=True),
                   _str(d, "best_metric", where, "val_loss", BEST_METRICS),
                   _str(d, "compile", where, "off", COMPILE_MODES),
                   RestartSpec.from_json(d.get("restarts", {}), f"{where}.restarts"),
                   _bool(d, "checkpoint_async", where, False))

    def to_json(self) -> dict:
        out = _plain(self)
        if out["compile"] == "off":  # (left out at its default: a runtime from before it reads the file)
            del out["compile"]
        if self.restarts == RestartSpec():
            del out["restarts"]
        if not self.checkpoint_async:
            del out["checkpoint_async"]
        return out


TASKS = ("classification", "regression", "language_model", "multi_label")


@dataclass(frozen=True)
class DataRef:
    """Where a run's samples are and what they are: a data set read in place (`source`,
    training.dataset's settings with its path made absolute on the machine that runs it,
    and the `fingerprint` of its files when the run was made), or a small generated set
    written into the run folder (`path`, relative to it)."""
    path: str = "data.npz"
    task: str = "classification"  # or regression, language_model, multi_label
    n_classes: int | None = None  # classes, labels, or a language model's vocabulary
    n_train: int = 0
    n_val: int = 0
    source: dict | None = None  # {"kind": "image_folder", "path": "/data/imagenet", ...} (runtime/datasets/)
    fingerprint: dict | None = None  # runtime/datasets/fingerprint.py: files, bytes, digest
    loader: dict = field(default_factory=dict)  # workers, prefetch, pin_memory, strict

    @classmethod
    def from_json(cls, d, where: str) -> DataRef:
        d = _obj(d, where)
        _unknown(d, {f.name for f in fields(cls)}, where)
        path = _str(d, "path", where, "data.npz")
        if os.path.isabs(path) or ".." in Path(path).parts:
            raise SpecError(f"{_at(where, 'path')}: {path!r} is not inside the run folder")
        source = d.get("source")
        if source is not None:
            source = _obj(source, _at(where, "source"))
            _str(source, "kind", _at(where, "source"))
            _str(source, "path", _at(where, "source"))
        fp = d.get("fingerprint")
        return cls(path, _str(d, "task", where, "classification", TASKS),
                   _int(d, "n_classes", where, None, 1, optional=True), _int(d, "n_train", where, 0, 0),
                   _int(d, "n_val", where, 0, 0), source,
                   _obj(fp, _at(where, "fingerprint")) if fp is not None else None,
                   _obj(d.get("loader", {}), _at(where, "loader")))


@dataclass(frozen=True)
class Predicted:
    """What the planner predicted for one step of this run (engine/runs/calibration.py)."""
    step_s: float | None = None
    device: str | None = None  # the device kind it predicted for
    nproc: int = 1  # over how many processes
    peak_bytes: int | None = None  # the largest of any device, where the planner gave it (the deploy's memory check)


LOSSES = ("cross_entropy", "bce", "mse", "none")


def _loss_options(d, where: str) -> dict:
    """The Output node's loss settings beyond its kind: label_smoothing, ignore_index
    (cross-entropy's; written only when not PyTorch's defaults)."""
    d = _obj(d, where)
    _unknown(d, {"label_smoothing", "ignore_index"}, where)
    out = {}
    if "label_smoothing" in d:
        v = _num(d, "label_smoothing", where)
        if not 0.0 <= v < 1.0:
            raise SpecError(f"{_at(where, 'label_smoothing')}: {v!r} is not in [0, 1)")
        out["label_smoothing"] = float(v)
    if "ignore_index" in d:
        out["ignore_index"] = _int(d, "ignore_index", where)
    return out


@dataclass
class RunSpec:
    """RUN_DIR/run.json."""
    model: dict  # the compiled diagram (engine/diagram/compile.py), built by runtime/model.py
    training: TrainingSpec
    plan: RunPlan
    data: DataRef
    total_steps: int
    loss: str = "cross_entropy"
    loss_options: dict = field(default_factory=dict)  # label_smoothing, ignore_index (steps.compute_loss)
    name: str = "run"
    created: float = 0.0
    weights: str | None = None  # initial weights beside run.json (an imported model)
    epochs: int = 1
    predicted: Predicted = field(default_factory=Predicted)
    version: int = SPEC_VERSION

    @property
    def world(self) -> int:
        """The processes this run needs (pp x dp x tp)."""
        return self.plan.world

    @property
    def distributed(self) -> bool:
        return self.plan.world > 1

    # ----- JSON ----------------------------------------------------------------
    def to_json(self) -> dict:
        pr = self.predicted
        return {
            "version": self.version, "name": self.name, "created": self.created, "model": self.model,
            "training": self.training.to_json(), "plan": self.plan.to_json(), "data": _plain(self.data),
            "weights": self.weights, "total_steps": self.total_steps, "loss": self.loss, "epochs": self.epochs,
            "predicted": {k: v for k, v in _plain(pr).items() if v is not None},
            **({"loss_options": dict(self.loss_options)} if self.loss_options else {}),
        }

    @classmethod
    def from_json(cls, d, where: str = "run.json") -> RunSpec:
        d = _obj(d, where)
        version = d.get("version", 1)
        if type(version) is not int or version < 1 or version > SPEC_VERSION:
            raise SpecError(f"{_at(where, 'version')}: {version!r}; this runtime reads run specs up to version "
                            f"{SPEC_VERSION}, update Layerflow on this machine")
        known = {"version", "name", "created", "model", "training", "plan", "data", "weights", "total_steps",
                 "loss", "loss_options", "epochs", "predicted"}
        v1 = {"placement", "predicted_step_s", "predicted_device", "nproc"}  # run.json before version 2
        _unknown(d, known | (v1 if version == 1 else set()), where)
        model = _obj(d.get("model"), _at(where, "model"))
        if not isinstance(model.get("nodes"), list):
            raise SpecError(f"{_at(where, 'model.nodes')}: expected the compiled diagram's list of nodes")
        plan = d.get("plan")
        if plan is None and version == 1:
            plan_obj = _plan_of_placement(_obj(d.get("placement") or {}, _at(where, "placement")), _at(where, "placement"))
        else:
            plan_obj = RunPlan.from_json(plan, _at(where, "plan"))
        if version == 1:
            pr = Predicted(_num(d, "predicted_step_s", where, None, optional=True),
                           _str(d, "predicted_device", where, None, optional=True),
                           _int(d, "nproc", where, 1, 1),
                           _int(plan or {}, "predicted_peak_bytes", _at(where, "plan"), None, 0, optional=True))
        else:
            p = _obj(d.get("predicted", {}), _at(where, "predicted"))
            _unknown(p, {f.name for f in fields(Predicted)}, _at(where, "predicted"))
            pr = Predicted(_num(p, "step_s", _at(where, "predicted"), None, optional=True),
                           _str(p, "device", _at(where, "predicted"), None, optional=True),
                           _int(p, "nproc", _at(where, "predicted"), 1, 1),
                           _int(p, "peak_bytes", _at(where, "predicted"), None, 0, optional=True))
        weights = _str(d, "weights", where, None, optional=True)
        if weights is not None and (os.path.isabs(weights) or ".." in Path(weights).parts):
            raise SpecError(f"{_at(where, 'weights')}: {weights!r} is not inside the run folder")
        return cls(model=model, training=TrainingSpec.from_json(d.get("training", {}), _at(where, "training")),
                   plan=plan_obj, data=DataRef.from_json(d.get("data", {}), _at(where, "data")),
                   total_steps=_int(d, "total_steps", where, None, 1), loss=_str(d, "loss", where, "cross_entropy", LOSSES),
                   loss_options=_loss_options(d.get("loss_options", {}), _at(where, "loss_options")),
                   name=_str(d, "name", where, "run"), created=_num(d, "created", where, 0.0), weights=weights,
                   epochs=_int(d, "epochs", where, 1, 0), predicted=pr, version=SPEC_VERSION)

    # ----- files ---------------------------------------------------------------
    @classmethod
    def load(cls, run_dir: str | os.PathLike) -> RunSpec:
        """RUN_DIR/run.json, checked; SpecError names the file and the field at fault."""
        path = Path(run_dir) / SPEC_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise SpecError(f"{Path(run_dir)} is not a run folder (no {SPEC_FILE})") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(f"{path}: cannot be read ({exc})") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise SpecError(f"{path}: not JSON ({exc})") from None
        return cls.from_json(data, str(path))

    def save(self, run_dir: str | os.PathLike) -> Path:
        """Written whole or not at all (temp file, rename)."""
        path = Path(run_dir) / SPEC_FILE
        tmp = path.with_name(f".{SPEC_FILE}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path


def _plan_of_placement(pl: dict, where: str) -> RunPlan:
    """A v1 run.json of one process (or one launched with `--nproc N` and no plan): its
    placement as a plan without stages (the runtime cuts an even pipeline if pp > 1)."""
    pp = _int(pl, "pp", where, 1, 1)
    return RunPlan(pp=pp, dp=_int(pl, "dp", where, 1, 1), tp=_int(pl, "tp", where, 1, 1),
                   data_parallel=_str(pl, "data_parallel", where, "ddp", ("ddp", "fsdp", "none")),
                   reshard_after_forward=bool(pl.get("reshard_after_forward", True)),
                   schedule=_str(pl, "schedule", where, "1f1b", ("gpipe", "1f1b", "interleaved1f1b", "none")),
                   microbatches=_int(pl, "microbatches", where, None, 1, optional=True) or pp,
                   mixed_precision=_str(pl, "mixed_precision", where, "none", MIXED_PRECISION),
                   sync_batchnorm=bool(pl.get("sync_batchnorm", False)))


def _plain(obj) -> dict:
    out = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        if hasattr(v, "__dataclass_fields__"):
            v = _plain(v)
        elif isinstance(v, tuple):
            v = list(v)
        out[f.name] = v
    return out
