"""Shape inference of every catalog layer agrees with a real forward pass."""
import pytest
import torch

from engine.diagram.compile import compile_graph
from engine.diagram.graph import Graph
from engine.diagram.catalog import CATALOG

# type -> (input shape per sample, input dtype, params)
CASES = {
    "Linear": ((5, 12), "float32", {"out_features": 7}),
    "Conv1d": ((4, 20), "float32", {"out_channels": 6, "kernel_size": 5, "stride": 2, "padding": 1}),
    "Conv2d": ((3, 11, 9), "float32", {"out_channels": 8, "kernel_size": [3, 5], "stride": 2, "padding": [0, 1]}),
    "MaxPool2d": ((3, 9, 9), "float32", {"kernel_size": [2, 3]}),
    "AvgPool2d": ((3, 9, 9), "float32", {"kernel_size": 3, "stride": [2, 1], "padding": 1}),
    "AdaptiveAvgPool2d": ((3, 9, 7), "float32", {"output_size": 2}),
    "BatchNorm1d": ((6, 10), "float32", {}),
    "BatchNorm2d": ((6, 5, 5), "float32", {}),
    "LayerNorm": ((4, 10), "float32", {}),
    "RMSNorm": ((4, 10), "float32", {"eps": 1e-5}),
    "Dropout": ((10,), "float32", {"p": 0.0}),
    "ReLU": ((3, 4), "float32", {}),
    "GELU": ((3, 4), "float32", {"approximate": "tanh"}),
    "SiLU": ((3, 4), "float32", {}),
    "Tanh": ((3, 4), "float32", {}),
    "Sigmoid": ((3, 4), "float32", {}),
    "Softmax": ((3, 4), "float32", {"dim": 1}),
    "Flatten": ((3, 4, 5), "float32", {}),
    "Reshape": ((3, 4, 5), "float32", {"shape": [4, -1]}),
    "Mean": ((6, 8), "float32", {"dim": 1}),
    "Transpose": ((3, 4, 5), "float32", {"dim0": -1, "dim1": 1}),
    "Slice": ((6, 8), "float32", {"dim": -1, "start": 1, "end": -2, "step": 2}),
    "Scale": ((3, 4, 5), "float32", {"scale": 0.5, "shift": 2.0, "shape": [4, 1]}),
    "Embedding": ((7,), "int64", {"num_embeddings": 20, "embedding_dim": 8}),
    "PositionalEmbedding": ((7, 8), "float32", {"max_len": 10}),
    "MultiheadAttention": ((7, 16), "float32", {"num_heads": 4, "causal": True}),
    "TransformerEncoderLayer": ((7, 16), "float32", {"nhead": 2, "dim_feedforward": 32}),
    "Identity": ((3,), "float32", {}),
    "Custom": ((3, 4), "float32", {"path": "torch.nn:Hardswish"}),
    # x.permute(0, 2, 1) * gamma: a generic ATen op that owns a tensor
    "Op": ((3, 4), "float32", {"code": [["t", "aten.permute.default", [{"$": "in0"}, [0, 2, 1]], {}],
                                        ["y", "aten.mul.Tensor", [{"$": "t"}, {"$": "gamma"}], {}]],
                               "weights": {"gamma": {"shape": [3], "dtype": "float32", "grad": True}}}),
}
# type -> (params, per-sample shape of each input)
MERGES = {"Add": ({}, [(4, 5)] * 2), "Mul": ({}, [(4, 5)] * 2), "Concat": ({"num_inputs": 3, "dim": -1}, [(4, 5)] * 3),
          "MatMul": ({}, [(2, 4, 5), (2, 5, 3)])}


def one_layer(t, shape, dtype, params):
    g = Graph()
    g.add_node("Input", {"shape": list(shape), "dtype": dtype}, id="x")
    g.add_node(t, params, id="layer")
    g.add_node("Output", {"loss": "none"}, id="out")
    g.connect("x", "out", "layer", "in")
    g.connect("layer", "out", "out", "in")
    return g


def test_every_catalog_type_is_covered():
    assert set(CASES) | set(MERGES) | {"Input", "Output"} == set(CATALOG)


@pytest.mark.parametrize("layer_type", sorted(CASES))
def test_inferred_shape_matches_forward(layer_type):
    shape, dtype, params = CASES[layer_type]
    r = compile_graph(one_layer(layer_type, shape, dtype, params))
    assert r.ok, r.errors
    m = r.build(seed=0)
    x = torch.randint(0, 5, (3, *shape)) if dtype == "int64" else torch.randn(3, *shape)
    y = m(x)
    assert r.nodes["layer"].out.shape == tuple(y.shape[1:])
    assert r.nodes["layer"].out.dtype == str(y.dtype).replace("torch.", "")
    assert r.nodes["layer"].n_params == sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("layer_type", sorted(MERGES))
def test_merge_layers(layer_type):
    params, shapes = MERGES[layer_type]
    g = Graph()
    ports = CATALOG[layer_type].input_ports(params)
    g.add_node(layer_type, params, id="m")
    for i, (port, shape) in enumerate(zip(ports, shapes)):
        g.add_node("Input", {"shape": list(shape)}, id=f"x{i}")
        g.connect(f"x{i}", "out", "m", port)
    g.add_node("Output", {"loss": "none"}, id="out")
    g.connect("m", "out", "out", "in")
    r = compile_graph(g)
    assert r.ok, r.errors
    xs = [torch.randn(2, *shape) for shape in shapes]
    y = r.build()(*xs)
    assert r.nodes["m"].out.shape == tuple(y.shape[1:])
    if layer_type == "MatMul":
        torch.testing.assert_close(y, xs[0] @ xs[1])
        assert r.nodes["m"].flops == 2 * 2 * 4 * 5 * 3  # per sample


def test_inferred_sizes_follow_the_input():
    g = one_layer("Linear", (37,), "float32", {"out_features": 5})
    r = compile_graph(g)
    assert r.nodes["layer"].params["in_features"] == 37
    assert r.nodes["layer"].n_params == 37 * 5 + 5
    assert r.nodes["layer"].flops == 2 * 37 * 5  # per sample


def test_flops_of_conv():
    r = compile_graph(one_layer("Conv2d", (3, 8, 8), "float32", {"out_channels": 4, "kernel_size": 3, "padding": 1}))
    assert r.nodes["layer"].flops == 2 * 3 * 9 * 4 * 8 * 8


def test_new_layers_compute_what_torch_does():
    """Transpose, Slice, Scale and RMSNorm against the torch expression they stand for."""
    x = torch.randn(3, 4, 6, 5)
    cases = [
        ("Transpose", {"dim0": 1, "dim1": -1}, x.transpose(1, 3)),
        ("Slice", {"dim": 2, "start": -5, "end": 5, "step": 2}, x[:, :, -5:5:2]),
        ("Slice", {"dim": -1, "start": 1}, x[..., 1:]),
        ("Scale", {"scale": -2.0, "shift": 0.25}, x * -2.0 + 0.25),
        ("RMSNorm", {"eps": 1e-6}, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)),
    ]
    for t, params, want in cases:
        r = compile_graph(one_layer(t, x.shape[1:], "float32", params))
        assert r.ok, r.errors
        torch.testing.assert_close(r.build(seed=0)(x), want, msg=f"{t} {params}")
    # a Scale with a shape holds its constants as buffers, filled from scale and shift
    r = compile_graph(one_layer("Scale", (4, 6, 5), "float32", {"scale": 3.0, "shift": -1.0, "shape": [4, 1, 1]}))
    m = r.build()
    assert r.nodes["layer"].n_params == 0 and set(m.state_dict()) == {"layer.scale", "layer.shift"}
    m.layer.scale[1] = 0.0
    want = x * 3.0 - 1.0
    want[:, 1] = -1.0
    torch.testing.assert_close(m(x), want)


# (type, input shape, params, field the error names, words in the message)
REFUSALS = [
    ("Transpose", (4, 5), {"dim0": 0}, "dim0", "batch"),
    ("Transpose", (4, 5), {"dim0": 2, "dim1": -1}, "dim1", "same dimension"),
    ("Transpose", (4, 5), {"dim1": 3}, "dim1", "out of range"),
    ("Slice", (4, 5), {"dim": 0}, "dim", "batch"),
    ("Slice", (4, 5), {"dim": 2, "start": 5}, "start", "keeps nothing"),
    ("Slice", (4, 5), {"dim": 2, "start": 3, "end": -2}, "end", "keeps nothing"),
    ("Slice", (4, 5), {"step": 0}, "step", "at least 1"),
    ("Scale", (3, 4, 5), {"shape": [3, 5]}, "shape", "does not broadcast"),
    ("Scale", (3, 4, 5), {"scale": "x"}, "scale", "number"),
    ("RMSNorm", (4, 5), {"normalized_shape": 4}, "normalized_shape", "last dim 5"),
    ("Conv2d", (3, 6, 6), {"kernel_size": [3, 7], "padding": 0}, "kernel_size", "width 6"),
    ("Conv2d", (3, 6, 6), {"kernel_size": [3, 2, 1]}, "kernel_size", "pair [h, w]"),
    ("MaxPool2d", (3, 6, 6), {"kernel_size": [2, 2], "padding": [1, 2]}, "padding", "half the window"),
    ("AvgPool2d", (3, 6, 6), {"stride": [1, 0]}, "stride", "at least 1"),
]


@pytest.mark.parametrize("t,shape,params,field,words", REFUSALS)
def test_shape_errors_name_the_field(t, shape, params, field, words):
    r = compile_graph(one_layer(t, shape, "float32", params))
    errs = r.errors_for("layer")
    assert len(errs) == 1 and errs[0].field == field and words in str(errs[0]), errs


def test_matmul_errors_name_both_shapes():
    g = Graph()
    g.add_node("Input", {"shape": [2, 4, 5]}, id="a")
    g.add_node("Input", {"shape": [2, 6, 3]}, id="b")
    g.add_node("MatMul", {}, id="mm")
    g.add_node("Output", {"loss": "none"}, id="out")
    g.connect("a", "out", "mm", "a")
    g.connect("b", "out", "mm", "b")
    g.connect("mm", "out", "out", "in")
    msg = str(compile_graph(g).errors_for("mm")[0])
    assert "(B, 2, 4, 5)" in msg and "(B, 2, 6, 3)" in msg and "(5)" in msg and "(6)" in msg
    g.set_param("b", "shape", [6, 3])
    assert "same rank" in str(compile_graph(g).errors_for("mm")[0])


def test_square_kernels_keep_their_int_form():
    """Old project files hold ints; [3, 3] means the same and resolves to 3."""
    r = compile_graph(one_layer("Conv2d", (3, 8, 8), "float32", {"kernel_size": [3, 3], "stride": 1}))
    assert r.nodes["layer"].params["kernel_size"] == 3
    r = compile_graph(one_layer("MaxPool2d", (3, 8, 8), "float32", {"kernel_size": [2, 4]}))
    assert r.nodes["layer"].params["kernel_size"] == [2, 4] and r.nodes["layer"].out.shape == (3, 4, 2)


@pytest.mark.parametrize("layer_type", sorted(set(CASES) - {"Custom", "Op"}))
def test_one_declaration_builds_prints_and_reads_back_each_layer(layer_type):
    """A layer type's constructor declaration (engine/runtime/layers.py CTORS) is the one
    place its module, its line in the exported script and its reading by the module
    importer come from: the script's line builds the same module, and importing that
    module gives back the node's parameters."""
    from torch import nn

    from engine.interop.module.importer import catalog_layer
    from engine.interop.script_export import _ctor
    from engine.runtime import layers as rl

    shape, dtype, params = CASES[layer_type]
    r = compile_graph(one_layer(layer_type, shape, dtype, params))
    resolved = r.nodes["layer"].params
    built = rl.build_layer(layer_type, resolved)
    code = _ctor(layer_type, resolved)
    again = eval(code, {"nn": nn, **{c.cls.__name__: c.cls for c in rl.CTORS.values()}})  # noqa: S307
    assert repr(again) == repr(built) and type(again) is type(built), code
    assert {k: tuple(v.shape) for k, v in again.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in built.state_dict().items()}
    kind, read = catalog_layer(built)
    assert kind == layer_type
    assert {k: v for k, v in read.items() if k in resolved} == {k: v for k, v in resolved.items() if k in read}


def test_a_torch_module_configured_beyond_the_catalog_is_not_read_as_it():
    """The importer reads a module as a catalog layer only when the catalog's module
    computes the same: ceil_mode, reflect padding, affine=False, LayerNorm without bias
    and a padding_idx are refused (they come in as generic calls instead); an in-place
    ReLU is a ReLU."""
    from torch import nn

    from engine.interop.module.importer import catalog_layer

    for m in (nn.MaxPool2d(2, ceil_mode=True), nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"),
              nn.BatchNorm2d(4, affine=False), nn.LayerNorm(8, bias=False), nn.Embedding(5, 3, padding_idx=0),
              nn.AvgPool2d(2, count_include_pad=False), nn.Conv2d(3, 4, 3, dilation=(1, 2))):
        assert catalog_layer(m) is None, m
    assert catalog_layer(nn.ReLU(inplace=True)) == ("ReLU", {})
    assert catalog_layer(nn.MaxPool2d(3, 2, 1)) == ("MaxPool2d", {"kernel_size": 3, "stride": 2, "padding": 1})
    assert catalog_layer(nn.MaxPool2d((2, 2), (2, 2), (0, 0))) == ("MaxPool2d", {"kernel_size": 2, "stride": None,
                                                                                 "padding": 0})
