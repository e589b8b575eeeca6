"""Layered (Sugiyama-style) auto-layout, left to right or top down (graph.direction),
with blocks laid out as units.

1. layers: longest path from the sources (a node sits one column right of its
   rightmost input), so every edge points rightwards;
2. order within a column: a few barycenter sweeps (down and up) to cut crossings;
   a long edge takes a lane (dummy node) in each column it crosses, so a skip
   connection runs beside the chain, not through it;
3. coordinates: columns as wide as their widest unit, units stacked and centred,
   then each nudged towards the mean height of its neighbours where there is room.

Top down is the same layout with the axes swapped: layers become rows, the order
within a layer runs left to right (units are measured across the flow, so wide frames
sit side by side).

`view_layout` lays out what the editor shows: a collapsed block is one unit the size
of its card (its nodes all sit at the card's corner), an expanded block is a unit
whose inside is laid out first, recursively, so the module tree of an imported model
reads as nested boxes. Pure Python (no Qt): it returns positions; the editor makes one
undo step of them.
"""
from __future__ import annotations

from engine.diagram.graph import BLOCK_SEP, Graph, block_path, in_block, ports_of

COL_W = 250.0
NODE_W = 152.0  # matches widgets.node_scene.NODE_W
COL_GAP = COL_W - NODE_W
ROW_GAP = 40.0
LAYER_GAP_TB = 60.0  # between rows top down (edges run vertically there: less room needed than for labels across)
NODE_H_BASE = 54.0  # matches widgets.node_scene.node_height: BODY_TOP + 6
ROW_H = 18.0
CARD_EXTRA = 2 * ROW_H  # a block card's two lines of figures (type and size, shapes)
DUMMY_H = 16.0  # the lane a long edge takes in a column it crosses
BLOCK_UNIT = "\x01"  # prefix of a block among the units of a layout (a node may have a block's name)
FRAME = (16.0, 34.0, 16.0, 16.0)  # an expanded block's frame around its inside: left, top, right, bottom


def _height(graph: Graph, nid: str) -> float:
    node = graph.nodes[nid]
    ins, outs = ports_of(node.type, node.params)
    return NODE_H_BASE + max(len(ins), len(outs), 1) * ROW_H


def layered_layout(graph: Graph, ids: list[str] | None = None, origin: tuple[float, float] | None = None) -> dict[str, tuple[float, float]]:
    """Positions of `ids` (default: every node), ignoring blocks."""
    ids = list(graph.nodes) if ids is None else [n for n in graph.nodes if n in set(ids)]
    if not ids:
        return {}
    keep = set(ids)
    succ: dict[str, list[str]] = {n: [] for n in ids}
    pred: dict[str, list[str]] = {n: [] for n in ids}
    for e in graph.edges:
        if e.src in keep and e.dst in keep and e.src != e.dst:
            succ[e.src].append(e.dst)
            pred[e.dst].append(e.src)
    if origin is None:
        xs = [graph.nodes[n].pos[0] for n in ids]
        ys = [graph.nodes[n].pos[1] for n in ids]
        origin = (min(xs), min(ys)) if ids != list(graph.nodes) else (0.0, 0.0)
    sizes = {n: (NODE_W, _height(graph, n)) for n in ids}
    rel = _layered(ids, succ, pred, sizes, graph.direction == "TB")
    return {n: (round((origin[0] + x) / 20) * 20.0, round((origin[1] + y) / 20) * 20.0) for n, (x, y) in rel.items()}


def _layered(ids: list[str], succ: dict[str, list[str]], pred: dict[str, list[str]],
             sizes: dict[str, tuple[float, float]], top_down: bool = False) -> dict[str, tuple[float, float]]:
    """Top-left corners (from 0, 0) of units of the given (width, height): layers are
    columns from left to right, or (`top_down`) rows from the top."""
    if top_down:  # lay out the transposed picture, then transpose it back
        k = COL_GAP / LAYER_GAP_TB  # (the gap between layers is COL_GAP; heights scaled so it reads LAYER_GAP_TB)
        flipped = _layered(ids, succ, pred, {n: (h * k, w) for n, (w, h) in sizes.items()})
        return {n: (y, x / k) for n, (x, y) in flipped.items()}
    succ = {n: list(v) for n, v in succ.items()}
    pred = {n: list(v) for n, v in pred.items()}
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

    def index(col):  # (only the column just sorted moved: indexing every column each time is quadratic)
        for i, n in enumerate(col):
            pos_in_col[n] = i

    for col in cols:
        index(col)
    for _ in range(4):
        for c in range(1, n_layers):
            cols[c].sort(key=lambda n: (sum(pos_in_col[p] for p in pred[n]) / len(pred[n])) if pred[n] else pos_in_col[n])
            index(cols[c])
        for c in range(n_layers - 2, -1, -1):
            cols[c].sort(key=lambda n: (sum(pos_in_col[s] for s in succ[n]) / len(succ[n])) if succ[n] else pos_in_col[n])
            index(cols[c])
    # 3. coordinates
    heights = {n: sizes[n][1] for n in ids}
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
    col_x, x = [], 0.0
    for col in cols:
        col_x.append(x)
        x += max((sizes[n][0] for n in col if n in sizes), default=0.0) + COL_GAP
    top = min((center[n] - heights[n] / 2 for n in ids), default=0.0)
    return {n: (col_x[layer[n]], center[n] - heights[n] / 2 - top) for n in ids}



# ----- blocks as units ------------------------------------------------------------------
def _card_height(graph: Graph, members: set[str]) -> float:
    ins = {(e.src, e.src_port) for e in graph.edges if e.dst in members and e.src not in members}
    outs = {(e.src, e.src_port) for e in graph.edges if e.src in members and e.dst not in members}
    return NODE_H_BASE + max(len(ins), len(outs), 1) * ROW_H + CARD_EXTRA


def _signature(graph: Graph, block: str, members: list[str]) -> tuple:
    """What a block computes, to tell repeats apart: its layers' types and parameters
    (and their nesting), in order, relative to the block."""
    import json

    depth = block.count(BLOCK_SEP) + 1
    out = []
    for nid in members:
        n = graph.nodes[nid]
        inner = tuple(b.count(BLOCK_SEP) - depth for b in block_path(n.group)[depth:])
        params = _canonical_op(n.params) if n.type == "Op" else n.params
        out.append((n.type, json.dumps(params, sort_keys=True, default=str), inner))
    return tuple(out)


def _canonical_op(p: dict) -> dict:
    """An Op node's program with its value and weight names replaced by their order
    (two calls of the same code read as the same)."""
    names = {c[0]: f"v{i}" for i, c in enumerate(p.get("code") or [])}
    names.update({w: f"w{i}" for i, w in enumerate(p.get("weights") or {})})

    def sub(v):
        if isinstance(v, dict):
            return {k: (names.get(x, x) if k == "$" else sub(x)) for k, x in v.items()}
        if isinstance(v, list):
            return [sub(x) for x in v]
        return v
    return {"inputs": p.get("inputs"), "code": [[names[c[0]], c[1], sub(c[2]), sub(c[3])] for c in p.get("code") or []],
            "weights": [w for w in (p.get("weights") or {}).values()], "label": p.get("label")}


def repeated_runs(graph: Graph) -> dict[str, list[str]]:
    """Runs of two or more identical sibling blocks, each fed only by the one before
    (ResNet's layer3.1 .. layer3.5, a GPT's h.0 .. h.11): block -> its run. Kept on the
    graph until its structure changes (moving or collapsing does not change it)."""
    key = (graph.structure_version, len(graph.nodes), len(graph.edges), id(graph.edges))
    cached = getattr(graph, "_runs_cache", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    out = _repeated_runs(graph)
    graph._runs_cache = (key, out)
    return out


def _repeated_runs(graph: Graph) -> dict[str, list[str]]:
    members: dict[str, list[str]] = {}
    for nid, n in graph.nodes.items():
        for b in block_path(n.group):
            members.setdefault(b, []).append(nid)
    if not members:
        return {}
    order = {nid: i for i, nid in enumerate(graph.nodes)}
    feeds_of: dict[str, set[str]] = {}  # node -> the nodes feeding it
    for e in graph.edges:
        feeds_of.setdefault(e.dst, set()).add(e.src)
    siblings: dict[str, list[str]] = {}
    for b in members:
        siblings.setdefault(b.rpartition(BLOCK_SEP)[0], []).append(b)
    out: dict[str, list[str]] = {}
    for sibs in siblings.values():
        if len(sibs) < 2:
            continue
        sibs.sort(key=lambda b: order[members[b][0]])
        sig: dict[str, tuple] = {}

        def signature(b: str) -> tuple:
            if b not in sig:
                sig[b] = _signature(graph, b, members[b])
            return sig[b]

        run = [sibs[0]]
        for prev, b in zip(sibs, sibs[1:]):
            same = len(members[b]) == len(members[prev]) and signature(b) == signature(prev)
            if same:
                mine = set(members[b])
                feeds = {src for nid in mine for src in feeds_of.get(nid, ()) if src not in mine}
                same = bool(feeds) and all(in_block(graph.nodes[src].group, prev) for src in feeds)
            if same:
                run.append(b)
                continue
            if len(run) > 1:
                out.update({x: run for x in run})
            run = [b]
        if len(run) > 1:
            out.update({x: run for x in run})
    return out


def card_of(graph: Graph, nid: str, runs: dict[str, list[str]] | None = None) -> str | None:
    """The card that stands for a node in the editor (its outermost collapsed block, or
    the first block of the folded run that block is in); None: the node shows itself."""
    b = graph.outermost_collapsed(nid)
    if b is None:
        return None
    run = (repeated_runs(graph) if runs is None else runs).get(b)
    return run[0] if run and folded(graph, run) else b


def folded(graph: Graph, run: list[str]) -> bool:
    """A run shows as one card: all its blocks collapsed and the user has not unfolded it."""
    return run[0] not in graph.unfolded and all(b in graph.collapsed for b in run)


def view_layout(graph: Graph, origin: tuple[float, float] = (0.0, 0.0)) -> dict[str, tuple[float, float]]:
    """Positions of every node for the editor's current view (graph.collapsed): blocks
    are laid out as units, inside out."""
    pos: dict[str, tuple[float, float]] = {}
    runs = repeated_runs(graph)

    def unit_of(nid: str, depth: int) -> str:
        """What stands for a node among the units of a container at `depth` (a folded
        run of repeats is one unit, named after its first block)."""
        path = block_path(graph.nodes[nid].group)
        if len(path) <= depth:
            return nid
        run = runs.get(path[depth])
        return BLOCK_UNIT + (run[0] if run and folded(graph, run) else path[depth])

    def place(block: str | None, depth: int) -> tuple[float, float]:
        """Lay out the inside of `block` (None: the whole diagram) from (0, 0) in `pos`
        (relative); its size."""
        members = graph.block_members(block) if block else list(graph.nodes)
        units: list[str] = []
        inner: dict[str, list[str]] = {}
        for nid in members:
            u = unit_of(nid, depth)
            if u not in inner:
                inner[u] = []
                units.append(u)
            inner[u].append(nid)
        sizes: dict[str, tuple[float, float]] = {}
        for u in units:
            if not u.startswith(BLOCK_UNIT):
                sizes[u] = (NODE_W, _height(graph, u))
            elif u[1:] in graph.collapsed:
                sizes[u] = (NODE_W, _card_height(graph, set(inner[u])))
                for nid in inner[u]:
                    pos[nid] = (0.0, 0.0)
            else:
                w, h = place(u[1:], depth + 1)
                sizes[u] = (w + FRAME[0] + FRAME[2], h + FRAME[1] + FRAME[3])
                for nid in inner[u]:
                    x, y = pos[nid]
                    pos[nid] = (x + FRAME[0], y + FRAME[1])
        owner = {nid: u for u, ns in inner.items() for nid in ns}
        succ: dict[str, list[str]] = {u: [] for u in units}
        pred: dict[str, list[str]] = {u: [] for u in units}
        for e in graph.edges:
            a, b = owner.get(e.src), owner.get(e.dst)
            if a is not None and b is not None and a != b and b not in succ[a]:
                succ[a].append(b)
                pred[b].append(a)
        corners = _layered(units, succ, pred, sizes, graph.direction == "TB")
        for u in units:
            cx, cy = corners[u]
            if not u.startswith(BLOCK_UNIT):
                pos[u] = (cx, cy)
            else:
                for nid in inner[u]:
                    x, y = pos[nid]
                    pos[nid] = (x + cx, y + cy)
        width = max((corners[u][0] + sizes[u][0] for u in units), default=0.0)
        height = max((corners[u][1] + sizes[u][1] for u in units), default=0.0)
        return width, height

    if graph.nodes:
        place(None, 0)
    return {n: (round((origin[0] + x) / 20) * 20.0, round((origin[1] + y) / 20) * 20.0) for n, (x, y) in pos.items()}


def lay_out(graph: Graph, direction: str | None = None) -> dict[str, tuple[float, float]]:
    """Positions of every node for the editor's Auto-Layout of the whole diagram (blocks
    as units where it has blocks), the way data flows in `direction` (default the
    graph's own; the graph is not changed)."""
    old = graph.direction
    graph.direction = direction or old
    try:
        return view_layout(graph) if graph.blocks() else layered_layout(graph)
    finally:
        graph.direction = old


def set_direction(graph: Graph, direction: str) -> None:
    """Make data flow in `direction` and lay the diagram out so (the command line's and
    a fresh import's way; the editor makes it one undo step)."""
    pos = lay_out(graph, direction)
    graph.set_direction(direction)
    for nid, p in pos.items():
        graph.move(nid, p)


def blocks_from_scopes(graph: Graph) -> None:
    """Imported nodes' module tree (Node.scope) as nested blocks, the outer ones collapsed:
    ResNet-50 opens as a stem, four stages and a head. A block holding a single node is
    no block (the node says it all); the diagram is laid out again on collapse/expand."""
    paths: dict[str, list[str]] = {}
    for nid, node in graph.nodes.items():
        scope = node.scope or []
        own = scope and _own_module(nid, scope[-1][0])
        path = [p.replace(BLOCK_SEP, "_") for p, _ in (scope[:-1] if own else scope)]
        paths[nid] = path
    count: dict[str, int] = {}
    for path in paths.values():
        for i in range(len(path)):
            key = BLOCK_SEP.join(path[: i + 1])
            count[key] = count.get(key, 0) + 1
    for nid, path in paths.items():
        while path and count[BLOCK_SEP.join(path)] < 2:
            path = path[:-1]
        graph.nodes[nid].group = BLOCK_SEP.join(path) if path else None
    blocks = graph.blocks()
    top = {b for b in blocks if BLOCK_SEP not in b}
    shown = set()
    if len(top) == 1 and len(blocks) > 1:  # one wrapper around everything: show what it holds
        shown = top
    graph.set_collapsed(blocks - shown)  # expanding a stage shows its blocks; expanding one, its layers
    graph.layout = "hierarchy" if blocks else None
    for nid, p in view_layout(graph).items():
        graph.nodes[nid].pos = p


def _own_module(nid: str, path: str) -> bool:
    """The node was made from the module at `path` (its id is that path, made an identifier)."""
    import re

    base = re.sub(r"[^A-Za-z0-9_]", "_", path).strip("_")
    return nid == base or nid.startswith(base + "_call") or nid.startswith(base + "_")  and nid[len(base) + 1:].isdigit()
