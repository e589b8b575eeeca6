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


class WeightsRefused(ValueError):
    """A weights file that is not a state_dict of tensors as torch.load(weights_only=True)
    reads one (pickled Python objects, which could run code; not torch's at all): one line
    naming the file, why, and what to do. Nothing of it was run."""


def pickled_globals(path, limit: int = 5) -> list[str]:
    """The Python objects ('posix.system') a pickle or torch file names, read from its
    opcodes (nothing is run, nothing imported); [] where none can be told."""
    import pickletools
    import zipfile

    try:
        if zipfile.is_zipfile(path):
            return torch.serialization.get_unsafe_globals_in_checkpoint(path)[:limit]
        names: list[str] = []
        strings: list[str] = []
        with open(path, "rb") as f:
            for i, (op, arg, _) in enumerate(pickletools.genops(f)):
                if i > 100_000 or len(names) >= limit:
                    break
                if op.name == "GLOBAL":  # protocols 0-3: "module name"
                    names.append(str(arg).replace(" ", ".", 1))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:  # protocol 4+: the last two strings
                    names.append(f"{strings[-2]}.{strings[-1]}")
                elif isinstance(arg, str) and "UNICODE" in op.name:
                    strings.append(arg)
        return list(dict.fromkeys(names))
    except Exception:  # noqa: BLE001 - not a pickle we can walk: the refusal says it without names
        return []


def read_weights(path) -> dict[str, torch.Tensor]:
    """A weights file (a state_dict saved by torch) read without running anything:
    torch.load(weights_only=True), and a dictionary of tensors by name; else
    WeightsRefused in one line. OSError (missing, unreadable) is left to the caller."""
    import pickle
    import warnings
    import zipfile

    try:
        with warnings.catch_warnings():  # (torch's note on a raw pickle's protocol: the refusal below says more)
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        names = pickled_globals(path)
        what = f" ({', '.join(names)})" if names else ""
        raise WeightsRefused(
            f"{path}: not loaded: it holds pickled Python objects{what}, not only tensors, and reading them could "
            "run code (torch.load with weights_only=True refuses them); re-save it as a state_dict of tensors "
            "(torch.save(model.state_dict(), PATH), in a Python you trust), or use weights Layerflow wrote") from None
    except (RuntimeError, EOFError, ValueError, KeyError, IndexError, AttributeError, zipfile.BadZipFile) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise WeightsRefused(f"{path}: not a weights file Layerflow reads (torch.load: {first}); give a state_dict "
                             "saved by torch.save(model.state_dict(), PATH)") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise WeightsRefused(f"{path}: does not hold a state_dict (a dictionary of tensors by parameter name); "
                             "save one with torch.save(model.state_dict(), PATH)")
    return state


def load_weights(gm: nn.Module, path: str) -> None:
    """Load a weights file written by engine/project.py (a state_dict saved by torch);
    WeightsRefused in one line for anything else."""
    state = read_weights(path)
    missing, unexpected = gm.load_state_dict(state, strict=False)
    if unexpected:
        raise ValueError(f"weights file {path} has entries for no layer of the diagram: {', '.join(sorted(unexpected)[:10])}")
