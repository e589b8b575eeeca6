"""Shared pieces of the importers: the Imported result, names, saving atomically."""
from __future__ import annotations

import builtins
import io
import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from engine.errors import InteropError  # noqa: F401  (raised by every interop module; the API's name)
from engine.diagram.graph import MAX_ID_LEN
from engine.project import Project, atomic_write, save_project, weights_name


class ModelRunError(RuntimeError):
    """A run of an imported model that failed at a part its message names, in one line
    for the user (which node, on which inputs, and what to do); the importer says it as is."""

# Names a node may not take: fx would rename it (keywords, builtins, names fx's
# generated code uses) or nn.Module already has the attribute (compile refuses those).
_RESERVED = (set(dir(nn.Module)) | {"forward", "code", "graph"} | set(keyword.kwlist)
             | set(vars(builtins)) | {"torch", "math", "inf", "nan", "device", "pytree", "fx_pytree"})


@dataclass
class Imported:
    """A diagram built from a foreign model, with the weights it came with.

    `state` has the keys of the compiled module's state_dict (node id + '.' +
    parameter), so engine/runtime/model.py load_weights reads it once saved."""

    project: Project
    state: dict[str, torch.Tensor]
    source: str
    notes: list[str] = field(default_factory=list)
    drawn: bool = False  # the diagram comes with its author's positions (a Layerflow export), not laid out here

    @property
    def n_params(self) -> int:
        """Learnable parameters in the imported diagram (buffers not counted)."""
        from engine.diagram.compile import compile_graph

        return compile_graph(self.project.graph).total_params


def best_effort(notes: list[str], what: str, step, graph=None, state: dict | None = None):
    """step()'s result, or None when it raised: then one line in `notes` says what was not
    done and why. For the parts of an import it can do without (its notes, pruning dead
    calls, the layout, a synthetic data set): none of them may fail an import that read
    the model right. `graph` and `state`, when given, are put back as they were before the
    step, so a step that failed halfway leaves nothing half done."""
    saved = (graph.to_dict() if graph is not None else None, dict(state) if state is not None else None)
    try:
        return step()
    except Exception as exc:  # noqa: BLE001 - whatever went wrong, the import stands without this step
        if getattr(exc, "stops_the_import", False):
            raise  # the user stopped the import (progress.Cancelled), or it ran past a limit (LimitError)
        if graph is not None:
            graph.load_dict(saved[0])
        if state is not None:
            state.clear()
            state.update(saved[1])
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        notes.append(f"{what} failed, so the import goes without it ({type(exc).__name__}: {first})")
        return None


def settle_torch_trace() -> None:
    """Call on the GUI thread before torch.export or the ONNX exporter run on a worker thread.
    torch installs its structured-trace handler (LazyTraceHandler) in every process; with
    no trace directory (TORCH_TRACE unset) it removes itself at its first record, but until
    then each structured record captures and symbolizes the caller's stack. The first
    export of the process doing that on a worker thread while the GUI thread collected
    garbage crashed the app (a segfault in the Model menu's ONNX export, tests/app/
    test_run_model_ui.py, about one full test run in two). One record here, without the
    stack, lets the handler go first; a set TORCH_TRACE keeps it (then tracing was asked for)."""
    from torch._logging import trace_structured

    trace_structured("layerflow_start", suppress_context=True, expect_trace_id=False)


def save_imported(imported: Imported, project_path: str | Path) -> Path:
    """Write the weights file, then the project that names it; each atomically.

    A crash between the two leaves at most an unreferenced weights file, never a
    project whose weights are missing or half written."""
    project_path = Path(project_path)
    wname = weights_name(project_path)
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu().contiguous() for k, v in imported.state.items()}, buf)
    wpath = project_path.parent / wname
    atomic_write(wpath, buf.getvalue())
    imported.project.weights = wname
    try:
        return save_project(imported.project, project_path)
    except BaseException:
        imported.project.weights = None
        raise


def make_id(base: str, taken: set[str]) -> str:
    """A valid, unused Python identifier made from any text (ONNX names, fx targets)."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", base).strip("_")
    s = re.sub(r"_+", "_", s) or "node"
    if s[0].isdigit():
        s = "n_" + s
    s = s[:MAX_ID_LEN - 8]  # room for a numeric suffix within the id rule's length
    if s not in taken and s not in _RESERVED:
        taken.add(s)
        return s
    i = 1
    while f"{s}{i}" in taken or f"{s}{i}" in _RESERVED:
        i += 1
    taken.add(f"{s}{i}")
    return f"{s}{i}"


def check_imported(imported: Imported) -> None:
    """The diagram compiles and the weights fit it exactly; raises InteropError."""
    from engine.diagram.compile import compile_graph

    result = compile_graph(imported.project.graph)
    if not result.ok:
        raise InteropError(f"{imported.source}: the imported diagram does not compile:\n"
                           + "\n".join(f"  {e}" for e in result.errors))
    gm = result.build(seed=0)
    want = gm.state_dict()
    missing = sorted(set(want) - set(imported.state))
    extra = sorted(set(imported.state) - set(want))
    wrong = sorted(k for k in set(want) & set(imported.state) if tuple(want[k].shape) != tuple(imported.state[k].shape))
    if missing or extra or wrong:
        raise InteropError(
            f"{imported.source}: the weights do not fit the diagram (a bug in the importer): "
            f"missing {missing[:5]}, unexpected {extra[:5]}, wrong shape {wrong[:5]}")


def synthetic_training(project: Project) -> str | None:
    """Give an imported diagram a synthetic data set of its input's shape, so it can
    train (from the imported weights) at once; the user swaps in real data later.
    Returns a note for the user when the data set is not the obvious one."""
    from engine.diagram.compile import compile_graph
    from engine.data.sources import SyntheticClassification, SyntheticImages, SyntheticRegression, SyntheticSequence

    result = compile_graph(project.graph)
    if not result.ok or len(result.spec["inputs"]) != 1 or len(result.spec["outputs"]) != 1:
        return
    inp = result.nodes[result.spec["inputs"][0]]
    out_id = result.spec["outputs"][0]
    src = result.graph.incoming(out_id).get("in")
    pred = result.nodes[src.src].out if src else None
    if pred is None:
        return
    shape, loss = list(inp.params["shape"]), result.nodes[out_id].params.get("loss")
    classes = pred.shape[-1] if pred.shape else 1
    if inp.params["dtype"] == "int64" and len(shape) == 1 and tuple(pred.shape[:-1]) == (shape[0],) and classes >= 2:
        # a language model: per-token logits over a vocabulary
        if loss != "cross_entropy":
            project.graph.set_param(out_id, "loss", "cross_entropy")
        ds = SyntheticSequence(kind="synthetic_sequence", seq_len=shape[0], vocab_size=classes, n_classes=classes,
                               task="next_token")
    elif inp.params["dtype"] == "int64" and len(shape) == 1 and tuple(pred.shape[:-1]) == (1,) and \
            2 <= classes <= 10_000:
        # only the last position's logits (B, 1, vocab), as nanoGPT's forward gives them without
        # targets: one label per sequence, a token of the vocabulary (cross_entropy flattens (B, 1))
        if loss != "cross_entropy":
            project.graph.set_param(out_id, "loss", "cross_entropy")
        ds = SyntheticSequence(kind="synthetic_sequence", seq_len=shape[0], vocab_size=classes, n_classes=classes)
        project.training = project.training.model_copy(update={"dataset": ds})
        return (f"with one position's logits (shape (1, {classes}) per sequence) it trains with cross_entropy on one "
                "token per sequence (synthetic: the token each sequence repeats most)")
    elif loss == "cross_entropy" and len(pred.shape) == 1 and classes >= 2:
        if inp.params["dtype"] == "int64" and len(shape) == 1:
            vocab = min((n.params["num_embeddings"] for n in result.nodes.values() if n.type == "Embedding"), default=32)
            ds = SyntheticSequence(kind="synthetic_sequence", seq_len=shape[0], vocab_size=vocab, n_classes=classes)
        elif len(shape) == 3:
            ds = SyntheticImages(kind="synthetic_images", channels=shape[0], height=shape[1], width=shape[2],
                                 n_classes=classes)
        elif len(shape) == 1:
            ds = SyntheticClassification(kind="synthetic_classification", n_features=shape[0], n_classes=classes)
        else:
            return
    elif loss == "mse" and len(shape) == 1 and len(pred.shape) == 1 and inp.params["dtype"] == "float32":
        ds = SyntheticRegression(kind="synthetic_regression", n_features=shape[0], n_targets=classes)
    else:
        return None
    project.training = project.training.model_copy(update={"dataset": ds})
    return None
