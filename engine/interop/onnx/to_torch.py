"""ONNX -> an nn.Module that computes the same thing, op by op (opset 9 and later).

The module is then imported like any PyTorch model (engine/interop/module/importer.py,
through torch.export), so everything the torch importer handles works for ONNX files
too, and ONNX needs no mapping table of its own beyond "which torch call is this op".
Layers with weights become torch.nn layers named after the ONNX node (Conv ->
nn.Conv2d, Gemm -> nn.Linear, BatchNormalization -> nn.BatchNorm2d, pools, LRN), so
they come in as catalog nodes; the rest are torch function calls. Initializers are
parameters (they are the model's weights); values computed only from constants are
folded when the module is built. Shapes (Shape, Gather, Concat of sizes) are plain
Python sizes, so a symbolic batch flows through Reshape.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from torch import nn

from engine.interop.onnx import limits
from engine.interop.common import InteropError, ModelRunError


class _Sizes(list):
    """A shape as Python sizes (ints, or the symbolic batch while exporting)."""


def _f32(v: float) -> float:
    """A float32 number as the shortest decimal that is the same float32 (1e-06, not
    9.99999997e-07): what the file's author wrote, and exact in float32 arithmetic."""
    return float(str(np.float32(v))) if np.isfinite(v) else float(v)


def _scalar(v):
    """A one-element numpy constant as a Python number (it becomes an argument of the
    op, e.g. x * 0.5); other numpy constants as tensors."""
    if isinstance(v, np.ndarray) and v.size == 1:
        if v.dtype == np.float32:
            return _f32(v.reshape(-1)[0])
        return v.reshape(-1)[0].item() if v.ndim == 0 or v.dtype.kind == "f" else torch.as_tensor(v)
    return _tt(v)


def _tt(v):
    """An integer constant (numpy while the module runs) as a tensor, for tensor ops."""
    return torch.as_tensor(v) if isinstance(v, np.ndarray) else v


class _Scope(nn.Module):
    """One module of the source model's tree, rebuilt from the ONNX file's scope names:
    running an ONNX node inside it makes torch.export record the node's module path, so
    the imported diagram keeps the hierarchy (Node.scope)."""

    def forward(self, fn, *args):
        return fn(*args)


class NodeName(_Scope):
    """Carries an ONNX node's name to the fx nodes it gives (module_import names the
    diagram node after it); not part of the module tree."""


_SCOPE_TYPES: dict[str, type] = {}


def _scope_type(name: str) -> type:
    name = re.sub(r"[^A-Za-z0-9_]", "_", name) or "Block"
    if name not in _SCOPE_TYPES:
        _SCOPE_TYPES[name] = type(name, (_Scope,), {"__module__": "onnx_scope", "__qualname__": name})
    return _SCOPE_TYPES[name]


def _scopes(node) -> list[tuple[str, str]]:
    """(module path, type) from the outside in: torch's exporter writes them as metadata;
    other files name scopes with '/' (Caffe2-era model-zoo files: 'inception_3a/1x1')."""
    import ast

    meta = {p.key: p.value for p in node.metadata_props}
    if "pkg.torch.onnx.name_scopes" in meta:
        try:
            names = ast.literal_eval(meta["pkg.torch.onnx.name_scopes"])
            types = ast.literal_eval(meta.get("pkg.torch.onnx.class_hierarchy", "[]"))
        except (ValueError, SyntaxError, RecursionError, MemoryError):  # (nested past any real module tree)
            return []
        return [(n, str(types[i]).rpartition(".")[2] if i < len(types) else "Module")
                for i, n in enumerate(names[1:-1], start=1) if isinstance(n, str) and n]
    labels = [node.name, *(node.output[:1])]
    label = next((x for x in labels if x and "/" in x), "")
    parts = [p for p in label.split("/")[:-1] if p]
    return [(".".join(parts[: i + 1]), "Block") for i in range(len(parts))]


def _loaded(m: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    """A fresh layer with the file's weight (and bias)."""
    with torch.no_grad():
        m.weight.copy_(weight)
        if bias is not None:
            m.bias.copy_(bias)
    return m


def _run_scoped(chain: list, fn, args: tuple):
    """fn(*args) called through each scope module of `chain`, as the source's forward did."""
    if not chain:
        return fn(*args)
    return chain[0](lambda *a: _run_scoped(chain[1:], fn, a), *args)


def _attrs(node) -> dict:
    from onnx import helper

    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if a.type == a.FLOAT:
            v = _f32(v)
        elif a.type == a.FLOATS:
            v = [_f32(x) for x in v]
        out[a.name] = v
    return out


def _name(s: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_]", "_", s).strip("_") or "node"
    base = "n_" + base if base[0].isdigit() else base
    out, i = base, 1
    while out in taken:
        i += 1
        out = f"{base}_{i}"
    taken.add(out)
    return out


def _pads(pads, nd: int):
    """ONNX pads [b1, b2, e1, e2] -> (symmetric per-dim padding or None, F.pad list)."""
    pads = list(pads or [0] * (2 * nd))
    begin, end = pads[:nd], pads[nd:]
    fpad = [v for d in reversed(range(nd)) for v in (begin[d], end[d])]
    return (tuple(begin) if begin == end else None), fpad


class OnnxModule(nn.Module):
    """Runs an ONNX graph with torch calls; weights are its parameters."""

    user_source_lines = False  # its calls' source lines are this file's, nothing the user wrote (no stack traces)

    def __init__(self, model, source: str):
        super().__init__()
        g = model.graph
        self.source = source
        self._const_learn: dict[str, bool] = {}  # value -> it is (made from) a learned weight
        self._layers: dict[str, tuple] = {}  # ONNX node -> (module holding its nn layer, attribute)
        self._run_in: dict[str, list] = {}  # ONNX node -> the scope modules it runs in
        self._np: dict[str, np.ndarray] = {}  # integer constants, as numpy while the module runs
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        self._taken: set[str] = set(dir(nn.Module)) | {"forward"}
        self._const: dict[str, str | torch.Tensor | _Sizes] = {}  # value -> attribute name (or a folded constant)
        self._released: dict[str, torch.Tensor] = {}  # attribute -> an initializer only a layer's copy uses
        inits = {i.name for i in g.initializer}
        for init in g.initializer:
            arr = numpy_helper.to_array(init)
            self._store(init.name, torch.from_numpy(np.array(arr)), learn=arr.dtype.kind == "f")
        self.inputs = [i.name for i in g.input if i.name not in inits]
        self.outputs = [o.name for o in g.output]
        self.declared = {i.name: [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                                  for d in i.type.tensor_type.shape.dim]
                         for i in g.input if i.name not in inits and i.type.HasField("tensor_type")}
        self.declared_batch = [
            (i.type.tensor_type.shape.dim[0].dim_value if i.type.tensor_type.shape.dim else 0) for i in g.input
            if i.name not in inits]
        self._elem = {vi.name: vi.type.tensor_type.elem_type
                      for vi in (*g.value_info, *g.input, *g.output) if vi.type.HasField("tensor_type")}
        self._elem.update({i.name: i.data_type for i in g.initializer})
        self._rank = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in (*g.value_info, *g.input, *g.output)
                      if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}
        readers: dict[str, list] = {}  # value -> the nodes that read it
        for node in g.node:
            for i in node.input:
                readers.setdefault(i, []).append(node)
        self.uses = {v: len(r) for v, r in readers.items()}  # how many nodes read each value
        self._bias_for = self._linear_biases(g, readers)  # MatMul output -> (bias, the Add that adds it)
        self._absorbed: dict[str, str] = {}  # Add output -> the Linear output it passes on
        self.steps: list[tuple] = []  # (node, op function, attribute names)
        problems = []
        self._measure: limits.Measure | None = None  # set while dry_run checks what a run would hold
        for k, node in enumerate(g.node):
            if k % 256 == 0:
                limits.check_time(f"building node {k:,} of {len(g.node):,}")
            fn = getattr(self, f"_op_{node.op_type}", None)
            label = node.name or (node.output[0] if node.output else node.op_type)
            if node.domain not in ("", "ai.onnx") or fn is None:
                problems.append(f"node '{label}' ({node.op_type}{', domain ' + node.domain if node.domain else ''}): "
                                "no torch equivalent in Layerflow's ONNX reader")
                continue
            shared = node.op_type not in ("Shape", "Size") and \
                any(self._const_learn.get(i) and self.uses.get(i, 0) > 1 for i in node.input)
            needed = node.input[:1] if node.op_type == "CastLike" and node.input[1] in self._elem else node.input
            if all(i == "" or i in self._const for i in needed) and node.op_type not in ("Dropout",) \
                    and not shared:  # (a weight several nodes read stays one tensor: it is not folded)
                try:  # constants only: fold now (what it makes checked against the memory budget first)
                    values = [self._value(i) for i in needed]
                    limits.check_fold(source, node, values, _attrs(node))
                    outs = fn(node, values, _attrs(node), build=True)
                except limits.LimitError:
                    raise
                except InteropError as exc:
                    problems.append(str(exc))
                    continue
                learn = any(i in inits and self._const_learn.get(i, False) for i in node.input)
                for o, v in zip(node.output, outs if isinstance(outs, tuple) else (outs,)):
                    if isinstance(v, torch.Tensor):
                        self._store(o, v, learn=learn and v.is_floating_point())
                        if learn:
                            inits.add(o)
                    else:
                        self._const[o] = v
                continue
            try:
                fn(node, [None] * len(node.input), _attrs(node), build=True)  # create its layer, check attributes
            except InteropError as exc:
                problems.append(str(exc))
                continue
            self.steps.append((node, fn))
            self._step_scope(node)  # its place in the module tree, made before anything is traced
        if problems:
            shown = "; ".join(p.replace("\n", " ") for p in problems[:8])
            more = f"; and {len(problems) - 8} more" if len(problems) > 8 else ""
            raise InteropError(f"cannot import {source}: {len(problems)} operator(s) cannot be read: {shown}{more}")
        self._release_copies()

    def _release_copies(self) -> None:
        """Initializers that only a layer's construction reads (the nn layer holds its own
        copy: a Conv's weight, BatchNorm's statistics, a Linear's bias) or that nothing
        reads stop being this module's parameters and buffers; kept as plain tensors. Else
        each such weight would count twice, once never read by forward, and the import
        would name it as left out of the diagram (a false note on every ResNet file)."""
        read = set(self.outputs)
        for node, _ in self.steps:
            key = node.output[0] if node.output else node.name
            if key in self._layers:
                read.add(node.input[0])  # its data; the other inputs are the layer's copy
            elif node.op_type == "Add" and node.output[0] in self._absorbed:
                read.add(self._absorbed[node.output[0]])  # a Linear's bias, held by the Linear
            else:
                read.update(node.input)
        for name, attr in self._const.items():
            if isinstance(attr, str) and name not in read and (attr in self._parameters or attr in self._buffers):
                t = self._parameters.pop(attr, None) if attr in self._parameters else self._buffers.pop(attr)
                self._released[attr] = t.detach()

    def _linear_biases(self, g, readers: dict[str, list]) -> dict[str, tuple[str, str]]:
        """MatMul by a weight, then Add of a bias vector read nowhere else: one Linear
        with a bias (exporters write nn.Linear on 3-D inputs this way)."""
        inits = {i.name: i for i in g.initializer}
        out = {}
        graph_outputs = {o.name for o in g.output}
        for node in g.node:
            if node.op_type != "MatMul" or len(readers.get(node.output[0], [])) != 1 or node.output[0] in graph_outputs:
                continue  # (a product the file also returns stays without its bias)
            add = readers[node.output[0]][0]
            if add.op_type != "Add" or len(add.input) != 2:
                continue
            bias = add.input[1] if add.input[0] == node.output[0] else add.input[0]
            b = inits.get(bias)
            if b is not None and len(b.dims) == 1 and len(readers.get(bias, [])) == 1 and \
                    b.data_type in (1, 11):  # FLOAT, DOUBLE
                out[node.output[0]] = (bias, add.output[0])
        return out

    def _store(self, name: str, t: torch.Tensor, learn: bool) -> None:
        if not t.is_floating_point() or t.numel() == 1:  # shapes, axes, indices, scalars: plain numbers, never traced
            self._const[name] = t
            self._np[name] = t.numpy()
            self._const_learn[name] = False
            return
        attr = _name(name, self._taken)
        if learn:
            self.register_parameter(attr, nn.Parameter(t.float() if t.dtype == torch.float64 else t))
        else:
            self.register_buffer(attr, t)
        self._const[name] = attr
        self._const_learn[name] = learn

    def _value(self, name: str, env: dict | None = None):
        if name == "":
            return None
        if env is not None and name in env:
            return env[name]
        if env is not None and name in self._np:
            return self._np[name]
        c = self._const[name]
        if isinstance(c, str):
            return self._released[c] if c in self._released else getattr(self, c)
        return c

    def _module_at(self, path: str, typ: str) -> nn.Module:
        """The scope module at a dotted path of the source's tree (made on first use;
        the path's uncalled parents, a ModuleList say, become plain containers)."""
        mod: nn.Module = self
        parts = path.split(".")
        for i, part in enumerate(parts):
            attr = re.sub(r"[^A-Za-z0-9_]", "_", part) or "scope"
            child = mod._modules.get(attr)
            if child is not None and not isinstance(child, _Scope):
                attr += "_scope"  # a layer sits there already
                child = mod._modules.get(attr)
            if child is None:
                if mod is self and (attr in self._taken or hasattr(self, attr)):
                    attr = _name(attr, self._taken)
                self._taken.add(attr) if mod is self else None
                child = _scope_type(typ if i == len(parts) - 1 else "Module")()
                mod.add_module(attr, child)
            mod = child
        return mod

    def _chain(self, scopes: list[tuple[str, str]]) -> list[nn.Module]:
        return [self._module_at(path, typ) for path, typ in scopes]

    def _layer(self, node, make):
        """The nn layer of an ONNX node, created once when the module is built, at its
        place in the source's module tree when the file names one."""
        key = node.output[0] if node.output else node.name
        if key not in self._layers:
            scopes = _scopes(node)
            chain = self._chain(scopes[:-1])
            parent = chain[-1] if chain else self
            base = scopes[-1][0].rpartition(".")[2] if scopes else (node.name or node.output[0])
            attr = re.sub(r"[^A-Za-z0-9_]", "_", base) or "layer"
            if parent is self:
                attr = _name(attr, self._taken)
            while attr in parent._modules:
                attr += "_"
            parent.add_module(attr, make())
            self._layers[key] = (parent, attr)
            self._run_in[key] = chain
        parent, attr = self._layers[key]
        return getattr(parent, attr)

    def forward(self, *xs):
        env = dict(zip(self.inputs, xs))
        for node, fn in self.steps:
            ins = [self._value(i, env) for i in node.input]
            try:
                outs = _run_scoped(self._step_scope(node), fn, (node, ins, _attrs(node), False))
            except (InteropError, limits.LimitError, ModelRunError):
                raise
            except Exception as exc:  # noqa: BLE001 - torch's own error, said with the node it came from
                if torch.compiler.is_exporting():
                    raise  # (torch.export's own retries read its errors)
                raise ModelRunError(self._run_failure(node, ins, exc)) from exc
            if self._measure is not None:
                self._measure.step(node, outs)
            for o, v in zip(node.output, outs if isinstance(outs, tuple) else (outs,)):
                env[o] = v
        res = [self._value(o, env) for o in self.outputs]
        return res[0] if len(res) == 1 else tuple(res)

    def _step_scope(self, node) -> list[nn.Module]:
        """The scope modules an ONNX node runs inside, outermost first. A node of a file
        without scopes runs inside a NodeName module, so its diagram node takes its name."""
        key = node.output[0] if node.output else node.name
        if key not in self._run_in:
            scopes = _scopes(node)
            chain = self._chain(scopes)
            if not scopes and node.name and key not in self._layers:
                if "onnx_nodes" not in self._modules:
                    self.add_module("onnx_nodes", nn.Module())
                holder = self._modules["onnx_nodes"]
                attr = _name(node.name, set(holder._modules) | set(dir(nn.Module)))
                holder.add_module(attr, NodeName())
                chain = [*chain, holder._modules[attr]]
            self._run_in[key] = chain
        return self._run_in[key]

    def _run_failure(self, node, ins: list, exc: Exception) -> str:
        """One line: the node that failed, the shape of each input it was given, and where a
        graph input is among them, the dims the file declares for it."""
        def shape(v):
            return list(v.shape) if hasattr(v, "shape") else type(v).__name__
        given = ", ".join(f"'{n}' {shape(v)}" for n, v in zip(node.input, ins) if n)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        label = node.name or (node.output[0] if node.output else node.op_type)
        line = f"node '{label}' ({node.op_type}) failed on its inputs {given}: {first}"
        direct = [n for n in node.input if n in self.declared]
        if direct:
            decl = ", ".join(f"'{n}' as {self.declared[n]}" for n in direct)
            return (f"{line}. The file declares input {decl}, which this node cannot take: its declared dims "
                    "disagree with what the node reads; correct the input's shape in the file (or re-export it "
                    "with the input shape the model reads)")
        decl = ", ".join(f"'{n}' {d}" for n, d in self.declared.items())
        return f"{line} (the file's inputs, as declared: {decl}); check the shapes the file declares"

    # ----- helpers --------------------------------------------------------------
    def _fail(self, node, why: str):
        raise InteropError(f"node '{node.name or node.output[0]}' ({node.op_type}): {why}")

    def _ints(self, v) -> list:
        if isinstance(v, (torch.Tensor, np.ndarray)):
            return [int(x) for x in v.reshape(-1).tolist()]
        return list(v)

    def _weight(self, node, i: int) -> torch.Tensor:
        name = node.input[i]
        if name not in self._const:
            self._fail(node, f"input {i} ('{name}') must be a constant (an initializer) for a layer's weights")
        return self._value(name)  # (no call on it: while forward is traced, a released weight is read only for its shape)

    # ----- layers with weights -----------------------------------------------------
    def _op_Conv(self, node, ins, a, build):
        w = self._weight(node, 1)
        nd = w.dim() - 2
        if nd not in (1, 2):
            self._fail(node, f"{nd}-D convolution (the catalog has Conv1d and Conv2d)")
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
            self._fail(node, f"auto_pad={a['auto_pad']!r}: give explicit pads")
        sym, fpad = _pads(a.get("pads"), nd)
        b = self._weight(node, 2) if len(node.input) > 2 and node.input[2] else None

        def make():
            # torch's exporter gives a bias=False convolution a zero bias made from a constant
            # (Expand(CastLike(0), ...)): no weight of the file, so no bias of the layer either
            bias = b if b is not None and (self._const_learn.get(node.input[2], False) or bool(b.any())) else None
            cls = nn.Conv1d if nd == 1 else nn.Conv2d
            m = cls(w.shape[1] * a.get("group", 1), w.shape[0], tuple(w.shape[2:]), stride=tuple(a.get("strides", [1] * nd)),
                    padding=sym if sym is not None else 0, dilation=tuple(a.get("dilations", [1] * nd)),
                    groups=a.get("group", 1), bias=bias is not None)
            return _loaded(m, w, bias)
        m = self._layer(node, make)
        if build:
            return None
        x = ins[0] if sym is not None else F.pad(ins[0], fpad)
        return m(x)

    def _op_Gemm(self, node, ins, a, build):
        if a.get("transA", 0) or node.input[1] not in self._const or self.uses.get(node.input[1], 0) > 1:
            return self._matmul_general(node, ins, a, build)
        w = self._weight(node, 1)
        b = self._weight(node, 2) if len(node.input) > 2 and node.input[2] else None
        alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)

        def make():  # (the weight made (out, in) here, once: forward reads the layer, not the initializer)
            wt = w if a.get("transB", 0) else w.t()
            return _loaded(nn.Linear(wt.shape[1], wt.shape[0], bias=b is not None), wt * alpha,
                           (b * beta).expand(wt.shape[0]) if b is not None else None)
        m = self._layer(node, make)
        return None if build else m(ins[0])

    def _matmul_general(self, node, ins, a, build):
        if build:
            return None
        x, w = ins[0], ins[1]
        x = x.transpose(-1, -2) if a.get("transA", 0) else x
        w = w.transpose(-1, -2) if a.get("transB", 0) else w
        y = a.get("alpha", 1.0) * (x @ w)
        return y + a.get("beta", 1.0) * ins[2] if len(ins) > 2 and ins[2] is not None else y

    def _op_MatMul(self, node, ins, a, build):
        if node.input[1] in self._const and self._weight(node, 1).dim() == 2 and node.input[0] not in self._const \
                and self.uses.get(node.input[1], 0) == 1:  # a weight read by others stays shared
            w = self._weight(node, 1)
            bias, add = self._bias_for.get(node.output[0], (None, None))
            b = self._value(bias) if bias is not None else None
            if b is not None and tuple(b.shape) != (w.shape[1],):
                b = None
            if b is not None:
                self._absorbed[add] = node.output[0]
            m = self._layer(node, lambda: _loaded(nn.Linear(w.shape[0], w.shape[1], bias=b is not None), w.t(), b))
            return None if build else m(ins[0])
        return None if build else torch.matmul(_tt(ins[0]), _tt(ins[1]))

    def _op_BatchNormalization(self, node, ins, a, build):
        scale, bias, mean, var = (self._weight(node, i) for i in range(1, 5))

        cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 5: nn.BatchNorm3d}.get(self._rank.get(node.input[0]), nn.BatchNorm2d)

        def make():
            m = cls(scale.shape[0], eps=a.get("epsilon", 1e-5), momentum=1 - a.get("momentum", 0.9))
            with torch.no_grad():
                m.weight.copy_(scale), m.bias.copy_(bias), m.running_mean.copy_(mean), m.running_var.copy_(var)
            return m
        m = self._layer(node, make)
        return None if build else m(ins[0])

    def _op_LayerNormalization(self, node, ins, a, build):
        # ONNX normalizes over dims axis.. whose shape the scale has: nn.LayerNorm(scale.shape) does the same
        scale = self._weight(node, 1)
        bias = self._weight(node, 2) if len(node.input) > 2 and node.input[2] else None
        m = self._layer(node, lambda: _loaded(nn.LayerNorm(tuple(scale.shape), eps=a.get("epsilon", 1e-5),
                                                           bias=bias is not None), scale, bias))
        return None if build else m(ins[0])

    def _op_SimplifiedLayerNormalization(self, node, ins, a, build):
        # RMSNorm as onnxruntime (and opset 23's RMSNormalization) write it: over the dims the scale has
        scale = self._weight(node, 1)
        axis, rank = a.get("axis", -1), self._rank.get(node.input[0])
        if axis != -scale.dim() and not (rank and axis >= 0 and axis == rank - scale.dim()):
            self._fail(node, f"axis {a.get('axis')} with a scale of {scale.dim()} dim(s)")
        m = self._layer(node, lambda: _loaded(nn.RMSNorm(tuple(scale.shape), eps=a.get("epsilon", 1e-5)), scale, None))
        return None if build else m(ins[0])

    _op_RMSNormalization = _op_SimplifiedLayerNormalization

    def _pool(self, node, ins, a, build, kind: str):
        k = a["kernel_shape"]
        nd = len(k)
        if nd != 2:
            self._fail(node, f"{nd}-D pooling")
        sym, fpad = _pads(a.get("pads"), nd)
        strides = tuple(a.get("strides", [1] * nd))
        ceil = bool(a.get("ceil_mode", 0))
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
            self._fail(node, f"auto_pad={a['auto_pad']!r}: give explicit pads")
        include = bool(a.get("count_include_pad", 0))
        if kind == "max":
            if a.get("dilations", [1] * nd) != [1] * nd or len(node.output) > 1 and node.output[1]:
                self._fail(node, "MaxPool with dilations or indices")
            m = self._layer(node, lambda: nn.MaxPool2d(tuple(k), strides, sym or 0, ceil_mode=ceil))
            if build:
                return None
            return m(ins[0] if sym is not None else F.pad(ins[0], fpad, value=-math.inf))
        if sym is not None and (include or not any(sym)) or sym is not None and all(2 * p <= kk for p, kk in zip(sym, k)):
            m = self._layer(node, lambda: nn.AvgPool2d(tuple(k), strides, sym, ceil_mode=ceil, count_include_pad=include))
            return None if build else m(ins[0])
        if build:
            return None
        x = F.pad(ins[0], fpad)
        total = F.avg_pool2d(x, tuple(k), strides, ceil_mode=ceil)
        if include:
            return total
        ones = F.pad(torch.ones_like(ins[0][:1, :1]), fpad)
        return total / F.avg_pool2d(ones, tuple(k), strides, ceil_mode=ceil)

    def _op_MaxPool(self, node, ins, a, build):
        return self._pool(node, ins, a, build, "max")

    def _op_AveragePool(self, node, ins, a, build):
        return self._pool(node, ins, a, build, "avg")

    def _op_GlobalAveragePool(self, node, ins, a, build):
        m = self._layer(node, lambda: nn.AdaptiveAvgPool2d(1))
        return None if build else m(ins[0])

    def _op_GlobalMaxPool(self, node, ins, a, build):
        return None if build else torch.amax(ins[0], dim=tuple(range(2, ins[0].dim())), keepdim=True)

    def _op_LRN(self, node, ins, a, build):
        m = self._layer(node, lambda: nn.LocalResponseNorm(a["size"], a.get("alpha", 1e-4), a.get("beta", 0.75),
                                                           a.get("bias", 1.0)))
        return None if build else m(ins[0])

    # ----- elementwise and shapes ------------------------------------------------------
    def _binary(self, ins, f):
        a, b = ins
        if isinstance(a, (int, float, _Sizes)) or isinstance(b, (int, float, _Sizes)):
            av = a[0] if isinstance(a, _Sizes) and len(a) == 1 else a
            bv = b[0] if isinstance(b, _Sizes) and len(b) == 1 else b
            return f(_scalar(av), _scalar(bv))
        return f(_scalar(a), _scalar(b))

    def _op_Add(self, node, ins, a, build):
        if node.output[0] in self._absorbed:  # the bias of the Linear before it
            return None if build else ins[list(node.input).index(self._absorbed[node.output[0]])]
        return None if build and None in ins else self._binary(ins, lambda x, y: x + y)

    def _op_Sub(self, node, ins, a, build):
        return None if build and None in ins else self._binary(ins, lambda x, y: x - y)

    def _op_Mul(self, node, ins, a, build):
        return None if build and None in ins else self._binary(ins, lambda x, y: x * y)

    def _op_Div(self, node, ins, a, build):
        def div(x, y):
            if isinstance(x, int) and isinstance(y, int):
                return x // y
            if isinstance(x, torch.Tensor) and not x.is_floating_point() and isinstance(y, torch.Tensor) \
                    and not y.is_floating_point():
                return torch.div(x, y, rounding_mode="trunc")
            return x / y
        return None if build and None in ins else self._binary(ins, div)

    def _op_Pow(self, node, ins, a, build):
        return None if build and None in ins else torch.pow(_tt(ins[0]), _scalar(ins[1]))

    def _variadic(f):
        """Sum, Max, Min: f folded over any number of inputs."""
        def op(self, node, ins, a, build):
            if build and None in ins:
                return None
            out = ins[0]
            for x in ins[1:]:
                out = f(out, x)
            return out
        return op

    _op_Sum = _variadic(lambda x, y: x + y)
    _op_Max = _variadic(torch.maximum)
    _op_Min = _variadic(torch.minimum)

    def _unary(f):
        def op(self, node, ins, a, build):
            return None if build and ins[0] is None else f(ins[0], a)
        return op

    _op_Relu = _unary(lambda x, a: torch.relu(x))
    _op_Sigmoid = _unary(lambda x, a: torch.sigmoid(x))
    _op_Tanh = _unary(lambda x, a: torch.tanh(x))
    _op_Exp = _unary(lambda x, a: torch.exp(x))
    _op_Log = _unary(lambda x, a: torch.log(x))
    _op_Sqrt = _unary(lambda x, a: torch.sqrt(x))
    _op_Neg = _unary(lambda x, a: -x)
    _op_Abs = _unary(lambda x, a: torch.abs(x))
    _op_Erf = _unary(lambda x, a: torch.erf(x))
    _op_Reciprocal = _unary(lambda x, a: torch.reciprocal(x))
    _op_Identity = _unary(lambda x, a: x)
    _op_LeakyRelu = _unary(lambda x, a: F.leaky_relu(x, a.get("alpha", 0.01)))
    _op_Elu = _unary(lambda x, a: F.elu(x, a.get("alpha", 1.0)))
    _op_HardSigmoid = _unary(lambda x, a: torch.clamp(x * a.get("alpha", 0.2) + a.get("beta", 0.5), 0, 1))
    _op_Gelu = _unary(lambda x, a: F.gelu(x, approximate=(a.get("approximate", b"none").decode()
                                                           if isinstance(a.get("approximate"), bytes) else "none")))
    _op_Softplus = _unary(lambda x, a: F.softplus(x))
    _op_Cos = _unary(lambda x, a: torch.cos(x))
    _op_Sin = _unary(lambda x, a: torch.sin(x))

    def _op_Dropout(self, node, ins, a, build):
        # identity in inference (the mask output is unused); kept as a layer so that
        # training the imported model drops out as its source did
        ratio = a.get("ratio", 0.5)
        if self.opset >= 12:
            ratio = float(np.asarray(self._value(node.input[1])).reshape(-1)[0]) \
                if len(node.input) > 1 and node.input[1] in self._const else 0.5
        m = self._layer(node, lambda: nn.Dropout(ratio))
        return None if build else m(ins[0])

    def _op_Clip(self, node, ins, a, build):
        if build and ins[0] is None:
            return None
        lo = ins[1] if len(ins) > 1 and ins[1] is not None else a.get("min")
        hi = ins[2] if len(ins) > 2 and ins[2] is not None else a.get("max")
        lo = float(lo) if isinstance(lo, (torch.Tensor, np.ndarray)) else lo
        hi = float(hi) if isinstance(hi, (torch.Tensor, np.ndarray)) else hi
        return torch.clamp(ins[0], lo, hi)

    def _softmax(self, node, ins, a, f):
        x = ins[0]
        if self.opset < 13:
            axis = a.get("axis", 1) % x.dim()
            if axis == x.dim() - 1:
                return f(x, dim=-1)
            return f(x.flatten(axis), dim=-1).reshape(x.shape)  # opset < 13: over dims axis.. as one
        return f(x, dim=a.get("axis", -1))

    def _op_Softmax(self, node, ins, a, build):
        return None if build else self._softmax(node, ins, a, torch.softmax)

    def _op_LogSoftmax(self, node, ins, a, build):
        return None if build else self._softmax(node, ins, a, torch.log_softmax)

    def _op_Flatten(self, node, ins, a, build):
        if build:
            return None
        axis = a.get("axis", 1)
        x = ins[0]
        if axis == 1:
            return x.flatten(1)
        return x.reshape(math.prod(x.shape[:axis]) if axis else 1, -1)

    def _op_Reshape(self, node, ins, a, build):
        if build and ins[0] is None:
            return None
        x, shape = ins[0], self._ints(ins[1]) if not isinstance(ins[1], _Sizes) else list(ins[1])
        if not isinstance(x, torch.Tensor):  # sizes: a size is a shape of one, a shape of one a size
            sizes = _Sizes(x) if isinstance(x, (list, tuple, np.ndarray)) else _Sizes([x])
            if not shape:
                if len(sizes) != 1:
                    self._fail(node, f"reshapes {len(sizes)} sizes to a scalar")
                return sizes[0]
            return sizes
        shape = [x.shape[i] if s == 0 and not a.get("allowzero", 0) else s for i, s in enumerate(shape)]
        if shape and x.dim() and self.declared_batch and isinstance(shape[0], int) and shape[0] == self.declared_batch[0] \
                and shape[0] != x.shape[0]:
            shape[0] = x.shape[0]  # the file fixed the batch (usually 1): keep the real one
        return x.reshape(shape)

    def _op_Transpose(self, node, ins, a, build):
        return None if build and ins[0] is None else ins[0].permute(a.get("perm", list(reversed(range(ins[0].dim())))))

    def _axes(self, ins, a) -> list[int]:
        return self._ints(ins[1]) if len(ins) > 1 and ins[1] is not None else list(a.get("axes", []))

    def _op_Unsqueeze(self, node, ins, a, build):
        if build and ins[0] is None:
            return None
        x = ins[0]
        if isinstance(x, (int, torch.SymInt)) or isinstance(x, _Sizes):
            return _Sizes([x] if not isinstance(x, _Sizes) else x)
        for ax in sorted(d % (x.dim() + len(self._axes(ins, a))) for d in self._axes(ins, a)):
            x = x.unsqueeze(ax)
        return x

    def _op_Squeeze(self, node, ins, a, build):
        if build and ins[0] is None:
            return None
        axes = self._axes(ins, a)
        x = ins[0]
        if isinstance(x, _Sizes):  # a one-element shape squeezed to its size
            if len(x) != 1:
                self._fail(node, f"squeezes a shape of {len(x)} sizes")
            return x[0]
        if isinstance(x, np.ndarray):
            return np.squeeze(x, tuple(axes)) if axes else np.squeeze(x)
        return x.squeeze(tuple(axes)) if axes else x.squeeze()

    def _op_Concat(self, node, ins, a, build):
        if build and None in ins:
            return None
        if any(isinstance(x, _Sizes) for x in ins):
            out = _Sizes()
            for x in ins:
                out.extend(x if isinstance(x, _Sizes) else self._ints(x))
            return out
        return torch.cat([_tt(x) for x in ins], dim=a["axis"])

    def _op_Shape(self, node, ins, a, build):
        if build and ins[0] is None:
            return None
        dims = list(ins[0].shape)
        return _Sizes(dims[a.get("start", 0):a.get("end", len(dims))])

    def _op_Gather(self, node, ins, a, build):
        if build and ins[0] is None:
            return None
        data, idx = ins[0], _tt(ins[1])
        axis = a.get("axis", 0)
        if isinstance(idx, torch.Tensor) and idx.dtype != torch.int64:
            idx = idx.long()  # ONNX allows int32 indices; index_select and embedding read int64
        if isinstance(data, _Sizes):
            ids = self._ints(idx) if isinstance(idx, torch.Tensor) else [idx]
            picked = [data[i] for i in ids]
            return picked[0] if isinstance(idx, torch.Tensor) and idx.dim() == 0 else _Sizes(picked)
        if isinstance(idx, torch.Tensor) and idx.dim() == 0:
            return data.select(axis, int(idx)) if node.input[1] in self._const else torch.index_select(
                data, axis, idx.reshape(1)).squeeze(axis)
        if axis == 0 and node.input[0] in self._const:
            return F.embedding(idx, data)  # a table lookup: an embedding
        return torch.index_select(data, axis, idx.reshape(-1)).reshape(
            *data.shape[:axis], *idx.shape, *data.shape[axis + 1:])

    def _op_ScatterND(self, node, ins, a, build):
        """`data` with `updates` written at `indices` (their last axis picks an element or a
        slice): index_put on a copy, the diagram having no in-place writes. torch's exporter
        writes slice assignments this way (Swin's attention mask, filled region by region)."""
        if build and any(v is None for v in ins):
            return None
        data, idx, upd = _tt(ins[0]), _tt(ins[1]), _tt(ins[2])
        red = a.get("reduction", "none")
        red = red.decode() if isinstance(red, bytes) else red
        if red not in ("none", "add"):
            self._fail(node, f"reduction '{red}' (Layerflow reads none and add)")
        return torch.index_put(data, tuple(idx.long().unbind(-1)), upd, accumulate=red == "add")

    def _op_Slice(self, node, ins, a, build):
        if build and ins[0] is None:
            return None
        x = ins[0]
        if self.opset < 10:
            starts, ends, axes = a["starts"], a["ends"], a.get("axes")
            steps = None
        else:
            starts, ends = self._ints(ins[1]), self._ints(ins[2])
            axes = self._ints(ins[3]) if len(ins) > 3 and ins[3] is not None else None
            steps = self._ints(ins[4]) if len(ins) > 4 and ins[4] is not None else None
        axes = list(axes) if axes is not None else list(range(len(starts)))
        steps = steps or [1] * len(starts)
        if isinstance(x, _Sizes):
            return _Sizes(x[starts[0]:min(ends[0], len(x)):steps[0]])
        index = [slice(None)] * x.dim()
        for s, e, ax, st in zip(starts, ends, axes, steps):
            if st < 0:
                self._fail(node, "a negative step")
            index[ax % x.dim()] = slice(s, None if e >= 2 ** 31 - 1 else e, st)
        return x[tuple(index)]

    def _op_Cast(self, node, ins, a, build):
        if build and ins[0] is None:
            return None
        from onnx import helper

        dt = torch.from_numpy(np.zeros(1, dtype=helper.tensor_dtype_to_np_dtype(a["to"]))).dtype
        if isinstance(ins[0], _Sizes) and dt.is_floating_point and all(isinstance(v, int) for v in ins[0]):
            return torch.tensor(list(ins[0]), dtype=dt)  # sizes used in arithmetic (1 / sqrt(head_dim))
        return ins[0] if isinstance(ins[0], (_Sizes, int, np.ndarray)) else ins[0].to(dt)

    def _op_CastLike(self, node, ins, a, build):
        if node.input[1] not in self._elem:  # no type known: the other tensor tells it while running
            return None if build and None in ins else (ins[0].to(ins[1].dtype) if isinstance(ins[0], torch.Tensor)
                                                       else ins[0])
        return self._op_Cast(node, ins[:1], {"to": self._elem[node.input[1]]}, build)

    def _op_Constant(self, node, ins, a, build):
        if "value" in a:
            return torch.from_numpy(np.array(numpy_helper.to_array(a["value"])))
        for k in ("value_float", "value_int"):
            if k in a:
                return torch.tensor(a[k])
        for k in ("value_floats", "value_ints"):
            if k in a:
                return torch.tensor(list(a[k]))
        self._fail(node, f"constant of kind {', '.join(a)}")

    def _op_ConstantOfShape(self, node, ins, a, build):
        if build and ins[0] is None:
            return None
        v = torch.from_numpy(np.array(numpy_helper.to_array(a["value"]))) if "value" in a else torch.zeros(1)
        shape = list(ins[0]) if isinstance(ins[0], _Sizes) else self._ints(ins[0])
        return torch.full(shape, v.reshape(-1)[0].item(), dtype=v.dtype)

    def _reduce(self, node, ins, a, f):
        axes = self._axes(ins, a) if not (self.opset >= 18 or node.op_type == "ReduceSum" and self.opset >= 13) \
            else (self._ints(ins[1]) if len(ins) > 1 and ins[1] is not None else [])
        if not axes and a.get("noop_with_empty_axes", 0):
            return ins[0]
        axes = axes or list(range(ins[0].dim()))
        return f(ins[0], dim=tuple(axes), keepdim=bool(a.get("keepdims", 1)))

    def _op_ReduceMean(self, node, ins, a, build):
        return None if build and ins[0] is None else self._reduce(node, ins, a, torch.mean)

    def _op_ReduceSum(self, node, ins, a, build):
        return None if build and ins[0] is None else self._reduce(node, ins, a, torch.sum)

    def _op_ReduceMax(self, node, ins, a, build):
        return None if build and ins[0] is None else self._reduce(node, ins, a, torch.amax)

    def _op_Pad(self, node, ins, a, build):
        if build and ins[0] is None:
            return None
        x = ins[0]
        pads = self._ints(ins[1]) if len(ins) > 1 and ins[1] is not None else list(a["pads"])
        mode = a.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        value = float(np.asarray(ins[2])) if len(ins) > 2 and ins[2] is not None else a.get("value", 0.0)
        nd = x.dim()
        fpad = [v for d in reversed(range(nd)) for v in (pads[d], pads[d + nd])]
        while len(fpad) > 2 and fpad[-1] == 0 and fpad[-2] == 0:
            fpad = fpad[:-2]
        return F.pad(x, fpad, mode=mode, value=value) if mode == "constant" else F.pad(x, fpad, mode=mode)

    def _op_Expand(self, node, ins, a, build):
        if build and ins[0] is None:
            return None
        shape = list(ins[1]) if isinstance(ins[1], _Sizes) else self._ints(ins[1])
        if isinstance(ins[0], _Sizes):  # a shape vector broadcast (to itself, as exporters write it)
            if len(shape) != 1 or shape[0] not in (1, len(ins[0])) and len(ins[0]) != 1:
                self._fail(node, f"expands a shape of {len(ins[0])} sizes to {shape}")
            return _Sizes(ins[0] * (shape[0] if len(ins[0]) == 1 else 1))
        x = _tt(ins[0])
        if x.dim() > len(shape) or any(isinstance(s, int) and s == 1 for s in shape):
            # ONNX broadcasts both ways (a 1 in the shape keeps the input's size)
            return x * torch.ones(shape, dtype=x.dtype, device=x.device)
        return x.expand(shape)

    def _op_Trilu(self, node, ins, a, build):
        if build and ins[0] is None:
            return None
        k = int(np.asarray(ins[1]).reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else 0
        return torch.triu(_tt(ins[0]), k) if a.get("upper", 1) else torch.tril(_tt(ins[0]), k)

    def _op_Where(self, node, ins, a, build):
        return None if build and None in ins else torch.where(*(_tt(v) for v in ins))

    def _op_Equal(self, node, ins, a, build):
        return None if build and None in ins else torch.eq(_tt(ins[0]), _tt(ins[1]))

    def _op_Not(self, node, ins, a, build):
        return None if build and None in ins else torch.logical_not(_tt(ins[0]))

    def _op_Range(self, node, ins, a, build):
        if build and None in ins:
            return None
        s, e, d = (int(np.asarray(v).reshape(-1)[0]) if isinstance(v, (torch.Tensor, np.ndarray)) else v for v in ins)
        return torch.arange(s, e, d)

    def _op_Split(self, node, ins, a, build):
        if build and ins[0] is None:
            return None
        x, axis = ins[0], a.get("axis", 0)
        sizes = self._ints(ins[1]) if len(ins) > 1 and ins[1] is not None else a.get("split")
        if sizes is None:
            n = len(node.output)
            sizes = [x.shape[axis] // n] * n
        return tuple(torch.split(x, list(sizes), dim=axis))


def onnx_module(path: str | Path, model=None) -> OnnxModule:
    """The ONNX file as an nn.Module in eval mode (weights from its initializers)."""
    import onnx

    model = model if model is not None else onnx.load(str(path))
    return OnnxModule(model, str(Path(path).name)).eval()
