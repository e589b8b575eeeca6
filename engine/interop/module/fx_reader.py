"""Reading torch.export's graph back as a diagram: _Reader walks the fx graph of the
exported program, makes catalog nodes of catalog layers' calls and of plain calls that
are one (forms.py), Op nodes of the rest, keeps each parameter once (ties), and wires
them (engine/interop/module/importer.py runs it)."""
from __future__ import annotations

import operator
import re
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import fx, nn

from engine.diagram.catalog import get_layer
from engine.diagram.graph import Edge, Graph
from engine.interop.common import make_id
from engine.interop.module.catalog_read import _Unsupported, catalog_layer
from engine.interop.module.forms import _BIG, _catalog_form
from engine.interop.module.samples import SAMPLE_BATCH
from engine.interop.module.shared import batch_view, shared_values
from engine.runtime.ops import PY_OPS, OpError, encode_float
from engine.runtime.ops import refs as _refs


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
