"""torch.nn layers the catalog has, read as catalog nodes: a module instance -> (layer type,
parameters), from its constructor's arguments as the module holds them (engine/interop/module/importer.py)."""
from __future__ import annotations

import torch
from torch import nn

from engine.diagram.catalog import FieldError, get_layer
from engine.runtime import layers as rl


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
