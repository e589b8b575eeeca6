"""Written-out layers read back whole: torch.export records GELU, SiLU and RMSNorm as their
elementwise calls; these passes put the one call back in the fx graph before it is read
(engine/interop/module/importer.py), and drop casts to the dtype a value already has."""
from __future__ import annotations

import math

import torch
from torch import fx

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
