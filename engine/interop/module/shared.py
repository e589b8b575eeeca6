"""Values computed once and handed on, kept as one node.

A T5-style encoder computes its relative position bias in the first block and passes it
to the others; a model may build a rotary table or a mask once for all its layers. Such a
value has no batch dimension, so the importer would fold it into each node that reads it:
every block would rebuild it, reading the same weight (a tie the source does not have,
which also pins those blocks to one pipeline stage). Instead it becomes one Op node that
computes it and gives it expanded over the batch (a view: no copy), and each reader takes
it back with x[0]; the diagram then says what the source does.
"""
from __future__ import annotations

import torch
from torch import fx


def shared_values(gm: fx.GraphModule, dep: set, lifted: dict, stack) -> set[fx.Node]:
    """Batch-independent values computed from a parameter or buffer that calls of two or
    more modules read (the calls that carry the batch)."""
    weighted: set[fx.Node] = set()
    out: set[fx.Node] = set()
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            if n.name in lifted and lifted[n.name][0] in ("PARAMETER", "BUFFER"):
                weighted.add(n)
            continue
        if n.op != "call_function" or n in dep or not any(a in weighted for a in n.all_input_nodes):
            continue
        weighted.add(n)
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor) or any(not isinstance(d, int) for d in val.shape):
            continue
        readers = {(stack(u)[-1][0] if stack(u) else u.name) for u in n.users if u in dep}
        if len(readers) >= 2:
            out.add(n)
    return out


def batch_view(code: list, inputs: list[fx.Node], v: fx.Node, first_input: fx.Node) -> tuple[list, list[fx.Node]]:
    """`code` (which computes v) followed by v expanded over the batch of its first diagram
    input (the model's first input when it reads none)."""
    if not inputs:
        inputs = [first_input]
    taken = {c[0] for c in code}

    def name(base):
        while base in taken:
            base += "_"
        taken.add(base)
        return base

    size, one, out = name(f"{v.name}_batch"), name(f"{v.name}_one"), name(f"{v.name}_shared")
    shape = [int(d) for d in v.meta["val"].shape]
    return code + [[size, "aten.sym_size.int", [{"$": "in0"}, 0], {}],
                   [one, "aten.unsqueeze.default", [{"$": v.name}, 0], {}],
                   [out, "aten.expand.default", [{"$": one}, [{"$": size}, *shape]], {}]], inputs
