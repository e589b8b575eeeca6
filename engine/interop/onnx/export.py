"""Diagram -> ONNX through torch.onnx's dynamo exporter, with a dynamic batch dimension.

The legacy exporter (dynamo=False) fails on a hand-built fx GraphModule, so the
dynamo one is used. optimize=False on purpose: the optimizer folds constants, which
renames weights (a transposed Linear weight becomes `val_14`), merges equal weights
into one initializer and cuts a PositionalEmbedding table down to the rows one
sequence uses. Unoptimized, every initializer is named by its state_dict key and
holds the whole parameter, so an import gets back exactly what was exported.

The diagram itself travels in the model's metadata ("layerflow.diagram"): names, blocks,
positions and what ONNX cannot say (dropout rates, the loss). The importer takes it
back only when it computes what the file's operators compute (engine/interop/onnx/reader.py).
"""
from __future__ import annotations

import io
import json
import logging
import warnings
from pathlib import Path

import torch
from torch import fx

from engine.diagram.compile import compile_graph
from engine.interop.common import InteropError
from engine.interop.onnx.export_faults import describe
from engine.project import Project, atomic_write
from engine.runtime.model import load_weights

DEFAULT_OPSET = 20  # Gelu is one op from 20 on; LayerNormalization needs 17+
DIAGRAM_KEY = "layerflow.diagram"


def build_for_export(project: Project, seed: int | None = None, state: dict | None = None
                     ) -> tuple[fx.GraphModule, tuple, dict]:
    """The project's module in eval mode (weights: `state`, a run's, when given, else the
    project's weights file if it has one, else the initial weights of its seed), sample
    inputs of batch 2, and the compiled spec."""
    result = compile_graph(project.graph)
    if not result.ok:
        raise InteropError("the diagram has errors; fix them before exporting:\n"
                           + "\n".join(f"  {e}" for e in result.errors))
    gm = result.build(seed=project.training.seed if seed is None else seed)
    if state is not None:
        gm.load_state_dict(state, strict=True)  # (engine/runs/weights.py checked the fit)
    elif project.weights:
        wpath = project.resolve_path(project.weights)
        try:
            load_weights(gm, str(wpath))
        except (OSError, RuntimeError, ValueError) as exc:
            from engine.runs.weights import weights_error

            raise weights_error(wpath, exc) from None
    gm.eval()
    inputs = []
    for nid in result.spec["inputs"]:
        info = result.nodes[nid].out
        dtype = getattr(torch, info.dtype)
        inputs.append(torch.zeros((2, *info.shape), dtype=dtype) if dtype.is_floating_point is False
                      else torch.randn((2, *info.shape), dtype=dtype))
    return gm, tuple(inputs), result.spec


def to_onnx_model(project: Project, opset: int = DEFAULT_OPSET, state: dict | None = None):
    """The ONNX ModelProto of a project (checked by onnx.checker); `state`: weights to
    carry instead of the project's (a run's, engine/runs/weights.py)."""
    import onnx

    gm, inputs, spec = build_for_export(project, state=state)
    batch = torch.export.Dim("batch", min=1)
    dynamic = tuple({0: batch} for _ in inputs)
    custom = [n["id"] for n in spec["nodes"] if n["type"] == "Custom"]
    names = dict(input_names=list(spec["inputs"]), output_names=[_out_name(o) for o in spec["outputs"]])
    try:
        with warnings.catch_warnings(), _quiet():
            warnings.simplefilter("ignore")
            prog = torch.onnx.export(gm, inputs, dynamo=True, dynamic_shapes=dynamic, opset_version=opset,
                                     optimize=False, verbose=False, **names)
    except Exception as exc:  # torch raises many types; say which node and operator
        first = describe(exc, spec)
        try:  # torch's fallback: its own decomposition table first, then ONNX translation
            prog = _decomposed_first(gm, inputs, dynamic, opset, names)
        except Exception as exc2:  # noqa: BLE001
            second = describe(exc2, spec)
            hint = "" if second == first else f"; exporting it decomposed by torch.export first failed too: {second}"
            if custom:
                hint += f"; Custom layers ({', '.join(custom)}) are the usual cause: replace them by catalog layers"
            raise InteropError(f"the diagram cannot be exported to ONNX: {first}{hint}") from None
    model = prog.model_proto
    entry = model.metadata_props.add()
    entry.key, entry.value = DIAGRAM_KEY, json.dumps(project.graph.to_dict(), sort_keys=True)
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise InteropError(f"the exported ONNX model does not pass onnx.checker: {str(exc).splitlines()[0]}") from None
    return model


def _decomposed_first(gm, inputs, dynamic, opset, names):
    """The fallback torch offers when torch.onnx's own decomposition fails (a Reshape read
    as a view whose strides the decomposed attention changes, T5-style float masks into
    scaled_dot_product_attention): export, decompose with torch.export's default table, and
    translate that program."""
    with warnings.catch_warnings(), _quiet():
        warnings.simplefilter("ignore")
        ep = torch.export.export(gm, inputs, dynamic_shapes=dynamic, strict=False).run_decompositions()
        return torch.onnx.export(ep, dynamo=True, opset_version=opset, optimize=False, verbose=False, **names)


def _out_name(node_id: str) -> str:
    return node_id


class _quiet:
    """torch.onnx prints progress lines and torchvision warnings; keep the CLI clean."""

    def __enter__(self):
        import contextlib

        self._log = logging.getLogger("torch.onnx")
        self._level = self._log.level
        self._log.setLevel(logging.ERROR)
        self._out = contextlib.redirect_stdout(io.StringIO())
        self._out.__enter__()
        return self

    def __exit__(self, *exc):
        self._out.__exit__(*exc)
        self._log.setLevel(self._level)
        return False


def export_onnx(project: Project, path: str | Path, opset: int = DEFAULT_OPSET, *, run=None,
                checkpoint: str | None = None) -> Path:
    """Write the project's model as ONNX with a dynamic batch dimension. Its weights: a
    run's (`run`, a run folder, at `checkpoint`: final, latest, best or step_N; refused
    when the run's diagram differs), else the project's weights file, else the initial
    weights for its training seed."""
    state = None
    if run is not None:
        from engine.runs.weights import run_state

        state = run_state(project, run, checkpoint)
    model = to_onnx_model(project, opset, state=state)
    path = Path(path)
    atomic_write(path, model.SerializeToString())
    return path
