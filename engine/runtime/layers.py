"""torch modules for each layer type, built from *resolved* parameters.

This file runs on cluster nodes: torch, numpy and the standard library only.
engine/diagram/catalog.py declares the parameters (docs, ranges, inference); here we only
turn a complete parameter dict into an nn.Module.
"""
from __future__ import annotations

import importlib
import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
import torch.nn.functional as F

from .ops import AtenOp


class Reshape(nn.Module):
    """Reshape every sample; the batch dimension is kept."""

    def __init__(self, shape: list[int]):
        super().__init__()
        self.shape = tuple(int(s) for s in shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)

    def extra_repr(self) -> str:
        return f"shape={self.shape}"


class Mean(nn.Module):
    """Mean over one dimension (dim counts the batch as 0), e.g. pooling over tokens."""

    def __init__(self, dim: int = 1, keepdim: bool = False):
        super().__init__()
        self.dim, self.keepdim = int(dim), bool(keepdim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=self.dim, keepdim=self.keepdim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, keepdim={self.keepdim}"


class Transpose(nn.Module):
    """Swaps two dimensions (counted with the batch as 0)."""

    def __init__(self, dim0: int = 1, dim1: int = 2):
        super().__init__()
        self.dim0, self.dim1 = int(dim0), int(dim1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(self.dim0, self.dim1)

    def extra_repr(self) -> str:
        return f"dim0={self.dim0}, dim1={self.dim1}"


class Slice(nn.Module):
    """x[:, ..., start:end:step] along one dimension (counted with the batch as 0)."""

    def __init__(self, dim: int = 1, start: int = 0, end: int | None = None, step: int = 1):
        super().__init__()
        self.dim, self.start, self.end, self.step = int(dim), int(start), end, int(step)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = [slice(None)] * x.dim()
        index[self.dim] = slice(self.start, self.end, self.step)
        return x[tuple(index)]

    def extra_repr(self) -> str:
        return f"dim={self.dim}, start={self.start}, end={self.end}, step={self.step}"


class Scale(nn.Module):
    """x * scale + shift by constants: two numbers, or (with a shape) two tensors that
    broadcast over each sample, kept as buffers so the weights file carries them."""

    def __init__(self, scale: float = 1.0, shift: float = 0.0, shape: tuple[int, ...] = ()):
        super().__init__()
        if shape:
            self.register_buffer("scale", torch.full(tuple(shape), float(scale)))
            self.register_buffer("shift", torch.full(tuple(shape), float(shift)))
        else:
            self.scale, self.shift = float(scale), float(shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


class PositionalEmbedding(nn.Module):
    """Learned positions added to a (B, T, C) input."""

    def __init__(self, max_len: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(max_len, dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        return x + self.weight[: x.shape[1]]


class SelfAttention(nn.Module):
    """Multi-head self-attention on (B, T, C): q, k and v all come from the input.

    Written with explicit q/k/v/out Linear layers (not nn.MultiheadAttention) so
    that tensor parallelism can shard the heads: q/k/v column-wise, out row-wise.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True, causal: bool = False):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.causal = causal
        self.q = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # (B, T, H*D) -> (B, H, T, D); -1 for H so a TP shard with fewer local heads works
        q = self.q(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal
        )
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, H*D)
        return self.out(y)


def import_object(path: str) -> Any:
    """'pkg.mod:Name' -> the object. Raises ImportError/AttributeError with the path."""
    if ":" not in path:
        raise ImportError(f"'{path}' is not of the form 'package.module:Class'")
    mod_name, _, attr = path.partition(":")
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _custom(p: dict) -> nn.Module:
    cls = import_object(p["path"])
    m = cls(**(p.get("kwargs") or {}))
    if not isinstance(m, nn.Module):
        raise TypeError(f"{p['path']} built a {type(m).__name__}, not an nn.Module")
    return m


def _hw(v: int | list[int]) -> int | tuple[int, int]:
    """A size that is one int or [h, w] (project files hold lists) as torch takes it."""
    return tuple(v) if isinstance(v, list) else v


@dataclass(frozen=True)
class Ctor:
    """How a layer type's module is made: `cls(*args, **kwargs)` with the values of the
    node's parameters of those names (`out=param` where the keyword differs, `fixed` for
    constants). One declaration gives the module (build), the line the exported script
    writes (code) and what the module importer reads back from a torch module of this
    class (engine/interop/module/catalog_read.py): a new layer type is one line here and one
    LayerSpec in engine/diagram/catalog.py (that one is not shipped to cluster nodes)."""

    cls: type
    args: tuple[str, ...] = ()
    kwargs: tuple[str, ...] = ()  # "stride" (param of the same name) or "dim=dim_param"
    fixed: tuple[tuple[str, Any], ...] = ()  # keywords the catalog always passes (batch_first=True)
    defaults: tuple[tuple[str, str], ...] = ()  # (param, param whose value it takes when None): pool stride

    def values(self, p: dict) -> tuple[list, dict]:
        p = dict(p)
        for k, other in self.defaults:
            if p.get(k) is None:
                p[k] = p[other]
        args = [_hw(p[a]) for a in self.args]
        kw = {}
        for spec in self.kwargs:
            key, _, param = spec.partition("=")
            kw[key] = _hw(p[param or key])
        return args, {**kw, **dict(self.fixed)}

    def build(self, p: dict) -> nn.Module:
        args, kw = self.values(p)
        return self.cls(*args, **kw)

    def code(self, p: dict) -> str:
        """The constructor call as source code: nn.Linear(64, 10, bias=True)."""
        args, kw = self.values(p)
        import inspect

        defaults = [q.default for q in list(inspect.signature(self.cls.__init__).parameters.values())[1:len(args) + 1]]
        while args and len(defaults) == len(args) and defaults[-1] in ((), None) and defaults[-1] == args[-1]:
            args.pop()  # a trailing empty argument: Scale(0.25, 0.0), not Scale(0.25, 0.0, ())
            defaults.pop()
        name = f"nn.{self.cls.__name__}" if self.cls.__module__.startswith("torch.nn") else self.cls.__name__
        return f"{name}({', '.join([*map(repr, args), *(f'{k}={v!r}' for k, v in kw.items())])})"

    @property
    def own(self) -> bool:
        """A class of this file (the exported script carries its source)."""
        return self.cls.__module__ == __name__


def _conv(cls: type) -> Ctor:
    return Ctor(cls, ("in_channels", "out_channels", "kernel_size"),
                ("stride", "padding", "dilation", "groups", "bias"))


def _pool(cls: type) -> Ctor:
    return Ctor(cls, ("kernel_size",), ("stride", "padding"), defaults=(("stride", "kernel_size"),))


def _bn(cls: type) -> Ctor:
    return Ctor(cls, ("num_features",), ("eps", "momentum"))


def _norm(cls: type) -> Ctor:
    return Ctor(cls, ("normalized_shape",), ("eps", "elementwise_affine"))


# type -> how its module is made (from the node's resolved parameters)
CTORS: dict[str, Ctor] = {
    "Linear": Ctor(nn.Linear, ("in_features", "out_features"), ("bias",)),
    "Conv1d": _conv(nn.Conv1d), "Conv2d": _conv(nn.Conv2d),
    "MaxPool2d": _pool(nn.MaxPool2d), "AvgPool2d": _pool(nn.AvgPool2d),
    "AdaptiveAvgPool2d": Ctor(nn.AdaptiveAvgPool2d, ("output_size",)),
    "BatchNorm1d": _bn(nn.BatchNorm1d), "BatchNorm2d": _bn(nn.BatchNorm2d),
    "LayerNorm": _norm(nn.LayerNorm), "RMSNorm": _norm(nn.RMSNorm),
    "Dropout": Ctor(nn.Dropout, ("p",)),
    "ReLU": Ctor(nn.ReLU), "SiLU": Ctor(nn.SiLU), "Tanh": Ctor(nn.Tanh), "Sigmoid": Ctor(nn.Sigmoid),
    "Identity": Ctor(nn.Identity),
    "GELU": Ctor(nn.GELU, (), ("approximate",)),
    "Softmax": Ctor(nn.Softmax, (), ("dim",)),
    "Flatten": Ctor(nn.Flatten, ("start_dim", "end_dim")),
    "Embedding": Ctor(nn.Embedding, ("num_embeddings", "embedding_dim")),
    "TransformerEncoderLayer": Ctor(nn.TransformerEncoderLayer, ("d_model", "nhead"),
                                    ("dim_feedforward", "dropout", "activation", "norm_first"),
                                    fixed=(("batch_first", True),)),
    "Reshape": Ctor(Reshape, ("shape",)),
    "Mean": Ctor(Mean, ("dim", "keepdim")),
    "Transpose": Ctor(Transpose, ("dim0", "dim1")),
    "Slice": Ctor(Slice, ("dim", "start", "end", "step")),
    "Scale": Ctor(Scale, ("scale", "shift", "shape")),
    "PositionalEmbedding": Ctor(PositionalEmbedding, ("max_len", "dim")),
    "MultiheadAttention": Ctor(SelfAttention, ("embed_dim", "num_heads"), ("dropout", "bias", "causal")),
}

# type -> callable(resolved params) -> nn.Module
MODULE_BUILDERS: dict[str, Callable[[dict], nn.Module]] = {
    **{t: c.build for t, c in CTORS.items()},
    "Custom": _custom,
    "Op": lambda p: AtenOp(p["inputs"], p["code"], p["weights"]),
}


def _concat(*xs: torch.Tensor, dim: int = 1) -> torch.Tensor:
    return torch.cat(xs, dim=dim)


# type -> (function, kwargs from params) for layers that hold no state; they
# become call_function nodes in the fx graph, so generated code reads `a + b`.
FUNCTION_LAYERS: dict[str, Callable[[dict], tuple[Callable, dict]]] = {
    "Add": lambda p: (operator.add, {}),
    "Mul": lambda p: (operator.mul, {}),
    "MatMul": lambda p: (operator.matmul, {}),
    "Concat": lambda p: (torch.cat, {"dim": p["dim"]}),
}


def build_layer(node_type: str, params: dict) -> nn.Module:
    try:
        builder = MODULE_BUILDERS[node_type]
    except KeyError:
        raise KeyError(f"no module builder for layer type '{node_type}'") from None
    return builder(params)
