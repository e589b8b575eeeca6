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
"""
from __future__ import annotations

import math
import operator
import re
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import fx, nn

from engine.diagram.graph import Edge, Graph
from engine.interop.common import (Imported, InteropError, ModelRunError, best_effort, check_imported, make_id,
                                   synthetic_training)
from engine.interop.module.faithful import check_arity as _check_arity, check_outputs as _check_outputs
from engine.interop.progress import phase
from engine.interop.module.mutations import functional
from engine.interop.module.prune import drop_dead
from engine.interop.module.shared import batch_view, shared_values
from engine.interop.module.unused import left_out_notes
from engine.interop.module.samples import embedding_vocab, first_samples, token_samples
from engine.diagram.layout import blocks_from_scopes
from engine.diagram.catalog import FieldError, get_layer
from engine.project import Project
from engine.runtime import layers as rl
from engine.runtime.ops import PY_OPS, OpError, encode_float
from engine.runtime.ops import refs as _refs

SAMPLE_BATCH = 3  # a batch unlike any other size, so the batch dimension is easy to tell apart


class _Unsupported(Exception):
    pass


def _plain(v):
    """A module attribute as a project file holds it: (3, 3) -> 3, (3, 5) -> [3, 5],
    a convolution's padding='valid' -> 0."""
    if v == "valid":
        return 0
    if isinstance(v, (tuple, list)):
        vals = [int(x) if isinstance(x, (int, torch.SymInt)) else x for x in v]
        return vals[0] if len(set(map(repr, vals))) == 1 else vals
    return v


def _config(m: nn.Module) -> dict:
    """What makes a module compute what it does, beyond its tensors: its plain attributes
    (ceil_mode, padding_mode, count_include_pad, affine, batch_first, ...) and the names
    and shapes of its parameters and buffers."""
    plain = {f"{name}.{k}": repr(_plain(v))
             for name, sub in m.named_modules() for k, v in vars(sub).items()
             if not k.startswith("_") and k not in _NO_MATTER and not isinstance(v, (torch.Tensor, nn.Module))}
    return {"attrs": plain, "state": {k: tuple(t.shape) for k, t in m.state_dict().items()}}


_NO_MATTER = {"training", "inplace"}  # an in-place ReLU computes what ReLU computes


def _read_ctor(kind: str, m: nn.Module) -> dict:
    """The catalog parameters of a torch module, read through the layer's constructor
    declaration (engine/runtime/layers.py CTORS) and checked by building the catalog's
    module from them: anything it would compute differently (ceil_mode=True, a reflect
    padding, affine=False, bias=False on a LayerNorm) is refused."""
    ctor, spec = rl.CTORS[kind], get_layer(kind)
    kinds = {ps.name: ps.kind for ps in spec.params}
    params = {}
    if kind in ("LayerNorm", "RMSNorm") and len(m.normalized_shape) != 1:
        raise _Unsupported(f"normalized_shape {tuple(m.normalized_shape)} (the catalog normalizes the last dimension)")
    for attr, name in (*((a, a) for a in ctor.args), *((k.partition("=")[0], k.partition("=")[2] or k) for k in ctor.kwargs)):
        v = getattr(m, attr)  # the module's attribute of the keyword's name, for the parameter it comes from
        if kinds.get(name) == "bool" and (v is None or isinstance(v, torch.Tensor)):
            v = v is not None  # bias=True: the module has a bias tensor
        params[name] = _plain(v)
    if kind in ("LayerNorm", "RMSNorm") and params["eps"] is None:
        params["eps"] = torch.finfo(torch.float32).eps  # torch's default for float32
    for k, v in ctor.defaults:
        if params.get(k) == params.get(v) and k in params:
            params[k] = None  # pool stride = kernel: the catalog's default
    try:
        checked = {ps.name: ps.check(params[ps.name]) for ps in spec.params if ps.name in params}
    except FieldError as exc:
        raise _Unsupported(str(exc)) from None
    src = _config(m)
    if getattr(m, "eps", 0) is None:  # RMSNorm(eps=None): torch's default, which the catalog writes out
        src["attrs"][".eps"] = repr(params["eps"])
    try:
        same = _config(ctor.build(spec.defaults() | checked)) == src
    except (TypeError, ValueError, RuntimeError) as exc:
        raise _Unsupported(f"{type(exc).__name__}: {exc}") from None
    if not same:
        raise _Unsupported(f"{type(m).__name__} configured beyond what the catalog's {kind} declares")
    return checked


def _read_scale(m: rl.Scale) -> dict:
    if isinstance(m.scale, float):
        return {"scale": m.scale, "shift": m.shift, "shape": []}
    return {"shape": list(m.scale.shape)}  # the constants travel as its buffers


# torch module class -> (catalog type, reader); most read through their constructor declaration
MODULES: dict[type, tuple[str, object]] = {c.cls: (t, None) for t, c in rl.CTORS.items()}
MODULES.update({
    nn.TransformerEncoderLayer: ("TransformerEncoderLayer", lambda m: {
        "d_model": m.linear1.in_features, "nhead": m.self_attn.num_heads, "dim_feedforward": m.linear1.out_features,
        "dropout": m.dropout.p, "norm_first": m.norm_first,
        "activation": {1: "relu", 2: "gelu"}.get(getattr(m, "activation_relu_or_gelu", 0), repr(m.activation))}),
    rl.SelfAttention: ("MultiheadAttention", lambda m: {
        "embed_dim": m.q.in_features, "num_heads": m.num_heads, "dropout": m.dropout, "bias": m.q.bias is not None,
        "causal": m.causal}),
    rl.PositionalEmbedding: ("PositionalEmbedding", lambda m: {"max_len": m.weight.shape[0], "dim": m.weight.shape[1]}),
    rl.Scale: ("Scale", _read_scale),
})


def catalog_layer(m: nn.Module) -> tuple[str, dict] | None:
    """(catalog type, parameters) of a torch module the catalog has, else None."""
    kind, reader = MODULES.get(type(m), (None, None))
    if kind is None:
        return None
    try:
        if reader is None:
            return kind, _read_ctor(kind, m)
        params = reader(m)
        spec = get_layer(kind)
        checked = {ps.name: ps.check(params[ps.name]) for ps in spec.params if ps.name in params}
        if kind != "Scale" and _config(rl.CTORS[kind].build(spec.defaults() | checked)) != _config(m):
            return None
        return kind, checked
    except (_Unsupported, FieldError, TypeError, ValueError, RuntimeError, AttributeError):
        return None


# ----- reading torch.export's graph --------------------------------------------
def _op_name(target) -> str:
    """The name an Op node stores for an fx call target."""
    if isinstance(target, torch._ops.OpOverload):
        if target.namespace != "aten":
            raise _Unsupported(f"operator {target.namespace}::{target._opname} is not an ATen operator")
        op, ov = target._opname, target._overloadname
        if op.endswith("_") and not op.startswith("_") and hasattr(torch.ops.aten, op[:-1]):
            packet = getattr(torch.ops.aten, op[:-1])  # x.relu_() -> relu(x): the diagram has no aliasing
            if ov in packet.overloads():
                op = op[:-1]
        if op in ("view", "_unsafe_view") and ov == "default":
            op = "reshape"  # torch.export drops .contiguous(); reshape is view where a view is possible
        return f"aten.{op}.{ov}"
    for name, fn in PY_OPS.items():
        if target is fn:
            return f"operator.{name}"
    raise _Unsupported(f"call to {getattr(target, '__name__', target)} is not an ATen operator")


# calls that read a tensor only for its sizes (and dtype): what they make is no function of its values
_SIZE_READERS = {"sym_size", "sym_numel", "sym_stride", "zeros_like", "ones_like", "empty_like", "full_like",
                 "new_zeros", "new_ones", "new_empty", "new_full"}


def _op_label(n: fx.Node) -> str:
    """An fx call's ATen operator name without namespace and overload ('sym_size')."""
    return getattr(n.target, "_opname", getattr(n.target, "__name__", ""))


def _where(n: fx.Node) -> str:
    """The user's source line of an fx node, for error messages."""
    trace = (n.meta.get("stack_trace") or "").strip().splitlines()
    for i in range(len(trace) - 1, -1, -1):
        line = trace[i].strip()
        if line.startswith("File "):
            code = trace[i + 1].strip() if i + 1 < len(trace) else ""
            return f" ({line}: {code})" if code else f" ({line})"
    return ""


def _short_type(t) -> str:
    return (t if isinstance(t, str) else t.__qualname__).rpartition(".")[2]


_NAME_HOLDER = "engine.interop.onnx.to_torch.NodeName"


def _raw_stack(n: fx.Node) -> list[tuple[str, str, str]]:
    out = []
    for key, val in (n.meta.get("nn_module_stack") or {}).items():
        path, typ = val if isinstance(val, tuple) and len(val) == 2 else ("", "")
        if path and not key.startswith("_empty"):
            out.append((key, path, typ if isinstance(typ, str) else f"{typ.__module__}.{typ.__qualname__}"))
    return out


def _stack(n: fx.Node) -> list[tuple[str, str, str]]:
    """(key, module path, type) from the outside in, without the root module."""
    return [e for e in _raw_stack(n) if e[2] != _NAME_HOLDER]


def _given_name(n: fx.Node) -> str | None:
    """The name the source gave the call (an ONNX node's name), if any."""
    return next((path.rpartition(".")[2] for _, path, typ in _raw_stack(n) if typ == _NAME_HOLDER), None)


@dataclass
class _Region:
    """The calls of one catalog layer's forward (one call of one module)."""
    key: str
    path: str
    module: nn.Module
    kind: str
    params: dict
    members: list[fx.Node] = field(default_factory=list)
    inputs: list[fx.Node] = field(default_factory=list)
    output: fx.Node | None = None


class _Reader:
    def __init__(self, module: nn.Module, ep, batch_sym: str | None, input_names: list[str] | None = None):
        self.module, self.ep = module, ep
        self.gm = ep.graph_module
        self.batch_sym = batch_sym
        self.input_names = input_names
        sig = ep.graph_signature
        self.user_inputs = [n for n in self.gm.graph.nodes if n.op == "placeholder" and n.name in sig.user_inputs]
        self.lifted: dict[str, tuple[str, torch.Tensor]] = {}  # placeholder -> (kind, tensor)
        consts = getattr(ep, "constants", {}) or {}
        for spec in sig.input_specs:
            kind = spec.kind.name
            if kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
                t = spec.target
                if kind == "PARAMETER":
                    val = module.get_parameter(t)
                elif t in consts:
                    val = consts[t]
                else:
                    val = module.get_buffer(t)
                self.lifted[spec.arg.name] = (kind, val)
        self.graph = Graph()
        self._fx_names: frozenset[str] | None = None
        self.taken: set[str] = set()
        self.ids: dict[fx.Node, str] = {}
        self.state: dict[str, torch.Tensor] = {}
        self.owner: dict[int, str] = {}  # id(parameter) -> "node.param" that holds it first
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.pending: list[tuple[str, list[fx.Node]]] = []
        self.dep = self._batch_dependence()
        self.sizes_only = self._sizes_only()
        self.shared = shared_values(self.gm, self.dep, self.lifted, _stack)

    # which values carry the batch
    def _batch_dependence(self) -> set[fx.Node]:
        dep: set[fx.Node] = set(self.user_inputs)
        for n in self.gm.graph.nodes:
            if n.op == "call_function" and any(a in dep for a in n.all_input_nodes):
                dep.add(n)
        return dep

    def _sizes_only(self) -> set[fx.Node]:
        """Values made from the inputs' sizes alone, reading no input's values and no weight:
        a Hugging Face encoder's all-ones attention mask (torch.ones((B, T)), unsqueezed, cast,
        (1 - m) * min). They are folded into the nodes that read them, as sizes are: as nodes
        of their own they were four or five Op nodes per encoder computing a constant."""
        data: set[fx.Node] = set(self.user_inputs)  # values that read an input's values, or a weight
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                if n.name in self.lifted:
                    data.add(n)
            elif n.op == "call_function" and _op_label(n) not in _SIZE_READERS and \
                    any(a in data for a in n.all_input_nodes):
                data.add(n)
        return {n for n in self.dep if n.op == "call_function" and n not in data}

    def proper(self, n: fx.Node) -> bool:
        """A value the diagram can carry on an edge: a tensor whose dim 0 is the batch (and
        not one made from sizes alone, which the node reading it recomputes)."""
        if n not in self.dep or n in self.sizes_only:
            return False
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() == 0:
            return False
        d0 = val.shape[0]
        return str(d0) == self.batch_sym if self.batch_sym else d0 == SAMPLE_BATCH

    # ----- catalog layers -----------------------------------------------------
    def regions(self) -> dict[fx.Node, _Region]:
        """fx node -> the catalog layer call it belongs to (only regions that read
        batch tensors and give one back)."""
        cache: dict[str, tuple[str, dict] | None] = {}

        def catalog(path: str):
            if path not in cache:
                cache[path] = catalog_layer(self.module.get_submodule(path))
            return cache[path]

        found: dict[str, _Region] = {}
        for n in self.gm.graph.nodes:
            if n.op != "call_function":
                continue
            for key, path, _ in _stack(n):
                kp = catalog(path)
                if kp is not None:
                    r = found.setdefault(key, _Region(key, path, self.module.get_submodule(path), kp[0], kp[1]))
                    r.members.append(n)
                    break
        out: dict[fx.Node, _Region] = {}
        for r in found.values():
            mem = set(r.members)
            own = {id(t) for t in (*r.module.parameters(), *r.module.buffers())}
            ok, exits = True, []
            for n in r.members:
                if any(u not in mem for u in n.users):
                    exits.append(n)
                for a in n.all_input_nodes:
                    if a in mem:
                        continue
                    if a.name in self.lifted:
                        ok &= id(self.lifted[a.name][1]) in own
                    elif self.proper(a):
                        if a not in r.inputs:
                            r.inputs.append(a)
                    elif isinstance(a.meta.get("val"), torch.Tensor):
                        ok = False  # reads a tensor the layer cannot be given
            spec = get_layer(r.kind)
            if ok and len(exits) == 1 and self.proper(exits[0]) and \
                    len(r.inputs) == len(spec.input_ports(spec.defaults() | r.params)):
                r.output = exits[0]
                for n in r.members:
                    out[n] = r
        return out

    # ----- generic Op nodes ---------------------------------------------------
    def leaf_regions(self, catalog: dict) -> dict[fx.Node, tuple[str, str, fx.Node, set]]:
        """fx node -> (path, type, output, members) of one call of a leaf module the catalog
        has no layer for (ReLU6, LocalResponseNorm, nn.MultiheadAttention, a LayerNorm2d
        written with permutes): its calls become one Op node, named after the module."""
        groups: dict[str, list[fx.Node]] = {}
        where: dict[str, tuple[str, str]] = {}
        inner: set[str] = set()  # keys that called another module: not leaves
        for n in self.gm.graph.nodes:
            if n.op != "call_function":
                continue
            st = _stack(n)
            inner.update(k for k, _, _ in st[:-1])
            if st and n not in catalog:
                key, path, typ = st[-1]
                groups.setdefault(key, []).append(n)
                where[key] = (path, typ)
        out = {}
        for key, members in groups.items():
            mem = set(members)
            # sizes computed here and read elsewhere are recomputed where they are read
            exits = [m for m in members if any(u not in mem for u in m.users)
                     and isinstance(m.meta.get("val"), torch.Tensor)]
            if key in inner or len(exits) != 1 or not self.proper(exits[0]) or \
                    sum(1 for m in members if m.target is not operator.getitem and "sym_size" not in str(m.target)) < 2:
                continue
            for m in members:
                out[m] = (*where[key], exits[0], mem)
        return out

    def program(self, root: fx.Node, inside: set | frozenset = frozenset()) -> tuple[list, dict, dict, list[fx.Node]]:
        """The Op node that computes `root` (with the calls of `inside`): its calls,
        weights (specs and values) and the diagram values it reads."""
        code: list = []
        weights: dict[str, dict] = {}
        values: dict[str, torch.Tensor] = {}
        inputs: list[fx.Node] = []
        names: dict[fx.Node, str] = {}
        if self._fx_names is None:  # (the fx graph is fixed while it is read: its names once, not once per call)
            self._fx_names = frozenset(n.name for n in self.gm.graph.nodes)
        taken = self._fx_names

        def enc(v):
            if isinstance(v, fx.Node):
                return {"$": emit(v)}
            if isinstance(v, (list, tuple)):
                return [enc(x) for x in v]
            if isinstance(v, torch.dtype):
                return {"dtype": str(v).replace("torch.", "")}
            if isinstance(v, torch.device):
                return {"device": None}
            if isinstance(v, torch.layout):
                return {"layout": str(v).replace("torch.", "")}
            if isinstance(v, torch.memory_format):
                return {"memory_format": str(v).replace("torch.", "")}
            if isinstance(v, float):
                return encode_float(v)
            if v is None or isinstance(v, (bool, int, str)):
                return v
            raise _Unsupported(f"argument {v!r} ({type(v).__name__}) cannot be written to a project file")

        def emit(n: fx.Node) -> str:
            if n in names:
                return names[n]
            if n is not root and n in self.shared:  # computed once, one node: read back without its batch
                inputs.append(n)
                names[n] = f"{n.name}_in{len(inputs) - 1}"
                code.append([names[n], "aten.select.int", [{"$": f"in{len(inputs) - 1}"}, 0, 0], {}])
                return names[n]
            if n is not root and n not in inside and (self.proper(n) or n in self.user_inputs):
                inputs.append(n)
                names[n] = f"in{len(inputs) - 1}"
                return names[n]
            if n.op == "placeholder":
                if n.name not in self.lifted:
                    raise _Unsupported(f"input '{n.name}' is used without its batch dimension")
                kind, t = self.lifted[n.name]
                w = re.sub(r"^(p|b|c)_", "", n.name) or "w"
                while w in taken or w in weights:
                    w += "_"
                weights[w] = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                              "grad": kind == "PARAMETER"}
                values[w] = t
                names[n] = w
                return w
            if n.op != "call_function":
                raise _Unsupported(f"fx op {n.op} '{n.name}'")
            op = _op_name(n.target)
            args = enc(list(n.args))
            kwargs = {k: enc(v) for k, v in n.kwargs.items()}
            code.append([n.name, op, args, kwargs])
            names[n] = n.name
            return n.name

        emit(root)
        code, inputs = _batch_from_first_input(code, inputs)
        return code, weights, values, inputs

    # ----- the diagram --------------------------------------------------------
    def new_id(self, base: str) -> str:
        return make_id(base, self.taken)

    def add(self, kind: str, params: dict, base: str, n: fx.Node, inputs: list[fx.Node], scope_upto: str | None = None):
        nid = self.new_id(base)
        stack = _stack(n)
        if scope_upto is not None:
            stack = stack[: [p for _, p, _ in stack].index(scope_upto) + 1]
        scope = [[p, _short_type(t)] for _, p, t in stack] or None
        self.graph.add_node(kind, params, id=nid)
        self.graph.nodes[nid].scope = scope
        self.ids[n] = nid
        self.pending.append((nid, inputs))
        return nid

    def keep(self, nid: str, name: str, t: torch.Tensor, is_param: bool) -> None:
        """Store a node's tensor; a parameter seen before becomes a tie."""
        key = f"{nid}.{name}"
        self.state[key] = t.detach().clone()
        if is_param:
            first = self.owner.setdefault(id(t), key)
            if first != key:
                self.graph.ties[key] = first

    def read(self) -> None:
        regions = self.regions()
        leaves = self.leaf_regions(regions)
        calls: Counter = Counter()
        for n in self.gm.graph.nodes:
            try:
                if n.op == "placeholder":
                    if n in self.user_inputs:
                        val = n.meta["val"]
                        dtype = str(val.dtype).replace("torch.", "")
                        names = self.input_names or []
                        k = self.user_inputs.index(n)
                        nid = self.new_id(names[k] if k < len(names) else n.name)
                        self.graph.add_node("Input", {"shape": [int(s) for s in val.shape[1:]], "dtype": dtype}, id=nid)
                        self.ids[n] = nid
                    continue
                if n.op == "output":
                    self.outputs(n)
                    continue
                if n in self.shared:
                    self.shared_node(n)
                    continue
                if n.op != "call_function" or not self.proper(n):
                    continue  # folded into the node that reads it
                r = regions.get(n)
                if r is not None:
                    if n is r.output:
                        calls[r.path] += 1
                        nid = self.add(r.kind, dict(r.params), r.path if calls[r.path] == 1 else f"{r.path}_call{calls[r.path]}",
                                       n, r.inputs, scope_upto=r.path)
                        params = dict(r.module.named_parameters())
                        for k, t in r.module.state_dict(keep_vars=True).items():
                            self.keep(nid, k, t, k in params)
                    continue
                if n in leaves:
                    path, typ, out, members = leaves[n]
                    if n is out:
                        self.generic(n, members, label=_short_type(typ), base=path)
                    continue
                self.generic(n)
            except (_Unsupported, OpError) as exc:
                self.problems.append(f"'{n.name}'{_where(n)}: {exc}")
        for path, c in calls.items():
            if c > 1 and any(True for _ in self.module.get_submodule(path).buffers()):
                self.notes.append(f"'{path}' is called {c} times: its parameters are shared; its buffers "
                                  "(running statistics) are kept per call")

    def generic(self, n: fx.Node, inside: set | frozenset = frozenset(), label: str = "",
                base: str | None = None) -> None:
        code, weights, values, inputs = self.program(n, inside)
        if len(code) == 1 and inputs and _is_noop(code[0]):
            self.ids[n] = self.ids[inputs[0]]  # x[:, ...], x.contiguous(): the same value
            return
        val = n.meta.get("val")
        kind, params, keys = None, {}, {}
        if not isinstance(val, torch.Tensor) or val.is_floating_point():
            # (integer values, indices computed from the batch size, stay Op calls: a Scale gives floats)
            kind, params, keys = _catalog_form(code, weights, inputs)
        if kind is None:
            kind, params = "Op", {"inputs": len(inputs), "code": code, "weights": weights}
            keys = {w: w for w in weights}
            if label:
                params["label"] = label
        stack = _stack(n)
        if base is None:
            base = _given_name(n) or (f"{stack[-1][1]}.{n.name}" if stack else n.name)
        nid = self.add(kind, params, base, n, inputs)
        for w, key in keys.items():
            self.keep(nid, key, values[w], weights[w]["grad"])

    def shared_node(self, v: fx.Node) -> None:
        """A value without the batch that several calls read (T5's position bias): one Op
        node that computes it and hands it on expanded over the batch (a view)."""
        code, weights, values, inputs = self.program(v)
        code, inputs = batch_view(code, inputs, v, self.user_inputs[0])
        stack = _stack(v)
        nid = self.add("Op", {"inputs": len(inputs), "code": code, "weights": weights, "label": "computed once"},
                       _given_name(v) or (f"{stack[-1][1]}.{v.name}" if stack else v.name), v, inputs)
        for w in weights:
            self.keep(nid, w, values[w], weights[w]["grad"])

    def outputs(self, n: fx.Node) -> None:
        outs = n.args[0] if isinstance(n.args[0], (tuple, list)) else [n.args[0]]
        for k, o in enumerate(outs):
            if not isinstance(o, fx.Node) or (o not in self.ids and not self.proper(o)):
                val = o.meta.get("val") if isinstance(o, fx.Node) else o
                what = (f"has shape ({', '.join('B' if str(d) == self.batch_sym else str(d) for d in val.shape)})"
                        if isinstance(val, torch.Tensor) else f"is {type(val).__name__}")
                self.problems.append(f"output {k} {what}: a diagram's outputs are tensors with the batch first "
                                     f"(batch {SAMPLE_BATCH} here); return only those from forward")
                continue
            val = o.meta["val"]
            per = tuple(val.shape[1:])
            loss = "cross_entropy" if len(per) == 1 and per[0] > 1 else "mse"
            nid = self.new_id("output" if len(outs) == 1 else f"output{k}")
            self.graph.add_node("Output", {"loss": loss}, id=nid)
            self.pending.append((nid, [o]))

    def wire(self) -> None:
        for nid, inputs in self.pending:
            node = self.graph.nodes[nid]
            ports = get_layer(node.type).input_ports(node.params)
            for port, a in zip(ports, inputs):
                self.graph.add_edge_unchecked(Edge(self.ids[a], "out", nid, port))


def _merge_scales(graph: Graph) -> None:
    """x / 2 - 1 is one Scale: a scalar Scale whose only reader is another takes it in."""
    for nid in list(graph.nodes):
        node = graph.nodes.get(nid)
        if node is None or node.type != "Scale" or node.params.get("shape"):
            continue
        while True:
            outs = graph.outgoing(nid)
            nxt = graph.nodes[outs[0].dst] if len(outs) == 1 else None
            if nxt is None or nxt.type != "Scale" or nxt.params.get("shape") or nxt.scope != node.scope:
                break
            a, b = node.params["scale"], node.params["shift"]
            c, d = nxt.params["scale"], nxt.params["shift"]
            node.params = {"scale": a * c, "shift": b * c + d, "shape": []}
            _, edges = graph.remove_node(nxt.id)
            for e in edges:
                if e.src == nxt.id:
                    graph.add_edge_unchecked(Edge(nid, e.src_port, e.dst, e.dst_port))


_ALIASES = {"aten.clone.default", "aten.contiguous.default", "aten.alias.default", "aten.detach.default",
            "aten.lift_fresh_copy.default"}


def _is_noop(ins: list) -> bool:
    """A call that gives back its input unchanged: a full slice or a copy."""
    _, op, args, kwargs = ins
    if not args or args[0] != {"$": "in0"}:
        return False
    if op in _ALIASES:
        return not {k: v for k, v in kwargs.items() if k != "memory_format"}
    if op == "aten.slice.Tensor":
        dim, start, end, step = (list(args[1:]) + [0, None, None, 1][len(args) - 1:])[:4]
        return dim == 0 and not start and (end is None or end >= _BIG) and step == 1
    return False


def _batch_from_first_input(code: list, inputs: list[fx.Node]) -> tuple[list, list[fx.Node]]:
    """torch.export reads the batch size from the model's input; every diagram value has
    the same batch, so an input read only for its batch size is dropped in favour of in0."""
    if len(inputs) < 2:
        return code, inputs
    reads: dict[str, list[bool]] = {}
    for _, op, args, kwargs in code:
        batch_only = op == "aten.sym_size.int" and len(args) == 2 and args[1] == 0
        for r in _refs(args) + _refs(list(kwargs.values())):
            reads.setdefault(r, []).append(batch_only)
    drop = [i for i in range(1, len(inputs)) if all(reads.get(f"in{i}", [True]))]
    if not drop:
        return code, inputs
    keep = [i for i in range(len(inputs)) if i not in drop]
    rename = {f"in{i}": f"in{k}" for k, i in enumerate(keep)} | {f"in{i}": "in0" for i in drop}

    def sub(v):
        if isinstance(v, list):
            return [sub(x) for x in v]
        if isinstance(v, dict) and "$" in v:
            return {"$": rename.get(v["$"], v["$"])}
        return v
    code = [[o, op, sub(a), {k: sub(x) for k, x in kw.items()}] for o, op, a, kw in code]
    return code, [inputs[i] for i in keep]


# ----- written-out layers read back whole -------------------------------------------
_A = torch.ops.aten


def _scalar_arg(n: fx.Node, target, value: float | None = None) -> fx.Node | None:
    """`n` is target(x, c) (or (c, x) for add/mul) with a Python number c (= value when
    given, to 1e-4): x, else None."""
    if not isinstance(n, fx.Node) or n.op != "call_function" or n.target is not target or len(n.args) != 2 or n.kwargs:
        return None
    for x, c in ((n.args[0], n.args[1]), (n.args[1], n.args[0])):
        if isinstance(x, fx.Node) and isinstance(c, (int, float)) and not isinstance(c, bool):
            if value is None or math.isclose(float(c), value, rel_tol=1e-6):
                return x
        if target not in (_A.add.Tensor, _A.mul.Tensor):
            break  # div and sub are not symmetric
    return None


def _only_user(n: fx.Node) -> fx.Node | None:
    return next(iter(n.users)) if len(n.users) == 1 else None


def _factors(n: fx.Node, depth: int = 2) -> list:
    """The factors of a product of single-use multiplications (x * 0.5 * y -> [x, 0.5, y])."""
    if n.op != "call_function" or n.target is not _A.mul.Tensor or n.kwargs or depth < 0:
        return [n]
    out = []
    for a in n.args:
        if isinstance(a, fx.Node) and a.target is _A.mul.Tensor and len(a.users) == 1:
            out += _factors(a, depth - 1)
        else:
            out.append(a)
    return out


def _replace(g: fx.Graph, root: fx.Node, target, args: tuple, dead: list[fx.Node]) -> None:
    """Put target(*args) in place of `root`; the nodes of `dead` (the pattern) go."""
    with g.inserting_before(root):
        new = g.call_function(target, args)
    new.meta = dict(root.meta)
    root.replace_all_uses_with(new)
    left = [root, *dead]
    while left:  # the pattern's nodes, each once nothing reads it any more
        gone = [d for d in left if not d.users]
        if not gone:
            break
        for d in gone:
            g.erase_node(d)
            left.remove(d)


def _fuse_gelu(g: fx.Graph, erf: fx.Node) -> bool:
    """x * 0.5 * (1 + erf(x / sqrt(2))), in any order -> gelu(x)."""
    scaled = erf.args[0]
    x = _scalar_arg(scaled, _A.div.Tensor, math.sqrt(2)) or _scalar_arg(scaled, _A.mul.Tensor, 1 / math.sqrt(2))
    # (constants to 1e-6: float32's sqrt(2) is within 2e-8; a formula merely near GELU stays itself)
    one = _only_user(erf)
    if x is None or len(scaled.users) != 1 or one is None or _scalar_arg(one, _A.add.Tensor, 1.0) is not erf:
        return False
    root = _only_user(one)
    while root is not None:
        fs = _factors(root)
        rest = [f for f in fs if f is not x and f is not one]
        if len(fs) == 3 and x in fs and one in fs and len(rest) == 1 and isinstance(rest[0], (int, float)) \
                and math.isclose(float(rest[0]), 0.5, rel_tol=1e-6):
            inner = [a for a in root.all_input_nodes if a.target is _A.mul.Tensor and a is not x and a is not one]
            _replace(g, root, _A.gelu.default, (x,), [*inner, one, erf, scaled])
            return True
        root = _only_user(root) if root.target is _A.mul.Tensor else None
    return False


def _fuse_silu(g: fx.Graph, sig: fx.Node) -> bool:
    """x * sigmoid(x) -> silu(x)."""
    x, m = sig.args[0], _only_user(sig)
    if m is None or m.target is not _A.mul.Tensor or m.kwargs or set(m.args) != {x, sig} or len(m.args) != 2:
        return False
    _replace(g, m, _A.silu.default, (x,), [sig])
    return True


def _fuse_rms(g: fx.Graph, mean: fx.Node) -> bool:
    """x * 1/sqrt(mean(x^2, -1, keepdim) + eps) (* w) -> rms_norm(x, [C], w, eps): RMSNorm
    as exporters write it out (Pow, ReduceMean, Add, Sqrt, Reciprocal or Div, Mul)."""
    sq = mean.args[0]
    if mean.target is not _A.mean.dim or len(mean.args) < 3 or mean.args[2] is not True or \
            list(mean.args[1]) not in ([-1],) and not (isinstance(sq, fx.Node) and list(mean.args[1]) == [
                sq.meta["val"].dim() - 1]) or not isinstance(sq, fx.Node) or len(sq.users) != 1:
        return False
    if sq.target is _A.pow.Tensor_Scalar and sq.args[1] == 2:
        x = sq.args[0]
    elif sq.target is _A.mul.Tensor and len(sq.args) == 2 and sq.args[0] is sq.args[1]:
        x = sq.args[0]
    else:
        return False
    add = _only_user(mean)
    if add is None or _scalar_arg(add, _A.add.Tensor) is not mean:
        return False
    eps = float(next(a for a in add.args if not isinstance(a, fx.Node)))
    nxt, chain = _only_user(add), [add, mean, sq]
    if nxt is not None and nxt.target is _A.rsqrt.default:
        inv = nxt
    elif nxt is not None and nxt.target is _A.sqrt.default and _only_user(nxt) is not None and \
            _only_user(nxt).target is _A.reciprocal.default:
        chain.append(nxt)
        inv = _only_user(nxt)
    else:
        return False
    m = _only_user(inv)
    if m is None or m.target is not _A.mul.Tensor or set(m.args) != {x, inv}:
        return False
    c = x.meta["val"].shape[-1]
    w, root = None, m
    wm = _only_user(m)
    if wm is not None and wm.target is _A.mul.Tensor and m in wm.args and len(wm.args) == 2:
        other = wm.args[1] if wm.args[0] is m else wm.args[0]
        if isinstance(other, fx.Node) and other.op == "placeholder" and isinstance(other.meta.get("val"), torch.Tensor) \
                and tuple(other.meta["val"].shape) == (c,):
            w, root = other, wm
    dead = [m, inv, *chain] if root is wm else [inv, *chain]
    _replace(g, root, _A.rms_norm.default, (x, [int(c)], w, eps), dead)
    return True


_CASTS = {_A.to.dtype, _A._to_copy.default, _A.type_as.default}


def _drop_same_dtype_casts(g: fx.Graph) -> None:
    """x.to(torch.float32) of a float32 x, softmax(...).type_as(scores) of equal dtypes:
    calls that give back their input (the program is functional, so no alias matters).
    T5's layer norm and attention have one or two each: kept, each was an Op node, and
    the cast (with the metadata check torch.export records beside it, Llama's RMSNorm)
    hid the RMSNorm pattern from _fuse_rms."""
    for n in list(g.nodes):
        if n.op == "call_function" and n.target is _A._assert_tensor_metadata.default and not n.users:
            g.erase_node(n)  # torch.export's record of what a cast checked: it would hide a value's only user
            continue
        if n.op != "call_function" or n.target not in _CASTS or not isinstance(n.args[0], fx.Node):
            continue
        src, val = n.args[0].meta.get("val"), n.meta.get("val")
        if n.target is _A._to_copy.default and set(n.kwargs) - {"dtype"}:
            continue  # a device, layout or memory format asked for: not only a cast
        if isinstance(src, torch.Tensor) and isinstance(val, torch.Tensor) and src.dtype == val.dtype \
                and src.device == val.device:
            n.replace_all_uses_with(n.args[0])
            g.erase_node(n)


def _fuse(gm: fx.GraphModule) -> None:
    """Read layers that a model (or an ONNX exporter) wrote out op by op as the one call
    they are, so they come in as catalog layers: GELU, SiLU, RMSNorm. The import's final
    check (the diagram equals the source) covers these rewrites too."""
    _drop_same_dtype_casts(gm.graph)
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or getattr(n, "_erased", False):
            continue
        try:
            if n.target is _A.erf.default:
                _fuse_gelu(gm.graph, n)
            elif n.target is _A.sigmoid.default:
                _fuse_silu(gm.graph, n)
            elif n.target is _A.mean.dim:
                _fuse_rms(gm.graph, n)
        except (KeyError, AttributeError, IndexError, TypeError):
            continue  # not the pattern (a value without meta, an odd signature)


# ----- plain calls that read as catalog layers ------------------------------------
_ACTS = {"aten.relu.default": "ReLU", "aten.sigmoid.default": "Sigmoid", "aten.tanh.default": "Tanh",
         "aten.silu.default": "SiLU"}
_BIG = 2 ** 62


def _weighted_form(code: list, weights: dict, inputs: list[fx.Node]) -> tuple[str | None, dict, dict]:
    """A functional call with learned weights that a catalog layer is (F.layer_norm,
    F.embedding, an RMSNorm read whole): (type, params, weight name -> layer's key)."""
    if len(code) != 1 or len(inputs) != 1 or not all(w["grad"] for w in weights.values()):
        return None, {}, {}
    _, op, args, kwargs = code[0]
    ref = lambda v: v.get("$") if isinstance(v, dict) else None  # noqa: E731
    shape = lambda w: weights[w]["shape"] if w in weights else None  # noqa: E731
    if kwargs:
        return None, {}, {}
    if op == "aten.embedding.default" and len(args) == 2 and ref(args[1]) == "in0" and len(shape(ref(args[0])) or []) == 2:
        n, d = shape(ref(args[0]))
        return "Embedding", {"num_embeddings": n, "embedding_dim": d}, {ref(args[0]): "weight"}
    if op in ("aten.layer_norm.default", "aten.rms_norm.default") and args and ref(args[0]) == "in0" \
            and isinstance(args[1], list) and len(args[1]) == 1:
        c = args[1][0]
        at = lambda i, default=None: args[i] if len(args) > i else default  # noqa: E731
        layer = op == "aten.layer_norm.default"
        w, b = ref(at(2)), ref(at(3)) if layer else None
        eps = at(4, 1e-5) if layer else at(3)
        if eps is None and not layer:
            eps = torch.finfo(torch.float32).eps  # torch's default for float32
        eps = eps if isinstance(eps, (int, float)) and not isinstance(eps, bool) else None
        if eps is None or (w is not None and shape(w) != [c]) or (b is not None and shape(b) != [c]):
            return None, {}, {}
        if op == "aten.layer_norm.default":
            if (w is None) != (b is None):
                return None, {}, {}  # the catalog's LayerNorm has both or neither
            keys = {w: "weight", b: "bias"} if w else {}
            return "LayerNorm", {"normalized_shape": c, "eps": float(eps), "elementwise_affine": w is not None}, keys
        return "RMSNorm", {"normalized_shape": c, "eps": float(eps), "elementwise_affine": w is not None}, \
            ({w: "weight"} if w else {})
    return None, {}, {}


def _catalog_form(code: list, weights: dict, inputs: list[fx.Node]) -> tuple[str | None, dict, dict]:
    """A program that a catalog layer expresses (friendlier to read and to place: Add
    and Mul join the tensor-parallel regions, Reshape keeps the batch): (type, params,
    weight name -> the layer's state key); type None when none does."""
    if weights:
        return _weighted_form(code, weights, inputs)
    kind, params = _plain_form(code, inputs)
    return kind, params, {}


def _plain_form(code: list, inputs: list[fx.Node]) -> tuple[str | None, dict]:
    main = code[-1]
    _, op, args, kwargs = main
    ins = [{"$": f"in{i}"} for i in range(len(inputs))]
    shapes = [tuple(a.meta["val"].shape) for a in inputs]
    if len(code) == 1:
        if op in _ACTS and args == ins[:1] and not kwargs:
            return _ACTS[op], {}
        if op == "aten.gelu.default" and args == ins[:1]:
            return "GELU", {"approximate": kwargs.get("approximate", "none")}
        if op in ("aten.add.Tensor", "aten.mul.Tensor") and args == ins and len(ins) == 2 and not kwargs \
                and shapes[0] == shapes[1]:
            return ("Add" if op.startswith("aten.add") else "Mul"), {}
        if op == "aten.matmul.default" and args == ins and len(ins) == 2 and len(shapes[0]) == len(shapes[1]) >= 3:
            return "MatMul", {}
        if op == "aten.cat.default" and args[:1] == [ins] and len(ins) >= 2 and len(ins) <= 8:
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if isinstance(dim, int) and dim % len(shapes[0]) != 0:
                return "Concat", {"num_inputs": len(ins), "dim": dim}
        if len(args) >= 1 and args[0] == ins[0] if ins else False:
            rest = args[1:]
            if op == "aten.flatten.using_ints" and 1 <= len(rest) <= 2 and rest[0] >= 1:
                return "Flatten", {"start_dim": rest[0], "end_dim": rest[1] if len(rest) == 2 else -1}
            if op == "aten.dropout.default" and len(rest) == 2:
                return "Dropout", {"p": float(rest[0])}
            if op == "aten.softmax.int" and len(rest) >= 1 and isinstance(rest[0], int) and rest[0] % len(shapes[0]):
                return "Softmax", {"dim": rest[0]}
            if op == "aten.transpose.int" and len(rest) == 2 and all(d % len(shapes[0]) for d in rest):
                return "Transpose", {"dim0": rest[0], "dim1": rest[1]}
            if op == "aten.mean.dim" and len(rest) >= 1 and isinstance(rest[0], list) and len(rest[0]) == 1 \
                    and rest[0][0] % len(shapes[0]) and not kwargs.get("dtype"):
                return "Mean", {"dim": rest[0][0], "keepdim": bool(rest[1]) if len(rest) > 1 else False}
            if op == "aten.slice.Tensor" and len(rest) >= 1 and isinstance(rest[0], int) and rest[0] % len(shapes[0]):
                start, end, step = (list(rest[1:]) + [0, None, 1][len(rest) - 1:])[:3]
                if all(v is None or isinstance(v, int) for v in (start, end, step)):
                    end = None if end is not None and end >= _BIG else end
                    return "Slice", {"dim": rest[0], "start": start or 0, "end": end, "step": step or 1}
            if op == "aten.adaptive_avg_pool2d.default" and len(rest) == 1 and rest[0] in ([1, 1], 1):
                return "AdaptiveAvgPool2d", {"output_size": 1}
            if op == "aten.mean.dim" and len(shapes[0]) == 4 and len(rest) == 2 and rest[1] is True and \
                    isinstance(rest[0], list) and sorted(d % 4 for d in rest[0]) == [2, 3] and not kwargs:
                return "AdaptiveAvgPool2d", {"output_size": 1}  # global average pooling written as a mean
            if op == "aten.permute.default" and len(rest) == 1 and isinstance(rest[0], list):
                perm = [d % len(shapes[0]) for d in rest[0]]
                moved = [i for i, d in enumerate(perm) if d != i]
                if len(moved) == 2 and 0 not in moved and perm[moved[0]] == moved[1]:
                    return "Transpose", {"dim0": moved[0], "dim1": moved[1]}
            if op in ("aten.mul.Tensor", "aten.add.Tensor", "aten.sub.Tensor", "aten.div.Tensor") and len(rest) == 1 \
                    and isinstance(rest[0], (int, float)) and not isinstance(rest[0], bool) and not kwargs:
                c = float(rest[0])
                scale, shift = {"mul": (c, 0.0), "add": (1.0, c), "sub": (1.0, -c),
                                "div": (1.0 / c if c else math.nan, 0.0)}[op.split(".")[1]]
                if not math.isnan(scale):
                    return "Scale", {"scale": scale, "shift": shift, "shape": []}
            if op == "aten.rsub.Scalar" and len(rest) == 1 and isinstance(rest[0], (int, float)) and not kwargs:
                return "Scale", {"scale": -1.0, "shift": float(rest[0]), "shape": []}
    if op in ("aten.view.default", "aten.reshape.default") and len(code) == 1 and len(ins) == 1 and \
            args[0] == ins[0] and isinstance(args[1], list) and len(args[1]) >= 2 and args[1][0] == -1 and \
            all(isinstance(v, int) and v > 0 for v in args[1][1:]) and \
            math.prod(args[1][1:]) == math.prod(int(d) for d in shapes[0][1:]):
        return "Reshape", {"shape": list(args[1][1:])}  # x.reshape(-1, C): the batch is what is left
    # x.view(x.size(0), ...) / x.reshape(B, ...) / x.flatten(1) after folding: Reshape
    if op in ("aten.view.default", "aten.reshape.default") and len(ins) == 1 and args[0] == ins[0] and \
            isinstance(args[1], list) and args[1] and all(isinstance(v, int) for v in args[1][1:]):
        first = args[1][0]
        sym = [c for c in code[:-1] if c[0] == (first.get("$") if isinstance(first, dict) else None)]
        if sym and sym[0][1] == "aten.sym_size.int" and sym[0][2] == [ins[0], 0] and len(code) == 2:
            return "Reshape", {"shape": list(args[1][1:])}
    return None, {}


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
