"""ONNX -> diagram with weights.

The ONNX graph is cut into *units*, each of which becomes one diagram node:

- Files written by torch.onnx (ours and anyone's) record on every node the module
  it came from (`pkg.torch.onnx.name_scopes` / `class_hierarchy`). All ONNX nodes
  under one module of a class we know (nn.Linear, nn.TransformerEncoderLayer,
  Layerflow's SelfAttention, ...) form one unit named after the module, so a
  GELU decomposed into five ops, or a whole encoder layer, comes back as one node.
- Other files are read op by op, with the usual fusions: MatMul by a constant plus
  Add of a constant = Linear, Sigmoid + Mul = SiLU, the Erf pattern = GELU.

Constant subgraphs are evaluated first (a Transpose of a weight becomes a plain
constant), and values computed only from Shape ops (the dynamic-batch plumbing of
Reshape) are set aside, so only data flows between units. Every problem is
collected before anything is built: unsupported operators are listed all at once
with counts, and no file is written by this module (see common.save_imported).
"""
from __future__ import annotations

import ast
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import numpy as np
import torch

from engine.graph import Graph
from engine.interop.common import Imported, InteropError, check_imported, make_id, synthetic_training
from engine.interop.layout import layered_layout
from engine.layers import get_layer
from engine.project import Project

DIAGRAM_KEY = "layerflow.diagram"

# torch module class (as torch.onnx writes it) -> catalog type
CLASS_TYPES = {
    "torch.nn.modules.linear.Linear": "Linear",
    "torch.nn.modules.conv.Conv1d": "Conv1d",
    "torch.nn.modules.conv.Conv2d": "Conv2d",
    "torch.nn.modules.pooling.MaxPool2d": "MaxPool2d",
    "torch.nn.modules.pooling.AvgPool2d": "AvgPool2d",
    "torch.nn.modules.pooling.AdaptiveAvgPool2d": "AdaptiveAvgPool2d",
    "torch.nn.modules.batchnorm.BatchNorm1d": "BatchNorm1d",
    "torch.nn.modules.batchnorm.BatchNorm2d": "BatchNorm2d",
    "torch.nn.modules.normalization.LayerNorm": "LayerNorm",
    "torch.nn.modules.normalization.RMSNorm": "RMSNorm",
    "torch.nn.modules.dropout.Dropout": "Dropout",
    "torch.nn.modules.activation.ReLU": "ReLU",
    "torch.nn.modules.activation.SiLU": "SiLU",
    "torch.nn.modules.activation.Tanh": "Tanh",
    "torch.nn.modules.activation.Sigmoid": "Sigmoid",
    "torch.nn.modules.activation.GELU": "GELU",
    "torch.nn.modules.activation.Softmax": "Softmax",
    "torch.nn.modules.flatten.Flatten": "Flatten",
    "torch.nn.modules.sparse.Embedding": "Embedding",
    "torch.nn.modules.linear.Identity": "Identity",
    "torch.nn.modules.transformer.TransformerEncoderLayer": "TransformerEncoderLayer",
    "engine.runtime.layers.Reshape": "Reshape",
    "engine.runtime.layers.Mean": "Mean",
    "engine.runtime.layers.Transpose": "Transpose",
    "engine.runtime.layers.Slice": "Slice",
    "engine.runtime.layers.Scale": "Scale",
    "engine.runtime.layers.PositionalEmbedding": "PositionalEmbedding",
    "engine.runtime.layers.SelfAttention": "MultiheadAttention",
    "engine.interop.onnx_export.Add": "Add",
    "engine.interop.onnx_export.Mul": "Mul",
    "engine.interop.onnx_export.MatMul": "MatMul",
    "engine.interop.onnx_export.Concat": "Concat",
    "engine.interop.onnx_export.Identity": "Identity",
}

# ONNX op -> catalog type when there is no module scope to go by
OP_TYPES = {
    "Gemm": "Linear", "MatMul": "Linear", "Conv": "Conv", "Relu": "ReLU", "Sigmoid": "Sigmoid",
    "Tanh": "Tanh", "Gelu": "GELU", "Erf": "GELU", "Softmax": "Softmax", "MaxPool": "MaxPool2d",
    "AveragePool": "AvgPool2d", "GlobalAveragePool": "AdaptiveAvgPool2d",
    "BatchNormalization": "BatchNorm", "LayerNormalization": "LayerNorm", "Add": "Add", "Mul": "Mul",
    "Concat": "Concat", "Flatten": "Flatten", "Reshape": "Reshape", "Identity": "Identity",
    "Dropout": "Dropout", "ReduceMean": "Mean", "Gather": "Embedding", "Transpose": "Transpose", "Slice": "Slice",
    "Sub": "Scale", "Div": "Scale", "SimplifiedLayerNormalization": "RMSNorm", "RMSNormalization": "RMSNorm",
}

# Parameters ONNX cannot state (dropout rates vanish in an inference graph, the
# loss is not part of the model): taken from the diagram a Layerflow export embeds.
HINT_PARAMS = {"p", "dropout", "loss", "momentum", "eps"}
# Dimensions ONNX writes counted from 0 (Transpose perm, Slice axes): the diagram's
# own form (dim -1) is taken when it names the same dimensions.
DIM_PARAMS = ("dim", "dim0", "dim1")


class _Unsupported(Exception):
    pass


@dataclass
class _Unit:
    key: str
    name: str
    cls_type: str | None  # catalog type from the module class, if any
    nodes: list = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)  # data values from outside, in order
    output: str | None = None
    raw_inits: list[str] = field(default_factory=list)  # initializers used before folding

    @property
    def ops(self) -> list[str]:
        return [n.op_type for n in self.nodes]

    def find(self, *ops: str):
        return next((n for n in self.nodes if n.op_type in ops), None)


def _attrs(node) -> dict:
    import onnx

    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _meta(node) -> dict:
    return {p.key: p.value for p in node.metadata_props}


def _scopes(node) -> tuple[list[str], list[str]]:
    md = _meta(node)
    try:
        names = ast.literal_eval(md.get("pkg.torch.onnx.name_scopes", "[]"))
        classes = ast.literal_eval(md.get("pkg.torch.onnx.class_hierarchy", "[]"))
    except (ValueError, SyntaxError):
        return [], []
    return list(names), list(classes)


def _unit_scope(u: _Unit) -> list[list[str]] | None:
    """The module tree around a unit: what the scope names of all its ONNX nodes share."""
    from engine.interop.onnx_to_torch import _scopes as scope_chain

    chains = [scope_chain(n) for n in u.nodes]
    common = chains[0] if chains else []
    for c in chains[1:]:
        k = 0
        while k < min(len(common), len(c)) and common[k] == c[k]:
            k += 1
        common = common[:k]
    return [list(x) for x in common] or None


def _round(v: float) -> float:
    """float32 attributes read back as 9.99999974e-06; give the user 1e-05."""
    return float(f"{float(v):.6g}")


class _Reader:
    def __init__(self, model, source: str):
        import onnx

        self.source = source
        self.model = model
        self.graph = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        self.consts: dict[str, np.ndarray] = {}
        self.init_names: set[str] = set()
        for t in self.graph.initializer:
            self.consts[t.name] = onnx.numpy_helper.to_array(t)
            self.init_names.add(t.name)
        self.shapes: dict[str, list] = {}
        self.elem: dict[str, int] = {}
        for vi in [*self.graph.input, *self.graph.value_info, *self.graph.output]:
            tt = vi.type.tensor_type
            if tt.HasField("shape"):
                self.shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            self.elem[vi.name] = tt.elem_type
        self.producer: dict[str, object] = {}
        self.consumers: dict[str, list] = {}
        for n in self.graph.node:
            for o in n.output:
                self.producer[o] = n
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(n)
        self.folded: set[int] = set()
        self.shapeish: set[str] = set()

    # ----- constants and shape plumbing ---------------------------------------
    def fold(self) -> None:
        from onnx.reference import ReferenceEvaluator

        for idx, n in enumerate(self.graph.node):
            ins = [i for i in n.input if i]
            if n.op_type == "Constant":
                self.consts[n.output[0]] = ReferenceEvaluator(n).run(None, {})[0]
                self.folded.add(idx)
            elif ins and all(i in self.consts for i in ins) and n.domain in ("", "ai.onnx") \
                    and n.op_type not in ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"):
                try:
                    outs = ReferenceEvaluator(n).run(None, {i: self.consts[i] for i in ins})
                except Exception:  # an op the reference cannot run: leave it as an op
                    continue
                for name, val in zip(n.output, outs):
                    self.consts[name] = np.asarray(val)
                self.folded.add(idx)
            elif n.op_type in ("Shape", "Size") or (
                    ins and all(i in self.consts or i in self.shapeish for i in ins) and any(i in self.shapeish for i in ins)):
                self.shapeish.update(n.output)

    def is_data(self, v: str) -> bool:
        return bool(v) and v not in self.consts and v not in self.shapeish

    def shape(self, v: str) -> list | None:
        return self.shapes.get(v)

    def sample_shape(self, v: str) -> list[int] | None:
        s = self.shapes.get(v)
        if s is None or len(s) < 1 or any(d is None for d in s[1:]):
            return None
        return [int(d) for d in s[1:]]

    def const(self, v: str, what: str) -> np.ndarray:
        if v not in self.consts:
            raise _Unsupported(f"{what} is computed, not a constant")
        return self.consts[v]

    # ----- units ----------------------------------------------------------------
    def units(self) -> tuple[list[_Unit], dict[str, _Unit]]:
        by_key: dict[str, _Unit] = {}
        order: list[_Unit] = []
        node_unit: dict[int, _Unit] = {}
        for idx, n in enumerate(self.graph.node):
            data_out = [o for o in n.output if self.is_data(o)]
            raw = [i for i in n.input if i in self.init_names]
            names, classes = _scopes(n)
            key = name = cls_type = None
            for i in range(1, min(len(names), len(classes)) - 1):
                if classes[i] in CLASS_TYPES:
                    key, name, cls_type = "scope:" + names[i], names[i], CLASS_TYPES[classes[i]]
                    break
            if key is None:
                if not data_out:
                    continue
                key = "node:" + data_out[0]
                name = "_".join(s for s in names[1:] if s) or n.name.removeprefix("node_") or n.output[0]
            unit = by_key.get(key)
            if unit is None:
                unit = by_key[key] = _Unit(key, name, cls_type)
                order.append(unit)
            unit.raw_inits.extend(r for r in raw if r not in unit.raw_inits)
            # A module's unit keeps its shape plumbing too (a causal mask is a Trilu
            # on shapes); only nodes with data outputs bring inputs (see below).
            if idx not in self.folded and (data_out or cls_type):
                unit.nodes.append(n)
                node_unit[idx] = unit
        self._fuse(order, node_unit)
        order = [u for u in order if u.nodes]
        produced: dict[str, _Unit] = {}
        for u in order:
            inside = {o for n in u.nodes for o in n.output}
            for n in u.nodes:
                if not any(self.is_data(o) for o in n.output):
                    continue
                for i in n.input:
                    if self.is_data(i) and i not in inside and i not in u.inputs:
                        u.inputs.append(i)
            outs = [o for o in inside if self.is_data(o) and (
                any(c not in u.nodes for c in self.consumers.get(o, [])) or o in self.graph_outputs)]
            outs.sort(key=lambda o: [x for n in u.nodes for x in n.output].index(o))
            if len(outs) > 1:
                raise _Unsupported(f"{u.name}: gives {len(outs)} outputs that are used elsewhere ({', '.join(outs)})")
            u.output = outs[0] if outs else None
            if u.output:
                produced[u.output] = u
        return order, produced

    @property
    def graph_outputs(self) -> set[str]:
        return {o.name for o in self.graph.output}

    def _fuse(self, order: list[_Unit], node_unit: dict[int, _Unit]) -> None:
        """Op-level fusions for units without a module scope."""
        index = {id(n): i for i, n in enumerate(self.graph.node)}

        def unit_of(n):
            return node_unit.get(index[id(n)])

        def only_consumer(v):
            cs = self.consumers.get(v, [])
            return cs[0] if len(cs) == 1 and v not in self.graph_outputs else None

        def merge(a: _Unit, b: _Unit | None):
            if b is None or a is b or b.cls_type or a.cls_type:
                return
            a.nodes.extend(b.nodes)
            for n in b.nodes:
                node_unit[index[id(n)]] = a
            b.nodes = []

        for u in list(order):
            if u.cls_type or len(u.nodes) != 1:
                continue
            n = u.nodes[0]
            if n.op_type == "MatMul" and n.input[1] in self.consts:
                c = only_consumer(n.output[0])
                if c is not None and c.op_type == "Add" and any(i in self.consts for i in c.input):
                    merge(u, unit_of(c))
            elif n.op_type in ("Mul", "Div") and sum(i in self.consts for i in n.input) == 1:
                c = only_consumer(n.output[0])  # x * a + b: one Scale
                if c is not None and c.op_type in ("Add", "Sub") and any(i in self.consts for i in c.input):
                    merge(u, unit_of(c))
            elif n.op_type in ("Pow", "Mul") and (chain := self._rms_chain(n, only_consumer)):
                for c in chain:
                    merge(u, unit_of(c))
            elif n.op_type == "Sigmoid":
                c = only_consumer(n.output[0])
                if c is not None and c.op_type == "Mul" and n.input[0] in c.input:
                    merge(u, unit_of(c))
            elif n.op_type == "Erf":  # x * 0.5 * (1 + erf(x / sqrt 2)), in either order
                p = self.producer.get(n.input[0])
                if p is None or p.op_type not in ("Div", "Mul") or unit_of(p) is None:
                    continue
                x = next((i for i in p.input if self.is_data(i)), None)
                chain, cur = [], n
                for _ in range(3):
                    c = only_consumer(cur.output[0])
                    if c is None or c.op_type not in ("Add", "Mul"):
                        break
                    chain.append(c)
                    cur = c
                    if x in c.input:
                        break
                if not chain or x not in chain[-1].input:
                    continue
                pu = unit_of(p)
                pu.nodes.append(n)  # keep the order: div, erf, add, mul, mul
                node_unit[index[id(n)]] = pu
                u.nodes = []
                for c in chain:
                    merge(pu, unit_of(c))
                pu.nodes.sort(key=lambda m: index[id(m)])

    def _rms_chain(self, n, only_consumer) -> list:
        """The ops after x^2 (Pow or x * x) of torch's RMSNorm decomposition:
        ReduceMean, Add eps, Sqrt, Reciprocal then Mul by x (or Div of x), and a Mul
        by the weight if there is one. [] when the pattern does not hold."""
        x = n.input[0]
        if n.op_type == "Pow":
            e = self.consts.get(n.input[1])
            if e is None or np.asarray(e).size != 1 or float(np.asarray(e).reshape(-1)[0]) != 2.0:
                return []
        elif n.input[1] != x:
            return []
        chain, cur = [], n
        for want in (("ReduceMean",), ("Add",), ("Sqrt",), ("Reciprocal", "Div"), ("Mul",)):
            c = only_consumer(cur.output[0])
            if c is None or c.op_type not in want:
                return []
            chain.append(c)
            cur = c
            if c.op_type == "Div":
                if c.input[0] != x:
                    return []
                break
        if x not in cur.input:
            return []
        c = only_consumer(cur.output[0])
        if c is not None and c.op_type == "Mul" and any(i in self.consts for i in c.input):
            chain.append(c)
        return chain


# ----- extractors: unit -> (type, params, state) ---------------------------------
def _t(a: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(np.array(a, copy=True))
    return t.float() if t.is_floating_point() else t


def _linear(r: _Reader, u: _Unit):
    g = u.find("Gemm")
    if g is not None:
        a = _attrs(g)
        if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
            raise _Unsupported(f"Gemm with transA={a.get('transA', 0)}, alpha={a.get('alpha', 1.0)}, beta={a.get('beta', 1.0)}")
        b = r.const(g.input[1], "Gemm weight")
        w = b if a.get("transB", 0) else b.T
        bias = r.const(g.input[2], "Gemm bias") if len(g.input) > 2 and g.input[2] else None
    else:
        m = u.find("MatMul")
        if m is not None and m.input[1] not in r.consts and u.cls_type is None:
            return _matmul(r, u)
        if m is None or m.input[1] not in r.consts:
            raise _Unsupported("MatMul by a computed tensor inside a Linear")
        wt = r.consts[m.input[1]]
        if wt.ndim != 2:
            raise _Unsupported(f"MatMul by a constant of rank {wt.ndim} (a Linear needs rank 2)")
        w = wt.T
        add = u.find("Add")
        bias = None
        if add is not None:
            bias = next((r.consts[i] for i in add.input if i in r.consts), None)
    out_f, in_f = w.shape
    state = {"weight": _t(w)}
    if bias is not None:
        bias = np.asarray(bias).reshape(-1)
        if bias.shape[0] != out_f:
            bias = np.broadcast_to(bias, (out_f,))
        state["bias"] = _t(bias)
    return "Linear", {"in_features": int(in_f), "out_features": int(out_f), "bias": bias is not None}, state


def _same(vals, what: str) -> int:
    vals = [int(v) for v in vals]
    if len(set(vals)) != 1:
        raise _Unsupported(f"{what} {vals} differ per dimension; the catalog layer takes one value")
    return vals[0]


def _hw(vals, what: str) -> int | list[int]:
    """One value per spatial dimension: an int when they agree, else [h, w] (2-D only)."""
    vals = [int(v) for v in vals]
    return vals if len(vals) == 2 and vals[0] != vals[1] else _same(vals, what)


def _pads(a: dict, nd: int) -> int | list[int]:
    auto = a.get("auto_pad", "NOTSET")
    if auto not in ("NOTSET", "VALID"):
        raise _Unsupported(f"auto_pad={auto}")
    pads = [int(v) for v in a.get("pads", [0] * 2 * nd)]
    if pads[:nd] != pads[nd:]:
        raise _Unsupported(f"pads {pads} differ at the start and the end of a dimension (torch pads both sides alike)")
    return _hw(pads[:nd], "pads")


def _conv(r: _Reader, u: _Unit):
    n = u.find("Conv")
    if n is None:
        raise _Unsupported("no Conv op under a Conv module")
    w = r.const(n.input[1], "Conv weight")
    nd = w.ndim - 2
    if nd not in (1, 2):
        raise _Unsupported(f"{nd}-D convolution (the catalog has Conv1d and Conv2d)")
    a = _attrs(n)
    params = {
        "in_channels": int(w.shape[1] * a.get("group", 1)), "out_channels": int(w.shape[0]),
        "kernel_size": _hw(a.get("kernel_shape", w.shape[2:]), "kernel_shape"),
        "stride": _hw(a.get("strides", [1] * nd), "strides"), "padding": _pads(a, nd),
        "dilation": _same(a.get("dilations", [1] * nd), "dilations"), "groups": int(a.get("group", 1)),
        "bias": len(n.input) > 2 and bool(n.input[2]) and not _zeros(r, n.input[2]),
    }
    state = {"weight": _t(w)}
    if params["bias"]:
        state["bias"] = _t(r.const(n.input[2], "Conv bias"))
    return f"Conv{nd}d", params, state


def _zeros(r: _Reader, v: str) -> bool:
    """A computed all-zero tensor (torch.onnx writes bias=False as Expand(CastLike(0)))."""
    for _ in range(4):
        if v in r.consts:
            return not np.any(r.consts[v])
        p = r.producer.get(v)
        if p is None or p.op_type not in ("Expand", "CastLike", "Cast"):
            return False
        v = p.input[0]
    return False


def _pool(r: _Reader, u: _Unit):
    n = u.find("MaxPool", "AveragePool", "GlobalAveragePool", "ReduceMean")
    if n is None:
        raise _Unsupported("no pooling op under a pooling module")
    if n.op_type in ("GlobalAveragePool", "ReduceMean"):
        return _global_pool(r, u, n)
    a = _attrs(n)
    if a.get("ceil_mode", 0):
        raise _Unsupported(f"{n.op_type} with ceil_mode=1")
    if any(d != 1 for d in a.get("dilations", [1, 1])):
        raise _Unsupported(f"{n.op_type} with dilations {a['dilations']}")
    if len(a.get("kernel_shape", [])) != 2:
        raise _Unsupported(f"{n.op_type} over {len(a.get('kernel_shape', []))} dimensions (the catalog pools 2-D)")
    if n.op_type == "MaxPool" and len(n.output) > 1 and n.output[1]:
        raise _Unsupported("MaxPool whose indices are used")
    pad = _pads(a, 2)
    if n.op_type == "AveragePool" and pad and not a.get("count_include_pad", 0):
        raise _Unsupported("AveragePool with padding and count_include_pad=0 (torch counts the padding)")
    k = _hw(a["kernel_shape"], "kernel_shape")
    s = _hw(a.get("strides", [1, 1]), "strides")
    # stride None is the catalog's "same as the window", as in torch
    return ("MaxPool2d" if n.op_type == "MaxPool" else "AvgPool2d"), {"kernel_size": k, "stride": None if s == k else s, "padding": pad}, {}


def _global_pool(r: _Reader, u: _Unit, n=None):
    n = n or u.find("GlobalAveragePool", "ReduceMean", "AveragePool")
    out = r.sample_shape(u.output)
    if u.cls_type == "AdaptiveAvgPool2d" and out and len(out) == 3 and out[1] == out[2]:
        return "AdaptiveAvgPool2d", {"output_size": out[1]}, {}
    if n is not None and n.op_type == "GlobalAveragePool":
        return "AdaptiveAvgPool2d", {"output_size": 1}, {}
    raise _Unsupported("average pooling to a size the file does not state")


def _reduce_axes(r: _Reader, n) -> tuple[list[int], int]:
    a = _attrs(n)
    if len(n.input) > 1 and n.input[1]:
        axes = [int(x) for x in np.asarray(r.const(n.input[1], "ReduceMean axes")).reshape(-1)]
    else:
        axes = list(a.get("axes", []))
    return axes, int(a.get("keepdims", 1))


def _mean(r: _Reader, u: _Unit):
    n = u.find("ReduceMean")
    if n is None:
        raise _Unsupported("no ReduceMean under a Mean module")
    axes, keep = _reduce_axes(r, n)
    rank = len(r.shape(n.input[0]) or [])
    norm = sorted(a % rank for a in axes) if rank else axes
    if rank == 4 and norm == [2, 3] and keep:
        return "AdaptiveAvgPool2d", {"output_size": 1}, {}
    if len(axes) != 1 or (rank and norm[0] == 0):
        raise _Unsupported(f"ReduceMean over axes {axes} (Mean takes one non-batch dimension)")
    return "Mean", {"dim": int(axes[0]), "keepdim": bool(keep)}, {}


def _bn(r: _Reader, u: _Unit):
    n = u.find("BatchNormalization")
    if n is None:
        raise _Unsupported("no BatchNormalization under a BatchNorm module")
    a = _attrs(n)
    if a.get("training_mode", 0):
        raise _Unsupported("BatchNormalization in training mode")
    rank = len(r.shape(n.input[0]) or [0, 0, 0, 0])
    kind = {2: "BatchNorm1d", 3: "BatchNorm1d", 4: "BatchNorm2d"}.get(rank)
    if kind is None:
        raise _Unsupported(f"BatchNormalization of a rank-{rank} tensor")
    scale, bias, mean, var = (r.const(i, "BatchNormalization " + w) for i, w in zip(n.input[1:5], ("scale", "bias", "mean", "var")))
    state = {"weight": _t(scale), "bias": _t(bias), "running_mean": _t(mean), "running_var": _t(var),
             "num_batches_tracked": torch.tensor(0, dtype=torch.long)}
    params = {"num_features": int(scale.shape[0]), "eps": _round(a.get("epsilon", 1e-5)),
              "momentum": _round(1.0 - a.get("momentum", 0.9))}
    return kind, params, state


def _ln(r: _Reader, u: _Unit):
    n = u.find("LayerNormalization")
    if n is None:
        raise _Unsupported("no LayerNormalization under a LayerNorm module")
    a = _attrs(n)
    rank = len(r.shape(n.input[0]) or [])
    axis = a.get("axis", -1)
    if axis != -1 and not (rank and axis == rank - 1):
        raise _Unsupported(f"LayerNormalization over axis {axis} (LayerNorm normalizes the last dimension)")
    scale = r.const(n.input[1], "LayerNormalization scale")
    bias = r.const(n.input[2], "LayerNormalization bias") if len(n.input) > 2 and n.input[2] else np.zeros_like(scale)
    if scale.ndim != 1:
        raise _Unsupported(f"LayerNormalization with a scale of shape {list(scale.shape)}")
    return "LayerNorm", {"normalized_shape": int(scale.shape[0]), "eps": _round(a.get("epsilon", 1e-5)),
                         "elementwise_affine": True}, {"weight": _t(scale), "bias": _t(bias)}


def _plain(kind: str):
    def ext(r: _Reader, u: _Unit):
        return kind, {}, {}
    return ext


def _gelu(r: _Reader, u: _Unit):
    g = u.find("Gelu")
    approx = _attrs(g).get("approximate", "none") if g is not None else ("tanh" if "Tanh" in u.ops else "none")
    return "GELU", {"approximate": approx}, {}


def _sigmoid(r: _Reader, u: _Unit):
    return ("SiLU" if "Mul" in u.ops else "Sigmoid"), {}, {}


def _softmax(r: _Reader, u: _Unit):
    n = u.find("Softmax")
    axis = int(_attrs(n).get("axis", -1 if r.opset >= 13 else 1))
    rank = len(r.shape(n.input[0]) or [])
    if r.opset < 13 and rank and axis % rank != rank - 1:
        raise _Unsupported(f"Softmax of opset {r.opset} over axis {axis} (it flattens; re-export with opset 13+)")
    if rank and axis % rank == 0:
        raise _Unsupported("Softmax over the batch dimension")
    return "Softmax", {"dim": axis}, {}


def _flatten(r: _Reader, u: _Unit):
    n = u.find("Flatten")
    if n is not None:
        axis = int(_attrs(n).get("axis", 1))
        if axis < 1:
            raise _Unsupported("Flatten with axis 0 folds the batch into the features")
        return "Flatten", {"start_dim": axis, "end_dim": -1}, {}
    ins, out = r.sample_shape(u.inputs[0]) if u.inputs else None, r.sample_shape(u.output)
    if ins is None or out is None:
        raise _Unsupported("Flatten whose shapes the file does not state")
    lead = 0
    while lead < min(len(ins), len(out)) - 1 and ins[lead] == out[lead]:
        lead += 1
    trail = 0
    while trail < min(len(ins), len(out)) - lead - 1 and ins[-1 - trail] == out[-1 - trail]:
        trail += 1
    return "Flatten", {"start_dim": lead + 1, "end_dim": -1 - trail}, {}


def _reshape(r: _Reader, u: _Unit):
    out = r.sample_shape(u.output)
    if out is None:
        n = u.find("Reshape")
        target = r.consts.get(n.input[1]) if n is not None else None
        if target is None or len(target) < 1 or int(target[0]) not in (0, -1) or -1 in [int(t) for t in target[1:]] and int(target[0]) == -1:
            raise _Unsupported("Reshape to a shape the file does not state (run onnx shape inference on it)")
        out = [int(t) for t in target[1:]]
    ins = r.shape(u.inputs[0]) if u.inputs else None
    outs = r.shape(u.output)
    if ins and outs and ins[0] is not None and outs[0] is not None and ins[0] != outs[0]:
        raise _Unsupported(f"Reshape changes the batch dimension ({ins[0]} -> {outs[0]})")
    return "Reshape", {"shape": out}, {}


def _embedding(r: _Reader, u: _Unit):
    n = u.find("Gather")
    if n is None or n.input[0] not in r.consts or _attrs(n).get("axis", 0) != 0:
        raise _Unsupported("Gather that is not a table lookup (constant table, axis 0)")
    w = r.consts[n.input[0]]
    if w.ndim != 2:
        raise _Unsupported(f"Gather from a rank-{w.ndim} table")
    return "Embedding", {"num_embeddings": int(w.shape[0]), "embedding_dim": int(w.shape[1])}, {"weight": _t(w)}


def _identity(r: _Reader, u: _Unit):
    if u.cls_type == "Dropout":
        return "Dropout", {}, {}
    n = u.find("Dropout")
    if n is not None:
        ratio = r.consts.get(n.input[1]) if len(n.input) > 1 and n.input[1] else _attrs(n).get("ratio", 0.5)
        return "Dropout", {"p": _round(float(np.asarray(ratio)))}, {}
    return "Identity", {}, {}


def _binary(kind: str):
    def ext(r: _Reader, u: _Unit):
        n = u.find(kind)
        if len(u.nodes) == 1 and all(r.is_data(i) for i in n.input):
            u.inputs = list(n.input)  # port order, with repeats (x * x)
            return kind, {}, {}
        if u.cls_type is None:
            return _scale(r, u)  # by a constant
        raise _Unsupported(f"{kind} with a constant operand under a module that joins two layers' outputs")
    return ext


def _f32(v) -> float:
    """A float32 constant as the shortest decimal that reads back the same (0.1, not 0.10000000149)."""
    return float(str(np.float32(v)))


def _per_sample(c: np.ndarray, rank: int | None) -> np.ndarray:
    """A constant operand without the batch dimension (it must not vary along it)."""
    c = np.asarray(c, dtype=np.float32)
    if c.size == 1:
        return c.reshape(())
    if rank and c.ndim >= rank:
        if c.ndim > rank or c.shape[0] != 1:
            raise _Unsupported(f"a constant of shape {list(c.shape)} for a rank-{rank} input: it varies along the "
                               "batch or adds dimensions")
        c = c.reshape(c.shape[1:])
    return c


def _scale(r: _Reader, u: _Unit):
    """Mul/Div/Add/Sub by constants on one computed input (a Scale module's Mul and
    Add, or a lone `x * 0.125`) as one map x * scale + shift."""
    if len(u.inputs) != 1:
        raise _Unsupported(f"{'/'.join(dict.fromkeys(u.ops))} of two computed tensors has no catalog layer "
                           "(Add, Mul and MatMul join two layers' outputs)")
    cur = u.inputs[0]
    rank = len(r.shape(cur) or []) or None
    scale, shift = np.ones((), np.float32), np.zeros((), np.float32)
    for n in u.nodes:
        if not any(r.is_data(o) for o in n.output):
            continue
        others = [i for i in n.input if i != cur]
        if n.op_type not in ("Mul", "Div", "Add", "Sub") or cur not in n.input or len(others) != 1:
            raise _Unsupported(f"{n.op_type} where a product or sum with a constant was expected")
        c = _per_sample(r.const(others[0], f"the {n.op_type} operand"), rank)
        left = n.input[0] == cur
        if n.op_type == "Mul":
            scale, shift = scale * c, shift * c
        elif n.op_type == "Div" and left:
            scale, shift = scale / c, shift / c
        elif n.op_type == "Add":
            shift = shift + c
        elif n.op_type == "Sub":
            scale, shift = (scale, shift - c) if left else (-scale, c - shift)
        else:
            raise _Unsupported("a constant divided by a computed tensor")
        cur = n.output[0]
    if scale.size == 1 and shift.size == 1:
        return "Scale", {"scale": _f32(scale), "shift": _f32(shift), "shape": []}, {}
    shape = np.broadcast_shapes(scale.shape, shift.shape)
    scale, shift = np.broadcast_to(scale, shape), np.broadcast_to(shift, shape)

    def uniform(a: np.ndarray, default: float) -> float:
        return _f32(a.flat[0]) if np.all(a == a.flat[0]) else default

    return ("Scale", {"scale": uniform(scale, 1.0), "shift": uniform(shift, 0.0), "shape": [int(d) for d in shape]},
            {"scale": _t(scale), "shift": _t(shift)})


def _matmul(r: _Reader, u: _Unit):
    m = u.find("MatMul")
    if m is None:
        raise _Unsupported("no MatMul under a MatMul module")
    if not all(r.is_data(i) for i in m.input):
        raise _Unsupported("MatMul of a constant by a computed tensor (only x @ W, a Linear, takes a constant)")
    a, b = r.shape(m.input[0]), r.shape(m.input[1])
    if a is not None and b is not None and (len(a) != len(b) or len(a) < 3):
        raise _Unsupported(f"MatMul of shapes {a} and {b}: the catalog's MatMul multiplies two inputs of the same "
                           "rank, batch first, with a matrix per sample")
    u.inputs = list(m.input)  # port order, with repeats (x @ x)
    return "MatMul", {}, {}


def _transpose(r: _Reader, u: _Unit):
    n = u.find("Transpose")
    rank = len(r.shape(n.input[0]) or [])
    perm = [int(p) for p in _attrs(n).get("perm", [])] or list(range(rank))[::-1]
    moved = [i for i, p in enumerate(perm) if p != i]
    if len(moved) != 2 or moved[0] == 0:
        raise _Unsupported(f"Transpose with perm {perm}: the catalog's Transpose swaps two dimensions after the batch")
    return "Transpose", {"dim0": moved[0], "dim1": moved[1]}, {}


_END = 2**31 - 1  # ends at or past this mean "to the end" (torch writes 2**63 - 1)


def _cuts(r: _Reader, u: _Unit) -> list[tuple[int, int, int | None, int]]:
    """(axis, start, end, step) of each Slice in the unit that keeps less than everything."""
    out = []
    for n in u.nodes:
        if n.op_type != "Slice":
            continue
        if len(n.input) >= 3:
            starts, ends = ([int(v) for v in np.asarray(r.const(n.input[i], f"Slice {w}")).reshape(-1)]
                            for i, w in ((1, "starts"), (2, "ends")))
            opt = [[int(v) for v in np.asarray(r.const(n.input[i], f"Slice {w}")).reshape(-1)]
                   if len(n.input) > i and n.input[i] else None for i, w in ((3, "axes"), (4, "steps"))]
            axes, steps = opt[0] or list(range(len(starts))), opt[1] or [1] * len(starts)
        else:  # opset < 10: attributes
            a = _attrs(n)
            starts, ends = list(a["starts"]), list(a["ends"])
            axes, steps = list(a.get("axes", range(len(starts)))), [1] * len(starts)
        shape = r.shape(n.input[0]) or []
        for ax, st, en, sp in zip(axes, starts, ends, steps):
            ax = ax % len(shape) if shape else ax
            size = shape[ax] if 0 <= ax < len(shape) else None
            end = None if en >= _END else en
            whole_start = st == 0 or (size is not None and st <= -size)
            whole_end = end is None or (size is not None and end >= size)
            if not (sp == 1 and whole_start and whole_end):
                out.append((ax, st, end, sp))
    return out


def _slice(r: _Reader, u: _Unit):
    cuts = _cuts(r, u)
    if not cuts:
        return ("Slice", {"dim": 1, "start": 0, "end": None, "step": 1}, {}) if u.cls_type else ("Identity", {}, {})
    if len(cuts) > 1:
        raise _Unsupported(f"Slice along {len(cuts)} dimensions (the catalog's Slice cuts one: chain several)")
    ax, st, en, sp = cuts[0]
    if ax == 0:
        raise _Unsupported("Slice of the batch dimension")
    if sp < 1:
        raise _Unsupported(f"Slice with step {sp} (the catalog's Slice steps forward)")
    return "Slice", {"dim": ax, "start": st, "end": en, "step": sp}, {}


def _rms(r: _Reader, u: _Unit):
    """RMSNorm: one SimplifiedLayerNormalization / RMSNormalization op, or torch's
    decomposition x * 1/sqrt(mean(x^2) + eps) [* weight]."""
    x = u.inputs[0] if u.inputs else None
    rank = len(r.shape(x) or []) if x else 0
    n = u.find("SimplifiedLayerNormalization", "RMSNormalization")
    if n is not None:
        a = _attrs(n)
        axis = a.get("axis", -1)
        if axis != -1 and not (rank and axis == rank - 1):
            raise _Unsupported(f"{n.op_type} over axis {axis} (RMSNorm normalizes the last dimension)")
        scale = r.const(n.input[1], f"{n.op_type} scale")
        if scale.ndim != 1:
            raise _Unsupported(f"{n.op_type} with a scale of shape {list(scale.shape)}")
        return "RMSNorm", {"normalized_shape": int(scale.shape[0]), "eps": _round(a.get("epsilon", 1e-5)),
                           "elementwise_affine": True}, {"weight": _t(scale)}
    mean, add = u.find("ReduceMean"), u.find("Add")
    if mean is None or add is None or u.find("Sqrt") is None:
        raise _Unsupported("not the pattern x / sqrt(mean(x^2) + eps) of an RMSNorm")
    axes, _ = _reduce_axes(r, mean)
    if rank and sorted(ax % rank for ax in axes) != [rank - 1]:
        raise _Unsupported(f"mean square over axes {axes} (RMSNorm normalizes the last dimension)")
    eps = next((r.consts[i] for i in add.input if i in r.consts), None)
    if eps is None:
        raise _Unsupported("an RMSNorm whose eps is computed")
    try:
        state = _by_prefix(u, r, ["weight"])
    except _Unsupported:  # an optimized export: the weight is the vector it multiplies by
        ws = [r.consts[i] for m in u.nodes if m.op_type == "Mul" for i in m.input
              if i in r.consts and np.asarray(r.consts[i]).ndim >= 1 and np.asarray(r.consts[i]).size > 1]
        state = {"weight": _t(np.asarray(ws[-1]).reshape(-1))} if ws else {}
    size = int(state["weight"].shape[0]) if state else (r.shape(x) or [None])[-1]
    if size is None:
        raise _Unsupported("an RMSNorm whose size the file does not state")
    return "RMSNorm", {"normalized_shape": int(size), "eps": _round(float(np.asarray(eps).reshape(-1)[0])),
                       "elementwise_affine": bool(state)}, state


def _concat(r: _Reader, u: _Unit):
    n = u.find("Concat")
    axis = int(_attrs(n).get("axis", 1))
    if any(not r.is_data(i) for i in n.input):
        raise _Unsupported("Concat with a constant input")
    if not 2 <= len(n.input) <= 8:
        raise _Unsupported(f"Concat of {len(n.input)} inputs (the catalog joins 2 to 8)")
    if axis == 0:
        raise _Unsupported("Concat along the batch dimension")
    u.inputs = list(n.input)  # port order, with repeats (x concatenated with itself)
    return "Concat", {"num_inputs": len(n.input), "dim": axis}, {}


def _by_prefix(u: _Unit, r: _Reader, keys: list[str]) -> dict[str, torch.Tensor]:
    """Weights of a composite layer, by the state_dict names torch.onnx keeps when
    the optimizer has not folded them (Layerflow's exports)."""
    prefix = u.name + "."
    state = {n[len(prefix):]: _t(r.consts[n]) for n in u.raw_inits if n.startswith(prefix)}
    missing = [k for k in keys if k not in state]
    if missing:
        raise _Unsupported(f"weights {', '.join(prefix + k for k in missing[:3])} are not in the file under "
                           "their module names (export the source with torch.onnx.export(..., optimize=False))")
    return state


def _linears(r: _Reader, u: _Unit) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """(weight, bias) of every linear map by a constant inside a unit, in graph order:
    Gemm, or MatMul by a constant with an Add of a constant after it."""
    out = []
    for n in u.nodes:
        if n.op_type == "Gemm" and n.input[1] in r.consts:
            a = _attrs(n)
            w = r.consts[n.input[1]] if a.get("transB", 0) else r.consts[n.input[1]].T
            b = r.consts.get(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        elif n.op_type == "MatMul" and n.input[1] in r.consts and r.consts[n.input[1]].ndim == 2:
            w, b = r.consts[n.input[1]].T, None
        else:
            continue
        if b is None:  # a bias added after the product (an optimizer drops an all-zero one)
            c = r.consumers.get(n.output[0], [])
            if len(c) == 1 and c[0].op_type == "Add":
                b = next((r.consts[i] for i in c[0].input if i in r.consts), None)
        out.append((w, b))
    return out


def _by_role(u: _Unit, r: _Reader, linears: list[str], norms: list[str]) -> dict[str, torch.Tensor]:
    """Weights of a composite layer from an optimized export (renamed, transposed,
    shared constants): its linear maps and LayerNorms in the order forward runs them."""
    lins = _linears(r, u)
    lns = [n for n in u.nodes if n.op_type == "LayerNormalization"]
    if len(lins) != len(linears) or len(lns) != len(norms):
        raise _Unsupported(f"expected {len(linears)} linear maps and {len(norms)} LayerNorms, found {len(lins)} "
                           f"and {len(lns)}")
    state = {}
    for name, (w, b) in zip(linears, lins):
        wkey = name if name.endswith("_weight") else name + ".weight"
        bkey = name.replace("_weight", "_bias") if name.endswith("_weight") else name + ".bias"
        state[wkey] = _t(w)
        state[bkey] = _t(np.zeros(w.shape[0], dtype=np.float32) if b is None else np.asarray(b).reshape(-1))
    for name, n in zip(norms, lns):
        scale = r.const(n.input[1], "LayerNormalization scale")
        bias = r.consts.get(n.input[2]) if len(n.input) > 2 and n.input[2] else np.zeros_like(scale)
        state[name + ".weight"], state[name + ".bias"] = _t(scale), _t(bias)
    return state


def _heads(r: _Reader, u: _Unit) -> int:
    sm = u.find("Softmax")
    s = r.shape(sm.output[0]) if sm is not None else None
    if not s or len(s) != 4 or s[1] is None:
        raise _Unsupported("the number of attention heads is not stated (no 4-D attention scores)")
    return int(s[1])


def _attention(r: _Reader, u: _Unit):
    try:
        state = _by_prefix(u, r, ["q.weight", "k.weight", "v.weight", "out.weight"])
    except _Unsupported:
        state = _by_role(u, r, ["q", "k", "v", "out"], [])
    params = {"embed_dim": int(state["q.weight"].shape[1]), "num_heads": _heads(r, u), "dropout": 0.0,
              "bias": "q.bias" in state, "causal": "Trilu" in u.ops}
    return "MultiheadAttention", params, state


def _encoder(r: _Reader, u: _Unit):
    keys = ["self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
            "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias", "norm1.weight", "norm1.bias",
            "norm2.weight", "norm2.bias"]
    try:
        state = _by_prefix(u, r, keys)
    except _Unsupported:
        state = _by_role(u, r, ["self_attn.in_proj_weight", "self_attn.out_proj", "linear1", "linear2"],
                         ["norm1", "norm2"])
    x = u.inputs[0] if u.inputs else None
    norm_first = any(n.op_type == "LayerNormalization" and n.input[0] == x for n in u.nodes)
    for n in u.nodes:
        if n.op_type == "LayerNormalization" and abs(_attrs(n).get("epsilon", 1e-5) - 1e-5) > 1e-9:
            raise _Unsupported(f"layer_norm_eps {_attrs(n)['epsilon']:.3g} (the catalog's encoder layer uses 1e-5)")
    params = {"d_model": int(state["norm1.weight"].shape[0]), "nhead": _heads(r, u),
              "dim_feedforward": int(state["linear1.weight"].shape[0]), "dropout": 0.0,
              "activation": "gelu" if ("Gelu" in u.ops or "Erf" in u.ops) else "relu", "norm_first": norm_first}
    return "TransformerEncoderLayer", params, state


def _posemb(r: _Reader, u: _Unit):
    state = _by_prefix(u, r, ["weight"])
    return "PositionalEmbedding", {"max_len": int(state["weight"].shape[0]), "dim": int(state["weight"].shape[1])}, state


EXTRACTORS = {
    "Linear": _linear, "Conv": _conv, "Conv1d": _conv, "Conv2d": _conv, "MaxPool2d": _pool, "AvgPool2d": _pool,
    "AdaptiveAvgPool2d": _pool, "BatchNorm": _bn, "BatchNorm1d": _bn, "BatchNorm2d": _bn, "LayerNorm": _ln,
    "Dropout": _identity, "Identity": _identity, "ReLU": _plain("ReLU"), "SiLU": _plain("SiLU"),
    "Tanh": _plain("Tanh"), "Sigmoid": _sigmoid, "GELU": _gelu, "Softmax": _softmax, "Flatten": _flatten,
    "Reshape": _reshape, "Mean": _mean, "Embedding": _embedding, "Add": _binary("Add"), "Mul": _binary("Mul"),
    "Concat": _concat, "MultiheadAttention": _attention, "TransformerEncoderLayer": _encoder,
    "PositionalEmbedding": _posemb, "RMSNorm": _rms, "Transpose": _transpose, "Slice": _slice, "Scale": _scale,
    "MatMul": _matmul,
}


def _unit_type(u: _Unit) -> str | None:
    return u.cls_type or _op_type(u)


def _op_type(u: _Unit) -> str | None:
    data = [n for n in u.nodes if n.op_type not in ("Shape", "Size", "Constant")]
    if not data:
        return None
    main = data[0]
    if main.op_type == "Div" and "Erf" in u.ops:
        return "GELU"
    if main.op_type in ("Pow", "Mul") and "ReduceMean" in u.ops and "Sqrt" in u.ops:
        return "RMSNorm"
    return OP_TYPES.get(main.op_type) if main.domain in ("", "ai.onnx") else None


# ----- the importer ----------------------------------------------------------------
def _load(path: Path):
    import onnx

    try:
        model = onnx.load(str(path))
    except FileNotFoundError:
        raise InteropError(f"{path}: no such file") from None
    except Exception as exc:  # protobuf decode errors have many types
        raise InteropError(f"{path}: not an ONNX model ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not model.graph.output or not model.graph.node:
        raise InteropError(f"{path}: holds no ONNX graph (no nodes or no outputs); is it an ONNX model?")
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # shapes are a help, not a must: keep what the file says
        pass
    return model


def _input_node(r: _Reader, vi) -> tuple[dict, str | None]:
    import onnx

    tt = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if len(dims) < 2 or any(d is None for d in dims[1:]):
        return {}, f"input '{vi.name}' has shape {dims}: the importer needs a batch dimension and fixed sizes after it"
    dtype = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int64",
             onnx.TensorProto.DOUBLE: "float32", onnx.TensorProto.FLOAT16: "float32"}.get(tt.elem_type)
    if dtype is None:
        return {}, f"input '{vi.name}' has element type {onnx.TensorProto.DataType.Name(tt.elem_type)}"
    return {"shape": [int(d) for d in dims[1:]], "dtype": dtype}, None


def import_onnx(path: str | Path, name: str | None = None) -> Imported:
    """Read an ONNX file into a diagram and its weights.

    Files whose operators all read as catalog layers (Layerflow's own exports keep their
    node names and blocks) come in through the catalog reader below; any other file is
    turned into torch calls op by op (engine/interop/onnx_to_torch.py) and imported like
    a PyTorch module through torch.export (module_import.py), generic Op nodes included.
    Raises InteropError naming every operator neither can read."""
    path = Path(path)
    model = _load(path)
    try:
        return _import_catalog(path, model, name)
    except InteropError as catalog_exc:
        try:
            return _import_through_torch(path, model, name)
        except InteropError as exc:
            raise InteropError(f"{exc}\n(the catalog reader refused it too: "
                               f"{str(catalog_exc).splitlines()[0][:300]})") from None


def _import_through_torch(path: Path, model, name: str | None) -> Imported:
    from engine.interop.module_import import from_module
    from engine.interop.onnx_to_torch import onnx_module

    module = onnx_module(path, model)
    inits = {i.name for i in model.graph.initializer}
    shapes, dtypes = [], []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if len(dims) < 2 or any(d is None or d <= 0 for d in dims[1:]):
            raise InteropError(f"{path}: input '{vi.name}' has shape {dims}: every dimension but the batch must be "
                               "a fixed size")
        shapes.append(dims[1:])
        np_dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        dtypes.append("int64" if np.dtype(np_dt).kind in "iu" else "float32")
    imported = from_module(module, shapes, dtypes, source=path.name, name=name or path.stem, input_names=module.inputs)
    imported.project.description = f"Imported from {path.name} (ONNX opset {module.opset}, read as torch calls)"
    return imported


def _import_catalog(path: Path, model, name: str | None) -> Imported:
    """The catalog reader: every ONNX operator (or torch export unit) becomes a catalog layer."""
    r = _Reader(model, str(path))
    r.fold()
    problems: list[str] = []
    unknown: Counter = Counter()
    try:
        units, produced = r.units()
    except _Unsupported as exc:
        raise InteropError(f"{path}: {exc}") from None

    real_inputs = [vi for vi in r.graph.input if vi.name not in r.init_names]
    graph = Graph()
    taken: set[str] = set()
    value_node: dict[str, str] = {}
    for vi in real_inputs:
        params, why = _input_node(r, vi)
        if why:
            problems.append(why)
            continue
        nid = make_id(vi.name, taken)
        graph.add_node("Input", params, id=nid)
        value_node[vi.name] = nid

    # Live units: those the outputs depend on (the rest, e.g. shape plumbing, is dropped).
    live: list[_Unit] = []
    seen: set[str] = set()
    stack = [o.name for o in r.graph.output]
    while stack:
        v = stack.pop()
        u = produced.get(v)
        if u is None or u.key in seen:
            continue
        seen.add(u.key)
        live.append(u)
        stack.extend(u.inputs)
    live.sort(key=lambda u: units.index(u))

    state: dict[str, torch.Tensor] = {}
    built: list[tuple[str, _Unit]] = []
    for u in live:
        kind = _unit_type(u)
        if kind is None or kind not in EXTRACTORS:
            for n in u.nodes:
                if not r.is_data(n.output[0]) and n.op_type in ("Shape",):
                    continue
                unknown[n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"] += 1
            continue
        if _is_alias(r, u, kind):
            value_node[u.output] = ("alias", u.inputs[0])  # type: ignore[assignment]
            continue
        try:
            try:
                ctype, params, wstate = EXTRACTORS[kind](r, u)
            except _Unsupported:
                # An optimized export may have fused a module away (BatchNorm folded
                # into the Conv before it): read the unit by its ops instead.
                op_kind = _op_type(u)
                if not u.cls_type or op_kind is None or op_kind == kind or op_kind not in EXTRACTORS:
                    raise
                u.cls_type = None
                ctype, params, wstate = EXTRACTORS[op_kind](r, u)
        except _Unsupported as exc:
            ops = ", ".join(sorted(set(u.ops)))
            problems.append(f"'{u.name}' ({ops}): {exc}")
            continue
        nid = make_id(u.name, taken)
        graph.add_node(ctype, params, id=nid)
        graph.nodes[nid].scope = _unit_scope(u)
        for k, v in wstate.items():
            state[f"{nid}.{k}"] = v
        value_node[u.output] = nid
        built.append((nid, u))

    for nid, u in built:
        spec = get_layer(graph.nodes[nid].type)
        ports = spec.input_ports(graph.nodes[nid].params)
        srcs = [_resolve(value_node, v) for v in u.inputs]
        if len(srcs) != len(ports):
            problems.append(f"'{u.name}' ({graph.nodes[nid].type}) takes {len(ports)} input(s) but gets {len(srcs)} from the file")
            continue
        for port, src in zip(ports, srcs):
            if src is not None:
                graph.add_edge_unchecked(_edge(src, nid, port))
    for o in r.graph.output:
        src = _resolve(value_node, o.name)
        if src is None:
            continue
        nid = make_id(o.name, taken)
        per_sample = r.sample_shape(o.name)
        loss = "cross_entropy" if per_sample is not None and len(per_sample) == 1 and per_sample[0] > 1 else "mse"
        graph.add_node("Output", {"loss": loss}, id=nid)
        graph.add_edge_unchecked(_edge(src, nid, "in"))

    if unknown:
        listed = ", ".join(f"{op} x{n}" for op, n in sorted(unknown.items(), key=lambda kv: (-kv[1], kv[0])))
        problems.insert(0, f"{sum(unknown.values())} operator(s) of {len(unknown)} type(s) have no catalog layer: {listed}")
    if problems:
        raise InteropError(f"cannot import {path}:\n" + "\n".join(f"  - {p}" for p in problems))

    hints = _hints(model)
    _apply_hints(graph, hints)
    project = Project(graph, name=name or path.stem, description=f"Imported from {path.name}")
    imported = Imported(project, state, str(path))
    check_imported(imported)
    synthetic_training(project)
    return imported


def _is_alias(r: _Reader, u: _Unit, kind: str) -> bool:
    """Plumbing that is no layer: torch's Identity for clone(), a Slice that keeps everything."""
    if u.cls_type is not None or len(u.inputs) != 1:
        return False
    if kind == "Identity":
        return u.find("Identity") is not None and _alias_ok(u)
    try:
        return kind == "Slice" and not _cuts(r, u)
    except _Unsupported:
        return False


def _alias_ok(u: _Unit) -> bool:
    """torch.onnx writes clone()/contiguous() as Identity: plumbing, not a layer. An
    Identity in a file without torch's metadata was put there on purpose: keep it."""
    return len(u.inputs) == 1 and all(n.op_type == "Identity" and _scopes(n)[0] for n in u.nodes)


def _resolve(value_node: dict, v: str):
    seen = 0
    while isinstance(value_node.get(v), tuple) and seen < 1000:
        v = value_node[v][1]
        seen += 1
    x = value_node.get(v)
    return x if isinstance(x, str) else None


def _edge(src: str, dst: str, port: str):
    from engine.graph import Edge

    return Edge(src, "out", dst, port)


def _hints(model) -> dict | None:
    entry = next((p.value for p in model.metadata_props if p.key == DIAGRAM_KEY), None)
    if not entry:
        return None
    try:
        d = json.loads(entry)
        return {n["id"]: n for n in d.get("nodes", []) if isinstance(n, dict) and "id" in n}
    except (ValueError, TypeError, KeyError):
        return None


def _apply_hints(graph: Graph, hints: dict | None) -> None:
    """Parameters ONNX cannot state, and canvas positions, from an embedded diagram."""
    all_placed = bool(hints)
    for nid, node in graph.nodes.items():
        h = (hints or {}).get(nid)
        if not h or h.get("type") != node.type:
            all_placed = False
            continue
        for k, v in (h.get("params") or {}).items():
            # a Scale with a shape holds its values in the weights: scale/shift are only its initial fill
            if k in HINT_PARAMS or (k in ("scale", "shift") and node.params.get("shape")):
                node.params[k] = v
    _dim_hints(graph, hints)
    if all_placed:
        for nid in graph.nodes:
            pos = hints[nid].get("pos") or (0, 0)
            graph.move(nid, (float(pos[0]), float(pos[1])))
    else:
        layered_layout(graph)


def _dim_hints(graph: Graph, hints: dict | None) -> None:
    if not hints:
        return
    from engine.compile import compile_graph

    result = compile_graph(graph)
    for nid, node in graph.nodes.items():
        h, info = hints.get(nid) or {}, result.nodes.get(nid)
        if h.get("type") != node.type or info is None or not info.inputs:
            continue
        rank = len(info.inputs[0].shape) + 1
        keys = [k for k in DIM_PARAMS if isinstance(node.params.get(k), int)]
        want = [(h.get("params") or {}).get(k) for k in keys]
        # as a set: Transpose(-1, -2) swaps what Transpose(2, 3) does
        if keys and all(isinstance(v, int) for v in want) and \
                sorted(v % rank for v in want) == sorted(node.params[k] % rank for k in keys):
            node.params.update(zip(keys, want))
