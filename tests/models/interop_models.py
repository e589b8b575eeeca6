"""Models the interop tests share: an MLP, a CNN with batch norm, a ResNet-style
network with skip connections, a small transformer encoder, attention written out
of parts (RMSNorm, Transpose, MatMul, Scale, Slice) and a CNN with non-square
kernels, as diagrams."""
from __future__ import annotations

import torch

from engine.diagram.graph import Graph
from engine.project import Project, Training


class Builder:
    def __init__(self):
        self.g = Graph()

    def add(self, type_: str, params: dict, *srcs: str, id: str | None = None, ports=None) -> str:
        n = self.g.add_node(type_, params, id=id)
        for s, port in zip(srcs, ports or ["in"]):
            self.g.connect(s, "out", n.id, port)
        return n.id


def mlp() -> Graph:
    b = Builder()
    x = b.add("Input", {"shape": [20]}, id="x")
    h = b.add("Linear", {"out_features": 32}, x, id="fc1")
    h = b.add("ReLU", {}, h, id="act1")
    h = b.add("Dropout", {"p": 0.2}, h, id="drop")
    h = b.add("Identity", {}, h, id="tap")  # nn.Identity leaves no ONNX op of its own
    h = b.add("Linear", {"out_features": 16}, h, id="fc2")
    h = b.add("GELU", {}, h, id="act2")
    h = b.add("Linear", {"out_features": 4}, h, id="head")
    b.add("Output", {"loss": "cross_entropy"}, h, id="out")
    return b.g


def cnn_bn() -> Graph:
    b = Builder()
    x = b.add("Input", {"shape": [3, 12, 12]}, id="image")
    h = b.add("Conv2d", {"out_channels": 8, "kernel_size": 3, "padding": 1}, x, id="conv1")
    h = b.add("BatchNorm2d", {}, h, id="bn1")
    h = b.add("ReLU", {}, h, id="relu1")
    h = b.add("MaxPool2d", {"kernel_size": 2}, h, id="pool1")
    h = b.add("Conv2d", {"out_channels": 16, "kernel_size": 3, "padding": 0, "bias": False}, h, id="conv2")
    h = b.add("BatchNorm2d", {"momentum": 0.05}, h, id="bn2")
    h = b.add("SiLU", {}, h, id="silu")
    h = b.add("AvgPool2d", {"kernel_size": 2}, h, id="pool2")
    h = b.add("Flatten", {}, h, id="flat")
    h = b.add("BatchNorm1d", {}, h, id="bn3")
    h = b.add("Linear", {"out_features": 5}, h, id="head")
    b.add("Output", {"loss": "cross_entropy"}, h, id="out")
    return b.g


def resnet() -> Graph:
    b = Builder()
    x = b.add("Input", {"shape": [3, 8, 8]}, id="x")
    h = b.add("Conv2d", {"out_channels": 8}, x, id="stem")
    for i in (1, 2):
        c1 = b.add("Conv2d", {"out_channels": 8}, h, id=f"b{i}_conv1")
        r = b.add("ReLU", {}, b.add("BatchNorm2d", {}, c1, id=f"b{i}_bn1"), id=f"b{i}_relu1")
        c2 = b.add("BatchNorm2d", {}, b.add("Conv2d", {"out_channels": 8}, r, id=f"b{i}_conv2"), id=f"b{i}_bn2")
        s = b.add("Add", {}, c2, h, id=f"b{i}_add", ports=["a", "b"])
        h = b.add("ReLU", {}, s, id=f"b{i}_out")
    side = b.add("Sigmoid", {}, h, id="gate")
    h = b.add("Mul", {}, h, side, id="gated", ports=["a", "b"])
    h = b.add("Concat", {"dim": 1}, h, side, id="cat", ports=["in0", "in1"])
    h = b.add("AdaptiveAvgPool2d", {"output_size": 1}, h, id="gap")
    h = b.add("Flatten", {}, h, id="flat")
    h = b.add("Linear", {"out_features": 3}, h, id="fc")
    b.add("Output", {"loss": "cross_entropy"}, h, id="out")
    return b.g


def transformer() -> Graph:
    b = Builder()
    x = b.add("Input", {"shape": [10], "dtype": "int64"}, id="tokens")
    h = b.add("Embedding", {"num_embeddings": 32, "embedding_dim": 16}, x, id="embed")
    h = b.add("PositionalEmbedding", {"max_len": 16}, h, id="pos")  # max_len > T: the whole table must travel
    h = b.add("TransformerEncoderLayer", {"nhead": 2, "dim_feedforward": 32}, h, id="enc1")
    h = b.add("TransformerEncoderLayer", {"nhead": 4, "dim_feedforward": 24, "norm_first": False,
                                          "activation": "gelu"}, h, id="enc2")
    h = b.add("MultiheadAttention", {"num_heads": 2, "causal": True}, h, id="attn")
    h = b.add("LayerNorm", {}, h, id="norm")
    h = b.add("Mean", {"dim": 1}, h, id="pool")
    h = b.add("Linear", {"out_features": 4}, h, id="head")
    b.add("Output", {"loss": "cross_entropy"}, h, id="out")
    return b.g


def attention_parts() -> Graph:
    """Single-head attention from catalog parts: softmax(q k^T / 4) v, then slices and constants."""
    b = Builder()
    x = b.add("Input", {"shape": [10], "dtype": "int64"}, id="tokens")
    h = b.add("Embedding", {"num_embeddings": 32, "embedding_dim": 16}, x, id="embed")
    h = b.add("RMSNorm", {}, h, id="rms")
    q = b.add("Linear", {"out_features": 16, "bias": False}, h, id="q")
    k = b.add("Linear", {"out_features": 16, "bias": False}, h, id="k")
    v = b.add("Linear", {"out_features": 16}, h, id="v")
    kt = b.add("Transpose", {"dim0": 1, "dim1": 2}, k, id="kt")
    s = b.add("MatMul", {}, q, kt, id="scores", ports=["a", "b"])
    s = b.add("Scale", {"scale": 0.25}, s, id="scaled")
    a = b.add("Softmax", {"dim": -1}, s, id="attn")
    h = b.add("MatMul", {}, a, v, id="mix", ports=["a", "b"])
    h = b.add("Slice", {"dim": 1, "start": 2, "end": 8, "step": 2}, h, id="every2")
    h = b.add("Slice", {"dim": -1, "start": 4}, h, id="tail")
    h = b.add("Scale", {"scale": 0.5, "shift": 0.1, "shape": [12]}, h, id="affine")
    h = b.add("RMSNorm", {"eps": 1e-5, "elementwise_affine": False}, h, id="rms_plain")
    h = b.add("Mean", {"dim": 1}, h, id="pool")
    h = b.add("Linear", {"out_features": 4}, h, id="head")
    b.add("Output", {"loss": "cross_entropy"}, h, id="out")
    return b.g


def cnn_rect() -> Graph:
    """Non-square kernels, strides and padding in Conv2d and both poolings."""
    b = Builder()
    x = b.add("Input", {"shape": [3, 12, 10]}, id="image")
    h = b.add("Conv2d", {"out_channels": 6, "kernel_size": [3, 5], "stride": [1, 2], "padding": [1, 2]}, x, id="conv")
    h = b.add("Scale", {"shape": [6, 1, 1]}, h, id="per_channel")
    h = b.add("MaxPool2d", {"kernel_size": [2, 1]}, h, id="maxpool")
    h = b.add("AvgPool2d", {"kernel_size": [3, 1], "stride": 1, "padding": [1, 0]}, h, id="avgpool")
    h = b.add("Transpose", {"dim0": -1, "dim1": -2}, h, id="swap_hw")
    h = b.add("Flatten", {}, h, id="flat")
    h = b.add("Linear", {"out_features": 3}, h, id="head")
    b.add("Output", {"loss": "cross_entropy"}, h, id="out")
    return b.g


MODELS = {"mlp": mlp, "cnn_bn": cnn_bn, "resnet": resnet, "transformer": transformer,
          "attention_parts": attention_parts, "cnn_rect": cnn_rect}


def sample(graph: Graph, batch: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    inp = next(n for n in graph.nodes.values() if n.type == "Input")
    shape = (batch, *inp.params["shape"])
    if inp.params.get("dtype") == "int64":
        return torch.randint(0, 32, shape, generator=g)
    return torch.randn(shape, generator=g)


def project_with_weights(name: str, folder) -> Project:
    """The model with trained-looking weights (BatchNorm statistics moved off 0/1),
    saved as the project's weights file, so exports carry more than initial values."""
    from engine.diagram.compile import compile_graph

    graph = MODELS[name]()
    gm = compile_graph(graph).build(seed=3)
    gen = torch.Generator().manual_seed(7)
    state = gm.state_dict()
    for k, v in state.items():
        if k.endswith("running_mean"):
            v.copy_(torch.randn(v.shape, generator=gen) * 0.3)
        elif k.endswith("running_var"):
            v.copy_(torch.rand(v.shape, generator=gen) + 0.5)
        elif k.endswith("norm1.weight") or k.endswith("bn1.weight") or k.startswith("rms."):
            v.copy_(torch.rand(v.shape, generator=gen) + 0.5)
        elif k.endswith(".scale") or k.endswith(".shift"):  # Scale's constants, one per element
            v.copy_(torch.randn(v.shape, generator=gen))
    torch.save(state, folder / f"{name}.weights.pt")
    project = Project(graph, name=name, training=Training(seed=3), weights=f"{name}.weights.pt",
                      path=folder / f"{name}.lflow")
    return project


class BesselLayer(torch.nn.Module):
    """A Custom layer whose operator ONNX has no translation for."""

    def forward(self, x):
        return torch.special.bessel_j0(x)


class Swish(torch.nn.Module):
    """A harmless Custom layer of the user's own (trust tests)."""

    def forward(self, x):
        return x * torch.sigmoid(x)


class Swish2(Swish):
    pass
