"""Dead calls out of an imported diagram.

A forward often computes values it never uses: a Hugging Face-style encoder builds an
extended attention mask, position ids or token-type ids that its attention path then
ignores. torch.export records those calls; kept, each would be a node that reaches no
Output (a `validate` warning apiece, and work the runtime would do for nothing). They
are removed here: every node from which no Output can be reached, except the Inputs
(forward takes them). A dead call that holds parameters is removed too and named in a
note, so the parameter count is explained, never silently short.
"""
from __future__ import annotations

import torch

from engine.diagram.graph import Graph


def live_nodes(graph: Graph) -> set[str]:
    """The nodes an Output reads, directly or not (the Outputs and Inputs included)."""
    live = {nid for nid, n in graph.nodes.items() if n.type in ("Output", "Input")}
    todo = [nid for nid, n in graph.nodes.items() if n.type == "Output"]
    sources: dict[str, list[str]] = {}  # node -> the nodes it reads (one pass over the edges, not one per node)
    for e in graph.edges:
        sources.setdefault(e.dst, []).append(e.src)
    while todo:
        for p in sources.get(todo.pop(), ()):
            if p not in live:
                live.add(p)
                todo.append(p)
    return live


def drop_dead(graph: Graph, state: dict[str, torch.Tensor]) -> list[str]:
    """Remove the nodes no Output reads (and their weights); the notes it has to make."""
    live = live_nodes(graph)
    dead = [nid for nid in graph.nodes if nid not in live]
    if not dead:
        return []
    gone = set(dead)
    # a tie whose first holder is dead moves to its first living holder
    for key, owner in list(graph.ties.items()):
        if owner.partition(".")[0] not in gone:
            continue
        heirs = [k for k, v in graph.ties.items() if v == owner and k.partition(".")[0] not in gone]
        if heirs:
            heir = heirs[0]
            state[heir] = state[owner]
            del graph.ties[heir]
            for k in heirs[1:]:
                graph.ties[k] = heir
    for key in [k for k, v in graph.ties.items() if k.partition(".")[0] in gone or v.partition(".")[0] in gone]:
        del graph.ties[key]
    held = []
    for nid in dead:
        graph.remove_node(nid)
        keys = [k for k in state if k.partition(".")[0] == nid]
        n = sum(state[k].numel() for k in keys if state[k].is_floating_point())
        if n:
            held.append(f"'{nid}' ({n} weights)")
        for k in keys:
            del state[k]
    notes = []
    if held:
        notes.append(f"calls whose results reach no output were left out, with their weights: {', '.join(held)}")
    return notes
