"""A PyTorch nn.Module -> diagram with weights, through torch.export.

torch.export (non-strict) runs the module's forward once with a symbolic batch and
records every ATen call, with the module path of each (`nn_module_stack`); shape-only
control flow (an `assert` on the sequence length, `targets=None`) passes, since it is
ordinary Python on sizes. The calls are then read back as a diagram:

- each call of a torch.nn layer the catalog has (Linear, Conv2d, BatchNorm2d, ...)
  becomes one catalog node named after its path (`layer1.0.conv1` -> `layer1_0_conv1`);
- a few plain calls between layers read as catalog nodes too (x + y -> Add, relu,
  torch.cat, x.view(B, -1) -> Reshape, ...);
- everything else becomes a generic Op node (engine/runtime/ops.py) holding its ATen
  call(s) and the tensors it reads (a class token, a layer-scale gamma); sizes,
  batch-independent values (positions, arange) and values made from sizes alone (an
  all-ones attention mask) are folded into the node that uses them.

Each parameter is kept once: a module called twice, or a weight tied between two
layers, becomes a tie in the diagram (Graph.ties), so the runtime, checkpoints and
exports hold one tensor. Every node keeps its module path as its `scope` (the module
tree, for nested blocks in the editor). The result is checked: the diagram computes
what the module computes, on the module's own weights.

The parts: catalog_read.py (an nn layer -> its catalog type and parameters), fusion.py
(GELU, SiLU, RMSNorm put back whole in the fx graph), forms.py (plain calls that are a
catalog layer), fx_reader.py (the fx graph read as nodes and edges); this module exports,
reads, checks and lays out.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.interop.common import (Imported, InteropError, ModelRunError, best_effort, check_imported, make_id,
                                   synthetic_training)
from engine.interop.module.catalog_read import MODULES, catalog_layer  # noqa: F401  (catalog_layer: this module's API too)
from engine.interop.module.faithful import check_arity as _check_arity, check_outputs as _check_outputs
from engine.interop.module.fusion import _fuse
from engine.interop.module.mutations import functional
from engine.interop.module.prune import drop_dead
from engine.interop.module.fx_reader import _Reader, _merge_scales
from engine.interop.module.samples import SAMPLE_BATCH, embedding_vocab, first_samples, token_samples
from engine.interop.module.unused import left_out_notes
from engine.interop.progress import phase
from engine.diagram.layout import blocks_from_scopes
from engine.project import Project
from engine.runtime import layers as rl


class _Root(nn.Module):
    """Holds a lone catalog layer, so that it is a submodule with a path (one node)."""

    def __init__(self, name: str, module: nn.Module):
        super().__init__()
        self.add_module(name, module)
        self._name = name

    def forward(self, *xs):
        return getattr(self, self._name)(*xs)


def _sample(shape, dtype) -> torch.Tensor:
    dt = getattr(torch, dtype)
    if not dt.is_floating_point:
        return torch.zeros((SAMPLE_BATCH, *shape), dtype=dt)
    return torch.randn((SAMPLE_BATCH, *shape), dtype=dt)


def _export(module: nn.Module, samples: list[torch.Tensor], source: str):
    """torch.export with a symbolic batch; (program, batch symbol or None).

    Recorded under no_grad: a forward that turns gradients off for a part (Hugging Face's
    rotary embedding is `@torch.no_grad()`) is then no change of mode, so torch.export
    records its calls as calls, not as a wrap_with_set_grad_enabled subgraph the reader
    cannot take. The diagram holds calls, not grad modes, either way."""
    with torch.no_grad():
        return _export_as_is(module, samples, source)


def _export_as_is(module: nn.Module, samples: list[torch.Tensor], source: str):
    """(torch.export records a stack trace per call, a third of its time on a long chain;
    a module whose source lines are not the user's, an ONNX file's, records none.)"""
    import torch.fx.config as fx_config

    keep = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = keep or not getattr(module, "user_source_lines", True)
    try:
        return _export_traced(module, samples, source)
    finally:
        fx_config.do_not_emit_stack_traces = keep


def _export_traced(module: nn.Module, samples: list[torch.Tensor], source: str):
    from torch.export import Dim, export

    import inspect

    batch = Dim("batch", min=1)
    dims = tuple({0: batch} for _ in samples)
    params = inspect.signature(module.forward).parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        dims = (dims,)  # forward(self, *xs): the inputs travel as one tuple
    try:
        ep = export(module, tuple(samples), dynamic_shapes=dims, strict=False)
        ph = next(n for n in ep.graph_module.graph.nodes if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs)
        return ep, str(ph.meta["val"].shape[0])
    except Exception:  # the batch was fixed by the model's own code: try a fixed batch
        try:
            return export(module, tuple(samples), strict=False), None
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            raise InteropError(f"{source} cannot be exported by torch.export ({type(exc).__name__}: {first}); "
                               "control flow that depends on tensor values cannot be recorded: move it out of "
                               "forward or make the branch a submodule") from None


def _one_position(samples: list[torch.Tensor], out) -> str | None:
    """The note for a forward that keeps one position of a sequence (nanoGPT's, called
    without targets, returns the last position's logits): training on a token file's
    per-position targets needs every position's."""
    tokens = [x for x in samples if not x.is_floating_point() and x.dim() == 2 and x.shape[1] > 1]
    if not tokens or not isinstance(out, torch.Tensor) or out.dim() != 3 or out.shape[1] != 1:
        return None
    return (f"the traced forward keeps one position: its output is {list(out.shape[1:])} per sample for "
            f"{tokens[0].shape[1]} input positions (a GPT's forward called without targets returns only the last "
            "position's logits); the diagram computes just that, so a token file's per-position targets are "
            "refused before Run: to train on next tokens at every position, return the logits of all positions "
            "from forward and import it again")


def from_module(module: nn.Module, input_shapes: list[list[int]], input_dtypes: list[str] | None = None,
                source: str | None = None, name: str | None = None,
                input_names: list[str] | None = None, vocab: int | None = None) -> Imported:
    """Diagram + weights of an nn.Module instance (input shapes without the batch);
    `input_names` names the Input nodes (else forward's argument names); `vocab` bounds
    the token ids it is checked on (else each embedding's own size)."""
    source = source or type(module).__qualname__
    module = module.eval()
    dtypes = list(input_dtypes or []) + ["float32"] * max(0, len(input_shapes) - len(input_dtypes or []))
    samples = first_samples(input_shapes, dtypes, SAMPLE_BATCH, vocab)
    _check_arity(module, len(samples), source)
    phase("tracing", "running the model on sample inputs")
    try:
        with torch.no_grad():
            first_out = module(*samples)
    except ModelRunError as exc:  # (it names the part that failed: an ONNX node)
        raise InteropError(f"{source}: {exc}") from None
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise InteropError(f"{source}: running it on inputs of shape "
                           f"{', '.join(str((SAMPLE_BATCH, *s)) for s in input_shapes)} failed: {type(exc).__name__}: {first}") from None
    root = _Root(make_id(type(module).__name__.lower(), set()), module) if type(module) in MODULES else module
    phase("tracing", "recording its calls (torch.export)")
    ep, batch_sym = _export(root, samples, source)
    ep = functional(ep)  # in-place writes (a mask filled slice by slice) become values
    users = [n for n in ep.graph_module.graph.nodes
             if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs]
    samples = token_samples(samples, embedding_vocab(ep.graph_module, users), vocab)  # checked on real tokens
    phase("converting", "reading the calls as layers")
    _fuse(ep.graph_module)
    reader = _Reader(root, ep, batch_sym, input_names)
    if batch_sym is None:
        reader.notes.append(f"the model fixes its batch size in forward: exported for a batch of {SAMPLE_BATCH}")
    one = _one_position(samples, first_out)
    if one:
        reader.notes.append(one)
    reader.read()
    notes = reader.notes
    strip = f"{root._name}." if isinstance(root, _Root) else ""
    left_out = best_effort(notes, "naming what the diagram leaves out of the module",  # training-only branches:
                           lambda: left_out_notes(root, ep, samples, strip=strip)) or []  # named, never dropped
    if reader.problems:
        raise InteropError(f"cannot import {source}: {len(reader.problems)} call(s) cannot be represented:\n"
                           + "\n".join(f"  - {p}" for p in reader.problems))
    reader.wire()
    graph = reader.graph
    left_out += best_effort(notes, "removing calls whose results reach no output",  # (a validate warning each)
                            lambda: drop_dead(graph, reader.state), graph, reader.state) or []
    notes += left_out  # (and kept in the project: its summary says them under the total)
    best_effort(notes, "merging chains of scalar Scale nodes", lambda: _merge_scales(graph), graph)
    phase("laying out", "blocks from the module tree")
    best_effort(notes, "laying the diagram out in blocks of its module tree", lambda: blocks_from_scopes(graph), graph)
    project = Project(graph, name=name or type(module).__name__, description=f"Imported from {source}",
                      left_out=left_out)
    imported = Imported(project, reader.state, source, notes)
    phase("checking", "the diagram computes what the module computes")
    check_imported(imported)
    note = best_effort(notes, "choosing a synthetic data set of the input's shape",
                       lambda: synthetic_training(project), graph)
    if note:
        notes.append(note)
    _check_outputs(imported, module, samples)
    return imported


def import_module(path: str, kwargs: dict | None = None, input_shapes: list[list[int]] | None = None,
                  input_dtypes: list[str] | None = None, name: str | None = None,
                  vocab: int | None = None) -> Imported:
    """'pkg.mod:Class' built with kwargs -> Imported (diagram + weights); `vocab` bounds the
    token ids the import is checked on."""
    phase("loading", f"importing {path}")
    try:
        cls = rl.import_object(path)
    except (ImportError, AttributeError) as exc:
        raise InteropError(f"cannot import '{path}': {exc}") from None
    phase("loading", f"building {path.rpartition(':')[2]}")
    try:
        module = cls(**(kwargs or {}))
    except Exception as exc:
        raise InteropError(f"'{path}' could not be built with {kwargs or {}}: {type(exc).__name__}: {exc}") from None
    if not isinstance(module, nn.Module):
        raise InteropError(f"'{path}' built a {type(module).__name__}, not an nn.Module")
    if not input_shapes:
        raise InteropError(f"'{path}': give the shape of each input without the batch (--input-shape 3,32,32)")
    return from_module(module, input_shapes, input_dtypes, source=path, name=name or path.rpartition(":")[2],
                       vocab=vocab)
