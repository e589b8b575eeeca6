"""Plain calls that read as catalog layers: a functional call with learned weights
(F.layer_norm, F.linear, ...), an activation, x + y, torch.cat, x.view(B, -1) -> the
catalog node they are, else None (an Op node; engine/interop/module/fx_reader.py)."""
from __future__ import annotations

import math

import torch
from torch import fx

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
