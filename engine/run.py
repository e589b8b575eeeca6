"""Prepare a run folder: everything the runtime needs, in one relocatable place.

RUN_DIR/
  project.lflow   snapshot of the project as it was run
  run.json        compiled model spec, training settings, placement, plan, total steps
  data.npz        x_train, y_train, x_val, y_val (engine/data.py)
  weights.pt      initial weights, when the project has a weights file (imported models)
The runtime (engine/runtime/train.py) reads only these, so the same folder runs on
this machine or, uploaded with the runtime package, on a cluster node.
"""
from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

from engine.compile import compile_graph
from engine.data import load_arrays
from engine.errors import LayerflowError
from engine.project import Project, atomic_write


class RunError(LayerflowError, ValueError):
    """The project cannot be run as it is; the message lists every reason."""


def default_runs_dir(project: Project) -> Path:
    from engine.runs import runs_dir

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


def check_data(result, arrays) -> list[str]:
    """The data set must fit the diagram's Input and Output."""
    errs = []
    spec = result.spec
    inp = result.nodes[spec["inputs"][0]]
    if len(spec["inputs"]) != 1:
        errs.append(f"training needs exactly one Input node; the diagram has {len(spec['inputs'])}")
    if len(spec["outputs"]) != 1:
        errs.append(f"training needs exactly one Output node; the diagram has {len(spec['outputs'])}")
    want = tuple(inp.params["shape"])
    if arrays.sample_shape != want:
        errs.append(f"node '{inp.id}' (Input): shape is {list(want)} but the data set's samples are "
                    f"{list(arrays.sample_shape)}; set the Input's shape to {list(arrays.sample_shape)}")
    kind = "int" if arrays.x_train.dtype.kind in "iu" else "float"
    if not inp.params["dtype"].startswith(kind):
        errs.append(f"node '{inp.id}' (Input): dtype is {inp.params['dtype']} but the data set holds "
                    f"{arrays.x_train.dtype}; set dtype to {'int64' if kind == 'int' else 'float32'}")
    if kind == "int":  # token ids must fit every Embedding's vocabulary
        top = max(int(arrays.x_train.max()) if arrays.x_train.size else 0,
                  int(arrays.x_val.max()) if arrays.x_val.size else 0)
        for nid, info in result.nodes.items():
            if info.type == "Embedding" and top >= info.params.get("num_embeddings", top + 1):
                errs.append(f"node '{nid}' (Embedding): the data set's token ids go up to {top} but num_embeddings "
                            f"is {info.params['num_embeddings']}; set num_embeddings to at least {top + 1}")
    out_id = result.output_node()
    loss = result.loss()
    if out_id and loss == "cross_entropy" and arrays.task != "classification":
        errs.append(f"node '{out_id}' (Output): loss is cross_entropy but the data set is a regression task; use mse")
    if out_id and loss == "mse" and arrays.task == "classification":
        errs.append(f"node '{out_id}' (Output): loss is mse but the data set has class labels; use cross_entropy")
    if out_id and loss == "none":
        errs.append(f"node '{out_id}' (Output): loss is none; choose cross_entropy or mse to train")
    src = result.graph.incoming(out_id).get("in") if out_id else None
    if src and loss == "cross_entropy" and arrays.n_classes:
        pred = result.nodes[src.src].out
        if pred and pred.shape and pred.shape[-1] != arrays.n_classes:
            errs.append(f"node '{src.src}' ({result.nodes[src.src].type}): outputs {pred.shape[-1]} values per sample "
                        f"but the data set has {arrays.n_classes} classes")
    return errs


def _check_weights(src: Path, result) -> None:
    """The weights file holds tensors (nothing else is unpickled) that fit the diagram."""
    import torch

    try:
        state = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as exc:  # a pickle payload weights_only refuses, a truncated file, not torch at all
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise RunError(f"weights: {src} is not a weights file Layerflow reads ({type(exc).__name__}: {first})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise RunError(f"weights: {src} does not hold a dictionary of tensors (a state_dict)")
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


def _predicted_alone(project: Project, result) -> dict | None:
    """The planner's step time for one process on this machine (a run without a plan)."""
    pl = project.placement
    if pl.pp * pl.dp * pl.tp != 1:
        return None
    try:
        from engine.planner import make_plan

        plan = make_plan(project, 1, compiled=result)
        return {"step_s": plan.predicted.step_s, "device": plan.device.name, "world": 1}
    except Exception:  # noqa: BLE001 - a run never fails for want of a prediction
        return None


def prepare_run(project: Project, out_dir: str | Path | None = None, *, steps: int | None = None,
                seed: int | None = None, placement: dict | None = None, plan: dict | None = None) -> Path:
    """Compile, check, and write RUN_DIR. Raises RunError listing every problem."""
    if project.conflicts:
        raise RunError(f"the project has {len(project.conflicts)} merge conflict(s) left (first: "
                       f"{project.conflicts[0]['what']}); settle them (editor, or `layerflow resolve`) before running it")
    project = project.copy()
    if steps is not None:
        project.training.steps, project.training.epochs = steps, None
    if seed is not None:
        project.training.seed = seed
    if placement:
        project.placement = project.placement.model_copy(update=placement)
    result = compile_graph(project.graph)
    if not result.ok:
        raise RunError("the diagram has errors:\n" + "\n".join(f"  {e}" for e in result.errors))
    arrays = load_arrays(project)  # ProjectError names the bad dataset field
    errs = check_data(result, arrays)
    if errs:
        raise RunError("the data set does not fit the diagram:\n" + "\n".join(f"  {e}" for e in errs))
    pl, acc = project.placement, project.training.grad_accumulation
    if acc > 1 and pl.pp * pl.dp * pl.tp > 1:
        raise RunError(f"training.grad_accumulation {acc} runs in one process only, but the placement asks for "
                       f"pp={pl.pp} x dp={pl.dp} x tp={pl.tp}; set training.grad_accumulation to 1 (a pipeline cuts "
                       f"the batch into placement.microbatches itself) or train in one process")
    if len(arrays.x_train) < project.training.batch_size:
        raise RunError(f"training.batch_size {project.training.batch_size} is larger than the training set "
                       f"({len(arrays.x_train)} samples)")

    run_dir = Path(out_dir) if out_dir else new_run_dir(project)
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / "run.json").exists():
        raise RunError(f"{run_dir} already holds a run; pick another --out or use --resume")
    arrays.save(run_dir / "data.npz")
    weights = None
    if project.weights:
        src = project.input_file(project.weights, "weights")
        _check_weights(src, result)
        shutil.copyfile(src, run_dir / "weights.pt")
        weights = "weights.pt"
    n_steps = total_steps(project, len(arrays.x_train))
    plan = dict(plan) if plan else None
    predicted = (plan or {}).pop("predicted", None) or _predicted_alone(project, result)
    spec = {
        "name": project.name,
        "created": time.time(),
        "model": result.spec,
        "training": project.training.model_dump(mode="json"),
        "placement": project.placement.model_dump(mode="json"),
        "plan": plan,
        # what the plan predicted for a step, on what device, over how many processes (engine/calibration.py)
        "predicted_step_s": (predicted or {}).get("step_s"),
        "predicted_device": (predicted or {}).get("device"),
        "nproc": (predicted or {}).get("world", 1),
        "data": {"path": "data.npz", "task": arrays.task, "n_classes": arrays.n_classes,
                 "n_train": int(len(arrays.x_train)), "n_val": int(len(arrays.x_val))},
        "weights": weights,
        "total_steps": n_steps,
        "loss": result.loss(),
        "epochs": math.ceil(n_steps / max(1, len(arrays.x_train) // project.training.batch_size)),
    }
    atomic_write(run_dir / "project.lflow", project.dumps().encode())
    atomic_write(run_dir / "run.json", (json.dumps(spec, indent=1, sort_keys=True) + "\n").encode())
    return run_dir
