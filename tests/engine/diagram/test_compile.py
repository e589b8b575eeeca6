"""compile_graph: the fx module equals a hand-built one; every invalid diagram gets
a message that names the node and the field, all errors at once."""
import torch
from torch import nn

from engine.diagram.compile import compile_graph
from engine.diagram.graph import Edge, Graph


def mlp_graph(hidden=16):
    g = Graph()
    g.add_node("Input", {"shape": [8]}, id="x")
    g.add_node("Linear", {"out_features": hidden}, id="fc1")
    g.add_node("ReLU", id="act")
    g.add_node("Linear", {"out_features": 3}, id="fc2")
    g.add_node("Add", id="skip")  # fc2 + a projection of x
    g.add_node("Linear", {"out_features": 3, "bias": False}, id="proj")
    g.add_node("Output", {"loss": "cross_entropy"}, id="out")
    g.connect("x", "out", "fc1", "in")
    g.connect("fc1", "out", "act", "in")
    g.connect("act", "out", "fc2", "in")
    g.connect("fc2", "out", "skip", "a")
    g.connect("x", "out", "proj", "in")
    g.connect("proj", "out", "skip", "b")
    g.connect("skip", "out", "out", "in")
    return g


class HandMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.proj = nn.Linear(8, 16), nn.Linear(16, 3), nn.Linear(8, 3, bias=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) + self.proj(x)


def test_fx_module_equals_hand_built_module():
    r = compile_graph(mlp_graph())
    assert r.ok
    gm = r.build(seed=1)
    hand = HandMLP()
    hand.load_state_dict(gm.state_dict())  # same names: node ids are submodule names
    x = torch.randn(5, 8)
    torch.testing.assert_close(gm(x), hand(x), rtol=0, atol=0)
    assert set(dict(gm.named_children())) == {"fc1", "act", "fc2", "proj"}


def test_same_seed_same_weights():
    a, b = compile_graph(mlp_graph()).build(seed=3), compile_graph(mlp_graph()).build(seed=3)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


def msgs(g):
    return [str(e) for e in compile_graph(g).errors]


def test_shape_mismatch_names_node_and_field():
    g = mlp_graph()
    g.set_param("fc2", "in_features", 64)
    r = compile_graph(g)
    assert "node 'fc2' (Linear): input has last dim 16 but in_features is 64" in [str(e) for e in r.errors]
    assert r.errors[0].node == "fc2" and r.errors[0].field == "in_features"


def test_cycle():
    g = mlp_graph()
    g.add_edge_unchecked(Edge("act", "out", "fc1", "in2"))  # loaders can produce anything
    g.edges.remove(next(e for e in g.edges if e.dst == "fc1"))
    g.add_edge_unchecked(Edge("act", "out", "fc1", "in"))
    m = msgs(g)
    assert any("cycle" in s and "fc1" in s and "act" in s for s in m), m


def test_connect_refuses_cycle_and_occupied_port():
    g = mlp_graph()
    assert "cycle" in g.check_connect("fc2", "out", "fc1", "in")
    assert "already connected" in g.check_connect("x", "out", "fc2", "in")


def test_unconnected_input():
    g = mlp_graph()
    g.disconnect(next(e for e in g.edges if e.dst == "skip" and e.dst_port == "b"))
    assert "node 'skip' (Add): input 'b' is not connected" in msgs(g)


def test_unknown_type_and_bad_param_types_all_at_once():
    g = mlp_graph()
    g.add_node("Frobnicate", id="weird")
    g.set_param("fc1", "out_features", "lots")
    g.set_param("act", "inplace", True)
    g.set_param("fc2", "bias", 1)
    m = msgs(g)
    assert "node 'weird' (Frobnicate): unknown layer type 'Frobnicate'" in m
    assert "node 'fc1' (Linear): out_features must be an integer, not 'lots'" in m
    assert "node 'act' (ReLU): unknown parameter 'inplace'" in m
    assert "node 'fc2' (Linear): bias must be true or false, not 1" in m


def test_a_mistyped_layer_type_gets_a_did_you_mean():
    """The same letters in another case first, then the closest spellings; one wording for
    the CLI, the API and the editor (catalog.unknown_type)."""
    from engine.diagram.catalog import near_types, unknown_type

    g = mlp_graph()
    g.add_node("Relu", id="r")
    g.add_node("Lienar", id="l")
    m = msgs(g)
    assert "node 'r' (Relu): unknown layer type 'Relu' (did you mean ReLU?)" in m
    assert any(e.startswith("node 'l' (Lienar): unknown layer type 'Lienar' (did you mean Linear") for e in m)
    assert near_types("conv2D") == ["Conv2d"] and unknown_type("Zzzzqx") == "unknown layer type 'Zzzzqx'"


def test_out_of_range_param():
    g = mlp_graph()
    g.set_param("fc1", "out_features", 0)
    assert "node 'fc1' (Linear): out_features must be at least 1, not 0" in msgs(g)


def test_custom_path_that_does_not_import():
    g = mlp_graph()
    g.add_node("Custom", {"path": "no_such_pkg.mod:Thing"}, id="c")
    g.add_node("Custom", {"path": "torch.nn:NoSuchLayer"}, id="c2")
    from engine import trust

    assert any(s.startswith("node 'c' (Custom): not checked") for s in msgs(g))  # nothing imported untrusted
    with trust.allowing(["no_such_pkg.mod:Thing", "torch.nn:NoSuchLayer"]):
        m = msgs(g)
    assert any(s.startswith("node 'c' (Custom): path 'no_such_pkg.mod:Thing' does not import: ModuleNotFoundError") for s in m), m
    assert any(s.startswith("node 'c2' (Custom): path 'torch.nn:NoSuchLayer' does not import: AttributeError") for s in m), m


def test_rank_and_dtype_mismatch():
    g = Graph()
    g.add_node("Input", {"shape": [32]}, id="x")
    g.add_node("Conv2d", {}, id="conv")
    g.add_node("Embedding", {}, id="emb")
    g.add_node("Output", {}, id="out")
    g.connect("x", "out", "conv", "in")
    g.connect("x", "out", "emb", "in")
    g.connect("conv", "out", "out", "in")
    m = msgs(g)
    assert "node 'conv' (Conv2d): input has shape (B, 32) but this layer needs (B, C, H, W)" in m
    assert any(s.startswith("node 'emb' (Embedding): input is float32 but Embedding needs integer token ids") for s in m)


def test_missing_input_and_output_nodes():
    g = Graph()
    g.add_node("ReLU", id="r")
    m = msgs(g)
    assert "the diagram has no Input node" in m and "the diagram has no Output node" in m


def test_errors_do_not_cascade():
    g = mlp_graph()
    g.set_param("fc1", "in_features", 3)
    r = compile_graph(g)
    assert [e.node for e in r.errors] == ["fc1"]


def test_reserved_name():
    g = Graph()
    g.add_node("Input", {"shape": [4]}, id="x")
    g.add_node("ReLU", id="training")
    assert any("reserved" in s for s in msgs(g))


def test_dead_end_is_a_warning():
    g = mlp_graph()
    g.add_node("ReLU", id="dangling")
    g.connect("fc1", "out", "dangling", "in")
    r = compile_graph(g)
    assert r.ok
    assert [w.node for w in r.warnings] == ["dangling"]
