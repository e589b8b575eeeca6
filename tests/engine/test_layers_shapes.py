"""Shape inference of every catalog layer agrees with a real forward pass."""
import pytest
import torch

from engine.compile import compile_graph
from engine.graph import Graph
from engine.layers import CATALOG

# type -> (input shape per sample, input dtype, params)
CASES = {
    "Linear": ((5, 12), "float32", {"out_features": 7}),
    "Conv1d": ((4, 20), "float32", {"out_channels": 6, "kernel_size": 5, "stride": 2, "padding": 1}),
    "Conv2d": ((3, 11, 9), "float32", {"out_channels": 8, "kernel_size": 3, "stride": 2, "padding": 0}),
    "MaxPool2d": ((3, 9, 9), "float32", {"kernel_size": 2}),
    "AvgPool2d": ((3, 9, 9), "float32", {"kernel_size": 3, "stride": 2, "padding": 1}),
    "AdaptiveAvgPool2d": ((3, 9, 7), "float32", {"output_size": 2}),
    "BatchNorm1d": ((6, 10), "float32", {}),
    "BatchNorm2d": ((6, 5, 5), "float32", {}),
    "LayerNorm": ((4, 10), "float32", {}),
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
    "Embedding": ((7,), "int64", {"num_embeddings": 20, "embedding_dim": 8}),
    "PositionalEmbedding": ((7, 8), "float32", {"max_len": 10}),
    "MultiheadAttention": ((7, 16), "float32", {"num_heads": 4, "causal": True}),
    "TransformerEncoderLayer": ((7, 16), "float32", {"nhead": 2, "dim_feedforward": 32}),
    "Identity": ((3,), "float32", {}),
    "Custom": ((3, 4), "float32", {"path": "torch.nn:Hardswish"}),
}
MERGES = {"Add": {}, "Mul": {}, "Concat": {"num_inputs": 3, "dim": -1}}


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
    params = MERGES[layer_type]
    g = Graph()
    ports = CATALOG[layer_type].input_ports(params)
    g.add_node(layer_type, params, id="m")
    for i, port in enumerate(ports):
        g.add_node("Input", {"shape": [4, 5]}, id=f"x{i}")
        g.connect(f"x{i}", "out", "m", port)
    g.add_node("Output", {"loss": "none"}, id="out")
    g.connect("m", "out", "out", "in")
    r = compile_graph(g)
    assert r.ok, r.errors
    xs = [torch.randn(2, 4, 5) for _ in ports]
    y = r.build()(*xs)
    assert r.nodes["m"].out.shape == tuple(y.shape[1:])


def test_inferred_sizes_follow_the_input():
    g = one_layer("Linear", (37,), "float32", {"out_features": 5})
    r = compile_graph(g)
    assert r.nodes["layer"].params["in_features"] == 37
    assert r.nodes["layer"].n_params == 37 * 5 + 5
    assert r.nodes["layer"].flops == 2 * 37 * 5  # per sample


def test_flops_of_conv():
    r = compile_graph(one_layer("Conv2d", (3, 8, 8), "float32", {"out_channels": 4, "kernel_size": 3, "padding": 1}))
    assert r.nodes["layer"].flops == 2 * 3 * 9 * 4 * 8 * 8
