"""Writes the bundled example projects. Run from the repository root:
    python resources/examples/build_examples.py
The .lflow files are committed; this script documents how they were made."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.diagram.graph import Graph  # noqa: E402
from engine.project import Placement, Project, Training, save_project  # noqa: E402

HERE = Path(__file__).resolve().parent
DX = 250.0  # node cards are 152 px wide: leaves room for the shape label on each edge


def chain(g: Graph, items, x0=0.0, y=0.0, dx=DX):
    """Add (id, type, params) in a row and connect each to the next."""
    prev = None
    for i, (nid, t, p) in enumerate(items):
        g.add_node(t, p, pos=(x0 + i * dx, y), id=nid)
        if prev:
            dst_port = "a" if t in ("Add", "Mul") else "in"
            g.connect(prev, "out", nid, dst_port)
        prev = nid
    return prev


def mlp_digits() -> Project:
    g = Graph()
    chain(g, [("x", "Input", {"shape": [64]}), ("fc1", "Linear", {"out_features": 128}), ("act1", "ReLU", {}),
              ("fc2", "Linear", {"out_features": 64}), ("act2", "ReLU", {}), ("head", "Linear", {"out_features": 10}),
              ("out", "Output", {"loss": "cross_entropy"})])
    tr = Training.model_validate({"dataset": {"kind": "digits"}, "optimizer": {"name": "adam", "lr": 0.003},
                                  "batch_size": 64, "steps": 300, "eval_interval": 50, "checkpoint_interval": 100})
    return Project(g, name="mlp_digits", description="A 3-layer perceptron on scikit-learn's 8x8 handwritten digits.",
                   training=tr)


def cnn_digits() -> Project:
    g = Graph()
    chain(g, [("x", "Input", {"shape": [1, 8, 8]}), ("conv1", "Conv2d", {"out_channels": 16}),
              ("bn1", "BatchNorm2d", {}), ("relu1", "ReLU", {}), ("pool1", "MaxPool2d", {"kernel_size": 2}),
              ("conv2", "Conv2d", {"out_channels": 32}), ("relu2", "ReLU", {}),
              ("gap", "AdaptiveAvgPool2d", {"output_size": 1}), ("flat", "Flatten", {}),
              ("head", "Linear", {"out_features": 10}), ("out", "Output", {"loss": "cross_entropy"})])
    tr = Training.model_validate({"dataset": {"kind": "digits", "image": True}, "optimizer": {"name": "adam", "lr": 0.003},
                                  "batch_size": 64, "steps": 300, "eval_interval": 50, "checkpoint_interval": 100})
    return Project(g, name="cnn_digits", description="A small CNN with batch norm on the digits as 1x8x8 images.",
                   training=tr)


def resnet_synthetic() -> Project:
    """No batch-dependent layers, so every layout gives the single-process losses."""
    g = Graph()
    last = chain(g, [("x", "Input", {"shape": [3, 16, 16]}), ("stem", "Conv2d", {"out_channels": 16}),
                     ("stem_act", "ReLU", {})])
    x = 3 * DX
    for b in (1, 2):
        y = 0.0
        chain(g, [(f"b{b}_conv1", "Conv2d", {"out_channels": 16}), (f"b{b}_act1", "ReLU", {}),
                  (f"b{b}_conv2", "Conv2d", {"out_channels": 16}), (f"b{b}_add", "Add", {}),
                  (f"b{b}_act2", "ReLU", {})], x0=x, y=y)
        g.connect(last, "out", f"b{b}_conv1", "in")
        g.connect(last, "out", f"b{b}_add", "b")  # the skip connection
        last = f"b{b}_act2"
        x += 5 * DX
    chain(g, [("gap", "AdaptiveAvgPool2d", {}), ("flat", "Flatten", {}), ("head", "Linear", {"out_features": 4}),
              ("out", "Output", {"loss": "cross_entropy"})], x0=x)
    g.connect(last, "out", "gap", "in")
    tr = Training.model_validate({"dataset": {"kind": "synthetic_images", "channels": 3, "height": 16, "width": 16,
                                              "n_classes": 4, "n_samples": 1024},
                                  "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
                                  "batch_size": 32, "steps": 100, "eval_interval": 25, "checkpoint_interval": 50})
    return Project(g, name="resnet_synthetic", training=tr, placement=Placement(),
                   description="Two residual blocks on synthetic 3x16x16 images; skips cross pipeline cuts.")


def transformer_synthetic() -> Project:
    """One pre-norm transformer block drawn from its parts, so tensor parallelism
    (column-wise q/k/v and fc_in, row-wise fc_out) can be placed per layer."""
    g = Graph()
    chain(g, [("tokens", "Input", {"shape": [16], "dtype": "int64"}),
              ("embed", "Embedding", {"num_embeddings": 32, "embedding_dim": 64}),
              ("pos", "PositionalEmbedding", {"max_len": 16}),
              ("ln1", "LayerNorm", {}), ("attn", "MultiheadAttention", {"num_heads": 4}),
              ("res1", "Add", {}), ("ln2", "LayerNorm", {}), ("fc_in", "Linear", {"out_features": 128}),
              ("gelu", "GELU", {}), ("fc_out", "Linear", {"out_features": 64}), ("res2", "Add", {}),
              ("ln_f", "LayerNorm", {}), ("pool", "Mean", {"dim": 1}), ("head", "Linear", {"out_features": 4}),
              ("out", "Output", {"loss": "cross_entropy"})])
    # res1 = pos + attn: the chain fed attn -> res1.a; the skip comes from pos
    g.connect("pos", "out", "res1", "b")
    g.connect("res1", "out", "res2", "b")
    # ln2 reads res1 (the chain connected res1 -> ln2 already)
    for nid, y in (("ln1", -110), ("attn", -110), ("ln2", -110), ("fc_in", -110), ("gelu", -110), ("fc_out", -110)):
        n = g.nodes[nid]
        g.move(nid, (n.pos[0], y))
    tr = Training.model_validate({"dataset": {"kind": "synthetic_sequence", "seq_len": 16, "vocab_size": 32,
                                              "n_classes": 4, "n_samples": 2048},
                                  "optimizer": {"name": "adamw", "lr": 0.002, "weight_decay": 0.01},
                                  "schedule": {"name": "cosine", "warmup_steps": 10},
                                  "batch_size": 32, "steps": 150, "eval_interval": 25, "checkpoint_interval": 50})
    # 15 nodes in a row need ~3800 px: top down they fit a laptop's canvas whole (cards and names)
    from engine.diagram.layout import set_direction

    set_direction(g, "TB")
    return Project(g, name="transformer_synthetic", training=tr,
                   description="A tiny pre-norm transformer classifying synthetic token sequences.")


if __name__ == "__main__":
    for make in (mlp_digits, cnn_digits, resnet_synthetic, transformer_synthetic):
        p = make()
        path = save_project(p, HERE / f"{p.name}.lflow")
        print("wrote", path)
