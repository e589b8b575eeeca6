"""The diagram model: what the user draws.

Pure dataclasses and an event list; no Qt. Views (widgets/) subscribe with
`Graph.subscribe(callback)` and redraw from the events; undo commands (app/) call
the mutating methods here and nothing else.

A node's id is its name: a Python identifier, unique in the graph. It becomes the
submodule name in the compiled torch.fx GraphModule, so pipeline stages, TP plans
and error messages all speak of the same names.
"""
from __future__ import annotations

import copy
import heapq
import keyword
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from engine.errors import LayerflowError
from engine.runtime.plan import TP_STYLES

_ID_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_ID_LEN = 200


def valid_id(node_id) -> bool:
    """The one rule for node names: a Python identifier (ASCII), not a keyword, at most
    MAX_ID_LEN characters; nothing after it (not even a newline)."""
    return (isinstance(node_id, str) and len(node_id) <= MAX_ID_LEN and _ID_RE.fullmatch(node_id) is not None
            and not keyword.iskeyword(node_id))

# Tensor-parallel styles a node may ask for (engine/planning/planner.py checks which apply): the
# runtime's (engine/runtime/plan.py), re-exported here.


class GraphError(LayerflowError, ValueError):
    """A refused edit: the message says which node/port and why."""


ASSIGNMENT_FIELDS = ("stage", "tp", "checkpoint")
# The kind of event an assignment edit emits. It keeps its older name: the editor's views
# (widgets/node_scene, app/main_window.py) dispatch on it.
ASSIGNMENT_CHANGED = "placement_changed"


@dataclass(frozen=True)
class NodeAssignment:
    """Where one node runs, as the user set it: its pipeline stage, its tensor-parallel
    style, whether its activations are recomputed in backward; None: the planner decides
    (engine/planning/partition.py, engine/planning/tp_layout.py). Not to be confused with the project's
    Placement (engine/project.py: pp x dp x tp and how that mesh runs). In a project file
    these stay the node's own keys, "stage", "tp" and "checkpoint", as they always were."""

    stage: int | None = None
    tp: str | None = None
    checkpoint: bool = False


class CycleError(GraphError):
    def __init__(self, cycle: list[str]):
        self.cycle = cycle
        super().__init__("cycle: " + " -> ".join(cycle))


@dataclass
class Node:
    id: str
    type: str
    params: dict[str, Any] = field(default_factory=dict)
    pos: tuple[float, float] = (0.0, 0.0)
    # The node's assignment (NodeAssignment; engine/planning/planner.py reads it): pipeline stage,
    # tensor-parallel style, activation checkpointing. None means "let the planner decide".
    stage: int | None = None
    tp: str | None = None
    checkpoint: bool = False
    # The block (group) this node belongs to in the editor; None: none. Blocks nest:
    # "layer1/layer1.0" is block layer1.0 inside block layer1 (see block_path).
    group: str | None = None
    # Where an imported node came from: the module tree from the outside in, as
    # [path, type] pairs, e.g. [["layer1", "Sequential"], ["layer1.0", "Bottleneck"]].
    scope: list[list[str]] | None = None

    @property
    def assignment(self) -> NodeAssignment:
        """Its stage, TP style and checkpointing, as one value (Graph.assign changes them)."""
        return NodeAssignment(self.stage, self.tp, self.checkpoint)

    def to_dict(self) -> dict:
        d: dict[str, Any] = {
            "id": self.id,
            "type": self.type,
            "params": copy.deepcopy(self.params),
            "pos": [float(self.pos[0]), float(self.pos[1])],
        }
        if self.stage is not None:
            d["stage"] = self.stage
        if self.tp is not None:
            d["tp"] = self.tp
        if self.checkpoint:
            d["checkpoint"] = True
        if self.group is not None:
            d["group"] = self.group
        if self.scope:
            d["scope"] = [list(s) for s in self.scope]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Node":
        return cls(
            id=d["id"],
            type=d["type"],
            params=copy.deepcopy(d.get("params", {})),
            pos=(float(d.get("pos", (0, 0))[0]), float(d.get("pos", (0, 0))[1])),
            stage=d.get("stage"),
            tp=d.get("tp"),
            checkpoint=bool(d.get("checkpoint", False)),
            group=d.get("group"),
            scope=[list(s) for s in d["scope"]] if d.get("scope") else None,
        )


@dataclass(frozen=True)
class Edge:
    src: str
    src_port: str
    dst: str
    dst_port: str

    def to_dict(self) -> dict:
        return {"src": self.src, "src_port": self.src_port, "dst": self.dst, "dst_port": self.dst_port}

    @classmethod
    def from_dict(cls, d: dict) -> "Edge":
        return cls(d["src"], d.get("src_port", "out"), d["dst"], d.get("dst_port", "in"))


@dataclass(frozen=True)
class GraphEvent:
    """kind is one of: node_added, node_removed, node_renamed, edge_added,
    edge_removed, param_changed, moved, placement_changed (ASSIGNMENT_CHANGED: a node's
    stage, tp or checkpoint; key/old/new), group_changed, collapsed_changed (old/new: the
    collapsed blocks before and after), reset."""

    kind: str
    node: str | None = None
    edge: Edge | None = None
    key: str | None = None
    old: Any = None
    new: Any = None


def ports_of(node_type: str, params: dict) -> tuple[list[str], list[str]]:
    """(input ports, output ports) of a layer type, from the catalog."""
    from engine.diagram.catalog import get_layer  # late import: layers imports nothing from here

    spec = get_layer(node_type)
    if spec is None:
        return (["in"], ["out"])
    return spec.input_ports(params), spec.output_ports(params)


BLOCK_SEP = "/"
LAYOUTS = ("hierarchy",)
DIRECTIONS = ("LR", "TB")  # data flows left to right (ports on the sides) or top down (ports on top and bottom)


def block_path(group: str | None) -> list[str]:
    """The blocks that hold a node of `group`, outside in: 'a/b' -> ['a', 'a/b']."""
    if not group:
        return []
    parts = group.split(BLOCK_SEP)
    return [BLOCK_SEP.join(parts[: i + 1]) for i in range(len(parts))]


def block_name(block: str) -> str:
    """A block's own name (the last part of its path)."""
    return block.rpartition(BLOCK_SEP)[2]


def block_type(graph: "Graph", block: str, members: Iterable[str] | None = None) -> str | None:
    """What an imported block is (its module's class, e.g. Bottleneck), from the
    module tree its nodes keep (`members`: its nodes, when the caller has them);
    None for blocks drawn by hand."""
    depth = block.count(BLOCK_SEP)
    name = block_name(block)
    nodes = (graph.nodes[m] for m in members) if members is not None else graph.nodes.values()
    for n in nodes:
        if in_block(n.group, block) and n.scope and len(n.scope) > depth:
            for path, kind in n.scope:
                if path.replace(BLOCK_SEP, "_") == name:
                    return kind
    return None


def in_block(group: str | None, block: str) -> bool:
    """A node of `group` is inside `block` (directly or in a block it holds)."""
    return bool(group) and (group == block or group.startswith(block + BLOCK_SEP))


class Graph:
    """Nodes and edges plus change events. Each input port takes one edge; an
    output port feeds any number."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.edges: list[Edge] = []
        self.collapsed: set[str] = set()  # blocks the editor shows as one card (saved with the diagram)
        # "hierarchy": the editor lays the diagram out again, blocks as units, whenever a
        # block is collapsed or expanded (imported models); None: positions are the user's.
        self.layout: str | None = None
        self.direction = "LR"  # which way data flows on the canvas (DIRECTIONS); saved with the diagram
        # Runs of identical blocks (layer3.1..5, h.0..11) show as one card "x5" while all
        # are collapsed; the runs named here (by their first block) show one card each.
        self.unfolded: set[str] = set()
        # Shared parameters: "node.param" -> "node.param" it is the very same tensor as
        # (a module called twice, an embedding tied to the output layer).
        self.ties: dict[str, str] = {}
        self._subscribers: list[Callable[[GraphEvent], None]] = []
        self.structure_version = 0  # bumped by every event but moves, placement and direction (caches key on it)
        self._batch_depth = 0

    # ----- events -------------------------------------------------------------
    def subscribe(self, callback: Callable[[GraphEvent], None]) -> None:
        self._subscribers.append(callback)

    def unsubscribe(self, callback: Callable[[GraphEvent], None]) -> None:
        if callback in self._subscribers:
            self._subscribers.remove(callback)

    def _emit(self, ev: GraphEvent) -> None:
        if ev.kind not in ("moved", "placement_changed", "direction_changed", "collapsed_changed"):
            self.structure_version += 1  # what the diagram computes, or its blocks, changed
        for cb in list(self._subscribers):
            cb(ev)

    def set_collapsed(self, blocks: Iterable[str]) -> None:
        """Which blocks the editor shows as one card (saved with the diagram): every
        writer goes through here, so a view, the editor's "modified" and a script see
        the change as a `collapsed_changed` event."""
        new = {str(b) for b in blocks}
        if new == self.collapsed:
            return
        old, self.collapsed = frozenset(self.collapsed), new
        self._emit(GraphEvent("collapsed_changed", old=old, new=frozenset(new)))

    # ----- queries ------------------------------------------------------------
    def node(self, node_id: str) -> Node:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise GraphError(f"no node named '{node_id}'") from None

    def incoming(self, node_id: str) -> dict[str, Edge]:
        return {e.dst_port: e for e in self.edges if e.dst == node_id}

    def outgoing(self, node_id: str) -> list[Edge]:
        return [e for e in self.edges if e.src == node_id]

    def predecessors(self, node_id: str) -> list[str]:
        return [e.src for e in self.edges if e.dst == node_id]

    def successors(self, node_id: str) -> list[str]:
        return [e.dst for e in self.edges if e.src == node_id]

    def unique_id(self, base: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", base.lower()) or "node"
        if base[0].isdigit():
            base = "n_" + base
        i = 1
        while f"{base}{i}" in self.nodes:
            i += 1
        return f"{base}{i}"

    def reaches(self, src: str, dst: str) -> bool:
        """True if there is a directed path src -> ... -> dst."""
        seen, stack = set(), [src]
        while stack:
            n = stack.pop()
            if n == dst:
                return True
            if n in seen:
                continue
            seen.add(n)
            stack.extend(self.successors(n))
        return False

    def find_cycle(self) -> list[str] | None:
        """A cycle as a node list (first == last), or None."""
        color: dict[str, int] = {}
        parent: dict[str, str] = {}
        succ = {n: [] for n in self.nodes}
        for e in self.edges:
            if e.src in succ:
                succ[e.src].append(e.dst)
        for start in self.nodes:
            if color.get(start):
                continue
            stack = [(start, iter(succ[start]))]
            color[start] = 1
            while stack:
                n, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    color[n] = 2
                    stack.pop()
                    continue
                if nxt not in succ:
                    continue
                if color.get(nxt) == 1:  # back edge: unwind
                    cyc = [nxt]
                    cur = n
                    while cur != nxt:
                        cyc.append(cur)
                        cur = parent[cur]
                    cyc.append(nxt)
                    return list(reversed(cyc))
                if not color.get(nxt):
                    color[nxt] = 1
                    parent[nxt] = n
                    stack.append((nxt, iter(succ[nxt])))
        return None

    def topo_order(self) -> list[str]:
        """Kahn's algorithm, always taking the ready node added first (a heap on insertion
        rank): the order is stable, and the runtime builds modules in it, so a seed gives
        the same weights. (graphlib's TopologicalSorter hands out ready nodes in batches,
        with no such tie-break.)"""
        indeg = {n: 0 for n in self.nodes}
        succ: dict[str, list[str]] = {}  # successors(n) for every n at once, in edge order
        for e in self.edges:
            succ.setdefault(e.src, []).append(e.dst)
            if e.dst in indeg and e.src in indeg:
                indeg[e.dst] += 1
        rank = {n: i for i, n in enumerate(self.nodes)}
        ready = [(rank[n], n) for n in self.nodes if indeg[n] == 0]  # (already a heap: ranks ascend)
        order: list[str] = []
        while ready:
            _, n = heapq.heappop(ready)
            order.append(n)
            for s in succ.get(n, ()):
                if s in indeg:
                    indeg[s] -= 1
                    if indeg[s] == 0:
                        heapq.heappush(ready, (rank[s], s))
        if len(order) != len(self.nodes):
            raise CycleError(self.find_cycle() or [])
        return order

    # ----- edits --------------------------------------------------------------
    def add_node(
        self,
        type: str,
        params: dict | None = None,
        pos: tuple[float, float] = (0.0, 0.0),
        id: str | None = None,
        **assignment: Any,
    ) -> Node:
        """A new node; `assignment`: its stage=, tp=, checkpoint= (NodeAssignment's fields)."""
        node_id = id or self.unique_id(type)
        self._check_id(node_id)
        node = Node(id=node_id, type=type, params=dict(params or {}), pos=(float(pos[0]), float(pos[1])), **assignment)
        self.nodes[node_id] = node
        self._emit(GraphEvent("node_added", node=node_id))
        return node

    def insert_node(self, node: Node) -> Node:
        """Add an existing Node object (undo of a removal, paste)."""
        self._check_id(node.id)
        self.nodes[node.id] = node
        self._emit(GraphEvent("node_added", node=node.id))
        return node

    def _check_id(self, node_id: str) -> None:
        if not valid_id(node_id):
            raise GraphError(f"{node_id!r} is not a valid node name: use letters, digits and _, not starting with a "
                             f"digit, not a Python keyword, at most {MAX_ID_LEN} characters")
        if node_id in self.nodes:
            raise GraphError(f"a node named '{node_id}' already exists")

    def remove_node(self, node_id: str) -> tuple[Node, list[Edge]]:
        """Removes the node and its edges; returns both (for undo)."""
        node = self.node(node_id)
        removed = [e for e in self.edges if e.src == node_id or e.dst == node_id]
        for e in removed:
            self.disconnect(e)
        del self.nodes[node_id]
        self._emit(GraphEvent("node_removed", node=node_id, old=node))
        return node, removed

    def rename_node(self, old: str, new: str) -> None:
        if old == new:
            return
        node = self.node(old)
        self._check_id(new)
        # rebuild the dict to keep insertion order stable
        self.nodes = {(new if k == old else k): v for k, v in self.nodes.items()}
        node.id = new
        self.edges = [
            Edge(new if e.src == old else e.src, e.src_port, new if e.dst == old else e.dst, e.dst_port)
            for e in self.edges
        ]

        def moved(end: str) -> str:
            n, _, rest = end.partition(".")
            return f"{new}.{rest}" if n == old else end
        self.ties = {moved(k): moved(v) for k, v in self.ties.items()}
        self._emit(GraphEvent("node_renamed", node=new, old=old, new=new))

    def check_connect(self, src: str, src_port: str, dst: str, dst_port: str, *,
                      taken_ok: bool = False) -> str | None:
        """Why this connection is refused, or None if it is allowed. taken_ok: an input
        that already has a wire is no reason (the editor replaces that wire)."""
        if src not in self.nodes:
            return f"no node named '{src}'"
        if dst not in self.nodes:
            return f"no node named '{dst}'"
        s, d = self.nodes[src], self.nodes[dst]
        outs = ports_of(s.type, s.params)[1]
        ins = ports_of(d.type, d.params)[0]
        if src_port not in outs:
            return f"node '{src}' ({s.type}) has no output port '{src_port}'"
        if dst_port not in ins:
            return f"node '{dst}' ({d.type}) has no input port '{dst_port}'"
        if src == dst or self.reaches(dst, src):
            return f"connecting '{src}' to '{dst}' would make a cycle"
        if dst_port in self.incoming(dst) and not taken_ok:
            return f"input '{dst_port}' of node '{dst}' is already connected"
        return None

    def connect(self, src: str, src_port: str, dst: str, dst_port: str) -> Edge:
        why = self.check_connect(src, src_port, dst, dst_port)
        if why:
            raise GraphError(why)
        e = Edge(src, src_port, dst, dst_port)
        self.edges.append(e)
        self._emit(GraphEvent("edge_added", edge=e))
        return e

    def add_edge_unchecked(self, e: Edge) -> None:
        """Used by loaders and undo: no port/cycle check (compile reports problems)."""
        self.edges.append(e)
        self._emit(GraphEvent("edge_added", edge=e))

    def disconnect(self, e: Edge) -> None:
        self.edges.remove(e)
        self._emit(GraphEvent("edge_removed", edge=e))

    def set_param(self, node_id: str, key: str, value: Any) -> None:
        node = self.node(node_id)
        old = node.params.get(key)
        if value is None:
            node.params.pop(key, None)
        else:
            node.params[key] = value
        self._emit(GraphEvent("param_changed", node=node_id, key=key, old=old, new=value))
        # a port-count parameter (Concat.num_inputs) may drop edges on ports that vanished
        ins = set(ports_of(node.type, node.params)[0])
        for e in [e for e in self.edges if e.dst == node_id and e.dst_port not in ins]:
            self.disconnect(e)

    def move(self, node_id: str, pos: tuple[float, float]) -> None:
        node = self.node(node_id)
        old = node.pos
        node.pos = (float(pos[0]), float(pos[1]))
        self._emit(GraphEvent("moved", node=node_id, old=old, new=node.pos))

    def assign(self, node_id: str, **kw: Any) -> None:
        """Change a node's assignment: stage=int|None, tp=str|None, checkpoint=bool; one
        ASSIGNMENT_CHANGED event per field."""
        node = self.node(node_id)
        for key, value in kw.items():
            if key not in ASSIGNMENT_FIELDS:
                raise GraphError(f"unknown node assignment field '{key}' (one of {', '.join(ASSIGNMENT_FIELDS)})")
            if key == "tp" and value is not None and value not in TP_STYLES:
                raise GraphError(f"node '{node_id}': tp must be one of {', '.join(TP_STYLES)}, not '{value}'")
            old = getattr(node, key)
            setattr(node, key, value)
            self._emit(GraphEvent(ASSIGNMENT_CHANGED, node=node_id, key=key, old=old, new=value))

    set_placement = assign  # the older name (app/controller.py, older scripts and tests call it)

    def set_group(self, node_id: str, group: str | None) -> None:
        """Put a node into a named block (editor grouping; no effect on the model)."""
        node = self.node(node_id)
        old = node.group
        node.group = group
        self._emit(GraphEvent("group_changed", node=node_id, old=old, new=group))

    def set_direction(self, direction: str) -> None:
        if direction not in DIRECTIONS:
            raise GraphError(f"direction '{direction}': one of {', '.join(DIRECTIONS)}")
        if direction != self.direction:
            old, self.direction = self.direction, direction
            self._emit(GraphEvent("direction_changed", old=old, new=direction))

    def clear(self) -> None:
        self.nodes.clear()
        self.edges.clear()
        self._emit(GraphEvent("reset"))

    # ----- (de)serialisation --------------------------------------------------
    def to_dict(self) -> dict:
        d = {
            "nodes": [n.to_dict() for n in self.nodes.values()],
            "edges": [e.to_dict() for e in self.edges],
        }
        blocks = self.blocks()
        if self.collapsed & blocks:  # written only when some block is collapsed
            d["collapsed"] = sorted(self.collapsed & blocks)
        ties = self.live_ties()
        if ties:
            d["ties"] = dict(sorted(ties.items()))
        if self.layout:
            d["layout"] = self.layout
        if self.direction != "LR":
            d["direction"] = self.direction
        if self.unfolded & blocks:
            d["unfolded"] = sorted(self.unfolded & blocks)
        return d

    def blocks(self) -> set[str]:
        """Every block of the diagram, nested ones included ('a', 'a/b')."""
        return {b for n in self.nodes.values() for b in block_path(n.group)}

    def block_members(self, block: str) -> list[str]:
        """The nodes inside a block, nested blocks' included, in model order."""
        return [nid for nid, n in self.nodes.items() if in_block(n.group, block)]

    def outermost_collapsed(self, nid: str) -> str | None:
        """The outermost collapsed block holding a node: what the editor shows for it."""
        node = self.nodes.get(nid)
        return next((b for b in block_path(node.group if node else None) if b in self.collapsed), None)

    def live_ties(self) -> dict[str, str]:
        """The ties whose two nodes are in the diagram (a deleted node's ties come back
        with it on undo)."""
        return {k: v for k, v in self.ties.items()
                if k.partition(".")[0] in self.nodes and v.partition(".")[0] in self.nodes}

    @classmethod
    def from_dict(cls, d: dict) -> "Graph":
        g = cls()
        g.load_dict(d)
        return g

    def load_dict(self, d: dict) -> None:
        """Replace the content (one 'reset' event)."""
        nodes: dict[str, Node] = {}
        for nd in d.get("nodes", []):
            n = Node.from_dict(nd)
            if not valid_id(n.id):
                raise GraphError(f"{str(n.id)[:60]!r} is not a valid node name: use letters, digits and _, not starting "
                                 f"with a digit, not a Python keyword, at most {MAX_ID_LEN} characters")
            if n.id in nodes:
                raise GraphError(f"two nodes are named '{n.id}'")
            if not all(math.isfinite(v) for v in n.pos):
                raise GraphError(f"node '{n.id}': position {list(n.pos)} is not a finite point")
            nodes[n.id] = n
        edges = [Edge.from_dict(ed) for ed in d.get("edges", [])]
        fed: dict[tuple[str, str], Edge] = {}
        for e in edges:
            if (e.dst, e.dst_port) in fed:
                raise GraphError(f"input {e.dst}.{e.dst_port} has two edges (from {fed[e.dst, e.dst_port].src} and "
                                 f"{e.src}); an input takes one")
            fed[e.dst, e.dst_port] = e
        for e in edges:
            for end in (e.src, e.dst):
                if end not in nodes:
                    raise GraphError(f"edge {e.src}.{e.src_port} -> {e.dst}.{e.dst_port} names unknown node '{end}'")
        direction = d.get("direction", "LR")
        if direction not in DIRECTIONS:
            raise GraphError(f"direction '{direction}' is not one of {', '.join(DIRECTIONS)} (left to right, top down)")
        ties = {str(k): str(v) for k, v in (d.get("ties") or {}).items()}
        for k, v in ties.items():
            for end in (k, v):
                if end.partition(".")[0] not in nodes or not end.partition(".")[2]:
                    raise GraphError(f"tie {k} = {v}: '{end}' is not NODE.PARAMETER of a node of the diagram")
        self.nodes = nodes
        self.edges = edges
        self.ties = ties
        self.collapsed = {str(b) for b in d.get("collapsed", [])} & {
            b for n in nodes.values() for b in block_path(n.group)}
        self.layout = d.get("layout") if d.get("layout") in LAYOUTS else None
        self.direction = direction
        self.unfolded = {str(b) for b in d.get("unfolded", [])} & self.blocks()
        self._emit(GraphEvent("reset"))

    def copy(self) -> "Graph":
        return Graph.from_dict(self.to_dict())

    def subgraph_dict(self, ids: Iterable[str]) -> dict:
        """Nodes `ids` and the edges among them (copy/paste, grouping)."""
        ids = set(ids)
        return {
            "nodes": [self.nodes[i].to_dict() for i in self.nodes if i in ids],
            "edges": [e.to_dict() for e in self.edges if e.src in ids and e.dst in ids],
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Graph) and self.to_dict() == other.to_dict()
