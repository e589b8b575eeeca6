"""Prepare a run folder: everything the runtime needs, in one relocatable place.

RUN_DIR/
  project.lflow   snapshot of the project as it was run
  run.json        the run spec (engine/runtime/spec.py RunSpec): compiled model, training
                  settings, the plan (layout, stages, TP), data reference, predictions
  data.npz        x_train, y_train, x_val, y_val of a generated set (engine/data/describe.py); the
                  user's data (a set read in place, an .npz) is referenced by run.json's
                  data.source, never copied
  weights.pt      initial weights, when the project has a weights file (imported models)
The runtime (engine/runtime/train.py) reads only these, so the same folder runs on
this machine or, uploaded with the runtime package, on a cluster node.
"""
from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from engine.diagram.compile import compile_graph
from engine.data.describe import Arrays, DataInfo, describe, info_of
from engine.errors import CheckFailed, LayerflowError
from engine.project import Placement, Project, Training, atomic_write, load_project
from engine.runtime.plan import RunPlan
from engine.runtime.spec import DataRef, Predicted, RunSpec, TrainingSpec


class RunError(LayerflowError, ValueError):
    """The project cannot be run as it is; the message lists every reason."""


def default_runs_dir(project: Project) -> Path:
    from engine.runs.history import runs_dir

    return runs_dir(project.directory)


def new_run_dir(project: Project, runs_dir: Path | None = None) -> Path:
    base = runs_dir or default_runs_dir(project)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in project.name) or "run"
    d = base / f"{name}-{stamp}"
    i = 1
    while d.exists():
        i += 1
        d = base / f"{name}-{stamp}-{i}"
    return d


def _loss_options(result) -> dict:
    """The Output node's cross-entropy settings that differ from PyTorch's defaults."""
    out = result.output_node()
    params = result.nodes[out].params if out else {}
    opts = {}
    if result.loss() == "cross_entropy":
        if params.get("label_smoothing", 0.0):
            opts["label_smoothing"] = float(params["label_smoothing"])
        if params.get("ignore_index", -100) != -100:
            opts["ignore_index"] = int(params["ignore_index"])
    return opts


def check_data(result, data: DataInfo | Arrays) -> list[str]:
    """The data set must fit the diagram's Input and Output: each message names the node
    and the setting to change."""
    if isinstance(data, Arrays):
        data = info_of(data)
    errs = []
    spec = result.spec
    if len(spec["outputs"]) != 1:
        errs.append(f"training needs exactly one Output node; the diagram has {len(spec['outputs'])}")
    if data.inputs:  # several named inputs (tokens + attention mask): each feeds the Input node of its name
        have = ", ".join(data.inputs)
        fed = {nid: data.inputs[nid] for nid in spec["inputs"] if nid in data.inputs}
        errs += [f"node '{nid}' (Input): the data set has no input named '{nid}' (it has {have}); name each Input "
                 f"node after the input it takes" for nid in spec["inputs"] if nid not in data.inputs]
        errs += [f"the data set's input '{name}' feeds no Input node; add an Input node with id '{name}' or leave "
                 f"it out of training.dataset.inputs" for name in data.inputs if name not in spec["inputs"]]
    else:
        if len(spec["inputs"]) != 1:
            errs.append(f"training on this data set needs exactly one Input node; the diagram has {len(spec['inputs'])}")
        fed = {nid: (data.sample_shape, data.x_dtype) for nid in spec["inputs"][:1]}
    integer = False
    for nid, (shape, dtype) in fed.items():
        inp, shape = result.nodes[nid], tuple(shape)
        want = tuple(inp.params["shape"])
        if shape != want:
            errs.append(f"node '{nid}' (Input): shape is {list(want)} but the data set's samples are "
                        f"{list(shape)}; set the Input's shape to {list(shape)}")
        is_int = dtype.startswith(("int", "uint"))
        integer = integer or is_int
        if not inp.params["dtype"].startswith("int" if is_int else "float"):
            errs.append(f"node '{nid}' (Input): dtype is {inp.params['dtype']} but the data set holds "
                        f"{dtype}; set dtype to {'int64' if is_int else 'float32'}")
    # token ids must fit every Embedding's vocabulary: the largest id where it is known, else the vocabulary
    top = data.max_token if data.max_token is not None else (
        data.n_classes - 1 if integer and data.task == "language_model" and data.n_classes else None)
    if integer and top is not None:
        for nid, info in result.nodes.items():
            if info.type == "Embedding" and top >= info.params.get("num_embeddings", top + 1):
                what = "token ids go up to" if data.max_token is not None else "vocabulary's largest id is"
                errs.append(f"node '{nid}' (Embedding): the data set's {what} {top} but num_embeddings "
                            f"is {info.params['num_embeddings']}; set num_embeddings to at least {top + 1}")
    out_id = result.output_node()
    loss = result.loss()
    fits = {"classification": "cross_entropy", "language_model": "cross_entropy", "multi_label": "bce",
            "regression": "mse"}
    want_loss = fits.get(data.task)
    if out_id and loss == "none":
        errs.append(f"node '{out_id}' (Output): loss is none; choose {want_loss or 'cross_entropy or mse'} to train")
    elif out_id and want_loss and loss != want_loss:
        errs.append(f"node '{out_id}' (Output): loss is {loss} but the data set is a {data.task.replace('_', '-')} task; "
                    f"use {want_loss}")
    src = result.graph.incoming(out_id).get("in") if out_id else None
    if src and loss in ("cross_entropy", "bce") and data.n_classes:
        pred = result.nodes[src.src].out
        if pred and pred.shape and pred.shape[-1] != data.n_classes:
            what = "a vocabulary of" if data.task == "language_model" else ""
            errs.append(f"node '{src.src}' ({result.nodes[src.src].type}): outputs {pred.shape[-1]} values per sample "
                        f"but the data set has {what or ''}{' ' if what else ''}{data.n_classes} "
                        f"{'tokens' if what else 'labels' if loss == 'bce' else 'classes'}")
    if src and out_id and loss == "cross_entropy" and data.target_shape is not None:
        pred = result.nodes[src.src].out
        want = tuple(data.target_shape)
        if pred and pred.shape and _positions(pred.shape[:-1]) != _positions(want):
            errs.append(_positions_message(out_id, tuple(pred.shape), want))
    return errs


def _positions(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _positions_message(out_id: str, pred: tuple, want: tuple) -> str:
    """The Output's logits and the data set's targets count different positions: the loss
    would fail at the first step (cross_entropy's 'Expected input batch_size (32) to match
    target batch_size (2048)'); said before Run, with both shapes and what to do."""
    per = (f"one per position ({want[0]:,} positions)" if len(want) == 1 else f"{_positions(want):,} per sample") \
        if want else "one per sample"
    line = (f"node '{out_id}' (Output): the model's logits are {list(pred)} per sample but the data set's targets "
            f"are {list(want)}, {per}: the loss would compare {_positions(pred[:-1]):,} prediction(s) per sample "
            f"with {_positions(want):,} target(s)")
    if want and _positions(pred[:-1]) == 1:
        return (line + "; the model keeps one position of its output (a GPT's forward called without targets returns "
                "the last position's logits only): make it return every position's logits (its head applied to "
                "every position, not to x[:, [-1], :]) and import it again, or train on a data set with one target "
                "per sample")
    return line + "; make the model's output hold one row of logits per target, or use a data set whose targets match it"


def _check_weights(src: Path, result) -> None:
    """The weights file holds tensors (nothing else is unpickled) that fit the diagram."""
    from engine.files import os_error_text
    from engine.runtime.model import WeightsRefused, read_weights

    try:
        state = read_weights(src)
    except WeightsRefused as exc:  # a pickle payload weights_only refuses, a truncated file, not torch at all
        raise RunError(f"weights: {exc}") from None
    except OSError as exc:
        raise RunError(f"weights: cannot read {src}: {os_error_text(exc)}") from None
    want = result.build(device="meta").state_dict()
    for k, v in state.items():
        if k not in want:
            raise RunError(f"weights: {src} has '{k}', which is no parameter of the diagram")
        if tuple(v.shape) != tuple(want[k].shape):
            raise RunError(f"weights: '{k}' in {src} has shape {list(v.shape)} but node '{k.split('.')[0]}' needs "
                           f"{list(want[k].shape)}")


def total_steps(project: Project, n_train: int) -> int:
    tr = project.training
    if tr.steps is not None:
        return tr.steps
    return max(1, (n_train // tr.batch_size)) * (tr.epochs or 1)


@dataclass
class BuiltRun:
    """A run folder ready to start: its typed spec (world = the processes it needs) and
    the planner's warnings."""
    run_dir: Path
    spec: RunSpec
    warnings: list[str] = field(default_factory=list)

    @property
    def nproc(self) -> int:
        return self.spec.world


def derived_placement(placement: Placement, overrides: dict | None) -> Placement:
    """`placement` with `overrides`' fields changed, validated as the project file's are;
    RunError names placement.<field>."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    for k in ("dp", "tp", "pp", "microbatches"):
        v = overrides.get(k)
        if v is not None and (type(v) is not int or v < 1):
            raise RunError(f"placement.{k} must be a whole number of at least 1, not {v!r}")
    if not overrides:
        return placement
    try:
        return Placement.model_validate({**placement.model_dump(), **overrides})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = "placement." + str(err["loc"][0]) if err.get("loc") else "the placement"
        raise RunError(f"{where}: {err['msg'].removeprefix('Value error, ')}") from None


def _world(pl: Placement) -> int:
    return pl.pp * pl.dp * pl.tp


def plan_run(project: Project, nproc: int | None = None, *, compiled=None, device=None):
    """The planner's plan of `project` as its placement says (one process: a plan of one,
    whose memory figure is checked against this machine). Returns (planner Plan, warnings);
    raises CheckFailed (several processes) or RunError (one) naming what cannot run."""
    from engine.planning.planner import grouped, make_plan

    world = _world(project.placement)
    plan = make_plan(project, nproc or world, device=device, compiled=compiled)
    if world > 1:
        if plan.errors:
            raise CheckFailed("the placement cannot run", plan.errors)
        return plan, [w for w, _ in grouped(plan.warnings)]
    too_big = [e for e in plan.errors if " needs " in e and " device has " in e]
    if too_big:  # one process: out_features 3e7 or a batch of 1e6 refused with the numbers, before anything is allocated
        raise RunError(too_big[0].replace("raise pp or tp, use data_parallel fsdp, or raise microbatches",
                                          "lower training.batch_size or the model's sizes, or train on several "
                                          "processes or a cluster (placement pp/tp, data_parallel fsdp)"))
    if plan.run is None:
        return None, []
    return plan, [w for w, _ in grouped(plan.warnings)]  # (what validate says of this placement, train says too)


def _predicted(plan) -> Predicted:
    if isinstance(plan, dict):  # a plan as run.json carries it (planner.Plan.runtime_plan())
        pr = plan.get("predicted") or {}
        return Predicted(pr.get("step_s"), pr.get("device"), int(pr.get("world", 1)), plan.get("predicted_peak_bytes"))
    if plan is None or plan.predicted is None:
        return Predicted()
    peak = plan.predicted.peak_bytes_max
    return Predicted(plan.predicted.step_s, plan.device.name, plan.world, int(peak) if peak else None)


def _run_plan(plan, pl: Placement) -> RunPlan:
    if isinstance(plan, dict):
        return RunPlan.from_json(plan, "plan")
    if plan is not None and plan.run is not None:
        return plan.run
    # one process whose diagram the planner could not price: the layout is all the runtime reads
    return RunPlan(data_parallel="none", schedule="none", mixed_precision=pl.mixed_precision,
                   sync_batchnorm=pl.sync_batchnorm)


def _settled(project: Project) -> None:
    if project.conflicts:
        raise RunError(f"the project has {len(project.conflicts)} merge conflict(s) left (first: "
                       f"{project.conflicts[0].what}); settle them (editor, or `layerflow resolve`) before running it")


def build_run(project: Project, out_dir: str | Path | None = None, *, nproc: int | None = None,
              steps: int | None = None, seed: int | None = None, placement: dict | None = None,
              accumulate: int | None = None, restarts: int | None = None, device=None, plan=None) -> BuiltRun:
    """THE way a project becomes a run folder (the CLI, the Python API, the editor and the
    SSH and Slurm launchers all come here): overrides applied and checked, the diagram
    compiled once and planned once, the data checked against it, RUN_DIR written with a
    typed run spec (runtime/spec.py). `nproc` alone (a one-process placement) means data
    parallel over nproc; `restarts`: training.restarts.max_restarts for this run. `plan`: a planner Plan made already (auto-placement, tests of a
    given cut; or its runtime_plan() JSON). Raises RunError (or CheckFailed) listing every problem; writes nothing then."""
    _settled(project)
    for k, v in (("nproc", nproc), ("steps", steps), ("accumulate", accumulate)):
        if v is not None and (type(v) is not int or v < 1):
            raise RunError(f"{k} must be a whole number of at least 1, not {v!r}")
    project = project.copy()
    if steps is not None:
        project.training.steps, project.training.epochs = steps, None
    if seed is not None:
        project.training.seed = seed
    if accumulate is not None:
        try:
            project.training = Training.model_validate({**project.training.model_dump(), "grad_accumulation": accumulate})
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise RunError(msg if "grad_accumulation" in msg else f"training.grad_accumulation {accumulate}: {msg}") from None
    if restarts is not None:
        if type(restarts) is not int or not 0 <= restarts <= 100:
            raise RunError(f"restarts must be a whole number from 0 to 100, not {restarts!r}")
        project.training.restarts = project.training.restarts.model_copy(update={"max_restarts": restarts})
    overrides = dict(placement or {})
    pl = derived_placement(project.placement, overrides)
    if nproc and nproc > 1 and _world(pl) == 1:
        pl = derived_placement(pl, {"dp": nproc})  # nproc alone: data parallel over nproc processes
    if nproc and nproc != _world(pl) and _world(pl) > 1:
        raise RunError(f"nproc {nproc} but the placement needs pp*dp*tp = {pl.pp}*{pl.dp}*{pl.tp} = {_world(pl)} "
                       f"processes; change nproc or the degrees")
    project.placement = pl

    result = compile_graph(project.graph)
    if not result.ok:
        raise RunError("the diagram has errors:\n" + "\n".join(f"  {e}" for e in result.errors))
    acc = project.training.grad_accumulation
    if acc > 1 and _world(pl) > 1:
        raise RunError(f"training.grad_accumulation {acc} runs in one process only, but the placement asks for "
                       f"pp={pl.pp} x dp={pl.dp} x tp={pl.tp}; set training.grad_accumulation to 1 (a pipeline cuts "
                       f"the batch into placement.microbatches itself) or train in one process")
    warnings: list[str] = []
    if plan is None:
        plan, warnings = plan_run(project, compiled=result, device=device)
    data = describe(project)  # ProjectError names the bad dataset field
    errs = check_data(result, data)
    if errs:
        raise RunError("the data set does not fit the diagram:\n" + "\n".join(f"  {e}" for e in errs))
    if data.inputs and pl.pp > 1:
        raise RunError(f"placement.pp {pl.pp}: a pipeline feeds one input to its first stage, and the data set gives "
                       f"{len(data.inputs)} ({', '.join(data.inputs)}); use pp 1 (data and tensor parallel take several)")
    if data.n_train < project.training.batch_size:
        raise RunError(f"training.batch_size {project.training.batch_size} is larger than the training set "
                       f"({data.n_train} samples)")
    weights_src = None
    if project.weights:
        weights_src = project.input_file(project.weights, "weights")
        _check_weights(weights_src, result)

    run_dir = Path(out_dir) if out_dir else new_run_dir(project)
    if (run_dir / "run.json").exists():
        raise RunError(f"{run_dir} already holds a run; pick another --out or use --resume")
    made = _folders_to_make(run_dir)  # run_dir and the parents it lacks (runs/), innermost first
    there = None if made else set(os.listdir(run_dir))  # a folder the user gave: what it held
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        spec = _write_run(project, run_dir, result, plan, pl, data, weights_src)
    except BaseException as exc:
        _unmake(run_dir, made, there)  # a full disk or Ctrl-C halfway: no half-made run is left for the runs list
        if isinstance(exc, OSError) and not isinstance(exc, LayerflowError):
            from engine.files import os_error_text

            where = exc.filename or run_dir
            raise RunError(f"{where}: cannot prepare the run folder: {os_error_text(exc)}") from None
        raise
    return BuiltRun(run_dir, spec, warnings)


def _folders_to_make(run_dir: Path) -> list[Path]:
    """run_dir and those of its parents that do not exist yet, innermost first."""
    out, p = [], run_dir
    while not os.path.lexists(p) and p != p.parent:
        out.append(p)
        p = p.parent
    return out


def _unmake(run_dir: Path, made: list[Path], there: set[str] | None) -> None:
    """Remove what build_run wrote: the run folder it made, and the parents it made while
    they are empty (another run may have begun in runs/ meanwhile); in a folder the user
    gave, only the entries that were not there before."""
    if made:
        shutil.rmtree(run_dir, ignore_errors=True)
        for p in made[1:]:
            try:
                os.rmdir(p)
            except OSError:
                break
        return
    try:
        names = set(os.listdir(run_dir)) - (there or set())
    except OSError:
        return
    for name in names:
        f = run_dir / name
        if f.is_dir() and not f.is_symlink():
            shutil.rmtree(f, ignore_errors=True)
        else:
            try:
                f.unlink()
            except OSError:
                pass


def _write_run(project: Project, run_dir: Path, result, plan, pl: Placement, data: DataInfo,
               weights_src: Path | None) -> RunSpec:
    if data.arrays is not None:  # a generated set: small, it travels with the run
        data.arrays.save(run_dir / "data.npz")
    if weights_src is not None:
        shutil.copyfile(weights_src, run_dir / "weights.pt")
        project.weights = "weights.pt"  # (the snapshot names the copy beside it, not the file it came from)
    n_steps = total_steps(project, data.n_train)
    tr = project.training.model_dump(mode="json", exclude={"loader"})
    loader = project.training.loader.model_dump(mode="json", exclude_none=True)
    spec = RunSpec(
        model=result.spec, training=TrainingSpec.from_json(tr, "training"), plan=_run_plan(plan, pl),
        data=DataRef("data.npz", data.task, data.n_classes, data.n_train, data.n_val, data.source, data.fingerprint,
                     loader if data.source else {}),
        total_steps=n_steps, loss=result.loss(), loss_options=_loss_options(result), name=project.name,
        created=time.time(),
        weights="weights.pt" if weights_src is not None else None,
        epochs=math.ceil(n_steps / max(1, data.n_train // project.training.batch_size)),
        predicted=_predicted(plan))
    atomic_write(run_dir / "project.lflow", project.dumps().encode())
    spec.save(run_dir)
    return spec


def prepare_run(project: Project, out_dir: str | Path | None = None, **kw) -> Path:
    """build_run's folder (benchmarks and tests that need only the path)."""
    return build_run(project, out_dir, **kw).run_dir


def replan_run(run_dir: str | Path, nproc: int | None, overrides: dict) -> list[str]:
    """Give a run folder a new layout and plan before resuming it (its DCP checkpoints load
    under any layout). The folder's project snapshot is planned; degrees not given start
    from 1, and dp takes what nproc leaves. Returns the planner's warnings."""
    run_dir = Path(run_dir)
    spec = RunSpec.load(run_dir)
    project = load_project(run_dir / "project.lflow")
    p = spec.plan
    current = project.placement.model_dump()
    current.update(pp=p.pp, dp=p.dp, tp=p.tp, mixed_precision=p.mixed_precision, sync_batchnorm=p.sync_batchnorm)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if {"dp", "tp", "pp"} & set(overrides) or nproc:
        degrees = {k: overrides.get(k, 1) for k in ("pp", "tp")}
        rest = (nproc or 1) // (degrees["pp"] * degrees["tp"])
        degrees["dp"] = overrides.get("dp", max(1, rest) if nproc else p.dp)
        overrides.update(degrees)
    pl = derived_placement(Placement.model_validate(current), overrides)
    if nproc and nproc != _world(pl):
        raise RunError(f"nproc {nproc} but the placement needs pp*dp*tp = {pl.pp}*{pl.dp}*{pl.tp} = {_world(pl)} "
                       f"processes")
    project.placement = pl
    plan, warnings = plan_run(project)
    spec.plan, spec.predicted = _run_plan(plan, pl), _predicted(plan)
    spec.save(run_dir)
    return warnings
