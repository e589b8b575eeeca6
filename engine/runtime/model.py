"""Build the torch.fx GraphModule of a diagram from its resolved spec.

The spec is what engine/diagram/compile.py writes after checking the diagram: plain JSON,
so it travels in a run bundle to cluster nodes, where this file rebuilds the very
same module (same names, same order, same initial weights for the same seed).

spec = {
  "nodes": [{"id": "fc1", "type": "Linear", "params": {...}, "args": ["x"]}, ...],  # topological order
  "inputs": ["x"],        # Input node ids, in placeholder order
  "outputs": ["out"],     # Output node ids
  "ties": {"head.weight": "wte.weight"},  # optional: parameters that are one tensor
}
Every node has one output, named by its id; "args" are the ids that feed its input
ports, in port order. Output nodes have one arg and become the graph's output.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from .layers import FUNCTION_LAYERS, build_layer

INPUT, OUTPUT = "Input", "Output"


def build_graph_module(spec: dict, device: str | torch.device = "cpu", seed: int | None = None) -> fx.GraphModule:
    """The diagram as a GraphModule. With `seed`, initial weights are a function of
    the seed alone (modules are built in the spec's topological order)."""
    if seed is not None:
        torch.manual_seed(seed)
    root = nn.Module()
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    outputs: list[fx.Node] = []
    with torch.device(device):
        for n in spec["nodes"]:
            nid, ntype, params = n["id"], n["type"], n.get("params", {})
            args = [env[a] for a in n.get("args", [])]
            if ntype == INPUT:
                env[nid] = graph.create_node("placeholder", nid, name=nid)
            elif ntype == OUTPUT:
                outputs.append(args[0])
            elif ntype in FUNCTION_LAYERS:
                fn, kwargs = FUNCTION_LAYERS[ntype](params)
                fargs: tuple[Any, ...] = (tuple(args),) if fn is torch.cat else tuple(args)
                env[nid] = graph.create_node("call_function", fn, fargs, kwargs, name=nid)
            else:
                root.add_module(nid, build_layer(ntype, params))
                env[nid] = graph.create_node("call_module", nid, tuple(args), name=nid)
    graph.output(outputs[0] if len(outputs) == 1 else tuple(outputs))
    gm = fx.GraphModule(root, graph, class_name="LayerflowModel")
    tie_parameters(gm, spec.get("ties") or {})
    return gm


def tie_parameters(model: nn.Module, ties: dict[str, str]) -> None:
    """Make each tied parameter the very object it is tied to: one tensor, one
    gradient, counted once by parameters() and by the optimizer."""
    for dst, src in ties.items():
        owner, _, name = dst.rpartition(".")
        setattr(model.get_submodule(owner), name, model.get_parameter(src))


def load_weights(gm: nn.Module, path: str) -> None:
    """Load a weights file written by engine/project.py (a state_dict saved by torch)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    missing, unexpected = gm.load_state_dict(state, strict=False)
    if unexpected:
        raise ValueError(f"weights file {path} has entries for no layer of the diagram: {', '.join(sorted(unexpected)[:10])}")
