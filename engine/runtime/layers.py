"""torch modules for each layer type, built from *resolved* parameters.

This file runs on cluster nodes: torch, numpy and the standard library only.
engine/layers.py declares the parameters (docs, ranges, inference); here we only
turn a complete parameter dict into an nn.Module.
"""
from __future__ import annotations

import importlib
import operator
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


# type -> callable(resolved params) -> nn.Module
MODULE_BUILDERS: dict[str, Callable[[dict], nn.Module]] = {
    "Linear": lambda p: nn.Linear(p["in_features"], p["out_features"], bias=p["bias"]),
    "Conv1d": lambda p: nn.Conv1d(
        p["in_channels"], p["out_channels"], p["kernel_size"], stride=p["stride"],
        padding=p["padding"], dilation=p["dilation"], groups=p["groups"], bias=p["bias"]),
    "Conv2d": lambda p: nn.Conv2d(
        p["in_channels"], p["out_channels"], _hw(p["kernel_size"]), stride=_hw(p["stride"]),
        padding=_hw(p["padding"]), dilation=p["dilation"], groups=p["groups"], bias=p["bias"]),
    "MaxPool2d": lambda p: nn.MaxPool2d(_hw(p["kernel_size"]), stride=_hw(p["stride"] or p["kernel_size"]),
                                        padding=_hw(p["padding"])),
    "AvgPool2d": lambda p: nn.AvgPool2d(_hw(p["kernel_size"]), stride=_hw(p["stride"] or p["kernel_size"]),
                                        padding=_hw(p["padding"])),
    "AdaptiveAvgPool2d": lambda p: nn.AdaptiveAvgPool2d(p["output_size"]),
    "BatchNorm1d": lambda p: nn.BatchNorm1d(p["num_features"], eps=p["eps"], momentum=p["momentum"]),
    "BatchNorm2d": lambda p: nn.BatchNorm2d(p["num_features"], eps=p["eps"], momentum=p["momentum"]),
    "LayerNorm": lambda p: nn.LayerNorm(p["normalized_shape"], eps=p["eps"], elementwise_affine=p["elementwise_affine"]),
    "RMSNorm": lambda p: nn.RMSNorm(p["normalized_shape"], eps=p["eps"], elementwise_affine=p["elementwise_affine"]),
    "Dropout": lambda p: nn.Dropout(p["p"]),
    "ReLU": lambda p: nn.ReLU(),
    "GELU": lambda p: nn.GELU(approximate=p["approximate"]),
    "SiLU": lambda p: nn.SiLU(),
    "Tanh": lambda p: nn.Tanh(),
    "Sigmoid": lambda p: nn.Sigmoid(),
    "Softmax": lambda p: nn.Softmax(dim=p["dim"]),
    "Flatten": lambda p: nn.Flatten(p["start_dim"], p["end_dim"]),
    "Reshape": lambda p: Reshape(p["shape"]),
    "Embedding": lambda p: nn.Embedding(p["num_embeddings"], p["embedding_dim"]),
    "PositionalEmbedding": lambda p: PositionalEmbedding(p["max_len"], p["dim"]),
    "MultiheadAttention": lambda p: SelfAttention(
        p["embed_dim"], p["num_heads"], dropout=p["dropout"], bias=p["bias"], causal=p["causal"]),
    "TransformerEncoderLayer": lambda p: nn.TransformerEncoderLayer(
        p["d_model"], p["nhead"], dim_feedforward=p["dim_feedforward"], dropout=p["dropout"],
        activation=p["activation"], batch_first=True, norm_first=p["norm_first"]),
    "Mean": lambda p: Mean(p["dim"], p["keepdim"]),
    "Transpose": lambda p: Transpose(p["dim0"], p["dim1"]),
    "Slice": lambda p: Slice(p["dim"], p["start"], p["end"], p["step"]),
    "Scale": lambda p: Scale(p["scale"], p["shift"], p["shape"]),
    "Identity": lambda p: nn.Identity(),
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
