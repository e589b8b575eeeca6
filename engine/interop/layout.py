"""A simple layered layout for imported diagrams: data flows left to right.

Each node goes in the column of its longest path from an input; within a column,
nodes are ordered by the mean row of their predecessors (one barycenter sweep),
which keeps skip connections short and parallel branches side by side.
"""
from __future__ import annotations

from engine.graph import Graph

DX, DY = 220.0, 120.0


def layered_layout(graph: Graph, dx: float = DX, dy: float = DY) -> None:
    order = graph.topo_order()
    layer: dict[str, int] = {}
    for nid in order:
        preds = graph.predecessors(nid)
        layer[nid] = 1 + max((layer[p] for p in preds), default=-1)
    columns: dict[int, list[str]] = {}
    for nid in order:
        columns.setdefault(layer[nid], []).append(nid)
    row: dict[str, float] = {}
    for col in sorted(columns):
        ids = columns[col]
        def key(nid: str) -> float:
            preds = graph.predecessors(nid)
            return sum(row[p] for p in preds) / len(preds) if preds else 0.0
        ids.sort(key=key)  # stable: ties keep topological order
        for i, nid in enumerate(ids):
            row[nid] = i - (len(ids) - 1) / 2
    for nid in order:
        graph.move(nid, (layer[nid] * dx, row[nid] * dy))
