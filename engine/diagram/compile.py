"""Diagram -> torch.fx GraphModule, with shapes, parameter counts and FLOPs.

Every node is checked on its own, in topological order: its parameters against the
catalog's declarations, its input shapes against what the layer needs, then a
forward pass on meta tensors (no memory, no compute) gives its output shape and,
through torch's FlopCounterMode, its FLOPs. Errors are collected, each naming the
node and the field; a node whose input could not be computed is skipped quietly so
one mistake does not cascade into a page of messages.
"""
from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from engine import trust
from engine.diagram.graph import CycleError, Edge, Graph
from engine.diagram.catalog import FieldError, LayerSpec, get_layer, unknown_type
from engine.runtime.layers import FUNCTION_LAYERS, build_layer
from engine.runtime.model import build_graph_module

# Batch used for the meta forward pass (BatchNorm refuses a batch of 1 in training).
META_BATCH = 2
MAX_MARKED = 50  # nodes marked for one diagram-wide problem (a cycle)
_RESERVED = set(dir(nn.Module)) | {"training", "forward", "code", "graph", "meta"}


@dataclass(frozen=True)
class CompileError:
    message: str
    node: str | None = None
    field: str | None = None
    severity: str = "error"  # error | warning

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]  # per sample: the batch dimension is left out
    dtype: str

    def label(self) -> str:
        return "(" + ", ".join(["B", *map(str, self.shape)]) + ")"

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def nbytes(self) -> int:
        """Bytes per sample."""
        return self.numel() * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


@dataclass
class NodeInfo:
    id: str
    type: str
    params: dict = field(default_factory=dict)  # resolved: inferred sizes filled in
    out: TensorInfo | None = None
    inputs: list[TensorInfo] = field(default_factory=list)
    n_params: int = 0
    flops: int = 0  # forward FLOPs per sample
    errors: list[CompileError] = field(default_factory=list)


@dataclass
class CompileResult:
    graph: Graph
    nodes: dict[str, NodeInfo]
    errors: list[CompileError]
    warnings: list[CompileError]
    order: list[str]
    spec: dict | None = None  # the runtime's input (engine/runtime/model.py); None if errors
    _module: torch.fx.GraphModule | None = None

    @property
    def module(self) -> torch.fx.GraphModule | None:
        """The GraphModule on the meta device (built on first use); None if errors."""
        if self._module is None and self.spec is not None:
            self._module = build_graph_module(self.spec, device="meta")
        return self._module

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def total_params(self) -> int:
        return sum(n.n_params for n in self.nodes.values())

    @property
    def total_flops(self) -> int:
        return sum(n.flops for n in self.nodes.values())

    def edge_info(self, e: Edge) -> TensorInfo | None:
        info = self.nodes.get(e.src)
        return info.out if info else None

    def errors_for(self, node_id: str) -> list[CompileError]:
        return [e for e in self.errors if e.node == node_id]

    def output_node(self) -> str | None:
        outs = self.spec["outputs"] if self.spec else [n for n in self.order if self.graph.nodes[n].type == "Output"]
        return outs[0] if outs else None

    def loss(self) -> str:
        out = self.output_node()
        return self.nodes[out].params.get("loss", "none") if out else "none"

    def build(self, device: str = "cpu", seed: int | None = None) -> torch.fx.GraphModule:
        """A real module with initial weights (a function of the seed)."""
        if self.spec is None:
            raise ValueError("the diagram has errors:\n" + "\n".join(map(str, self.errors)))
        return build_graph_module(self.spec, device=device, seed=seed)

    def summary_rows(self) -> list[dict]:
        return [
            {
                "node": nid,
                "type": self.nodes[nid].type,
                "output_shape": self.nodes[nid].out.label() if self.nodes[nid].out else "",
                "dtype": self.nodes[nid].out.dtype if self.nodes[nid].out else "",
                "params": self.nodes[nid].n_params,
                "flops": self.nodes[nid].flops,
            }
            for nid in self.order
        ]


def _err(errors: list[CompileError], node_id: str, ntype: str, msg: str, fld: str | None = None) -> CompileError:
    e = CompileError(f"node '{node_id}' ({ntype}): {msg}", node=node_id, field=fld)
    errors.append(e)
    return e


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def compile_graph(graph: Graph) -> CompileResult:
    errors: list[CompileError] = []
    warnings: list[CompileError] = []
    infos: dict[str, NodeInfo] = {}

    # 1. Per-node declarations: type known, parameters well typed.
    specs: dict[str, LayerSpec] = {}
    params: dict[str, dict] = {}
    for nid, node in graph.nodes.items():
        infos[nid] = NodeInfo(nid, node.type)
        if nid in _RESERVED:
            _err(errors, nid, node.type, f"the name '{nid}' is reserved by torch.nn.Module; rename the node")
        spec = get_layer(node.type)
        if spec is None:
            _err(errors, nid, node.type, unknown_type(node.type))
            continue
        specs[nid] = spec
        merged, perrs = spec.check_params(node.params)
        for fe in perrs:
            _err(errors, nid, node.type, str(fe), fe.field)
        params[nid] = merged
        if not perrs:
            infos[nid].params = dict(merged)
        if spec.type == "Custom" and not perrs and merged["path"]:
            if not trust.allowed(merged["path"]):
                _err(errors, nid, node.type, f"not checked: its code ('{merged['path']}') runs only once you trust "
                                             "this project; read it, then run `layerflow trust PROJECT` or add --trust",
                     "path")
                del specs[nid]  # nothing of it is built or run
                continue
            try:
                from engine.runtime.layers import import_object

                import_object(merged["path"])
            except Exception as exc:  # any import failure is the user's path
                _err(errors, nid, node.type, f"path '{merged['path']}' does not import: {_first_line(exc)}", "path")

    for e in graph.edges:  # an edge must leave from a port its node has
        src = graph.nodes.get(e.src)
        spec = specs.get(e.src)
        if src is not None and spec is not None and e.src_port not in spec.output_ports(params.get(e.src, {})):
            _err(errors, e.src, src.type, f"has no output port '{e.src_port}' (edge to '{e.dst}')")

    # 2. Graph-level structure.
    try:
        order = graph.topo_order()
    except CycleError as ce:
        ring = list(dict.fromkeys(ce.cycle))
        shown = ring if len(ring) <= 8 else [*ring[:4], f"... {len(ring) - 7} more ...", *ring[-3:]]
        msg = f"the diagram has a cycle of {len(ring)} node(s): " + " -> ".join([*shown, ring[0]])
        for nid in ring[:MAX_MARKED]:  # bounded: a 10,000-node ring is one message, not 10,000 pages
            _err(errors, nid, graph.nodes[nid].type, msg if nid == ring[0] else f"is on the cycle through '{ring[0]}'")
        return CompileResult(graph, infos, errors, warnings, list(graph.nodes))

    inputs = [n for n in order if graph.nodes[n].type == "Input"]
    outputs = [n for n in order if graph.nodes[n].type == "Output"]
    if not inputs:
        errors.append(CompileError("the diagram has no Input node"))
    if not outputs:
        errors.append(CompileError("the diagram has no Output node"))

    # the edges into each node, read once (graph.incoming per node scans every edge: quadratic at 10,000 nodes)
    into: dict[str, dict] = {}
    sources: dict[str, list[str]] = {}
    for e in graph.edges:
        into.setdefault(e.dst, {})[e.dst_port] = e
        sources.setdefault(e.dst, []).append(e.src)

    # 3. Shapes, counts and FLOPs node by node on the meta device.
    failed: set[str] = set()  # nodes with no usable output (errors here or upstream)
    metas: dict[str, torch.Tensor] = {}
    spec_nodes: list[dict] = []
    for nid in order:
        node = graph.nodes[nid]
        spec = specs.get(nid)
        info = infos[nid]
        if spec is None or nid not in params or info.params == {} and spec.params:
            failed.add(nid)
            continue
        incoming = into.get(nid, {})
        ports = spec.input_ports(params[nid])
        for port, e in incoming.items():
            if port not in ports:
                _err(errors, nid, node.type, f"has no input port '{port}' (edge from '{e.src}')")
        missing = [p for p in ports if p not in incoming]
        if missing:
            _err(errors, nid, node.type, "input " + ", ".join(f"'{p}'" for p in missing) + " is not connected")
            failed.add(nid)
            continue
        srcs = [incoming[p].src for p in ports]
        if any(s in failed for s in srcs):
            failed.add(nid)
            continue
        in_infos = [infos[s].out for s in srcs]
        if any(i is None for i in in_infos):  # fed by an Output
            _err(errors, nid, node.type, "is fed by a node that has no output")
            failed.add(nid)
            continue
        info.inputs = list(in_infos)
        p = dict(params[nid])
        try:
            if spec.resolve:
                p = spec.resolve(p, [i.shape for i in in_infos], [i.dtype for i in in_infos])
        except FieldError as fe:
            _err(errors, nid, node.type, str(fe), fe.field)
            failed.add(nid)
            continue
        info.params = p
        sn = {"id": nid, "type": node.type, "params": p, "args": srcs}
        # the editor's block ("h.0/h.0.attn") and an imported node's module tree: where
        # training.compile's blocks mode cuts its regions (engine/runtime/compiling.py)
        if node.group:
            sn["group"] = node.group
        if node.scope:
            sn["scope"] = [list(s) for s in node.scope]
        spec_nodes.append(sn)
        if spec.kind == "input":
            info.out = TensorInfo(tuple(p["shape"]), p["dtype"])
            dtype = getattr(torch, p["dtype"])
            metas[nid] = torch.zeros((META_BATCH, *p["shape"]), dtype=dtype, device="meta")
            continue
        if spec.kind == "output":
            info.out = None
            continue
        try:
            y, n_params, flops = _run_meta(node.type, p, [metas[s] for s in srcs])
        except Exception as exc:  # the layer itself refused the input
            _err(errors, nid, node.type, _first_line(exc))
            failed.add(nid)
            continue
        if not isinstance(y, torch.Tensor):
            _err(errors, nid, node.type, f"returned {type(y).__name__}, not one tensor")
            failed.add(nid)
            continue
        if y.dim() == 0 or y.shape[0] != META_BATCH:
            _err(errors, nid, node.type, f"output shape {tuple(y.shape)} lost the batch dimension")
            failed.add(nid)
            continue
        metas[nid] = y
        info.out = TensorInfo(tuple(y.shape[1:]), str(y.dtype).replace("torch.", ""))
        info.n_params = n_params
        info.flops = flops // META_BATCH

    # 4. Warnings: dead ends and layers whose result depends on how the batch is cut.
    if outputs:
        live = set()
        stack = list(outputs)
        while stack:
            n = stack.pop()
            if n not in live:
                live.add(n)
                stack.extend(sources.get(n, ()))
        for nid in order:
            if nid not in live:
                warnings.append(CompileError(f"node '{nid}' ({graph.nodes[nid].type}): does not reach an Output", nid, severity="warning"))

    ties = graph.live_ties()
    if ties and not errors:
        _check_ties(ties, infos, errors)
    result = CompileResult(graph, infos, errors, warnings, order)
    if not errors:
        result.spec = {"nodes": spec_nodes, "inputs": inputs, "outputs": outputs}
        if ties:
            result.spec["ties"] = dict(sorted(ties.items()))
    return result


def _check_ties(ties: dict[str, str], infos: dict[str, NodeInfo], errors: list[CompileError]) -> None:
    """Each tie joins two parameters of one shape; the tied copy is not counted twice."""
    shapes: dict[str, dict[str, tuple]] = {}

    def params_of(nid: str) -> dict[str, tuple]:
        if nid not in shapes:
            with torch.device("meta"):
                m = build_layer(infos[nid].type, infos[nid].params)
            shapes[nid] = {k: tuple(p.shape) for k, p in m.named_parameters()}
        return shapes[nid]

    for dst, src in ties.items():
        (dn, _, dp), (sn, _, sp) = dst.partition("."), src.partition(".")
        if infos[dn].type in FUNCTION_LAYERS or infos[sn].type in FUNCTION_LAYERS:
            _err(errors, dn, infos[dn].type, f"tie {dst} = {src}: a function layer has no parameters")
            continue
        a, b = params_of(dn).get(dp), params_of(sn).get(sp)
        if a is None or b is None:
            bad = dst if a is None else src
            _err(errors, dn, infos[dn].type, f"tie {dst} = {src}: '{bad}' is not a parameter of that node")
        elif a != b:
            _err(errors, dn, infos[dn].type, f"tie {dst} = {src}: shapes {list(a)} and {list(b)} differ")
        elif dst != src:
            infos[dn].n_params -= math.prod(a)


# Per-layer results keyed by (type, params, input shapes and dtypes): the GUI compiles
# after every edit, and an edit changes one node, so the other nodes come from here.
_META_CACHE: "OrderedDict[tuple, tuple[tuple[int, ...], torch.dtype, int, int]]" = OrderedDict()
_META_CACHE_SIZE = 4096
_META_LOCK = threading.Lock()


def _run_meta(ntype: str, params: dict, args: list[torch.Tensor]) -> tuple[Any, int, int]:
    """Forward one layer on meta tensors: (output, parameter count, FLOPs)."""
    try:
        key = (ntype, json.dumps(params, sort_keys=True), tuple((tuple(a.shape), a.dtype) for a in args))
    except (TypeError, ValueError):
        key = None
    hit = None
    if key is not None:
        with _META_LOCK:  # (the editor compiles in the GUI thread while a run is prepared in another)
            hit = _META_CACHE.get(key)
            if hit is not None:
                _META_CACHE.move_to_end(key)
    if hit is not None:
        shape, dtype, n_params, flops = hit
        return torch.empty(shape, dtype=dtype, device="meta"), n_params, flops
    y, n_params, flops = _forward_meta(ntype, params, args)
    if key is not None and isinstance(y, torch.Tensor):
        with _META_LOCK:
            _META_CACHE[key] = (tuple(y.shape), y.dtype, n_params, flops)
            if len(_META_CACHE) > _META_CACHE_SIZE:
                _META_CACHE.popitem(last=False)
    return y, n_params, flops


def _forward_meta(ntype: str, params: dict, args: list[torch.Tensor]) -> tuple[Any, int, int]:
    counter = FlopCounterMode(display=False)
    if ntype in FUNCTION_LAYERS:
        fn, kwargs = FUNCTION_LAYERS[ntype](params)
        with counter:
            y = fn(tuple(args), **kwargs) if fn is torch.cat else fn(*args, **kwargs)
        return y, 0, counter.get_total_flops()
    with torch.device("meta"):
        m = build_layer(ntype, params)
    m.train()
    with counter:
        y = m(*args)
    return y, sum(p.numel() for p in m.parameters()), counter.get_total_flops()


__all__ = ["compile_graph", "CompileResult", "CompileError", "NodeInfo", "TensorInfo", "META_BATCH"]
