"""Undo commands. Each one changes only the model (engine.diagram.graph.Graph or the
project's placement), captures what it needs to undo in __init__, and is
replayable: ids of new nodes are chosen once, in __init__, so redo after undo
makes the very same nodes. Compound edits are macros on the stack (controller).

Undo restores the model exactly, including the order of nodes and edges, so a
diagram after undo equals (==) the one before the edit.
"""
from __future__ import annotations

import copy
import time
from typing import Any

from PySide6.QtGui import QUndoCommand

from engine.diagram.graph import Edge, Graph, Node


def _restore_order(graph: Graph, node_order: list[str], edge_order: list[Edge]) -> None:
    """Put nodes and edges back in their old order (the order is part of ==)."""
    rank = {n: i for i, n in enumerate(node_order)}
    graph.nodes = dict(sorted(graph.nodes.items(), key=lambda kv: rank.get(kv[0], len(rank))))
    erank = {e: i for i, e in enumerate(edge_order)}
    graph.edges.sort(key=lambda e: erank.get(e, len(erank)))


class AddNode(QUndoCommand):
    def __init__(self, graph: Graph, node_type: str, pos: tuple[float, float], params: dict | None = None,
                 node_id: str | None = None):
        self.graph = graph
        self.node = Node(node_id or graph.unique_id(node_type), node_type, dict(params or {}), (float(pos[0]), float(pos[1])))
        super().__init__(f"Add {node_type} '{self.node.id}'")

    def redo(self) -> None:
        self.graph.insert_node(copy.deepcopy(self.node))

    def undo(self) -> None:
        self.graph.remove_node(self.node.id)


class AddSubgraph(QUndoCommand):
    """Paste/duplicate: insert nodes (already renamed to be unique) and their edges."""

    def __init__(self, graph: Graph, sub: dict, text: str = "Paste"):
        self.graph = graph
        self.nodes = [Node.from_dict(d) for d in sub["nodes"]]
        self.edges = [Edge.from_dict(d) for d in sub["edges"]]
        super().__init__(f"{text} {len(self.nodes)} node(s)")

    def redo(self) -> None:
        for n in self.nodes:
            self.graph.insert_node(copy.deepcopy(n))
        for e in self.edges:
            self.graph.add_edge_unchecked(e)

    def undo(self) -> None:
        for n in reversed(self.nodes):
            self.graph.remove_node(n.id)


class RemoveItems(QUndoCommand):
    """Delete nodes (with their edges) and edges."""

    def __init__(self, graph: Graph, node_ids: list[str], edges: list[Edge] = ()):
        self.graph = graph
        self.node_ids = [n for n in graph.nodes if n in set(node_ids)]
        self.nodes = [copy.deepcopy(graph.nodes[n]) for n in self.node_ids]
        gone = set(self.node_ids)
        self.edges = [e for e in graph.edges if e in set(edges) or e.src in gone or e.dst in gone]
        self.node_order = list(graph.nodes)
        self.edge_order = list(graph.edges)
        what = f"{len(self.nodes)} node(s)" if self.nodes else f"{len(self.edges)} connection(s)"
        super().__init__(f"Delete {what}")

    def redo(self) -> None:
        for e in self.edges:
            if e in self.graph.edges:
                self.graph.disconnect(e)
        for n in self.node_ids:
            self.graph.remove_node(n)

    def undo(self) -> None:
        for n in self.nodes:
            self.graph.insert_node(copy.deepcopy(n))
        for e in self.edges:
            self.graph.add_edge_unchecked(e)
        _restore_order(self.graph, self.node_order, self.edge_order)


class Connect(QUndoCommand):
    def __init__(self, graph: Graph, edge: Edge):
        self.graph, self.edge = graph, edge
        super().__init__(f"Connect {edge.src}.{edge.src_port} → {edge.dst}.{edge.dst_port}")

    def redo(self) -> None:
        self.graph.connect(self.edge.src, self.edge.src_port, self.edge.dst, self.edge.dst_port)

    def undo(self) -> None:
        self.graph.disconnect(self.edge)


class SetParam(QUndoCommand):
    """One parameter of one node. Consecutive edits of the same field merge
    (spin-box arrows), so undo steps are per field, not per click."""

    ID = 1001

    def __init__(self, graph: Graph, node_id: str, key: str, value: Any):
        self.graph, self.node_id, self.key, self.value = graph, node_id, key, copy.deepcopy(value)
        self.old = copy.deepcopy(graph.nodes[node_id].params.get(key))
        self.edge_order = list(graph.edges)
        self.dropped: list[Edge] = []  # edges on ports that vanish (Concat.num_inputs)
        super().__init__(f"Set {node_id}.{key}")

    def id(self) -> int:
        return self.ID

    def mergeWith(self, other) -> bool:  # noqa: N802 (Qt API)
        if not isinstance(other, SetParam) or (other.node_id, other.key) != (self.node_id, self.key) or other.dropped:
            return False
        self.value = other.value
        return True

    def redo(self) -> None:
        before = set(self.graph.edges)
        self.graph.set_param(self.node_id, self.key, copy.deepcopy(self.value))
        self.dropped = [e for e in self.edge_order if e in before and e not in self.graph.edges]

    def undo(self) -> None:
        self.graph.set_param(self.node_id, self.key, copy.deepcopy(self.old))
        for e in self.dropped:
            self.graph.add_edge_unchecked(e)
        if self.dropped:
            _restore_order(self.graph, list(self.graph.nodes), self.edge_order)


class MoveNodes(QUndoCommand):
    """One drag of any number of nodes: a single undo step."""

    def __init__(self, graph: Graph, moves: dict[str, tuple[tuple[float, float], tuple[float, float]]], text: str = ""):
        self.graph, self.moves = graph, dict(moves)
        super().__init__(text or (f"Move {next(iter(moves))}" if len(moves) == 1 else f"Move {len(moves)} nodes"))

    def redo(self) -> None:
        for nid, (_, new) in self.moves.items():
            self.graph.move(nid, new)

    def undo(self) -> None:
        for nid, (old, _) in self.moves.items():
            self.graph.move(nid, old)


class SetAssignment(QUndoCommand):
    """One field of some nodes' assignment (stage, tp or checkpoint: engine.diagram.graph.NodeAssignment)."""

    def __init__(self, graph: Graph, node_ids: list[str], key: str, value: Any):
        self.graph, self.key, self.value = graph, key, value
        self.old = {n: getattr(graph.nodes[n], key) for n in node_ids}
        super().__init__(f"Set {key} of {', '.join(node_ids) if len(node_ids) <= 3 else f'{len(node_ids)} nodes'}")

    def redo(self) -> None:
        for n in self.old:
            self.graph.assign(n, **{self.key: self.value})

    def undo(self) -> None:
        for n, v in self.old.items():
            self.graph.assign(n, **{self.key: v})


SetPlacement = SetAssignment  # the older name (app/controller.py)


class SetGroup(QUndoCommand):
    """Put nodes into blocks: one block for all (`group`), or each its own (`groups`:
    node -> block path, for nesting a new block inside one or taking one level away)."""

    def __init__(self, graph: Graph, node_ids: list[str], group: str | None, text: str,
                 groups: dict[str, str | None] | None = None, moved: dict[str, str | None] | None = None,
                 scene=None):
        self.graph, self.scene = graph, scene
        self.new = dict(groups) if groups is not None else {n: group for n in node_ids}
        self.old = {n: graph.nodes[n].group for n in self.new}
        self.moved = dict(moved or {})  # block renamed by the edit -> its new name (None: gone)
        self.state = (set(graph.collapsed), set(graph.unfolded))
        super().__init__(text)

    def _apply(self, groups: dict, collapsed: set, unfolded: set) -> None:
        import contextlib

        with self.scene.deferred() if self.scene is not None else contextlib.nullcontext():
            for n, g in groups.items():
                self.graph.set_group(n, g)
            self.graph.collapsed, self.graph.unfolded = set(collapsed), set(unfolded)

    def redo(self) -> None:
        def keep(blocks):  # a collapsed block keeps its state under its new name
            return {self.moved.get(b, b) for b in blocks if self.moved.get(b, b)}
        self._apply(self.new, keep(self.state[0]), keep(self.state[1]))

    def undo(self) -> None:
        self._apply(self.old, *self.state)


class Rename(QUndoCommand):
    def __init__(self, graph: Graph, old: str, new: str):
        self.graph, self.old, self.new = graph, old, new
        self.node_order = list(graph.nodes)
        super().__init__(f"Rename {old} → {new}")

    def redo(self) -> None:
        self.graph.rename_node(self.old, self.new)

    def undo(self) -> None:
        self.graph.rename_node(self.new, self.old)


class Disconnect(QUndoCommand):
    def __init__(self, graph: Graph, edges: list[Edge]):
        self.graph, self.edges = graph, list(edges)
        self.edge_order = list(graph.edges)
        super().__init__(f"Disconnect {len(edges)} connection(s)")

    def redo(self) -> None:
        for e in self.edges:
            self.graph.disconnect(e)

    def undo(self) -> None:
        for e in self.edges:
            self.graph.add_edge_unchecked(e)
        _restore_order(self.graph, list(self.graph.nodes), self.edge_order)


class SetProjectPlacement(QUndoCommand):
    """A mesh setting of the project (pp/dp/tp/...); the project's event repaints views."""

    ID = 1002

    MERGE_S = 1.5  # typing "12" into a spin box is one edit; a change a while later is another

    def __init__(self, project, key: str, value: Any):
        project.placement.derive(**{key: value})  # PlacementError here, before the undo stack holds a bad value
        self.project, self.key, self.value = project, key, value
        self.old = getattr(project.placement, key)
        self.at = time.monotonic()
        super().__init__(f"Set {key} = {value}")

    def id(self) -> int:
        return self.ID

    def mergeWith(self, other) -> bool:  # noqa: N802
        if not isinstance(other, SetProjectPlacement) or other.key != self.key or other.at - self.at > self.MERGE_S:
            return False
        self.value, self.at = other.value, other.at
        self.setText(f"Set {self.key} = {self.value}")  # named after the value it ends with
        self.setObsolete(self.value == self.old)  # typed back to where it was: no step at all
        return True

    def _set(self, value) -> None:
        self.project.placement = self.project.placement.derive(**{self.key: value})

    def redo(self) -> None:
        self._set(self.value)

    def undo(self) -> None:
        self._set(self.old)


class SetTraining(QUndoCommand):
    """The project's training settings, replaced by an already validated Training.
    `what` names the field edited ("optimizer.lr"); consecutive edits of one field
    merge (spin-box arrows), like SetParam. The project's event recompiles and refreshes views."""

    ID = 1003

    def __init__(self, project, training, what: str):
        self.project, self.new, self.what = project, training, what
        self.old = project.training
        super().__init__(f"Set training.{what}")

    def id(self) -> int:
        return self.ID

    def mergeWith(self, other) -> bool:  # noqa: N802
        if not isinstance(other, SetTraining) or other.what != self.what:
            return False
        self.new = other.new
        self.setObsolete(self.new == self.old)  # back where it started: no undo step left
        return True

    def _set(self, training) -> None:
        self.project.training = training

    def redo(self) -> None:
        self._set(self.new)

    def undo(self) -> None:
        self._set(self.old)


class _ViewChange(QUndoCommand):
    """A change of what the editor shows (a block collapsed, a run of repeats unfolded,
    the direction of flow) that, where the diagram is laid out by its hierarchy (imported
    models; a new direction: always), moves the nodes to the new view's layout: one undo
    step. Subclasses say how to show `on`."""

    def __init__(self, scene, layout, text: str):
        self.scene, self.layout = scene, layout
        self.moves: dict[str, tuple[tuple[float, float], tuple[float, float]]] | None = None
        super().__init__(text)

    def _state(self):
        graph = self.scene.graph
        return set(graph.collapsed), set(graph.unfolded), graph.direction

    def _relayout(self, graph) -> bool:
        return graph.layout == "hierarchy"

    def _set(self, on: bool) -> None:
        raise NotImplementedError

    def _show(self, on: bool, moves) -> None:
        graph = self.scene.graph
        with self.scene.deferred():  # the moves and the new state shown once
            for nid, (old, new) in moves.items():
                graph.move(nid, new if on else old)
            self._set(on)

    def redo(self) -> None:
        graph = self.scene.graph
        if self.moves is None:  # the first time: lay out the view it leads to
            collapsed, unfolded, direction = self._state()
            self._set(True)
            new = self.layout(graph) if self._relayout(graph) else {}
            graph.collapsed, graph.unfolded, graph.direction = collapsed, unfolded, direction
            self.moves = {n: (graph.nodes[n].pos, p) for n, p in new.items() if graph.nodes[n].pos != p}
        self._show(True, self.moves)

    def undo(self) -> None:
        self._show(False, self.moves)


class ToggleBlock(_ViewChange):
    """Collapse or expand a block."""

    def __init__(self, scene, name: str, collapse: bool, layout):
        self.name, self.collapse = name, collapse
        super().__init__(scene, layout, f"{'Collapse' if collapse else 'Expand'} {name.rpartition('/')[2]}")

    def _set(self, on: bool) -> None:
        want = self.collapse if on else not self.collapse
        if self.moves is None:  # laying out the view it leads to: the state only
            g = self.scene.graph  # through the scene: the layout below redraws the cards
            self.scene.collapsed = (g.collapsed | {self.name}) if want else (g.collapsed - {self.name})
        else:
            self.scene.set_collapsed(self.name, want)


class ToggleFold(_ViewChange):
    """Show a run of identical blocks one by one, or again as one card."""

    def __init__(self, scene, first: str, unfold: bool, layout):
        self.first, self.unfold = first, unfold
        super().__init__(scene, layout, f"{'Unfold' if unfold else 'Fold'} {first.rpartition('/')[2]} repeats")

    def _set(self, on: bool) -> None:
        graph = self.scene.graph
        want = self.unfold if on else not self.unfold
        graph.unfolded = (graph.unfolded | {self.first}) if want else (graph.unfolded - {self.first})
        if self.moves is not None:
            self.scene.folds_changed()


class SetDirection(_ViewChange):
    """Data flows left to right ("LR") or top down ("TB"): laid out again that way."""

    def __init__(self, scene, direction: str, layout):
        self.new, self.old = direction, scene.graph.direction
        super().__init__(scene, layout, "Lay Out Top Down" if direction == "TB" else "Lay Out Left to Right")

    def _relayout(self, graph) -> bool:
        return True

    def _set(self, on: bool) -> None:
        graph = self.scene.graph
        if self.moves is None:  # laying out the view it leads to: the state only
            graph.direction = self.new if on else self.old
        else:
            graph.set_direction(self.new if on else self.old)


class ResolveConflict(QUndoCommand):
    """Settle one merge conflict of the project (engine/diff.py) by taking a side. The
    project before and after are kept whole (a conflict may touch the diagram, the
    training or the placement); the project's and the graph's events refresh every view."""

    def __init__(self, project, index: int, side: str):
        from engine.diff import resolve_conflict
        from engine.project import Project

        self.project = project
        self.before = project.to_dict()
        trial = Project.from_dict(self.before)
        resolve_conflict(trial, index, side)  # raises ProjectError before anything changed
        self.after = trial.to_dict()
        super().__init__(f"Take {side} for {project.conflicts[index].where}")

    def _set(self, d: dict) -> None:
        from engine.project import Project

        p = Project.from_dict(d)
        for attr in ("name", "description", "training", "placement", "cluster", "weights", "conflicts", "left_out"):
            setattr(self.project, attr, getattr(p, attr))
        self.project.graph.load_dict(d["diagram"])

    def redo(self) -> None:
        self._set(self.after)

    def undo(self) -> None:
        self._set(self.before)
