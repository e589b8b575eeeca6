"""The layer catalog: every layer type the palette offers, with its parameters.

Each LayerSpec declares its parameters (kind, default, range, one-line doc) so the
GUI builds editors from the declaration alone, and a `resolve` function that fills
in sizes that follow from the incoming shape (Linear in_features, Conv in_channels,
norm sizes) and checks the ones the user fixed. Shapes here are per sample: the
batch dimension is left out.
"""
from __future__ import annotations

import difflib

from dataclasses import dataclass
from typing import Any, Callable, Sequence

Shape = tuple[int, ...]


class FieldError(ValueError):
    """A problem with one parameter (field=None: with the node's input)."""

    def __init__(self, field: str | None, message: str):
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class ParamSpec:
    name: str
    kind: str  # int | int2 (an int or a pair [h, w]) | float | bool | choice | str | ints | json | list
    default: Any
    doc: str
    min: float | None = None
    max: float | None = None
    choices: tuple = ()
    inferred: bool = False  # default None means "follows from the input shape"
    optional: bool = False  # None is a valid value (e.g. pooling stride = kernel)

    def check(self, value: Any) -> Any:
        """Validate one value; returns it (ints given as 2.0 are not accepted)."""
        if value is None and (self.inferred or self.optional):
            return None
        k = self.kind
        if k == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise FieldError(self.name, f"{self.name} must be an integer, not {value!r}")
        elif k == "int2":
            if isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_int(v) for v in value):
                value = value[0] if value[0] == value[1] else list(value)  # [3, 3] is 3
            elif not _is_int(value):
                raise FieldError(self.name, f"{self.name} must be an integer or a pair [h, w], not {value!r}")
        elif k == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise FieldError(self.name, f"{self.name} must be a number, not {value!r}")
            value = float(value)
        elif k == "bool":
            if not isinstance(value, bool):
                raise FieldError(self.name, f"{self.name} must be true or false, not {value!r}")
        elif k == "choice":
            if value not in self.choices:
                raise FieldError(self.name, f"{self.name} must be one of {', '.join(map(str, self.choices))}, not {value!r}")
        elif k == "str":
            if not isinstance(value, str):
                raise FieldError(self.name, f"{self.name} must be text, not {value!r}")
        elif k == "ints":
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise FieldError(self.name, f"{self.name} must be a list of integers, not {value!r}")
            value = list(value)
        elif k == "json":
            if not isinstance(value, dict):
                raise FieldError(self.name, f"{self.name} must be a JSON object (keyword arguments), not {value!r}")
        elif k == "list":
            if not isinstance(value, list):
                raise FieldError(self.name, f"{self.name} must be a JSON list, not {value!r}")
        if k in ("int", "int2", "float"):
            for v in value if isinstance(value, list) else [value]:
                if self.min is not None and v < self.min:
                    raise FieldError(self.name, f"{self.name} must be at least {self.min:g}, not {value}")
                if self.max is not None and v > self.max:
                    raise FieldError(self.name, f"{self.name} must be at most {self.max:g}, not {value}")
        return value

    def to_dict(self) -> dict:
        return {
            "name": self.name, "kind": self.kind, "default": self.default, "doc": self.doc,
            "min": self.min, "max": self.max, "choices": list(self.choices),
            "inferred": self.inferred, "optional": self.optional,
        }


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def pair(v: int | Sequence[int]) -> tuple[int, int]:
    """An int2 parameter as (h, w)."""
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


Resolver = Callable[[dict, list[Shape], list[str]], dict]


@dataclass(frozen=True)
class TPRule:
    """What one tensor-parallel style cuts: the parameter whose size tp must divide
    (`splits`, said as `what` in messages) and the dimension each weight is cut along
    (a name, or a prefix ending in '.' for a sub-layer's weights; weights not named are
    replicated)."""
    style: str
    splits: str
    what: str
    shards: tuple[tuple[str, int], ...]

    def shard_dim(self, pname: str) -> int | None:
        for name, dim in self.shards:
            if pname == name or (name.endswith(".") and pname.startswith(name)):
                return dim
        return None


@dataclass(frozen=True)
class LayerSpec:
    type: str
    category: str
    doc: str
    params: tuple[ParamSpec, ...] = ()
    inputs: tuple[str, ...] | Callable[[dict], list[str]] = ("in",)
    outputs: tuple[str, ...] = ("out",)
    # resolve(params with defaults, input shapes, input dtypes) -> params with
    # inferred sizes filled; raises FieldError. None: nothing to infer or check.
    resolve: Resolver | None = None
    tp_styles: tuple[str, ...] = ()  # tensor-parallel styles this layer supports
    tp_rules: tuple[TPRule, ...] = ()  # what each splitting style cuts (the planner's memory and checks)
    batch_dependent: bool = False  # result depends on how the batch is cut
    kind: str = "module"  # module | function | input | output

    def tp_rule(self, style: str | None) -> TPRule | None:
        return next((r for r in self.tp_rules if r.style == style), None)

    def input_ports(self, params: dict) -> list[str]:
        return list(self.inputs(params)) if callable(self.inputs) else list(self.inputs)

    def output_ports(self, params: dict) -> list[str]:
        return list(self.outputs)

    def param(self, name: str) -> ParamSpec | None:
        return next((p for p in self.params if p.name == name), None)

    def defaults(self) -> dict:
        return {p.name: p.default for p in self.params}

    def check_params(self, params: dict) -> tuple[dict, list[FieldError]]:
        """Defaults merged with the user's values, each type-checked."""
        out, errs = self.defaults(), []
        for k, v in params.items():
            spec = self.param(k)
            if spec is None:
                errs.append(FieldError(k, f"unknown parameter '{k}'"))
                continue
            try:
                out[k] = spec.check(v)
            except FieldError as e:
                errs.append(e)
        return out, errs


# ----- helpers for resolvers -------------------------------------------------
def _fmt(shape: Sequence[int]) -> str:
    return "(" + ", ".join(["B", *map(str, shape)]) + ")"


def _infer(p: dict, name: str, actual: int, what: str) -> None:
    """Fill an inferred size or check the user's fixed value against the input."""
    if p.get(name) is None:
        p[name] = int(actual)
    elif p[name] != actual:
        raise FieldError(name, f"input has {what} {actual} but {name} is {p[name]}")


def _need_rank(shape: Shape, ranks: Sequence[int], layout: str) -> None:
    if len(shape) not in ranks:
        raise FieldError(None, f"input has shape {_fmt(shape)} but this layer needs {layout}")


def _need_float(dtypes: list[str], what: str = "input") -> None:
    if dtypes and not dtypes[0].startswith("float") and not dtypes[0].startswith("bfloat"):
        raise FieldError(None, f"{what} is {dtypes[0]} but this layer needs floating point (an Embedding turns token ids into vectors)")


def _linear(p, shapes, dtypes):
    _need_rank(shapes[0], range(1, 8), "(B, ..., features)")
    _need_float(dtypes)
    _infer(p, "in_features", shapes[0][-1], "last dim")
    return p


def _window(p: dict, spatial: Shape, pool: bool) -> None:
    """The (dilated) kernel fits the padded input along each spatial dimension."""
    nd = len(spatial)
    names = ("length",) if nd == 1 else ("height", "width")

    def each(key: str, default: int = 1) -> tuple[int, ...]:
        v = p.get(key, default)
        return (v,) if nd == 1 else pair(v)

    k, pad, dil = each("kernel_size"), each("padding", 0), each("dilation")
    for i, n in enumerate(spatial):
        if pool and 2 * pad[i] > k[i]:
            raise FieldError("padding", f"padding {p['padding']} is more than half the window {p['kernel_size']}")
        if n + 2 * pad[i] < dil[i] * (k[i] - 1) + 1:
            raise FieldError("kernel_size", f"kernel_size {p['kernel_size']} does not fit the input's {names[i]} {n} "
                                            f"(padded by {pad[i]} on each side)")


def _conv(nd: int):
    def resolve(p, shapes, dtypes):
        layout = "(B, C, L)" if nd == 1 else "(B, C, H, W)"
        _need_rank(shapes[0], (nd + 1,), layout)
        _need_float(dtypes)
        _infer(p, "in_channels", shapes[0][0], "channels")
        for name in ("in_channels", "out_channels"):
            if p[name] % p["groups"]:
                raise FieldError("groups", f"groups={p['groups']} does not divide {name}={p[name]}")
        _window(p, shapes[0][1:], pool=False)
        return p
    return resolve


def _pool2d(p, shapes, dtypes):
    _need_rank(shapes[0], (3,), "(B, C, H, W)")
    if "kernel_size" in p:
        _window(p, shapes[0][1:], pool=True)
    return p


def _bn(nd_ranks: tuple[int, ...], layout: str):
    def resolve(p, shapes, dtypes):
        _need_rank(shapes[0], nd_ranks, layout)
        _infer(p, "num_features", shapes[0][0], "channels")
        return p
    return resolve


def _layernorm(p, shapes, dtypes):
    _need_float(dtypes)
    _infer(p, "normalized_shape", shapes[0][-1], "last dim")
    return p


def _embedding(p, shapes, dtypes):
    if dtypes and not dtypes[0].startswith("int"):
        raise FieldError(None, f"input is {dtypes[0]} but Embedding needs integer token ids (set the Input's dtype to int64)")
    return p


def _posemb(p, shapes, dtypes):
    _need_rank(shapes[0], (2,), "(B, T, C)")
    _infer(p, "dim", shapes[0][-1], "last dim")
    if shapes[0][0] > p["max_len"]:
        raise FieldError("max_len", f"sequence length {shapes[0][0]} is longer than max_len {p['max_len']}")
    return p


def _mha(p, shapes, dtypes):
    _need_rank(shapes[0], (2,), "(B, T, C)")
    _need_float(dtypes)
    _infer(p, "embed_dim", shapes[0][-1], "last dim")
    if p["embed_dim"] % p["num_heads"]:
        raise FieldError("num_heads", f"embed_dim {p['embed_dim']} is not divisible by num_heads {p['num_heads']}")
    return p


def _encoder(p, shapes, dtypes):
    _need_rank(shapes[0], (2,), "(B, T, C)")
    _need_float(dtypes)
    _infer(p, "d_model", shapes[0][-1], "last dim")
    if p["d_model"] % p["nhead"]:
        raise FieldError("nhead", f"d_model {p['d_model']} is not divisible by nhead {p['nhead']}")
    return p


def _same_shapes(p, shapes, dtypes):
    if len(set(shapes)) > 1:
        raise FieldError(None, "inputs have different shapes " + " and ".join(_fmt(s) for s in shapes))
    return p


def _concat(p, shapes, dtypes):
    rank = len(shapes[0]) + 1
    d = p["dim"] if p["dim"] >= 0 else p["dim"] + rank
    if d <= 0 or d >= rank:
        raise FieldError("dim", f"dim {p['dim']} is out of range for inputs of shape {_fmt(shapes[0])} (dim 0 is the batch)")
    for s in shapes[1:]:
        if len(s) != len(shapes[0]) or any(a != b for i, (a, b) in enumerate(zip(s, shapes[0])) if i != d - 1):
            raise FieldError("dim", "inputs " + " and ".join(_fmt(x) for x in shapes) + f" differ outside dim {p['dim']}")
    return p


def _sample_dim(p: dict, name: str, shape: Shape) -> int:
    """A dimension parameter (the batch counts as 0, negatives from the end) as an
    index into the per-sample shape; the batch itself is refused."""
    rank = len(shape) + 1
    d = p[name]
    if not -rank <= d < rank:
        raise FieldError(name, f"{name} {d} is out of range for input of shape {_fmt(shape)}")
    if d in (0, -rank):
        raise FieldError(name, f"{name} {d} is the batch dimension; a sample's dimensions are 1 to {rank - 1}")
    return d % rank - 1


def _dim_in_range(p, shapes, dtypes):
    _sample_dim(p, "dim", shapes[0])
    return p


def _transpose(p, shapes, dtypes):
    if _sample_dim(p, "dim0", shapes[0]) == _sample_dim(p, "dim1", shapes[0]):
        raise FieldError("dim1", f"dim0 {p['dim0']} and dim1 {p['dim1']} are the same dimension of "
                                 f"{_fmt(shapes[0])}: nothing to swap")
    return p


def _slice(p, shapes, dtypes):
    d = _sample_dim(p, "dim", shapes[0])
    n = shapes[0][d]
    if not range(n)[p["start"]:p["end"]:p["step"]]:
        fld = "start" if not -n <= p["start"] < n else "end"
        end = "the end" if p["end"] is None else p["end"]
        raise FieldError(fld, f"start {p['start']} to {end} keeps nothing of dim {p['dim']} (size {n}) of {_fmt(shapes[0])}")
    return p


def _broadcasts(small: Sequence[int], big: Sequence[int]) -> bool:
    """`small` broadcasts to `big` (aligned from the right) without growing it."""
    return len(small) <= len(big) and all(a in (1, b) for a, b in zip(reversed(small), reversed(big)))


def _scale(p, shapes, dtypes):
    if any(s <= 0 for s in p["shape"]) or not _broadcasts(p["shape"], shapes[0]):
        raise FieldError("shape", f"shape {p['shape']} does not broadcast over the input {_fmt(shapes[0])}: "
                                  "counted from the last dimension, each entry is 1 or the input's size")
    return p


def _matmul(p, shapes, dtypes):
    a, b = shapes
    what = f"a is {_fmt(a)} and b is {_fmt(b)}"
    if len(a) < 2 or len(a) != len(b):
        raise FieldError(None, f"{what}: MatMul needs two inputs of the same rank, at least (B, n, k) and (B, k, m)")
    if a[-1] != b[-2]:
        raise FieldError(None, f"{what}: a's last dimension ({a[-1]}) must equal b's second to last ({b[-2]})")
    if not all(x == y or 1 in (x, y) for x, y in zip(a[:-2], b[:-2])):
        raise FieldError(None, f"{what}: the dimensions before the last two must be equal or 1")
    return p


def _reshape(p, shapes, dtypes):
    n = 1
    for s in shapes[0]:
        n *= s
    target = p["shape"]
    if target.count(-1) > 1:
        raise FieldError("shape", "shape may contain at most one -1")
    known = 1
    for s in target:
        if s != -1:
            if s <= 0:
                raise FieldError("shape", f"shape entries must be positive or -1, not {s}")
            known *= s
    if (-1 in target and n % known) or (-1 not in target and known != n):
        raise FieldError("shape", f"cannot reshape {_fmt(shapes[0])} ({n} values per sample) to {_fmt(target)}")
    return p


MAX_SAMPLE_NUMEL = 2 ** 36  # values in one sample: far beyond any model, far below what overflows


def _input(p, shapes, dtypes):
    if not p["shape"] or any(s <= 0 for s in p["shape"]):
        raise FieldError("shape", f"shape must list positive sizes (without the batch), not {p['shape']}")
    n = 1
    for s in p["shape"]:
        n *= s
    if n > MAX_SAMPLE_NUMEL:
        raise FieldError("shape", f"shape {p['shape']} holds {n:.3g} values per sample; at most {MAX_SAMPLE_NUMEL:.3g}")
    return p


def _custom(p, shapes, dtypes):
    if not p["path"]:
        raise FieldError("path", "path is empty: give 'package.module:Class'")
    return p


def _op(p, shapes, dtypes):
    from engine.runtime.ops import OpError, check_program

    try:
        check_program(p)
    except OpError as e:
        raise FieldError("code", str(e)) from None
    return p


def _op_inputs(p: dict) -> list[str]:
    n = p.get("inputs", 1)
    n = n if isinstance(n, int) and 1 <= n <= 64 else 1
    return ["in"] if n == 1 else [f"in{i}" for i in range(n)]  # the program reads them as in0, in1, ...


def _n_inputs(p: dict) -> list[str]:
    n = p.get("num_inputs", 2)
    n = n if isinstance(n, int) and 2 <= n <= 8 else 2
    return [f"in{i}" for i in range(n)]


P = ParamSpec
_EPS = P("eps", "float", 1e-5, "added to the variance for numerical stability", min=0.0)
_BIAS = P("bias", "bool", True, "learn an additive bias")

CATALOG: dict[str, LayerSpec] = {}


def _add(spec: LayerSpec) -> None:
    CATALOG[spec.type] = spec


_add(LayerSpec("Input", "Input/Output", "A model input; shape is per sample (no batch dimension).", (
    P("shape", "ints", [64], "size of one sample, e.g. [1, 28, 28] or [32]"),
    P("dtype", "choice", "float32", "float32 for features, int64 for token ids", choices=("float32", "int64")),
), inputs=(), resolve=_input, kind="input"))
_add(LayerSpec("Output", "Input/Output", "A model output and the loss computed on it against the data's targets.", (
    P("loss", "choice", "cross_entropy", "cross_entropy: classes (per sample, or per token for a language model); "
      "bce: several labels per sample (multi-label, logits in); mse: regression; none: no training",
      choices=("cross_entropy", "bce", "mse", "none")),
    P("label_smoothing", "float", 0.0, "cross_entropy: the share of each target spread over all classes", min=0.0,
      max=0.99),
    P("ignore_index", "int", -100, "cross_entropy: a target of this value adds no loss and no accuracy (padding)"),
), outputs=(), kind="output"))

_add(LayerSpec("Linear", "Dense", "y = x W^T + b over the last dimension.", (
    P("in_features", "int", None, "input size (inferred from the incoming shape)", min=1, inferred=True),
    P("out_features", "int", 64, "output size", min=1),
    _BIAS,
), resolve=_linear, tp_styles=("colwise", "rowwise", "replicate"), tp_rules=(
    TPRule("colwise", "out_features", "output features", (("weight", 0), ("bias", 0))),
    TPRule("rowwise", "in_features", "input features", (("weight", 1),)))))
for _nd in (1, 2):
    _K, _HW = ("int", "") if _nd == 1 else ("int2", "; one number, or h, w")
    _add(LayerSpec(f"Conv{_nd}d", "Convolution", f"{_nd}-D convolution over (B, C, {'L' if _nd == 1 else 'H, W'}).", (
        P("in_channels", "int", None, "input channels (inferred)", min=1, inferred=True),
        P("out_channels", "int", 32, "output channels", min=1),
        P("kernel_size", _K, 3, "kernel size" + _HW, min=1),
        P("stride", _K, 1, "stride" + _HW, min=1),
        P("padding", _K, 1, "zero padding on each side" + _HW, min=0),
        P("dilation", "int", 1, "spacing between kernel elements", min=1),
        P("groups", "int", 1, "blocked connections from input to output channels", min=1),
        _BIAS,
    ), resolve=_conv(_nd)))
for _name, _doc in (("MaxPool2d", "max"), ("AvgPool2d", "average")):
    _add(LayerSpec(_name, "Pooling", f"2-D {_doc} pooling over (B, C, H, W).", (
        P("kernel_size", "int2", 2, "window size; one number, or h, w", min=1),
        P("stride", "int2", None, "step; one number, or h, w (empty: the window size)", min=1, optional=True),
        P("padding", "int2", 0, "padding on each side; one number, or h, w", min=0),
    ), resolve=_pool2d))
_add(LayerSpec("AdaptiveAvgPool2d", "Pooling", "Average pooling to a fixed output size (1 = global pooling).", (
    P("output_size", "int", 1, "output height and width", min=1),
), resolve=_pool2d))
_add(LayerSpec("BatchNorm1d", "Normalization", "Batch normalization over (B, C) or (B, C, L).", (
    P("num_features", "int", None, "channels (inferred)", min=1, inferred=True),
    _EPS, P("momentum", "float", 0.1, "running statistics update rate", min=0.0, max=1.0),
), resolve=_bn((1, 2), "(B, C) or (B, C, L)"), tp_styles=("replicate",), batch_dependent=True))
_add(LayerSpec("BatchNorm2d", "Normalization", "Batch normalization over (B, C, H, W).", (
    P("num_features", "int", None, "channels (inferred)", min=1, inferred=True),
    _EPS, P("momentum", "float", 0.1, "running statistics update rate", min=0.0, max=1.0),
), resolve=_bn((3,), "(B, C, H, W)"), tp_styles=("replicate",), batch_dependent=True))
_add(LayerSpec("LayerNorm", "Normalization", "Layer normalization over the last dimension.", (
    P("normalized_shape", "int", None, "size of the last dimension (inferred)", min=1, inferred=True),
    _EPS, P("elementwise_affine", "bool", True, "learn a scale and shift"),
), resolve=_layernorm, tp_styles=("sequence", "replicate")))
_add(LayerSpec("RMSNorm", "Normalization", "Root-mean-square normalization over the last dimension (no mean, no bias).", (
    P("normalized_shape", "int", None, "size of the last dimension (inferred)", min=1, inferred=True),
    P("eps", "float", 1e-6, "added to the mean square for numerical stability", min=0.0),
    P("elementwise_affine", "bool", True, "learn a scale per feature"),
), resolve=_layernorm, tp_styles=("sequence", "replicate")))
_add(LayerSpec("Dropout", "Regularization", "Zeroes elements with probability p while training.", (
    P("p", "float", 0.1, "drop probability", min=0.0, max=1.0),
), batch_dependent=True))
for _name, _doc in (("ReLU", "max(0, x)"), ("SiLU", "x * sigmoid(x)"), ("Tanh", "tanh(x)"), ("Sigmoid", "1 / (1 + exp(-x))")):
    _add(LayerSpec(_name, "Activation", f"Elementwise {_doc}."))
_add(LayerSpec("GELU", "Activation", "Gaussian error linear unit.", (
    P("approximate", "choice", "none", "exact or tanh approximation", choices=("none", "tanh")),
)))
_add(LayerSpec("Softmax", "Activation", "Softmax over one dimension.", (
    P("dim", "int", -1, "dimension (0 is the batch)"),
), resolve=_dim_in_range))
_add(LayerSpec("Flatten", "Shape", "Flattens dimensions start_dim..end_dim into one.", (
    P("start_dim", "int", 1, "first dimension to flatten (0 is the batch)", min=1),
    P("end_dim", "int", -1, "last dimension to flatten"),
)))
_add(LayerSpec("Reshape", "Shape", "Reshapes each sample (the batch dimension is kept).", (
    P("shape", "ints", [-1], "new per-sample shape; one entry may be -1"),
), resolve=_reshape))
_add(LayerSpec("Mean", "Shape", "Mean over one dimension, e.g. pooling a sequence over its tokens.", (
    P("dim", "int", 1, "dimension to average (0 is the batch)"),
    P("keepdim", "bool", False, "keep the averaged dimension with size 1"),
), resolve=_dim_in_range))
_add(LayerSpec("Transpose", "Shape", "Swaps two dimensions of each sample, e.g. (B, T, C) -> (B, C, T).", (
    P("dim0", "int", 1, "one dimension to swap (0 is the batch; negative counts from the end)"),
    P("dim1", "int", 2, "the other dimension to swap"),
), resolve=_transpose))
_add(LayerSpec("Slice", "Shape", "Keeps positions start:end:step of one dimension, like x[:, start:end:step].", (
    P("dim", "int", 1, "dimension to slice (0 is the batch; negative counts from the end)"),
    P("start", "int", 0, "first position kept; negative counts from the end"),
    P("end", "int", None, "position to stop before; negative counts from the end (empty: to the end)", optional=True),
    P("step", "int", 1, "keep every step-th position", min=1),
), resolve=_slice))
_add(LayerSpec("Scale", "Arithmetic", "Multiplies by a constant and adds a constant: x * scale + shift (nothing is learned).", (
    P("scale", "float", 1.0, "the factor (with a shape: every entry's value until weights are loaded)"),
    P("shift", "float", 0.0, "added after scaling (with a shape: likewise)"),
    P("shape", "ints", [], "empty: scale and shift are numbers; else the shape of per-element constants kept in "
                           "the weights file, broadcast over each sample from the last dimension, e.g. 3, 1, 1"),
), resolve=_scale))
_add(LayerSpec("Embedding", "Sequence", "Looks up a vector for each integer token id.", (
    P("num_embeddings", "int", 1000, "vocabulary size", min=1),
    P("embedding_dim", "int", 64, "vector size", min=1),
), resolve=_embedding, tp_styles=("colwise", "rowwise", "replicate"), tp_rules=(
    TPRule("colwise", "embedding_dim", "embedding size", (("weight", 1),)),
    TPRule("rowwise", "num_embeddings", "vocabulary", (("weight", 0),)))))
_add(LayerSpec("PositionalEmbedding", "Sequence", "Adds a learned vector for each position to (B, T, C).", (
    P("max_len", "int", 512, "longest sequence", min=1),
    P("dim", "int", None, "vector size (inferred)", min=1, inferred=True),
), resolve=_posemb))
_add(LayerSpec("MultiheadAttention", "Sequence", "Multi-head self-attention on (B, T, C).", (
    P("embed_dim", "int", None, "model width (inferred)", min=1, inferred=True),
    P("num_heads", "int", 4, "attention heads; must divide embed_dim", min=1),
    P("dropout", "float", 0.0, "attention dropout", min=0.0, max=1.0),
    _BIAS,
    P("causal", "bool", False, "each position attends only to earlier ones"),
), resolve=_mha, tp_styles=("colwise", "replicate"), tp_rules=(
    TPRule("colwise", "num_heads", "heads", (("q.", 0), ("k.", 0), ("v.", 0), ("out.weight", 1))),)))
_add(LayerSpec("TransformerEncoderLayer", "Sequence", "Self-attention + feed-forward block on (B, T, C).", (
    P("d_model", "int", None, "model width (inferred)", min=1, inferred=True),
    P("nhead", "int", 4, "attention heads; must divide d_model", min=1),
    P("dim_feedforward", "int", 256, "feed-forward hidden size", min=1),
    P("dropout", "float", 0.0, "dropout inside the block", min=0.0, max=1.0),
    P("activation", "choice", "relu", "feed-forward activation", choices=("relu", "gelu")),
    P("norm_first", "bool", True, "pre-norm (LayerNorm before attention and feed-forward)"),
), resolve=_encoder, tp_styles=("replicate",)))
_add(LayerSpec("Add", "Merge", "Elementwise sum of two inputs of equal shape (residual connections).",
               inputs=("a", "b"), resolve=_same_shapes, kind="function"))
_add(LayerSpec("Mul", "Merge", "Elementwise product of two inputs of equal shape (gating).",
               inputs=("a", "b"), resolve=_same_shapes, kind="function"))
_add(LayerSpec("MatMul", "Merge", "Matrix product a @ b per sample, (B, ..., n, k) @ (B, ..., k, m) -> (B, ..., n, m), "
               "e.g. attention scores.", inputs=("a", "b"), resolve=_matmul, kind="function"))
_add(LayerSpec("Concat", "Merge", "Joins inputs along one dimension.", (
    P("num_inputs", "int", 2, "number of inputs", min=2, max=8),
    P("dim", "int", 1, "dimension to join along (0 is the batch)"),
), inputs=_n_inputs, resolve=_concat, kind="function"))
_add(LayerSpec("Identity", "Shape", "Passes its input through unchanged."))
_add(LayerSpec("Custom", "Custom", "Any nn.Module by import path 'package.module:Class' with keyword arguments.", (
    P("path", "str", "", "import path, e.g. torch.nn:Hardswish"),
    P("kwargs", "json", {}, "keyword arguments for the constructor"),
), resolve=_custom))

_add(LayerSpec("Op", "Generic", "Any ATen computation the catalog has no layer for (what torch.export records), "
               "with the tensors it owns; imported models use it for permute, indexing, class tokens and the like.", (
    P("inputs", "int", 1, "number of inputs (read as in0, in1, ... by the calls)", min=1, max=64),
    P("code", "list", [["y", "aten.relu.default", [{"$": "in0"}], {}]],
      "calls [result, 'aten.NAME.OVERLOAD', args, kwargs]; {\"$\": name} reads an input, weight or result; "
      "the last result is the output"),
    P("weights", "json", {}, "tensors the node owns: name -> {shape, dtype, grad}"),
    P("label", "str", "", "what the calls compute, shown on the node (e.g. the module they came from)"),
), inputs=_op_inputs, resolve=_op, tp_styles=("replicate",)))


def get_layer(node_type: str) -> LayerSpec | None:
    return CATALOG.get(node_type)


def near_types(node_type: str, n: int = 3) -> list[str]:
    """The catalog's types a mistyped one was likely meant as: the same letters in another
    case first (Relu: ReLU), then the closest spellings, compared without case."""
    same = [t for t in CATALOG if t.lower() == node_type.lower()]
    if same:
        return same
    folded = {t.lower(): t for t in CATALOG}
    return [folded[t] for t in difflib.get_close_matches(node_type.lower(), list(folded), n=n, cutoff=0.7)]


def unknown_type(node_type: str) -> str:
    """The one line for a layer type the catalog has not: the CLI, the API and the editor."""
    near = near_types(node_type)
    return f"unknown layer type '{node_type}'" + (f" (did you mean {' or '.join(near)}?)" if near else "")


def categories() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for spec in CATALOG.values():
        out.setdefault(spec.category, []).append(spec.type)
    return out
