"""Layered (Sugiyama-style) auto-layout, left to right.

1. layers: longest path from the sources (a node sits one column right of its
   rightmost input), so every edge points rightwards;
2. order within a column: a few barycenter sweeps (down and up) to cut crossings;
3. coordinates: columns at fixed spacing, nodes stacked and centred, then each
   node nudged towards the mean height of its neighbours where there is room.
Pure Python (no Qt): it returns positions; the controller makes one undo step.
"""
from __future__ import annotations

from engine.graph import Graph, ports_of

COL_W = 250.0
ROW_GAP = 40.0
NODE_H_BASE = 54.0  # matches widgets.node_scene.node_height: BODY_TOP + 6
ROW_H = 18.0
DUMMY_H = 16.0  # the lane a long edge takes in a column it crosses


def _height(graph: Graph, nid: str) -> float:
    node = graph.nodes[nid]
    ins, outs = ports_of(node.type, node.params)
    return NODE_H_BASE + max(len(ins), len(outs), 1) * ROW_H


def layered_layout(graph: Graph, ids: list[str] | None = None, origin: tuple[float, float] | None = None) -> dict[str, tuple[float, float]]:
    ids = list(graph.nodes) if ids is None else [n for n in graph.nodes if n in set(ids)]
    if not ids:
        return {}
    keep = set(ids)
    succ = {n: [] for n in ids}
    pred = {n: [] for n in ids}
    for e in graph.edges:
        if e.src in keep and e.dst in keep and e.src != e.dst:
            succ[e.src].append(e.dst)
            pred[e.dst].append(e.src)
    # 1. longest-path layering (Kahn; nodes on a cycle, if any, go last)
    indeg = {n: len(pred[n]) for n in ids}
    ready = [n for n in ids if indeg[n] == 0]
    layer = {n: 0 for n in ids}
    seen = []
    while ready:
        n = ready.pop(0)
        seen.append(n)
        for s in succ[n]:
            layer[s] = max(layer[s], layer[n] + 1)
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    for n in ids:
        if n not in seen:
            layer[n] = max(layer.values()) + 1
    # pull sources right next to their first consumer (an Input far left of its use looks odd)
    for n in ids:
        if not pred[n] and succ[n]:
            layer[n] = max(layer[n], min(layer[s] for s in succ[n]) - 1)
    n_layers = max(layer.values()) + 1
    # long edges get a dummy node in every column they cross, so that ordering
    # keeps a lane free for them (a skip connection runs beside the chain, not through it)
    dummies: list[str] = []
    for u in list(ids):
        for v in list(succ[u]):
            span = layer[v] - layer[u]
            if span <= 1:
                continue
            succ[u].remove(v)
            pred[v].remove(u)
            prev = u
            for k in range(1, span):
                d = f"\0{u}>{v}#{k}"
                dummies.append(d)
                layer[d] = layer[u] + k
                succ[d], pred[d] = [], [prev]
                succ[prev].append(d)
                prev = d
            succ[prev].append(v)
            pred[v].append(prev)
    cols: list[list[str]] = [[] for _ in range(n_layers)]
    for n in [*ids, *dummies]:  # model order as the first guess
        cols[layer[n]].append(n)
    # 2. barycenter sweeps
    pos_in_col = {}

    def index():
        for col in cols:
            for i, n in enumerate(col):
                pos_in_col[n] = i

    index()
    for _ in range(4):
        for c in range(1, n_layers):
            cols[c].sort(key=lambda n: (sum(pos_in_col[p] for p in pred[n]) / len(pred[n])) if pred[n] else pos_in_col[n])
            index()
        for c in range(n_layers - 2, -1, -1):
            cols[c].sort(key=lambda n: (sum(pos_in_col[s] for s in succ[n]) / len(succ[n])) if succ[n] else pos_in_col[n])
            index()
    # 3. coordinates
    if origin is None:
        xs = [graph.nodes[n].pos[0] for n in ids]
        ys = [graph.nodes[n].pos[1] for n in ids]
        origin = (min(xs), min(ys)) if ids != list(graph.nodes) else (0.0, 0.0)
    heights = {n: _height(graph, n) for n in ids}
    heights.update({d: DUMMY_H for d in dummies})
    center: dict[str, float] = {}
    tallest = max(sum(heights[n] for n in col) + ROW_GAP * (len(col) - 1) for col in cols)
    for col in cols:
        total = sum(heights[n] for n in col) + ROW_GAP * (len(col) - 1)
        y = (tallest - total) / 2
        for n in col:
            center[n] = y + heights[n] / 2
            y += heights[n] + ROW_GAP
    # nudge towards predecessors' centres, keeping order and gaps (straightens chains)
    for c in range(1, n_layers):
        col = cols[c]
        want = [sum(center[p] for p in pred[n]) / len(pred[n]) if pred[n] else center[n] for n in col]
        prev_bottom = -1e18
        for n, w in zip(col, want):
            top = max(w - heights[n] / 2, prev_bottom + ROW_GAP)
            center[n] = top + heights[n] / 2
            prev_bottom = top + heights[n]
    out = {}
    for n in ids:
        x = origin[0] + layer[n] * COL_W
        y = origin[1] + center[n] - heights[n] / 2
        out[n] = (round(x / 20) * 20.0, round(y / 20) * 20.0)
    return out
