"""A PyTorch nn.Module (by import path) -> diagram with weights, through torch.fx.

torch.fx.symbolic_trace records the module's forward as a graph of calls. torch.nn
layers stay whole (fx treats them as leaves, and so do Layerflow's own layers), and
each becomes one catalog node named after its attribute path (`layer1.conv` ->
`layer1_conv`) carrying a copy of its weights. Functions between layers (x + y,
torch.cat, F.relu, x.view(B, -1), q @ k.transpose(1, 2), x[:, 2:], x * 0.5) map to
Add, Concat, ReLU, Reshape, MatMul, Transpose, Slice, Scale, and so on.
Shapes come from running the traced module once on a small batch (ShapeProp), so
`view`/`reshape` targets are read from the real result, and calls that only compute
sizes (`x.size(0)`) are left out. Every call the catalog cannot express is listed
at once; a module fx cannot trace is reported with fx's reason.
"""
from __future__ import annotations

import operator
from collections import Counter

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from engine.graph import Edge, Graph
from engine.interop.common import Imported, InteropError, check_imported, make_id, synthetic_training
from engine.interop.layout import layered_layout
from engine.layers import get_layer
from engine.project import Project
from engine.runtime import layers as rl

SAMPLE_BATCH = 2


class _Unsupported(Exception):
    pass


def _one(v, what: str) -> int:
    vals = list(v) if isinstance(v, (tuple, list)) else [v]
    if len(set(vals)) != 1:
        raise _Unsupported(f"{what} {tuple(vals)} differs per dimension; the catalog layer takes one value")
    return int(vals[0])


def _hw(v, what: str) -> int | list[int]:
    """A 2-D size: an int when height and width agree, else [h, w]."""
    vals = [int(x) for x in v] if isinstance(v, (tuple, list)) else [int(v)]
    return vals if len(vals) == 2 and vals[0] != vals[1] else _one(vals, what)


def _conv(m: nn.Module) -> tuple[str, dict]:
    if m.padding_mode != "zeros":
        raise _Unsupported(f"padding_mode='{m.padding_mode}' (the catalog pads with zeros)")
    if isinstance(m.padding, str):
        if m.padding != "valid":
            raise _Unsupported(f"padding='{m.padding}'")
        pad = 0
    else:
        pad = _hw(m.padding, "padding")
    nd = 1 if isinstance(m, nn.Conv1d) else 2
    return f"Conv{nd}d", {"in_channels": m.in_channels, "out_channels": m.out_channels,
                          "kernel_size": _hw(m.kernel_size, "kernel_size"), "stride": _hw(m.stride, "stride"),
                          "padding": pad, "dilation": _one(m.dilation, "dilation"), "groups": m.groups,
                          "bias": m.bias is not None}


def _pool(m: nn.Module) -> tuple[str, dict]:
    if m.ceil_mode:
        raise _Unsupported("ceil_mode=True")
    if isinstance(m, nn.MaxPool2d):
        if m.return_indices or _one(m.dilation, "dilation") != 1:
            raise _Unsupported("MaxPool2d with dilation or return_indices")
        kind = "MaxPool2d"
    else:
        if not m.count_include_pad or m.divisor_override is not None:
            raise _Unsupported("AvgPool2d with count_include_pad=False or divisor_override")
        kind = "AvgPool2d"
    stride = m.stride if m.stride is not None else m.kernel_size
    k, st = _hw(m.kernel_size, "kernel_size"), _hw(stride, "stride")
    return kind, {"kernel_size": k, "stride": None if st == k else st,
                  "padding": _hw(m.padding, "padding")}


def _bn(m: nn.Module) -> tuple[str, dict]:
    if not m.affine or not m.track_running_stats or m.momentum is None:
        raise _Unsupported("BatchNorm without affine, running statistics or momentum")
    return type(m).__name__, {"num_features": m.num_features, "eps": m.eps, "momentum": m.momentum}


def _ln(m: nn.LayerNorm) -> tuple[str, dict]:
    if len(m.normalized_shape) != 1:
        raise _Unsupported(f"normalized_shape {tuple(m.normalized_shape)} (the catalog normalizes the last dimension)")
    if m.elementwise_affine and getattr(m, "bias", True) is None:
        raise _Unsupported("LayerNorm(bias=False)")
    return "LayerNorm", {"normalized_shape": m.normalized_shape[0], "eps": m.eps, "elementwise_affine": m.elementwise_affine}


def _rms(m: nn.RMSNorm) -> tuple[str, dict]:
    if len(m.normalized_shape) != 1:
        raise _Unsupported(f"normalized_shape {tuple(m.normalized_shape)} (the catalog normalizes the last dimension)")
    eps = m.eps if m.eps is not None else torch.finfo(torch.float32).eps  # torch's default for float32
    return "RMSNorm", {"normalized_shape": m.normalized_shape[0], "eps": eps, "elementwise_affine": m.elementwise_affine}


def _encoder(m: nn.TransformerEncoderLayer) -> tuple[str, dict]:
    if not m.self_attn.batch_first:
        raise _Unsupported("batch_first=False (the catalog's encoder layer takes (B, T, C))")
    act = {1: "relu", 2: "gelu"}.get(getattr(m, "activation_relu_or_gelu", 0))
    if act is None:
        act = "relu" if m.activation in (F.relu,) else "gelu" if m.activation in (F.gelu,) else None
    if act is None:
        raise _Unsupported(f"activation {m.activation} (the catalog offers relu and gelu)")
    if abs(m.norm1.eps - 1e-5) > 1e-12 or m.linear1.bias is None:
        raise _Unsupported("layer_norm_eps other than 1e-5 or bias=False")
    return "TransformerEncoderLayer", {"d_model": m.linear1.in_features, "nhead": m.self_attn.num_heads,
                                       "dim_feedforward": m.linear1.out_features, "dropout": m.dropout.p,
                                       "activation": act, "norm_first": m.norm_first}


def _embedding(m: nn.Embedding) -> tuple[str, dict]:
    if m.max_norm is not None or m.scale_grad_by_freq or m.sparse:
        raise _Unsupported("Embedding with max_norm, scale_grad_by_freq or sparse")
    return "Embedding", {"num_embeddings": m.num_embeddings, "embedding_dim": m.embedding_dim}


def _softmax(dim) -> tuple[str, dict]:
    if dim is None:
        raise _Unsupported("Softmax without dim")
    return "Softmax", {"dim": int(dim)}


MODULES = {
    nn.Linear: lambda m: ("Linear", {"in_features": m.in_features, "out_features": m.out_features, "bias": m.bias is not None}),
    nn.Conv1d: _conv, nn.Conv2d: _conv, nn.MaxPool2d: _pool, nn.AvgPool2d: _pool,
    nn.AdaptiveAvgPool2d: lambda m: ("AdaptiveAvgPool2d", {"output_size": _one(m.output_size, "output_size")}),
    nn.BatchNorm1d: _bn, nn.BatchNorm2d: _bn, nn.LayerNorm: _ln, nn.RMSNorm: _rms,
    nn.Dropout: lambda m: ("Dropout", {"p": m.p}),
    nn.ReLU: lambda m: ("ReLU", {}), nn.SiLU: lambda m: ("SiLU", {}), nn.Tanh: lambda m: ("Tanh", {}),
    nn.Sigmoid: lambda m: ("Sigmoid", {}), nn.GELU: lambda m: ("GELU", {"approximate": m.approximate}),
    nn.Softmax: lambda m: _softmax(m.dim),
    nn.Flatten: lambda m: ("Flatten", {"start_dim": m.start_dim, "end_dim": m.end_dim}),
    nn.Embedding: _embedding, nn.Identity: lambda m: ("Identity", {}),
    nn.TransformerEncoderLayer: _encoder,
    rl.SelfAttention: lambda m: ("MultiheadAttention", {"embed_dim": m.q.in_features, "num_heads": m.num_heads,
                                                        "dropout": m.dropout, "bias": m.q.bias is not None, "causal": m.causal}),
    rl.PositionalEmbedding: lambda m: ("PositionalEmbedding", {"max_len": m.weight.shape[0], "dim": m.weight.shape[1]}),
    rl.Reshape: lambda m: ("Reshape", {"shape": list(m.shape)}),
    rl.Mean: lambda m: ("Mean", {"dim": m.dim, "keepdim": m.keepdim}),
    rl.Transpose: lambda m: ("Transpose", {"dim0": m.dim0, "dim1": m.dim1}),
    rl.Slice: lambda m: ("Slice", {"dim": m.dim, "start": m.start, "end": m.end, "step": m.step}),
    rl.Scale: lambda m: ("Scale", {"scale": m.scale, "shift": m.shift, "shape": []} if isinstance(m.scale, float)
                         else {"shape": list(m.scale.shape)}),  # the constants travel as its buffers
}

_ADD = {operator.add, operator.iadd, torch.add, "add", "add_"}
_MUL = {operator.mul, operator.imul, torch.mul, "mul", "mul_"}
_SCALE = {operator.add: "add", operator.iadd: "add", torch.add: "add", "add": "add", "add_": "add",
          operator.sub: "sub", operator.isub: "sub", torch.sub: "sub", "sub": "sub",
          operator.mul: "mul", operator.imul: "mul", torch.mul: "mul", "mul": "mul", "mul_": "mul",
          operator.truediv: "div", operator.itruediv: "div", torch.div: "div", "div": "div"}
_MATMUL = {operator.matmul, torch.matmul, torch.bmm, "matmul", "bmm"}
_ACT = {F.relu: "ReLU", torch.relu: "ReLU", "relu": "ReLU", torch.sigmoid: "Sigmoid", "sigmoid": "Sigmoid",
        torch.tanh: "Tanh", "tanh": "Tanh", F.silu: "SiLU", F.tanh: "Tanh", F.sigmoid: "Sigmoid"}
_ALIAS = {"contiguous", "clone", "detach"}


class _Wrap(nn.Module):
    def __init__(self, name: str, module: nn.Module):
        super().__init__()
        self.add_module(name, module)
        self._name = name

    def graph(self, n_inputs: int) -> fx.Graph:
        g = fx.Graph()
        xs = [g.placeholder(f"x{i}" if n_inputs > 1 else "x") for i in range(n_inputs)]
        g.output(g.call_module(self._name, tuple(xs)))
        return g


class _Tracer(fx.Tracer):
    """Layerflow's own layers stay whole, like torch.nn's."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return type(m) in MODULES or super().is_leaf_module(m, qualname)


def _custom_or_fail(m: nn.Module, name: str) -> tuple[str, dict]:
    """A parameter-free module with a no-argument constructor can ride along as Custom."""
    cls = type(m)
    if next(m.parameters(), None) is None and next(m.buffers(), None) is None:
        try:
            same = repr(cls()) == repr(m)
        except Exception:
            same = False
        if same and "<locals>" not in cls.__qualname__:
            return "Custom", {"path": f"{cls.__module__}:{cls.__qualname__}", "kwargs": {}}
    raise _Unsupported(f"module {cls.__module__}.{cls.__qualname__} has no catalog layer")


def _arg(node: fx.Node, i: int, key: str, default=None):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(key, default)


def _is_tensor(a) -> bool:
    return isinstance(a, fx.Node) and isinstance(a.meta.get("tensor_meta"), torch.fx.passes.shape_prop.TensorMetadata)


def _function(node: fx.Node) -> tuple[str, dict, list]:
    """(catalog type, params, data inputs) of a call_function / call_method node."""
    t = node.target
    tensors = [a for a in node.args if _is_tensor(a)]
    if t in _SCALE and len(tensors) == 1 and len(node.args) == 2 and not node.kwargs and \
            any(isinstance(a, (int, float)) and not isinstance(a, bool) for a in node.args):
        return (*_scale(_SCALE[t], node.args), tensors)
    shapes = [tuple(a.meta["tensor_meta"].shape) for a in tensors]
    if t in _MATMUL:
        if len(shapes) != 2 or len(shapes[0]) != len(shapes[1]) or len(shapes[0]) < 3:
            raise _Unsupported(f"matmul of shapes {' and '.join(map(str, shapes))} (MatMul multiplies two inputs "
                               "of the same rank, batch first, with a matrix per sample)")
        return "MatMul", {}, tensors
    if t in ("transpose", torch.transpose):
        dims = {"dim0": int(_arg(node, 1, "dim0")), "dim1": int(_arg(node, 2, "dim1"))}
        if any(d % len(shapes[0]) == 0 for d in dims.values()):
            raise _Unsupported(f"transpose({dims['dim0']}, {dims['dim1']}) moves the batch dimension")
        return "Transpose", dims, tensors[:1]
    if t is operator.getitem and tensors:
        return (*_getitem(node.args[1]), tensors[:1])
    if t in _ADD or t in _MUL:
        kind = "Add" if t in _ADD else "Mul"
        if len(tensors) != 2 or node.kwargs.get("alpha", 1) != 1:
            raise _Unsupported(f"{kind} with a constant operand: the catalog's {kind} joins two layers' outputs")
        if tensors[0].meta["tensor_meta"].shape != tensors[1].meta["tensor_meta"].shape:
            raise _Unsupported(f"{kind} of shapes {tuple(tensors[0].meta['tensor_meta'].shape)} and "
                               f"{tuple(tensors[1].meta['tensor_meta'].shape)} (broadcasting)")
        return kind, {}, tensors
    if t in (torch.cat, torch.concat):
        xs = list(_arg(node, 0, "tensors"))
        dim = int(_arg(node, 1, "dim", 0))
        if dim == 0:
            raise _Unsupported("torch.cat along the batch dimension")
        return "Concat", {"num_inputs": len(xs), "dim": dim}, xs
    if t in (torch.flatten, "flatten"):
        start, end = int(_arg(node, 1, "start_dim", 0)), int(_arg(node, 2, "end_dim", -1))
        if start == 0:
            raise _Unsupported("flatten from dim 0 folds the batch into the features (use torch.flatten(x, 1))")
        return "Flatten", {"start_dim": start, "end_dim": end}, tensors[:1]
    if t in _ACT:
        return _ACT[t], {}, tensors[:1]
    if t is F.gelu or t == "gelu":
        return "GELU", {"approximate": node.kwargs.get("approximate", "none")}, tensors[:1]
    if t in (F.softmax, torch.softmax, "softmax"):
        return (*_softmax(_arg(node, 1, "dim")), tensors[:1])
    if t in (torch.mean, "mean"):
        dim = _arg(node, 1, "dim")
        if isinstance(dim, (list, tuple)) and len(dim) == 1:
            dim = dim[0]
        if not isinstance(dim, int) or dim == 0:
            raise _Unsupported(f"mean over {dim!r} (Mean takes one non-batch dimension)")
        return "Mean", {"dim": dim, "keepdim": bool(_arg(node, 2, "keepdim", False))}, tensors[:1]
    if t in ("view", "reshape", torch.reshape):
        src, out = tensors[0].meta["tensor_meta"].shape, node.meta["tensor_meta"].shape
        if out[0] != src[0]:
            raise _Unsupported(f"view/reshape changes the batch dimension ({src[0]} -> {out[0]} for a batch of {SAMPLE_BATCH})")
        return "Reshape", {"shape": [int(s) for s in out[1:]]}, tensors[:1]
    if t is F.dropout:
        return "Dropout", {"p": float(_arg(node, 1, "p", 0.5))}, tensors[:1]
    name = t if isinstance(t, str) else getattr(t, "__name__", str(t))
    raise _Unsupported(f"call to {name} has no catalog layer")


def _scale(op: str, args) -> tuple[str, dict]:
    """x + c, c + x, x - c, c - x, x * c, c * x, x / c with a number c."""
    left = isinstance(args[0], fx.Node)
    c = float(args[1] if left else args[0])
    if op == "add":
        scale, shift = 1.0, c
    elif op == "mul":
        scale, shift = c, 0.0
    elif op == "sub":
        scale, shift = (1.0, -c) if left else (-1.0, c)
    elif left and c:
        scale, shift = 1.0 / c, 0.0
    else:
        raise _Unsupported("a number divided by a tensor" if not left else "division by zero")
    return "Scale", {"scale": scale, "shift": shift, "shape": []}


def _getitem(index) -> tuple[str, dict]:
    """x[:, a:b:s] (one sliced dimension after the batch) -> Slice."""
    index = index if isinstance(index, tuple) else (index,)
    cuts = [(d, i) for d, i in enumerate(index) if i != slice(None)]
    if not all(isinstance(i, slice) for i in index) or len(cuts) != 1 or cuts[0][0] == 0:
        raise _Unsupported(f"indexing [{', '.join(map(str, index))}] (Slice keeps start:end:step of one dimension "
                           "after the batch)")
    d, sl = cuts[0]
    if not all(v is None or isinstance(v, int) for v in (sl.start, sl.stop, sl.step)):
        raise _Unsupported(f"a slice whose bounds are computed ({sl})")
    return "Slice", {"dim": d, "start": sl.start or 0, "end": sl.stop, "step": sl.step or 1}


def _sample(shape, dtype) -> torch.Tensor:
    dt = getattr(torch, dtype)
    return torch.zeros((SAMPLE_BATCH, *shape), dtype=dt) if not dt.is_floating_point else torch.randn((SAMPLE_BATCH, *shape))


def from_module(module: nn.Module, input_shapes: list[list[int]], input_dtypes: list[str] | None = None,
                source: str | None = None, name: str | None = None) -> Imported:
    """Diagram + weights of an nn.Module instance (input shapes without the batch)."""
    source = source or type(module).__qualname__
    module = module.eval()
    root = module
    if type(module) in MODULES or type(module).__module__.startswith("torch.nn"):
        # fx traces into the root module's forward; a single layer is wrapped so
        # it stays whole (one catalog node) or is reported as one unsupported layer.
        root = _Wrap(make_id(type(module).__name__.lower(), set()), module)
    try:
        graph_fx = root.graph(len(input_shapes)) if isinstance(root, _Wrap) else _Tracer().trace(root)
    except Exception as exc:  # fx raises TraceError, TypeError, NotImplementedError...
        first = (str(exc).strip().splitlines() or [""])[0]
        raise InteropError(f"{source} cannot be traced by torch.fx ({type(exc).__name__}: {first}); "
                           "control flow that depends on tensor values cannot be traced: move it out of "
                           "forward or make the branch a submodule") from None
    gm = fx.GraphModule(root, graph_fx)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(input_shapes) != len(placeholders):
        raise InteropError(f"{source}: forward takes {len(placeholders)} input(s) "
                           f"({', '.join(p.name for p in placeholders)}) but {len(input_shapes)} input shape(s) were given (--input-shape)")
    dtypes = list(input_dtypes or []) + ["float32"] * (len(placeholders) - len(input_dtypes or []))
    samples = [_sample(s, d) for s, d in zip(input_shapes, dtypes)]
    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(*samples)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise InteropError(f"{source}: running it on inputs of shape "
                           f"{', '.join(str((SAMPLE_BATCH, *s)) for s in input_shapes)} failed: {type(exc).__name__}: {first}") from None

    graph = Graph()
    taken: set[str] = set()
    ids: dict[fx.Node, str] = {}
    state: dict[str, torch.Tensor] = {}
    problems: list[str] = []
    unknown: Counter = Counter()
    calls: Counter = Counter()
    pending: list[tuple[str, list]] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            i = placeholders.index(node)
            nid = make_id(node.name, taken)
            graph.add_node("Input", {"shape": list(input_shapes[i]), "dtype": dtypes[i]}, id=nid)
            ids[node] = nid
            continue
        if node.op == "output":
            outs = node.args[0] if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
            for k, o in enumerate(outs):
                if not _is_tensor(o):
                    problems.append(f"output {k} is not a tensor")
                    continue
                per = tuple(o.meta["tensor_meta"].shape[1:])
                loss = "cross_entropy" if len(per) == 1 and per[0] > 1 else "mse"
                nid = make_id("output" if len(outs) == 1 else f"output{k}", taken)
                graph.add_node("Output", {"loss": loss}, id=nid)
                pending.append((nid, [o]))
            continue
        if not _is_tensor(node) and node.op != "call_module":
            continue  # sizes, shapes: only feed view/reshape arguments
        if node.op == "call_method" and node.target in _ALIAS:
            ids[node] = ids.get(node.args[0])
            continue
        try:
            if node.op == "call_module":
                m = gm.get_submodule(node.target)
                builder = MODULES.get(type(m))
                kind, params = builder(m) if builder else _custom_or_fail(m, node.target)
                if not _is_tensor(node):
                    raise _Unsupported(f"returns {type(node.meta.get('val', None)).__name__}, not one tensor")
                inputs = [a for a in node.args if _is_tensor(a)]
                calls[node.target] += 1
                wstate = m.state_dict()
            elif node.op in ("call_function", "call_method"):
                kind, params, inputs = _function(node)
                wstate = {}
            elif node.op == "get_attr":
                raise _Unsupported(f"uses the tensor '{node.target}' directly; wrap it in a layer (e.g. nn.Linear)")
            else:
                raise _Unsupported(f"fx op {node.op}")
        except _Unsupported as exc:
            where = node.target if node.op == "call_module" else node.name
            problems.append(f"'{where}': {exc}")
            label = type(gm.get_submodule(node.target)).__name__ if node.op == "call_module" else \
                (node.target if isinstance(node.target, str) else getattr(node.target, "__name__", node.op))
            unknown[label] += 1
            continue
        nid = make_id(node.target if node.op == "call_module" else node.name, taken)
        graph.add_node(kind, params, id=nid)
        for k, v in wstate.items():
            state[f"{nid}.{k}"] = v.detach().clone()
        ids[node] = nid
        pending.append((nid, inputs))

    if problems:
        raise InteropError(f"cannot import {source}: {len(problems)} call(s) have no catalog layer:\n"
                           + "\n".join(f"  - {p}" for p in problems))
    for nid, inputs in pending:
        node = graph.nodes[nid]
        ports = get_layer(node.type).input_ports(node.params)
        for port, a in zip(ports, inputs):
            graph.add_edge_unchecked(Edge(ids[a], "out", nid, port))
    layered_layout(graph)
    notes = [f"'{t}' is called {c} times: the diagram holds {c} copies of its weights, no longer shared"
             for t, c in calls.items() if c > 1]
    project = Project(graph, name=name or type(module).__name__, description=f"Imported from {source}")
    imported = Imported(project, state, source, notes)
    check_imported(imported)
    synthetic_training(project)
    _check_outputs(imported, module, samples)
    return imported


def _check_outputs(imported: Imported, module: nn.Module, samples: list[torch.Tensor]) -> None:
    """The diagram computes what the module computes (eval mode, same weights)."""
    from engine.compile import compile_graph

    gm = compile_graph(imported.project.graph).build(seed=0)
    gm.load_state_dict(imported.state)
    gm.eval()
    with torch.no_grad():
        want, got = module(*samples), gm(*samples)
    want = want if isinstance(want, (tuple, list)) else [want]
    got = got if isinstance(got, (tuple, list)) else [got]
    for w, g in zip(want, got):
        if w.shape != g.shape or not torch.allclose(w, g, rtol=1e-4, atol=1e-5):
            raise InteropError(f"{imported.source}: the imported diagram computes something else than the module "
                               f"(largest difference {(w - g).abs().max().item() if w.shape == g.shape else 'shape'}); "
                               "please report this module")


def import_module(path: str, kwargs: dict | None = None, input_shapes: list[list[int]] | None = None,
                  input_dtypes: list[str] | None = None, name: str | None = None) -> Imported:
    """'pkg.mod:Class' built with kwargs -> Imported (diagram + weights)."""
    try:
        cls = rl.import_object(path)
    except (ImportError, AttributeError) as exc:
        raise InteropError(f"cannot import '{path}': {exc}") from None
    try:
        module = cls(**(kwargs or {}))
    except Exception as exc:
        raise InteropError(f"'{path}' could not be built with {kwargs or {}}: {type(exc).__name__}: {exc}") from None
    if not isinstance(module, nn.Module):
        raise InteropError(f"'{path}' built a {type(module).__name__}, not an nn.Module")
    if not input_shapes:
        raise InteropError(f"'{path}': give the shape of each input without the batch (--input-shape 3,32,32)")
    return from_module(module, input_shapes, input_dtypes, source=path, name=name or path.rpartition(":")[2])
