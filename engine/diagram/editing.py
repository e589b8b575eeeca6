"""Edits of a diagram that take more than one model call: paste (and duplicate),
grouping into blocks, ungrouping, repeating a block, renaming. No Qt.

Each edit is planned first: a `plan_*` function reads the graph and returns what to
change (a `Paste`, `Grouping` or `Repeat`), or raises EditError saying why it cannot
be done. The plan is then applied: the editor wraps each part in an undo command
(app/controller.py), the Python API and scripts call `apply(graph, plan)`. One rule
for names: `fresh_id` (a free id like relu, relu_2, relu_3) and `check_rename`
(graph.valid_id, the model's own id rule, and not taken).
"""
from __future__ import annotations

import copy
import re
from collections import Counter
from dataclasses import dataclass, field

from engine.errors import LayerflowError
from engine.diagram.graph import BLOCK_SEP, Edge, Graph, Node, block_name, block_path, valid_id
from engine.diagram.layout import COL_W

BLOCK_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_ -]*$")


class EditError(LayerflowError, ValueError):
    """An edit that cannot be made; the message names the node or block."""


def fresh_id(base: str, taken: set[str] | dict) -> str:
    """A free identifier like base, base_2, base_3 ... (base itself when it is free)."""
    if base not in taken:
        return base
    stem = re.sub(r"(_\d+)$", "", base)
    i = 2
    while f"{stem}_{i}" in taken:
        i += 1
    return f"{stem}_{i}"


def check_rename(graph: Graph, old: str, new: str) -> None:
    if old not in graph.nodes:
        raise EditError(f"no node '{old}' to rename")
    if new != old and new in graph.nodes:
        raise EditError(f"cannot rename '{old}' to '{new}': that name is taken")
    if not valid_id(new):
        raise EditError(f"cannot rename '{old}' to '{new}': use letters, digits and _, not starting with a digit "
                        "and not a Python keyword")


# ----- paste / duplicate -------------------------------------------------------------
@dataclass
class Paste:
    nodes: list[dict]  # node dicts with their new ids, positions and blocks
    edges: list[dict]
    rename: dict[str, str]  # id in the copied subgraph -> id in the diagram
    blocks: dict[str, str] = field(default_factory=dict)  # copied whole block -> the new block
    collapsed: set[str] = field(default_factory=set)  # new blocks that arrive collapsed, like their originals

    @property
    def ids(self) -> list[str]:
        return list(self.rename.values())


def plan_paste(graph: Graph, sub: dict, *, offset: tuple[float, float] = (40.0, 40.0),
               at: tuple[float, float] | None = None, taken: set[str] | None = None,
               taken_blocks: set[str] | None = None) -> Paste:
    """Copies of a subgraph (Graph.subgraph_dict) with fresh names. A copied whole block
    becomes a new block beside it (its nested blocks with it), copies of part of a block
    join it, and a block this diagram lacks comes as it is. `at`: where the copies' top
    left goes (else `offset` from the originals). `taken`: ids to avoid besides the
    graph's, and `taken_blocks` block names besides the graph's (copies planned before this
    one, not added yet)."""
    taken = set(graph.nodes) | set(taken or ())
    existing = graph.blocks()
    group_map: dict[str, str] = {}
    nodes = [copy.deepcopy(d) for d in sub.get("nodes", [])]
    for d in nodes:
        if not isinstance(d, dict) or not isinstance(d.get("id"), str) or not valid_id(d["id"]):
            raise EditError(f"cannot paste: {str(d)[:80]} is not a node of a Layerflow diagram")
    copied = Counter(b for d in nodes for b in block_path(d.get("group")))

    def new_group(group: str | None) -> str | None:
        for b in block_path(group):  # outermost first
            if b in group_map:
                return group_map[b] + group[len(b):]
            if b not in existing:
                return group
            if copied[b] >= len(graph.block_members(b)):
                parent, _, name = b.rpartition(BLOCK_SEP)
                names = ({block_name(x) for x in existing} | {block_name(v) for v in group_map.values()}
                         | set(taken_blocks or ()))
                group_map[b] = (parent + BLOCK_SEP if parent else "") + fresh_id(name, names)
                return group_map[b] + group[len(b):]
        return group

    if nodes and at is not None:
        offset = (at[0] - min(d["pos"][0] for d in nodes), at[1] - min(d["pos"][1] for d in nodes))
    rename = {}
    for d in nodes:
        new = fresh_id(d["id"], taken)
        taken.add(new)
        rename[d["id"]] = new
        d["id"] = new
        x, y = d.get("pos") or (0.0, 0.0)
        d["pos"] = [x + offset[0], y + offset[1]]
        if d.get("group"):
            d["group"] = new_group(d["group"])
    edges = [dict(e, src=rename[e["src"]], dst=rename[e["dst"]]) for e in sub.get("edges", [])
             if e.get("src") in rename and e.get("dst") in rename]
    shut = {new + b[len(old):] for old, new in group_map.items() for b in graph.collapsed
            if b == old or b.startswith(old + BLOCK_SEP)}
    return Paste(nodes, edges, rename, group_map, shut)


def insert_paste(graph: Graph, paste: Paste) -> None:
    for d in paste.nodes:
        graph.insert_node(Node.from_dict(d))
    for e in paste.edges:
        graph.add_edge_unchecked(Edge.from_dict(e))
    if paste.collapsed:  # (a copy of a collapsed block arrives collapsed: an event, as every write)
        graph.set_collapsed(graph.collapsed | paste.collapsed)


# ----- blocks ----------------------------------------------------------------------------
@dataclass
class Grouping:
    block: str | None  # the new block (None: an ungrouping)
    groups: dict[str, str | None]  # node -> its block path after the edit
    moved: dict[str, str | None]  # block renamed by the edit -> its new name (None: gone)
    text: str


def plan_group(graph: Graph, ids: list[str], name: str | None = None) -> Grouping:
    """Put nodes into a new block, inside the innermost block that holds all of them;
    blocks wholly inside the selection move into the new one."""
    ids = [n for n in graph.nodes if n in set(ids)]
    if not ids:
        raise EditError("select the nodes to group first")
    name = name or fresh_id("block", {block_name(b) for b in graph.blocks()})
    if not BLOCK_NAME_RE.match(name):
        raise EditError(f"'{name}' is not a usable block name (letters, digits, _, - and spaces)")
    if name in graph.nodes:
        raise EditError(f"'{name}' is the name of a node; give the block another name")
    paths = [block_path(graph.nodes[n].group) for n in ids]
    common = ""
    for level in zip(*paths):
        if len(set(level)) != 1:
            break
        common = level[0]
    block = f"{common}{BLOCK_SEP}{name}" if common else name
    groups = {}
    for n in ids:
        g = graph.nodes[n].group
        rest = g[len(common):].lstrip(BLOCK_SEP) if g and common else (g or "")
        groups[n] = f"{block}{BLOCK_SEP}{rest}" if rest else block
    whole = {b: block + b[len(common):] for b in graph.blocks()
             if (not common or b.startswith(common + BLOCK_SEP)) and set(graph.block_members(b)) <= set(ids)}
    return Grouping(block, groups, whole, f"Group {len(ids)} node(s) as '{name}'")


def plan_ungroup(graph: Graph, blocks: list[str] | set[str]) -> Grouping:
    """Take blocks away: what they held moves up one level."""
    unknown = sorted(set(blocks) - graph.blocks())
    if unknown:
        raise EditError(f"no block {', '.join(repr(b) for b in unknown)} in the diagram")
    groups: dict[str, str | None] = {}
    moved: dict[str, str | None] = {}
    for b in sorted(blocks, key=len, reverse=True):
        parent = b.rpartition(BLOCK_SEP)[0]
        moved[b] = None
        for inner in graph.blocks():
            if inner.startswith(b + BLOCK_SEP):
                moved[inner] = BLOCK_SEP.join(x for x in (parent, inner[len(b) + 1:]) if x)
        for n in graph.block_members(b):
            g = groups.get(n, graph.nodes[n].group) or ""
            if g != b and not g.startswith(b + BLOCK_SEP):
                continue
            rest = g[len(b):].lstrip(BLOCK_SEP)
            groups[n] = BLOCK_SEP.join(x for x in (parent, rest) if x) or None
    return Grouping(None, groups, moved, f"Ungroup {', '.join(sorted(blocks))}")


def apply_grouping(graph: Graph, g: Grouping) -> None:
    """Set the blocks; a collapsed block keeps its state under its new name."""
    for n, block in g.groups.items():
        graph.set_group(n, block)
    graph.set_collapsed({g.moved.get(b, b) for b in graph.collapsed if g.moved.get(b, b)})
    graph.unfolded = {g.moved.get(b, b) for b in graph.unfolded if g.moved.get(b, b)}


# ----- repeat ----------------------------------------------------------------------------
@dataclass
class Repeat:
    block: str
    times: int
    disconnect: list[Edge]  # what consumed the block's output (it consumes the last copy's)
    copies: list[Paste]
    connect: list[list[Edge]]  # per copy: the previous copy's output into this copy's inputs
    reconnect: list[Edge]  # the last copy's output into what consumed the block's

    @property
    def text(self) -> str:
        return f"Repeat block '{self.block}' ×{self.times}"


def plan_repeat(graph: Graph, block: str, times: int, *, width: float | None = None) -> Repeat:
    """`times` copies of a block in a chain (stacked transformer layers). The block must
    take one value in (any number of edges from one output) and give one value out; the
    copies are chained value to value, and what consumed the block's output consumes the
    last copy's."""
    ids = set(graph.block_members(block))
    if not ids:
        raise EditError(f"no block '{block}' in the diagram")
    if times < 2:
        raise EditError(f"repeat block '{block}': times must be at least 2, not {times}")
    ins = [e for e in graph.edges if e.dst in ids and e.src not in ids]
    outs = [e for e in graph.edges if e.src in ids and e.dst not in ids]
    in_vals = {(e.src, e.src_port) for e in ins}
    out_vals = {(e.src, e.src_port) for e in outs}
    if len(in_vals) != 1 or len(out_vals) != 1:
        raise EditError(f"block '{block}' has {len(in_vals)} input value(s) and {len(out_vals)} output value(s): "
                        "it needs exactly one of each to be repeated")
    (exit_node, exit_port), = out_vals
    sub = graph.subgraph_dict(ids)
    xs = [graph.nodes[i].pos[0] for i in ids]
    width = width if width is not None else max(xs) - min(xs) + COL_W
    copies, connect, taken, blocks = [], [], set(), set()
    prev = (exit_node, exit_port)
    for k in range(1, times):
        p = plan_paste(graph, sub, offset=(width * k, 0.0), taken=taken, taken_blocks=blocks)
        taken |= set(p.ids)
        blocks |= {block_name(b) for b in p.blocks.values()}
        copies.append(p)
        connect.append([Edge(prev[0], prev[1], p.rename[e.dst], e.dst_port) for e in ins])
        prev = (p.rename[exit_node], exit_port)
    return Repeat(block, times, outs, copies, connect, [Edge(prev[0], prev[1], e.dst, e.dst_port) for e in outs])


# ----- one call for scripts --------------------------------------------------------------
def apply(graph: Graph, plan: Paste | Grouping | Repeat) -> None:
    """Make a planned edit on the model (what the editor does as undo commands)."""
    if isinstance(plan, Paste):
        insert_paste(graph, plan)
    elif isinstance(plan, Grouping):
        apply_grouping(graph, plan)
    elif isinstance(plan, Repeat):
        for e in plan.disconnect:
            graph.disconnect(e)
        for p, edges in zip(plan.copies, plan.connect):
            insert_paste(graph, p)
            for e in edges:
                graph.connect(e.src, e.src_port, e.dst, e.dst_port)
        for e in plan.reconnect:
            graph.connect(e.src, e.src_port, e.dst, e.dst_port)
    else:
        raise TypeError(f"not an edit plan: {plan!r}")


__all__ = ["EditError", "Grouping", "Paste", "Repeat", "apply", "apply_grouping", "check_rename", "fresh_id",
           "insert_paste", "plan_group", "plan_paste", "plan_repeat", "plan_ungroup"]
