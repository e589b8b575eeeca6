"""ONNX -> diagram with weights: one importer, the torch one.

Every file is turned into torch calls op by op (engine/interop/onnx/to_torch.py) and
that module is imported like any PyTorch model, through torch.export
(engine/interop/module/importer.py): whatever the torch importer reads (catalog layers,
generic Op nodes, ties, the module tree as `scope`) comes from ONNX the same way, and
ONNX has no mapping of its own beyond "which torch call is this operator".

A file Layerflow wrote itself carries its diagram (metadata `layerflow.diagram`); that
diagram is taken back as it was drawn (names, blocks, positions, dropout rates and the
loss, which ONNX cannot state) with the file's weights, but only after the torch
reading of the same file has computed the same outputs on the same input. A file
edited after export (weights changed, operators optimized away) falls back to the
torch reading; a diagram that names code (Custom layers) is never taken from a file.
No file is written here (see common.save_imported).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import torch

from engine.diagram.graph import Graph, GraphError
from engine.interop.onnx import limits
from engine.interop.common import Imported, InteropError, best_effort, check_imported, synthetic_training
from engine.interop.progress import phase
from engine.project import Project

DIAGRAM_KEY = "layerflow.diagram"


def _load(path: Path):
    """The file's model, read and checked within the limits of engine/interop/onnx/limits.py
    before anything is built from it."""
    model = limits.read_model(path)
    if not model.graph.output or not model.graph.node:
        raise InteropError(f"{path}: holds no ONNX graph (no nodes or no outputs); is it an ONNX model?")
    limits.check_graph(str(path), model)
    limits.check_time("checking the graph")
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # shapes are a help, not a must: keep what the file says
        pass
    limits.check_values(str(path), model)
    return model


def _inputs(path: Path, model, names: list[str]) -> tuple[list[list[int]], list[str]]:
    """Per-sample shape and dtype of each graph input (initializers are no inputs)."""
    from engine.diagram.catalog import MAX_SAMPLE_NUMEL

    limits.input_types(str(path), model, names)
    vis = {vi.name: vi for vi in model.graph.input}
    shapes, dtypes = [], []
    for name in names:
        tt = vis[name].type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if len(dims) < 2 or any(d is None or d <= 0 for d in dims[1:]):
            raise InteropError(f"{path}: input '{name}' has shape {dims}: every dimension but the batch must be "
                               "a fixed size")
        n = math.prod(dims[1:])
        if n > MAX_SAMPLE_NUMEL:
            raise InteropError(f"{path}: input '{name}' has shape {dims}: {n:.3g} values per sample; at most "
                               f"{MAX_SAMPLE_NUMEL:.3g}")
        np_dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        dtypes.append("int64" if np.dtype(np_dt).kind in "iu" else "float32")
        limits.check_bytes(n * limits.SAMPLE_BATCH * (8 if dtypes[-1] == "int64" else 4),
                           f"{path}: input '{name}' of shape {dims} (batch {limits.SAMPLE_BATCH})")
        shapes.append(dims[1:])
    return shapes, dtypes


def import_onnx(path: str | Path, name: str | None = None) -> Imported:
    """Read an ONNX file into a diagram and its weights (opset 9 to current).

    Raises InteropError naming every operator that cannot be read, with its node, and
    LimitError (one) for a file past a limit: its size, nodes, memory or time."""
    path = Path(path)
    with limits.deadline(str(path)):
        return _import(path, name)


def _import(path: Path, name: str | None) -> Imported:
    from engine.interop.module.importer import from_module
    from engine.interop.onnx.to_torch import onnx_module

    phase("loading", f"reading {path.name}")
    model = _load(path)
    inits = {i.name for i in model.graph.initializer}
    shapes, dtypes = _inputs(path, model, [i.name for i in model.graph.input if i.name not in inits])
    phase("loading", "ONNX operators as torch calls")
    module = onnx_module(path, model)
    limits.dry_run(module, shapes, dtypes)
    limits.check_time("building the module")
    notes: list[str] = []
    own = best_effort(notes, "taking back the diagram the file carries (read as torch calls instead)",
                      lambda: _own_diagram(path, model, module, shapes, dtypes, name))
    if own is not None:
        return own
    imported = from_module(module, shapes, dtypes, source=path.name, name=name or path.stem, input_names=module.inputs)
    imported.notes[:0] = notes
    imported.project.description = f"Imported from {path.name} (ONNX opset {module.opset})"
    return imported


# ----- Layerflow's own exports --------------------------------------------------------
def _own_diagram(path: Path, model, module, shapes, dtypes, name: str | None) -> Imported | None:
    """The diagram a Layerflow export embeds, with the file's weights, when it computes
    what the file computes; None when the file has none or it does not agree."""
    from engine import trust
    from engine.diagram.compile import compile_graph
    from engine.interop.module.importer import SAMPLE_BATCH, _sample

    entry = next((p.value for p in model.metadata_props if p.key == DIAGRAM_KEY), None)
    if not entry:
        return None
    phase("checking", "the diagram the file carries against the file")
    try:
        graph = Graph.from_dict(json.loads(entry))
    except (ValueError, TypeError, KeyError, AttributeError, GraphError, RecursionError):
        return None  # (nested past the recursion limit: no diagram of ours)
    if trust.code_paths(graph):
        return None  # a file never brings code in; its torch reading is what it computes
    result = compile_graph(graph)
    if not result.ok:
        return None
    inits = {i.name: torch.from_numpy(np.array(onnx.numpy_helper.to_array(i))) for i in model.graph.initializer}
    try:
        gm = result.build(seed=0)
    except Exception:  # noqa: BLE001 - a diagram this build cannot make is read as torch calls
        return None
    want = gm.state_dict()
    state: dict[str, torch.Tensor] = {}
    for key, t in want.items():
        owner = graph.ties.get(key, key)
        src = inits.get(key, inits.get(owner))
        if src is None:
            if t.numel() == 0 or "num_batches_tracked" in key:
                src = t  # nothing to carry (BatchNorm's counter is not exported)
            else:
                return None
        if tuple(src.shape) != tuple(t.shape):
            return None
        state[key] = src.to(t.dtype).clone()
    gm.load_state_dict(state)
    gm.eval()
    torch.manual_seed(0)
    samples = [_sample(s, d) if d == "float32" else torch.randint(0, 2, (SAMPLE_BATCH, *s))
               for s, d in zip(shapes, dtypes)]  # (token ids every embedding has)
    with torch.no_grad():
        a, b = module(*samples), gm(*samples)
    a = list(a) if isinstance(a, (tuple, list)) else [a]
    b = list(b) if isinstance(b, (tuple, list)) else [b]
    if len(a) != len(b):
        return None
    for x, y in zip(a, b):
        if x.shape != y.shape or x.shape[0] != SAMPLE_BATCH:
            return None
        scale = max(x.abs().max().item(), 1e-6) if x.is_floating_point() and x.numel() else 1.0
        if not torch.allclose(x.double(), y.double(), rtol=1e-4, atol=1e-4 * scale):
            return None
    project = Project(graph, name=name or path.stem, description=f"Imported from {path.name} (a Layerflow export)")
    imported = Imported(project, state, str(path), drawn=True)
    check_imported(imported)
    best_effort(imported.notes, "choosing a synthetic data set of the input's shape", lambda: synthetic_training(project),
                graph)
    return imported
