"""The generic op node: any ATen computation the catalog has no layer for.

A node of type "Op" holds a short program of ATen calls (what torch.export records
for `x.permute(0, 2, 3, 1)`, `x[:, 0]`, `F.adaptive_avg_pool2d(x, 1)`, a class token
expanded to the batch...) and the tensors it owns (a class token, a layer-scale
gamma, positional embeddings). It is an nn.Module like every catalog layer, so
shapes, FLOPs, pipeline cuts, checkpoints and exports treat it the same way.

This file runs on cluster nodes: torch and the standard library only.

params = {
  "inputs": 2,                                   # input ports in0, in1, ...
  "code": [["t", "aten.permute.default", [{"$": "in0"}, [0, 2, 1]], {}],
           ["y", "aten.add.Tensor", [{"$": "t"}, {"$": "gamma"}], {}]],   # the last result is the output
  "weights": {"gamma": {"shape": [16], "dtype": "float32", "grad": true}},
}
Arguments are JSON: {"$": name} names an input, a weight or an earlier result;
{"dtype": "int64"}, {"device": null} (the device the node runs on), {"layout": ...},
{"memory_format": ...} and {"float": "inf"} stand for the torch values JSON lacks.

Only ATen operators (torch.ops.aten) and Python's arithmetic on sizes can be named,
so a project file cannot make an Op node import or call anything else.
"""
from __future__ import annotations

import functools
import math
import operator
import re
from typing import Any

import torch
from torch import nn

# Python operators that torch.export records on sizes and tuples (x.size(0) * 4, out[0]).
PY_OPS = {name: getattr(operator, name) for name in
          ("getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "neg", "pow", "eq", "ne", "lt", "le", "gt", "ge")}
# ATen operators that touch anything but tensors (files) are refused by name.
DENIED_ATEN = {"from_file", "_from_file"}
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DTYPES = {str(d).replace("torch.", ""): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
_LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo}
_FORMATS = {"contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
            "preserve_format": torch.preserve_format}


# What one Op node may cost, so a small project file cannot ask for unbounded work (a
# size raised to a size's power, a list of 10^8 tensors, a 10^12-value tensor): each
# limit is far beyond what a model's shape arithmetic needs, and the refusal names it.
MAX_SIZE = 2 ** 63  # a size, or any integer the size arithmetic makes: what int64 holds
MAX_ITEMS = 4096  # items in a list or text the size arithmetic makes, tensors one call returns
MAX_VALUES = 2 ** 32  # values in a weight, or in a tensor a call makes while shapes are inferred (meta)
MAX_DEPTH = 16  # nesting of an argument's lists


class OpError(ValueError):
    """A program that cannot run: the message names the instruction."""


def resolve_op(name: str) -> Any:
    """'aten.permute.default' -> torch.ops.aten.permute.default; 'operator.mul' -> operator.mul.
    Nothing outside these two namespaces can be named."""
    if not isinstance(name, str):
        raise OpError(f"operator {name!r} is not text")
    ns, _, rest = name.partition(".")
    if ns == "operator" and rest in PY_OPS:
        return PY_OPS[rest]
    if ns != "aten" or not rest:
        raise OpError(f"'{name}' is not an ATen operator (aten.NAME.OVERLOAD) or a size operator "
                      f"(operator.{'/'.join(PY_OPS)})")
    op, _, overload = rest.partition(".")
    if op in DENIED_ATEN or not _NAME_RE.match(op) or (overload and not _NAME_RE.match(overload)):
        raise OpError(f"'{name}' is not an operator an Op node may call")
    try:
        return getattr(getattr(torch.ops.aten, op), overload or "default")
    except (AttributeError, RuntimeError):
        raise OpError(f"'{name}': torch {torch.__version__} has no such ATen operator") from None


def decode(v: Any, env: dict, device: torch.device | None) -> Any:
    """A JSON argument as the value the operator takes."""
    if isinstance(v, list):
        return [decode(x, env, device) for x in v]
    if isinstance(v, dict):
        if "$" in v:
            return env[v["$"]]
        if "dtype" in v:
            return _DTYPES[v["dtype"]]
        if "device" in v:
            return device
        if "layout" in v:
            return _LAYOUTS[v["layout"]]
        if "memory_format" in v:
            return _FORMATS[v["memory_format"]]
        if "float" in v:
            return float(v["float"])
        raise OpError(f"argument {v!r} is not a reference or a torch value")
    return v


def refs(v: Any) -> list[str]:
    """Names an argument reads."""
    if isinstance(v, list):
        return [r for x in v for r in refs(x)]
    if isinstance(v, dict) and "$" in v:
        return [v["$"]]
    return []


def check_program(params: dict) -> None:
    """Every operator is allowed, every name is defined before it is read; raises OpError."""
    n_in, code, weights = params.get("inputs", 1), params.get("code"), params.get("weights") or {}
    if not isinstance(code, list) or not code:
        raise OpError("code is empty: an Op node needs at least one call")
    if not isinstance(weights, dict):
        raise OpError("weights must map names to {shape, dtype, grad}")
    known = {f"in{i}" for i in range(n_in)}
    for w, d in weights.items():
        if not isinstance(w, str) or not _NAME_RE.match(w) or w in known:
            raise OpError(f"weight name {w!r} is not an identifier (or clashes with an input)")
        if not isinstance(d, dict) or not isinstance(d.get("shape"), list) or d.get("dtype", "float32") not in _DTYPES:
            raise OpError(f"weight '{w}' needs a shape (a list) and a torch dtype")
        shape = d["shape"]
        if len(shape) > MAX_DEPTH or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in shape):
            raise OpError(f"weight '{w}' has shape {_clip(shape)}: give at most {MAX_DEPTH} sizes, each 0 or more")
        if math.prod(shape) > MAX_VALUES:
            raise OpError(f"weight '{w}' has shape {shape}: {math.prod(shape):.3g} values; at most {MAX_VALUES:.3g} "
                          "in one tensor of an Op node")
        known.add(w)
    for i, ins in enumerate(code):
        if not isinstance(ins, list) or len(ins) != 4 or not isinstance(ins[2], list) or not isinstance(ins[3], dict):
            raise OpError(f"call {i + 1} must be [result, operator, args, kwargs]")
        out, op, args, kwargs = ins
        if _depth([args, list(kwargs.values())]) > MAX_DEPTH + 2:
            raise OpError(f"call {i + 1} ({_clip(op)}): arguments nested more than {MAX_DEPTH} lists deep")
        resolve_op(op)
        for r in refs(args) + refs(list(kwargs.values())):
            if r not in known:
                raise OpError(f"call {i + 1} ({op}) reads '{r}' before it is defined")
        if not isinstance(out, str) or not _NAME_RE.match(out) or out in known:
            raise OpError(f"call {i + 1} ({op}) names its result {out!r}: not a new identifier")
        known.add(out)


def _depth(v: Any) -> int:
    """How deep lists (and dicts) nest in v, without recursion (a file may nest them 10^5 deep)."""
    deepest, stack = 0, [(v, 0)]
    while stack:
        x, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH + 2:
            break
        if isinstance(x, list):
            stack.extend((y, d + 1) for y in x)
        elif isinstance(x, dict):
            stack.extend((y, d + 1) for y in x.values())
    return deepest


def _clip(v: Any, most: int = 60) -> str:
    text = repr(v)
    return text if len(text) <= most else text[:most] + "..."


def _bounded_py(i: int, name: str, fn: Any, *args: Any) -> Any:
    """A Python operator on sizes, refused before it would make an integer past MAX_SIZE
    or a sequence past MAX_ITEMS (10^8 ** 10^8 has 2.7e9 bits: minutes of CPU)."""
    def refuse(why: str):
        raise OpError(f"call {i + 1} (operator.{name}): {why}")

    if name == "pow" and len(args) == 2 and all(isinstance(a, int) for a in args):
        base, exp = args
        if exp > 0 and abs(base) > 1 and exp * (abs(base).bit_length() - 1) >= 64:
            refuse(f"{_clip(base, 20)} ** {_clip(exp, 20)} is past {MAX_SIZE:.3g} (sizes are int64)")
    if name == "mul" and len(args) == 2:
        seq, n = (args[0], args[1]) if isinstance(args[1], int) else (args[1], args[0])
        if isinstance(seq, (list, tuple, str)) and isinstance(n, int) and len(seq) * n > MAX_ITEMS:
            refuse(f"repeats {len(seq)} item(s) {_clip(n, 20)} times; at most {MAX_ITEMS} items")
    out = fn(*args)
    if isinstance(out, int) and abs(out) >= MAX_SIZE:
        refuse(f"gives {_clip(out, 20)}, past {MAX_SIZE:.3g} (sizes are int64)")
    if isinstance(out, (list, tuple, str)) and len(out) > MAX_ITEMS:
        refuse(f"gives {len(out)} items; at most {MAX_ITEMS}")
    return out


# ATen calls that return one tensor per slice: how many, before they are made
_SPLITS = {"unbind": lambda t, dim=0: t.shape[dim],
           "split": lambda t, size, dim=0: -(-t.shape[dim] // size) if isinstance(size, int) and size > 0 else 0,
           "unsafe_split": lambda t, size, dim=0: -(-t.shape[dim] // size) if isinstance(size, int) and size > 0 else 0,
           "chunk": lambda t, chunks, dim=0: chunks if isinstance(chunks, int) else 0,
           "tensor_split": lambda t, sections, dim=0: sections if isinstance(sections, int) else len(sections) + 1}


def _bounded_split(i: int, op: str, count: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """An ATen call that returns one tensor per slice, refused before it makes more than MAX_ITEMS."""
    if args and isinstance(args[0], torch.Tensor):
        try:
            n = count(*args, **kwargs)
        except (TypeError, IndexError, ValueError, ZeroDivisionError):
            n = 0  # the operator itself will say what is wrong
        if isinstance(n, int) and n > MAX_ITEMS:  # (a symbolic size while exporting is no guard of ours)
            raise OpError(f"call {i + 1} ({op}): makes {n:,} tensors; at most {MAX_ITEMS} from one call")
    return fn(*args, **kwargs)


def _guarded(i: int, op: str, fn: Any) -> Any:
    """The callable instruction i runs: `fn` itself for most ATen operators (no cost on the
    training path), `fn` behind its bound for size arithmetic and the splitting calls."""
    if op.startswith("operator."):  # (getitem, comparisons, division, neg make nothing larger than they read)
        return functools.partial(_bounded_py, i, op[9:], fn) if op[9:] in ("add", "sub", "mul", "pow") else fn
    base = op.split(".")[1]
    if base in _SPLITS:
        return functools.partial(_bounded_split, i, op, _SPLITS[base], fn)
    return fn


def _check_meta(i: int, op: str, out: Any) -> None:
    """On the meta device (while shapes are inferred) no call makes a tensor of more than
    MAX_VALUES values: the real run would try to allocate it."""
    for t in (out if isinstance(out, (list, tuple)) else (out,)):
        if isinstance(t, torch.Tensor) and t.numel() > MAX_VALUES:
            raise OpError(f"call {i + 1} ({op}): makes a tensor of shape {list(t.shape)} ({t.numel():.3g} values); "
                          f"at most {MAX_VALUES:.3g} in one tensor of an Op node")


def _fmt_arg(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(map(_fmt_arg, v)) + "]"
    if isinstance(v, dict):
        if "$" in v:
            return v["$"]
        k, val = next(iter(v.items()))
        return f"torch.{val}" if k in ("dtype", "layout", "memory_format") and val else \
            ("<device>" if k == "device" else str(val))
    return repr(v)


def describe(params: dict) -> str:
    """The program as one short line of calls, e.g. 'permute(in0, [0, 2, 1])', or its
    label (the module it came from) and how many calls it makes."""
    if params.get("label"):
        n = sum(1 for c in params.get("code") or [] if not (c[1].startswith("aten.sym_size") or c[1] == "operator.getitem"))
        return f"{params['label']} ({n} call{'s' if n != 1 else ''})"
    parts = []
    for out, op, args, kwargs in params.get("code") or []:
        name = op.split(".")[1] if op.count(".") >= 1 else op
        if op.startswith("aten.sym_size") or op == "operator.getitem":
            continue
        a = [_fmt_arg(x) for x in args] + [f"{k}={_fmt_arg(v)}" for k, v in kwargs.items()]
        parts.append(f"{name}({', '.join(a)})")
    return "; ".join(parts) or "op"


class AtenOp(nn.Module):
    """Runs an Op node's program (see the module docstring)."""

    def __init__(self, inputs: int = 1, code: list | None = None, weights: dict | None = None, **_: Any):
        super().__init__()
        params = {"inputs": inputs, "code": code or [], "weights": weights or {}}
        check_program(params)
        self.n_inputs, self.code = int(inputs), [list(c) for c in params["code"]]
        self._ops = [resolve_op(c[1]) for c in self.code]
        self._calls = [_guarded(i, c[1], fn) for i, (c, fn) in enumerate(zip(self.code, self._ops))]
        for name, d in params["weights"].items():
            dtype = _DTYPES[d.get("dtype", "float32")]
            t = torch.empty(tuple(d["shape"]), dtype=dtype)
            if dtype.is_floating_point and t.device.type != "meta":
                nn.init.trunc_normal_(t, std=0.02)  # the importer loads the real values
            elif t.device.type != "meta":
                t.zero_()
            if d.get("grad", True) and dtype.is_floating_point:
                self.register_parameter(name, nn.Parameter(t))
            else:
                self.register_buffer(name, t)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        env: dict[str, Any] = {f"in{i}": x for i, x in enumerate(xs)}
        env.update(self.named_parameters(recurse=False))
        env.update(self.named_buffers(recurse=False))
        device = xs[0].device if xs else next(iter(env.values())).device
        meta = device.type == "meta"
        for i, ((out, op, args, kwargs), fn) in enumerate(zip(self.code, self._calls)):
            env[out] = v = fn(*decode(args, env, device), **{k: decode(x, env, device) for k, x in kwargs.items()})
            if meta:
                _check_meta(i, op, v)
        return env[self.code[-1][0]]

    def extra_repr(self) -> str:
        return describe({"code": self.code})


def encode_float(x: float) -> Any:
    return {"float": repr(x)} if math.isinf(x) or math.isnan(x) else x
