"""A run's trained model as a first-class thing: its weights, read from a run folder.

    run_state(project, run_dir, checkpoint)   -> the state_dict of the run's weights,
                                                checked to fit the project's diagram
    checkpoint_path(run_dir, checkpoint)      -> which file or folder that names
    use_run_weights(project_path, run_dir)    -> NAME.weights.pt beside the project, named by it
    init_from(project, "RUN_DIR[:checkpoint]") -> a project whose initial weights are the run's
                                                (fine-tuning; a context manager)
    predict(project, inputs, run_dir)         -> the run's model on inputs (numpy)

`checkpoint` is one of
    final    model.pt, the weights at the run's last step (written when it succeeded)
    latest   checkpoints/latest, the newest whole checkpoint
    best     checkpoints/best, the checkpoint with the best training.best_metric
    step_N   checkpoints/step_N
and None picks final when the run has model.pt, else latest.

A run folder travels (fetched from a cluster, shared by a colleague): its files are read
as tensors and plain values only (torch.load weights_only=True, and DCP's metadata
through engine/runtime/dist_checkpoint.py's safe reader); the model they fill is built
from the *project's* diagram, never from code the run folder names.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tempfile
from pathlib import Path

import torch

from engine.errors import InteropError
from engine.files import real_path
from engine.project import Project, atomic_write, weights_name

CHECKPOINTS = "checkpoints"
NAMED = ("final", "latest", "best")


def _run_dir(run_dir) -> Path:
    p = Path(run_dir)
    if not (p / "run.json").is_file():
        raise InteropError(f"{p}: not a run folder (no run.json)")
    return p


def split_run_arg(text: str) -> tuple[str, str | None]:
    """'RUN_DIR:best' -> ('RUN_DIR', 'best'); 'RUN_DIR' -> ('RUN_DIR', None)."""
    head, sep, tail = str(text).rpartition(":")
    if sep and head and (tail in NAMED or re.fullmatch(r"step_\d+", tail)):
        return head, tail
    return str(text), None


def checkpoint_path(run_dir, checkpoint: str | None = None) -> tuple[str, Path]:
    """(the checkpoint's name, its file or folder): model.pt for final, checkpoints/step_N
    for the others. InteropError, one line, when the run has no such checkpoint."""
    run = _run_dir(run_dir)
    ck = run / CHECKPOINTS
    if checkpoint is None:
        checkpoint = "final" if (run / "model.pt").is_file() else "latest"
    if checkpoint == "final":
        f = run / "model.pt"
        if not f.is_file():
            raise InteropError(f"{run.name}: has no final weights (model.pt: the run has not finished); "
                               f"use --checkpoint latest or best")
        return "final", f
    if checkpoint in ("latest", "best"):
        marker = ck / checkpoint
        name = marker.read_text().strip() if marker.is_file() else ""
        if not name or not re.fullmatch(r"step_\d+", name) or not (ck / name).is_dir():
            have = available_checkpoints(run)
            raise InteropError(f"{run.name}: has no {checkpoint} checkpoint"
                               + (f" (it has {', '.join(have)})" if have else " (it has none)"))
        return name, ck / name
    if not re.fullmatch(r"step_\d+", checkpoint or ""):
        raise InteropError(f"checkpoint '{checkpoint}': say final, latest, best or step_N")
    if not (ck / checkpoint).is_dir():
        have = available_checkpoints(run)
        raise InteropError(f"{run.name}: has no checkpoint {checkpoint}"
                           + (f" (it has {', '.join(have)})" if have else " (it has none)"))
    return checkpoint, ck / checkpoint


def available_checkpoints(run_dir) -> list[str]:
    """What a run offers, as `checkpoint` takes it: final (when model.pt exists), latest,
    best (when marked), then step_N, newest first."""
    run = Path(run_dir)
    ck = run / CHECKPOINTS
    out = ["final"] if (run / "model.pt").is_file() else []
    for m in ("latest", "best"):
        if (ck / m).is_file() and (ck / (ck / m).read_text().strip()).is_dir():
            out.append(m)
    steps = sorted((int(p.name[5:]) for p in ck.glob("step_*") if p.is_dir() and p.name[5:].isdigit()), reverse=True)
    return out + [f"step_{s}" for s in steps]


# ----- reading the weights -------------------------------------------------------------
def _want(project: Project):
    """The project's compiled diagram and the shapes of its state_dict (nothing allocated)."""
    from engine.diagram.compile import compile_graph

    result = compile_graph(project.graph)
    if not result.ok:
        raise InteropError("the diagram has errors; fix them first:\n" + "\n".join(f"  {e}" for e in result.errors))
    shapes = {k: tuple(v.shape) for k, v in result.build(device="meta").state_dict().items()}
    return result, shapes


def check_fits(run_name: str, want: dict[str, tuple], have: dict[str, tuple]) -> None:
    """The run's parameters are the project's, name for name and shape for shape; else
    InteropError naming the first that differs."""
    for k, shape in want.items():
        if k not in have:
            raise InteropError(f"{run_name}: was trained on another diagram: the project's parameter '{k}' is not in "
                               f"the run (node '{k.split('.')[0]}' was added or renamed since)")
        if tuple(have[k]) != tuple(shape):
            raise InteropError(f"{run_name}: was trained on another diagram: parameter '{k}' has shape "
                               f"{list(have[k])} in the run but {list(shape)} in the project")
    for k in have:
        if k not in want:
            raise InteropError(f"{run_name}: was trained on another diagram: the run's parameter '{k}' is not in the "
                               f"project (node '{k.split('.')[0]}' was removed or renamed since)")


def _load_tensors(file: Path) -> dict:
    from engine.runtime.dist_checkpoint import UnsafeCheckpoint, _load_tensors

    try:
        return _load_tensors(file)
    except UnsafeCheckpoint as exc:
        raise InteropError(str(exc)) from None


def run_state(project: Project, run_dir, checkpoint: str | None = None) -> dict[str, torch.Tensor]:
    """The run's weights at `checkpoint` as a state_dict of CPU tensors with the keys of
    the project's compiled module, after checking that they fit it."""
    run = _run_dir(run_dir)
    name, path = checkpoint_path(run, checkpoint)
    label = f"{run.name} ({name})"
    result, want = _want(project)
    if path.is_file():  # model.pt
        state = _load_tensors(path)
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise InteropError(f"{path}: does not hold a state_dict (a dictionary of tensors)")
        check_fits(label, want, {k: tuple(v.shape) for k, v in state.items()})
        return {k: v.detach().cpu().contiguous() for k, v in state.items()}
    from engine.runtime import dist_checkpoint as dc

    if not dc.is_dcp(path):  # an older run's single-process state.pt
        if not (path / "state.pt").is_file():
            raise InteropError(f"{path}: holds no checkpoint (neither .metadata nor state.pt)")
        state = _load_tensors(path / "state.pt").get("model")
        if not isinstance(state, dict):
            raise InteropError(f"{path / 'state.pt'}: holds no model state")
        check_fits(label, want, {k: tuple(v.shape) for k, v in state.items()})
        return {k: v.detach().cpu().contiguous() for k, v in state.items()}
    try:
        md = dc.read_metadata(path / ".metadata")
    except dc.UnsafeCheckpoint as exc:
        raise InteropError(str(exc)) from None
    have = {k[len("model."):]: tuple(getattr(m, "size", ())) for k, m in md.state_dict_metadata.items()
            if k.startswith("model.")}
    # DCP keeps a tied parameter once (under the name state_dict gives it first): ties are checked by the build
    ties = set(result.spec.get("ties") or {})
    check_fits(label, {k: v for k, v in want.items() if k not in ties}, {k: v for k, v in have.items() if k not in ties})
    return _dcp_state(project, result, run, path)


def _dcp_state(project: Project, result, run: Path, path: Path) -> dict[str, torch.Tensor]:
    """A DCP checkpoint read into the project's model in this process (no process group),
    with the optimizer the run used (DCP loads model and optimizer together)."""
    from engine.runtime import dist_checkpoint as dc
    from engine.runtime.spec import RunSpec, SpecError
    from engine.runtime.steps import make_optimizer

    try:
        spec = RunSpec.load(run)
    except SpecError as exc:
        raise InteropError(f"{run.name}: {exc}") from None
    gm = result.build(device="cpu", seed=0)
    opt = make_optimizer(gm.parameters(), spec.training.optimizer)
    try:
        dc.load_into_single(path, gm, opt)
    except dc.UnsafeCheckpoint as exc:
        raise InteropError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - DCP's own errors, many types
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise InteropError(f"{path}: cannot read the checkpoint: {first}") from None
    return {k: v.detach().cpu().contiguous().clone() for k, v in gm.state_dict().items()}


def weights_error(wpath, exc: Exception) -> InteropError:
    """The project's weights file that could not be loaded, in one line that names it once
    (a refusal or an OSError says the file itself; torch's size mismatch does not)."""
    from engine.files import os_error_text

    text = os_error_text(exc) if isinstance(exc, OSError) else str(exc)
    if str(wpath) in text:
        return InteropError(f"weights: {text}")
    return InteropError(f"cannot load the project's weights {wpath}: {text}")


def project_weights_bytes(project: Project, wpath) -> bytes:
    """The project's weights file as tensors only, saved again: read by the one safe reader
    (runtime/model.py read_weights: no pickled object is ever run or passed on), so what an
    export writes beside its script is a state_dict of tensors, whatever the file held."""
    from engine.runtime.model import read_weights

    try:
        return state_bytes(read_weights(wpath))
    except (OSError, RuntimeError, ValueError) as exc:
        raise weights_error(wpath, exc) from None


def state_bytes(state: dict[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu().contiguous() for k, v in state.items()}, buf)
    return buf.getvalue()


def trained_module(project: Project, run_dir=None, checkpoint: str | None = None):
    """The project's module in eval mode on the CPU, with a run's weights (or the
    project's own: its weights file, else the initial weights of its seed)."""
    from engine.runtime.model import load_weights

    result, _ = _want(project)
    gm = result.build(seed=project.training.seed)
    if run_dir is not None:
        gm.load_state_dict(run_state(project, run_dir, checkpoint), strict=True)
    elif project.weights:
        wpath = project.input_file(project.weights, "weights")
        try:
            load_weights(gm, str(wpath))
        except (OSError, RuntimeError, ValueError) as exc:
            raise weights_error(wpath, exc) from None
    return gm.eval(), result.spec


# ----- making them the project's ---------------------------------------------------------
def use_run_weights(project_path, run_dir, checkpoint: str | None = None) -> tuple[Path, str]:
    """Write the run's weights as NAME.weights.pt beside the project file (atomically) and
    make the project name it, under the file's edit lock (load, change, save). Returns
    (the weights file, the checkpoint's name)."""
    from engine.project import editing, load_project, save_project

    project_path = Path(project_path)
    run = _run_dir(run_dir)
    name, _ = checkpoint_path(run, checkpoint)
    with editing(project_path):
        project = load_project(project_path)
        state = run_state(project, run, name)
        wname = weights_name(project_path)
        wpath = project_path.parent / wname
        atomic_write(wpath, state_bytes(state))
        project.weights = wname
        save_project(project)
    return wpath, name


@contextlib.contextmanager
def init_from(project: Project, source: str | None, checkpoint: str | None = None):
    """`with init_from(project, "RUN_DIR[:checkpoint]") as start:` a copy of the project
    whose weights file is the run's weights (written to a temporary file, allowed to be
    read for this block), so build_run copies them into the new run as its initial
    weights.pt. With source None, the project itself."""
    if not source:
        yield project
        return
    from engine import trust

    run_arg, ck = split_run_arg(source)
    name, _ = checkpoint_path(run_arg, checkpoint or ck)
    state = run_state(project, run_arg, name)
    start = project.copy()
    start.weights_origin = f"{Path(run_arg).name} ({name})"
    with tempfile.TemporaryDirectory(prefix="layerflow-init-") as tmp:
        # (the new run's project snapshot names this file: its name says where the weights came from)
        f = Path(tmp) / f"{real_path(run_arg).name}.{name}.weights.pt"
        f.write_bytes(state_bytes(state))
        start.weights = str(f)
        with trust.allowing([f"file:{f.resolve()}"]):
            yield start


def note_init(run_dir, source: str, checkpoint: str | None = None) -> None:
    """init_from.json in the new run: which run and checkpoint its initial weights came from."""
    run_arg, ck = split_run_arg(source)
    name, _ = checkpoint_path(run_arg, checkpoint or ck)
    atomic_write(Path(run_dir) / "init_from.json",
                 json.dumps({"run": os.path.abspath(run_arg), "checkpoint": name}).encode())


# ----- running the trained model ----------------------------------------------------------
PREDICT_BATCH = 256


def predict(project: Project, inputs, run_dir=None, checkpoint: str | None = None, *,
            batch_size: int = PREDICT_BATCH):
    """The model's outputs (numpy) for `inputs`: an array of samples (N, *Input shape), or a
    dict {Input node id: array} for a diagram with several Inputs. Weights: the run's at
    `checkpoint`, else the project's. Batches of `batch_size`, eval mode, CPU, no grad."""
    import numpy as np

    gm, spec = trained_module(project, run_dir, checkpoint)
    names = list(spec["inputs"])
    shapes = {n["id"]: n["params"] for n in spec["nodes"] if n["type"] == "Input"}
    if not isinstance(inputs, dict):
        if len(names) != 1:
            raise InteropError(f"the diagram has {len(names)} Inputs ({', '.join(names)}); pass a dict of arrays "
                               f"named by them")
        inputs = {names[0]: inputs}
    arrays = []
    n = None
    for nid in names:
        if nid not in inputs:
            raise InteropError(f"no input for Input node '{nid}' (given: {', '.join(map(str, inputs))})")
        a = np.asarray(inputs[nid])
        want = tuple(shapes[nid]["shape"])
        if a.shape == want:  # one sample
            a = a[None]
        if tuple(a.shape[1:]) != want:
            raise InteropError(f"Input '{nid}' takes samples of shape {list(want)}; the inputs are "
                               f"{list(a.shape)} (N samples of {list(a.shape[1:])})")
        dtype = getattr(torch, shapes[nid].get("dtype", "float32"))
        if dtype.is_floating_point and not np.issubdtype(a.dtype, np.floating) and not np.issubdtype(a.dtype, np.integer):
            raise InteropError(f"Input '{nid}': the inputs hold {a.dtype}, not numbers")
        arrays.append((a, dtype))
        if n is not None and len(a) != n:
            raise InteropError(f"the inputs have different numbers of samples ({n} and {len(a)})")
        n = len(a)
    outs = []
    with torch.no_grad():
        for i in range(0, n or 0, batch_size):
            xs = [torch.as_tensor(np.ascontiguousarray(a[i:i + batch_size])).to(dtype) for a, dtype in arrays]
            out = gm(*xs)
            out = out[0] if isinstance(out, tuple) else out
            outs.append(out.detach().float().numpy())
    return np.concatenate(outs) if outs else np.zeros((0,), np.float32)


def read_inputs(project: Project, source) -> tuple[object, list[str]]:
    """The samples in a file or folder, for predict: .npy (an array), .npz (the array named
    by the Input node, else x, x_val or its only array), an image file, or a folder of
    images (sorted). Returns (array or dict, one name per sample). Images are decoded as
    the project's image data set decodes its validation images (resize, centre crop,
    normalise), else scaled to [0, 1] at the Input's size."""
    import numpy as np

    from engine.diagram.compile import compile_graph

    src = Path(source)
    result = compile_graph(project.graph)
    if not result.ok:
        raise InteropError("the diagram has errors; fix them first:\n" + "\n".join(f"  {e}" for e in result.errors))
    names = list(result.spec["inputs"])
    if not src.exists():
        raise InteropError(f"{src}: no such file or folder")
    if src.is_file() and src.suffix.lower() == ".npy":
        a = np.load(src, allow_pickle=False)
        return a, _labels(src.stem, a, result)
    if src.is_file() and src.suffix.lower() == ".npz":
        with np.load(src, allow_pickle=False) as z:
            keys = list(z.keys())
            if len(names) > 1:
                missing = [n for n in names if n not in keys]
                if missing:
                    raise InteropError(f"{src}: has no array named {missing[0]} (it has {', '.join(keys)})")
                d = {n: z[n] for n in names}
                return d, _labels(src.stem, d[names[0]], result)
            for k in (names[0], "x", "x_val", "x_test", "inputs"):
                if k in keys:
                    a = z[k]
                    return a, _labels(src.stem, a, result)
            if len(keys) == 1:
                a = z[keys[0]]
                return a, _labels(src.stem, a, result)
            raise InteropError(f"{src}: say which array holds the inputs: name it {names[0]} or x (it has "
                               f"{', '.join(keys)})")
    from engine.runtime.datasets.images import IMAGE_EXTS, list_images

    if src.is_dir():
        files = [src / f for f in list_images(src)]
        if not files:
            raise InteropError(f"{src}: holds no images ({', '.join(IMAGE_EXTS)}) and is no .npy or .npz file")
    elif src.suffix.lower() in IMAGE_EXTS:
        files = [src]
    else:
        raise InteropError(f"{src}: read .npy, .npz, an image ({', '.join(IMAGE_EXTS)}) or a folder of images")
    if len(names) != 1:
        raise InteropError(f"images feed one Input; the diagram has {len(names)}")
    shape = list(result.nodes[names[0]].params["shape"])
    if len(shape) != 3 or shape[0] not in (1, 3) or shape[1] != shape[2]:
        raise InteropError(f"Input '{names[0]}' takes {shape}; images need [C, S, S] with C 1 or 3")
    transform = _image_transform(project, shape)
    xs = [transform(str(f), None, lambda f=f: str(f)).numpy() for f in files]
    return np.stack(xs), [str(f.relative_to(src)) if src.is_dir() else f.name for f in files]


def _labels(stem: str, a, result) -> list[str]:
    want = tuple(result.nodes[result.spec["inputs"][0]].params["shape"])
    n = 1 if tuple(getattr(a, "shape", ())) == want else len(a)
    return [f"{stem}[{i}]" for i in range(n)]


def _image_transform(project: Project, shape: list[int]):
    from engine.runtime.datasets.images import ImageTransform

    ds = project.training.dataset.model_dump(mode="json")
    if ds.get("kind") in ("image_folder", "image_shards") or "image_size" in ds:
        settings = {**ds, "image_size": shape[1], "channels": shape[0]}
    else:  # not an image data set: pixels / 255 at the Input's size
        settings = {"image_size": shape[1], "channels": shape[0], "resize": shape[1],
                    "mean": [0.0] * shape[0], "std": [1.0] * shape[0]}
    return ImageTransform(settings, "predict")


def class_names(project: Project, n: int) -> list[str]:
    """The classes' names: an image folder data set's class folders, else 0..n-1."""
    ds = project.training.dataset
    root = getattr(ds, "path", None)
    if getattr(ds, "kind", "") == "image_folder" and root:
        from engine.runtime.datasets.images import class_folders

        base = project.resolve_path(root)
        base = base / "train" if (base / "train").is_dir() else base
        try:
            names = class_folders(base)
        except OSError:
            names = []
        if len(names) == n:
            return names
    return [str(i) for i in range(n)]


def top_classes(outputs, k: int = 3) -> list[list[tuple[int, float]]]:
    """Per sample, the k likeliest classes with their softmax probabilities."""
    import numpy as np

    o = np.asarray(outputs, dtype=np.float64).reshape(len(outputs), -1)
    p = np.exp(o - o.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    idx = np.argsort(-p, axis=1)[:, :k]
    return [[(int(j), float(p[i, j])) for j in row] for i, row in enumerate(idx)]
