"""The node editor's scene (NodeScene): a view of engine.diagram.graph.Graph.

Items are drawn from the model and from the last compile result; they hold no
diagram state of their own. The scene subscribes to the graph's events and adds,
removes or repaints items: one handler per event kind, listed in one table
(NodeScene._HANDLERS). User gestures (a finished drag, a port-to-port drag) are
reported as signals; the controller turns them into undo commands, which change
the model, whose events come back here.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import ClassVar

import shiboken6
from PySide6.QtCore import QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPen
from PySide6.QtWidgets import QGraphicsItem, QGraphicsPathItem, QGraphicsScene

from engine.diagram.graph import Edge, Graph, GraphEvent, block_path
from engine.diagram.layout import card_of, folded, repeated_runs
from widgets.node_scene.edge_item import EdgeItem
from widgets.node_scene.geometry import BODY_TOP, LOD_DETAIL, port_point, wire_path
from widgets.node_scene.group_item import GroupItem
from widgets.node_scene.node_item import GhostItem, NodeItem, PortItem
from widgets.node_scene.overview_item import OverviewItem
from widgets.style import LIGHT, SceneTheme


class NodeScene(QGraphicsScene):
    connect_requested = Signal(str, str, str, str)  # src, src_port, dst, dst_port
    nodes_moved = Signal(dict)  # {id: ((x0, y0), (x1, y1))}, one user drag
    port_released_on_empty = Signal(str, str, bool, QPointF)  # node, port, is_input, scene pos
    rewire_requested = Signal(object, object)  # old Edge, new (dst, dst_port) or None: remove the wire
    collapsed_changed = Signal(str)  # a block collapsed or expanded (saved with the diagram)
    layout_changed = Signal()  # the diagram was laid out again another way (a new direction, its undo)

    def __init__(self, graph: Graph | None = None, parent=None):
        super().__init__(parent)
        self.theme: SceneTheme = LIGHT
        self.snap = True
        self.graph: Graph | None = None
        self.result = None  # engine.diagram.compile.CompileResult of the current graph
        self.edge_notes: dict[Edge, str] = {}
        self.node_items: dict[str, NodeItem] = {}
        self.edge_items: dict[Edge, EdgeItem] = {}
        self.group_items: dict[str, GroupItem] = {}
        self.toggle_handler = None  # callable(block name) that collapses/expands it (the editor's undo step)
        self._members: dict[str, list[str]] | None = None  # block -> its nodes (block_members)
        self._defer = False  # inside deferred(): no refit per moved node
        self._relaid = False  # the direction changed inside deferred(): layout_changed at its end
        self._outer: dict[str, GroupItem | None] | None = None  # node -> its card, while collapse is unchanged
        self._edges_of: dict[str, set[Edge]] = {}
        self._syncing = False
        self.detail = True  # zoomed in enough for ports, labels and text
        self.overview: OverviewItem | None = None
        self._drag_port: PortItem | None = None
        self._drag_path: QGraphicsPathItem | None = None
        self._rewire: Edge | None = None  # the wire picked up from a connected input
        # a comparison with another version (app/compare_ui.py): node -> (added|changed, what), removed nodes
        self.diff_marks: dict[str, tuple[str, str]] = {}
        self.ghosts: list[tuple[dict, str]] = []
        self.ghost_items: dict[str, GhostItem] = {}
        # the plan's automatic pipeline cut: node -> the stage the planner put it on, for
        # nodes the user left without one (shown in a lighter stage colour: stage_of)
        self.auto_stages: dict[str, int] = {}
        self.setSceneRect(-50000, -50000, 100000, 100000)  # pan freely
        self.selectionChanged.connect(self._repaint_overview)
        self.setItemIndexMethod(QGraphicsScene.BspTreeIndex)
        if graph is not None:
            self.set_graph(graph)

    @property
    def top_down(self) -> bool:
        """Data flows down the canvas (ports on top and bottom), not left to right."""
        return self.graph is not None and self.graph.direction == "TB"

    # ----- model -> items -----------------------------------------------------
    def set_graph(self, graph: Graph) -> None:
        if self.graph is not None:
            self.graph.unsubscribe(self._on_event)
        self.graph = graph
        graph.subscribe(self._on_event)
        self.result = None
        self._rebuild()

    def detach(self) -> None:
        if self.graph is not None:
            self.graph.unsubscribe(self._on_event)

    def _repaint_overview(self) -> None:
        if self.overview is not None and not self.detail and shiboken6.isValid(self.overview):
            self.overview.update()

    def _rebuild(self) -> None:
        self._drag_port = None
        self._drag_path = None
        self.overview = None
        self.clear()
        self.node_items, self.edge_items, self.group_items, self._edges_of = {}, {}, {}, {}
        self.overview = OverviewItem(self)
        for nid in self.graph.nodes:
            self._add_node(nid)
        for e in self.graph.edges:
            self._add_edge(e)
        self._refit_groups()
        self.apply_result()
        self.ghost_items = {}
        self._place_ghosts()

    def set_diff(self, marks: dict[str, tuple[str, str]], ghosts: list[tuple[dict, str]]) -> None:
        """Show a comparison: marks on this version's nodes, ghosts of removed ones."""
        self.diff_marks = dict(marks)
        self.ghosts = list(ghosts)
        self._place_ghosts()
        self.apply_result()  # tooltips (collapsed cards' too)
        for item in (*self.node_items.values(), *self.group_items.values()):
            item.update()

    def _place_ghosts(self) -> None:
        for item in self.ghost_items.values():
            if item.scene() is self:
                self.removeItem(item)
        self.ghost_items = {}
        for node, tip in self.ghosts:
            item = self.ghost_items[node["id"]] = GhostItem(node, tip)
            self.addItem(item)

    def _add_node(self, nid: str) -> None:
        item = NodeItem(nid, self)
        item.setFlag(QGraphicsItem.ItemHasNoContents, not self.detail)
        self._syncing = True
        item.setPos(*self.graph.nodes[nid].pos)
        self._syncing = False
        self.node_items[nid] = item
        self._edges_of.setdefault(nid, set())

    def _add_edge(self, e: Edge) -> None:
        if e.src not in self.node_items or e.dst not in self.node_items:
            return
        self.edge_items[e] = item = EdgeItem(e, self)
        item.setVisible(self.detail)
        self._edges_of.setdefault(e.src, set()).add(e)
        self._edges_of.setdefault(e.dst, set()).add(e)

    def _remove_edge(self, e: Edge) -> None:
        item = self.edge_items.pop(e, None)
        if item is not None:
            self.removeItem(item)
        for end in (e.src, e.dst):
            self._edges_of.get(end, set()).discard(e)

    # ----- the graph's events -------------------------------------------------
    # Kinds that change no node and no block: the index of each block's nodes
    # (_members) and of each node's card (_outer) stay as they are.
    _KEEPS_INDEX = frozenset({"moved", "placement_changed", "collapsed_changed"})
    # Kinds that leave the far-out overview's cached path as it is (reset makes a new one).
    _KEEPS_OVERVIEW = frozenset({"reset", "param_changed", "collapsed_changed"})

    def _on_event(self, ev: GraphEvent) -> None:
        """The graph's one subscriber: drop what the event makes stale, then call the
        handler registered for its kind in _HANDLERS. A kind with no handler only
        drops the caches (as any kind but collapsed_changed does)."""
        k = ev.kind
        if k not in self._KEEPS_INDEX:
            self._members = self._outer = None  # nodes or blocks changed
        if not self.detail and k not in self._KEEPS_OVERVIEW:
            self.overview.invalidate()
        handler = self._HANDLERS.get(k)
        if handler is not None:
            handler(self, ev)

    def _on_collapsed_changed(self, ev: GraphEvent) -> None:
        self._outer = None
        # Written through `collapsed`, the writer redraws (once, after its layout);
        # written by someone else (a script, the engine), the cards follow here, once.
        if not getattr(self, "_writing_collapsed", False) and not getattr(self, "_collapse_due", False):
            self._collapse_due = True
            QTimer.singleShot(0, self, self._apply_due_collapse)  # not after the scene is gone

    def _on_reset(self, ev: GraphEvent) -> None:
        self._rebuild()

    def _on_node_added(self, ev: GraphEvent) -> None:
        self._add_node(ev.node)
        if self.graph.nodes[ev.node].group:
            self._refit_groups()

    def _on_node_removed(self, ev: GraphEvent) -> None:
        for e in list(self._edges_of.get(ev.node, ())):
            self._remove_edge(e)
        item = self.node_items.pop(ev.node, None)
        self._edges_of.pop(ev.node, None)
        if item is not None:
            self.removeItem(item)
        if ev.old is not None and getattr(ev.old, "group", None):
            self._refit_groups()

    def _on_node_renamed(self, ev: GraphEvent) -> None:
        # ids are baked into items and edges: rebuilding this node's pieces is simplest
        item = self.node_items.pop(ev.old)
        for e in list(self._edges_of.pop(ev.old, ())):
            self._remove_edge(e)
        self.removeItem(item)
        self._add_node(ev.new)
        for e in self.graph.edges:
            if ev.new in (e.src, e.dst) and e not in self.edge_items:
                self._add_edge(e)
        self._refit_groups()

    def _on_edge_added(self, ev: GraphEvent) -> None:
        self._add_edge(ev.edge)
        if self.collapsed:
            self.apply_collapse()

    def _on_edge_removed(self, ev: GraphEvent) -> None:
        self._remove_edge(ev.edge)
        if self.collapsed:
            self.apply_collapse()

    def _on_param_changed(self, ev: GraphEvent) -> None:
        item = self.node_items.get(ev.node)
        if item is not None:
            item.rebuild_ports()
            for e in self._edges_of.get(ev.node, ()):
                self.edge_items[e].update_path()
            item.update()

    def _on_moved(self, ev: GraphEvent) -> None:
        item = self.node_items.get(ev.node)
        if item is not None and item.pos() != QPointF(*ev.new):
            self._syncing = True
            item.setPos(*ev.new)
            self._syncing = False
        elif item is not None and self._collapsed_group(ev.node) is not None:
            self._item_moved(ev.node)

    def _on_placement_changed(self, ev: GraphEvent) -> None:
        item = self.node_items.get(ev.node)
        if item is not None:
            item.update()
        node = self.graph.nodes.get(ev.node)
        for b in block_path(node.group if node else None):  # a card shows its nodes' stage
            if b in self.group_items:
                self.group_items[b].update()

    def _on_group_changed(self, ev: GraphEvent) -> None:
        self._refit_groups()

    def _on_direction_changed(self, ev: GraphEvent) -> None:  # every port moves to another side
        for item in self.node_items.values():
            item.rebuild_ports()
            item.update()
        self._refit_groups()
        if not self._defer:  # (else deferred() draws them once at its end)
            for item in self.edge_items.values():
                item.update_path()
            self.layout_changed.emit()
        else:
            self._relaid = True

    # Event kind -> its handler, called as handler(scene, event). Plain functions on
    # the class, not methods bound to each scene: a scene holds no reference to itself.
    _HANDLERS: ClassVar[dict[str, Callable[[NodeScene, GraphEvent], None]]] = {
        "collapsed_changed": _on_collapsed_changed,
        "reset": _on_reset,
        "node_added": _on_node_added,
        "node_removed": _on_node_removed,
        "node_renamed": _on_node_renamed,
        "edge_added": _on_edge_added,
        "edge_removed": _on_edge_removed,
        "param_changed": _on_param_changed,
        "moved": _on_moved,
        "placement_changed": _on_placement_changed,
        "group_changed": _on_group_changed,
        "direction_changed": _on_direction_changed,
    }

    def block_members(self, block: str) -> list[str]:
        """The nodes of a block (nested ones' included), from an index kept until the
        diagram's nodes or blocks change: refits and paints ask for it often."""
        if self._members is None:
            index: dict[str, list[str]] = {}
            for nid, node in self.graph.nodes.items():
                if nid in self.node_items:
                    for b in block_path(node.group):
                        index.setdefault(b, []).append(nid)
            self._members = index
        return self._members.get(block, [])

    def folded_run(self, block: str) -> list[str] | None:
        """The folded run of repeats a block is part of (engine.diagram.layout.repeated_runs)."""
        run = repeated_runs(self.graph).get(block) if self.graph is not None else None  # (kept on the graph)
        return run if run is not None and folded(self.graph, run) else None

    @contextlib.contextmanager
    def deferred(self):
        """Many moves at once (a layout): blocks are refitted once at the end, not per node."""
        self._defer = True
        try:
            yield
        finally:
            self._defer = False
            self._refit_groups()  # (it applies a collapse state with blocks collapsed)
            if not self.collapsed:
                self.apply_collapse()  # every node shown again, every edge redrawn
            if self._relaid:
                self._relaid = False
                self.layout_changed.emit()

    def _item_moved(self, nid: str, refit: bool = True) -> None:
        if not self.detail:
            self.overview.invalidate()
        if self._defer:
            return  # deferred(): edges and blocks follow once, at its end
        for e in self._edges_of.get(nid, ()):
            item = self.edge_items.get(e)
            if item is not None:
                item.update_path()
        node = self.graph.nodes.get(nid)
        if refit and node is not None:
            for b in block_path(node.group):
                if b in self.group_items:
                    self.group_items[b].refit()

    def _refit_groups(self) -> None:
        self._members = self._outer = None
        names = self.graph.blocks()
        for name in list(self.group_items):
            if name not in names:
                self.removeItem(self.group_items.pop(name))
        for name in names:
            if name not in self.group_items:
                self.group_items[name] = GroupItem(name, self)
        if self.collapsed:
            self.apply_collapse()  # refits the blocks that show
        else:
            for item in sorted(self.group_items.values(), key=lambda i: -i.depth):  # inner blocks first
                item.refit()

    # ----- compile results ----------------------------------------------------
    def set_result(self, result, edge_notes: dict[Edge, str] | None = None, more_problems=()) -> None:
        """A compile result; the notes the plan puts on edges; problems found beyond the
        compiler's (the placement's), badged on their nodes like its own."""
        self.result = result
        self.edge_notes = dict(edge_notes or {})
        self.more_problems = list(more_problems)
        self.apply_result()

    def set_plan(self, plan) -> None:
        """The plan of the placement (engine.planning.planner.Plan, or None): with two pipeline
        stages or more, the nodes the user put on no stage are coloured as the plan cuts
        them (stage_of)."""
        run = getattr(plan, "run", None)
        stages = list(getattr(run, "stages", None) or []) if run is not None else []
        auto: dict[str, int] = {}
        if len(stages) > 1 and self.graph is not None:
            for i, ids in enumerate(stages):
                for nid in ids:
                    node = self.graph.nodes.get(nid)
                    if node is not None and node.stage is None:
                        auto[nid] = i
        if auto == self.auto_stages:
            return
        self.auto_stages = auto
        self.apply_result()  # (tooltips)
        for item in (*self.node_items.values(), *self.group_items.values()):
            item.update()
        if self.overview is not None and shiboken6.isValid(self.overview):
            self.overview.update()

    def stage_of(self, nid: str) -> tuple[int | None, bool]:
        """(the stage a node runs on, whether the plan chose it): the user's stage, else
        the plan's automatic cut, else (None, False)."""
        node = self.graph.nodes.get(nid) if self.graph is not None else None
        if node is not None and node.stage is not None:
            return node.stage, False
        stage = self.auto_stages.get(nid)
        return stage, stage is not None

    def apply_result(self) -> None:
        r = self.result
        more: dict[str, list] = {}
        for p in getattr(self, "more_problems", ()):
            if p.node:
                more.setdefault(p.node, []).append(p)
        for nid, item in self.node_items.items():
            errs = r.errors_for(nid) if r else []
            warns = [w for w in r.warnings if w.node == nid] if r else []
            extra = more.get(nid, [])
            item.set_problems(errs + [p for p in extra if p.severity == "error"],
                              warns + [p for p in extra if p.severity != "error"])
        for e, item in self.edge_items.items():
            info = r.edge_info(e) if r else None
            item.set_label(info.label() if info else "", self.edge_notes.get(e, ""))
        for item in self.group_items.values():
            if item.collapsed and item.isVisible():
                item.update_tip()
                members = set(item.members())
                item.set_problems([e for n in members for e in (r.errors_for(n) if r else [])]
                                  + [p for n in members for p in more.get(n, []) if p.severity == "error"],
                                  [w for w in (r.warnings if r else []) if w.node in members]
                                  + [p for n in members for p in more.get(n, []) if p.severity != "error"])
                item.update()
            elif item.badge is not None:
                item.set_problems([], [])

    def set_detail_for_zoom(self, zoom: float) -> None:
        """Hide the port items when zoomed far out: thousands fewer items to visit."""
        detail = zoom >= LOD_DETAIL
        if detail != self.detail:
            self.detail = detail
            for item in self.node_items.values():
                item.setFlag(QGraphicsItem.ItemHasNoContents, not detail)
                for port in item.ports.values():
                    port.setVisible(detail)
            for item in self.edge_items.values():
                item.setVisible(detail)
            if self.collapsed:
                self.apply_collapse()
            self.overview.invalidate()

    def set_theme(self, t: SceneTheme) -> None:
        self.theme = t
        self.update()

    # ----- queries ------------------------------------------------------------
    def _collapsed_group(self, nid: str) -> GroupItem | None:
        """The card that stands for a node: its outermost collapsed block's (a folded
        run's first block's)."""
        if self._outer is not None and nid in self._outer:
            return self._outer[nid]
        b = card_of(self.graph, nid) if self.graph is not None and nid in self.graph.nodes else None
        return self.group_items.get(b) if b is not None else None

    def edge_ends(self, e: Edge) -> tuple[QPointF, QPointF]:
        """Where an edge starts and ends: at its ports, or at the card of a
        collapsed block that holds one end."""
        gs, gd = self._collapsed_group(e.src), self._collapsed_group(e.dst)
        a = gs.port_pos((e.src, e.src_port), False) if gs is not None and gs is not gd else \
            self.port_pos(e.src, e.src_port, False)
        b = gd.port_pos((e.src, e.src_port), True) if gd is not None and gs is not gd else \
            self.port_pos(e.dst, e.dst_port, True)
        return a, b

    @property
    def collapsed(self) -> set[str]:
        """Blocks shown as one card: the graph's, so they are saved with the project."""
        return self.graph.collapsed if self.graph is not None else set()

    @collapsed.setter
    def collapsed(self, names: set[str]) -> None:
        if self.graph is not None:  # the scene's own write: its caller redraws the cards
            self._writing_collapsed = True
            try:
                self.graph.set_collapsed(names)
            finally:
                self._writing_collapsed = False

    def toggle_collapsed(self, name: str) -> None:
        """Collapse or expand a block: through `toggle_handler` when the editor set one
        (an undo step that may lay the diagram out again), else here and now."""
        if self.toggle_handler is not None:
            self.toggle_handler(name)
            return
        self.set_collapsed(name, name not in self.collapsed)

    def folds_changed(self) -> None:
        """graph.unfolded changed: which cards stand for which nodes, shown again."""
        self._outer = None
        self.apply_collapse()
        self.collapsed_changed.emit("")

    def set_collapsed(self, name: str, collapsed: bool) -> None:
        self._outer = None
        self.collapsed = (self.collapsed | {name}) if collapsed else (self.collapsed - {name})
        self.apply_collapse()
        self.collapsed_changed.emit(name)

    def _apply_due_collapse(self) -> None:
        self._collapse_due = False
        self.apply_collapse()
        self.collapsed_changed.emit("")

    def apply_collapse(self) -> None:
        """Show or hide block members, internal edges and cards per self.collapsed."""
        if self._defer:
            return  # deferred() applies it once at its end
        # names of blocks that no longer exist carry no state anyone sees: dropped in place,
        # with no event (the saved file never lists them: Graph.to_dict writes live blocks only)
        if self.graph is not None:
            self.graph.collapsed.intersection_update(self.group_items)
        self._outer = None
        self._outer = {nid: self._collapsed_group(nid) for nid in self.node_items}  # one lookup per node
        for item in sorted(self.group_items.values(), key=lambda i: -i.depth):  # inner blocks first
            hidden = item.hidden_inside
            item.setVisible(not hidden)
            if not hidden:
                item.refit()
        for nid, item in self.node_items.items():
            hidden = self._outer[nid] is not None
            item.setVisible(not hidden)
            if hidden:
                item.setSelected(False)
        for e, item in self.edge_items.items():
            gs, gd = self._outer.get(e.src), self._outer.get(e.dst)
            inside = gs is not None and gs is gd
            item.setVisible(self.detail and not inside)
            if not inside:  # an edge inside a card is drawn again when its block opens
                item.update_path()

    def cards_between(self, e: Edge, a: QPointF, b: QPointF) -> list[QRectF]:
        """The cards (nodes, collapsed blocks) shown in the stretch an edge from `a` to `b`
        crosses, and beside it, that are neither of its ends: what a wire must not run under."""
        if abs(b.x() - a.x()) + abs(b.y() - a.y()) < 200:
            return []
        ends = {self._collapsed_group(e.src) or self.node_items.get(e.src),
                self._collapsed_group(e.dst) or self.node_items.get(e.dst)}
        reach = 400.0  # across the flow: far enough for a lane beside a wide frame
        rect = QRectF(a, b).normalized().adjusted(-reach, -reach, reach, reach)
        out = []
        for it in self.items(rect, Qt.IntersectsItemBoundingRect):
            if it in ends or not it.isVisible():
                continue
            if isinstance(it, NodeItem):
                out.append(it.body())
            elif isinstance(it, GroupItem) and it.collapsed:
                out.append(it.mapRectToScene(it._rect))
        return out

    def port_pos(self, nid: str, port: str, is_input: bool) -> QPointF:
        item = self.node_items[nid]
        p = item.ports.get((port, is_input))
        if p is None:  # an edge to a port that vanished: attach to the side (top, bottom)
            return port_point(item.body(), 0, 1, is_input, item.pos().y() + BODY_TOP, self.top_down)
        return p.scenePos()

    def selected_ids(self) -> list[str]:
        sel = {i.node_id for i in self.selectedItems() if isinstance(i, NodeItem)}
        for i in self.selectedItems():
            if isinstance(i, GroupItem) and i.collapsed:
                sel.update(i.members())
        return [n for n in self.graph.nodes if n in sel]  # model order: stable

    def selected_edges(self) -> list[Edge]:
        return [i.edge for i in self.selectedItems() if isinstance(i, EdgeItem)]

    def selected_groups(self) -> list[str]:
        """Blocks of the selection: selected cards and the blocks of selected nodes."""
        names = {i.name for i in self.selectedItems() if isinstance(i, GroupItem)}
        direct = [i.node_id for i in self.selectedItems() if isinstance(i, NodeItem)]  # (not a card's inside)
        names |= {self.graph.nodes[n].group for n in direct if n in self.graph.nodes} - {None}
        return sorted(names)

    def select_nodes(self, ids) -> None:
        ids = set(ids)
        self.blockSignals(True)
        self.clearSelection()
        for nid in ids:
            if nid in self.node_items:
                self.node_items[nid].setSelected(True)
        self.blockSignals(False)
        self.selectionChanged.emit()

    def edge_label(self, e: Edge) -> str:
        return self.edge_items[e].label

    # ----- gestures -----------------------------------------------------------
    def _port_at(self, pos: QPointF) -> PortItem | None:
        for it in self.items(QRectF(pos.x() - 6, pos.y() - 6, 12, 12)):
            if isinstance(it, PortItem):
                return it
        return None

    def mousePressEvent(self, e) -> None:
        if e.button() == Qt.LeftButton:
            port = self._port_at(e.scenePos())
            if port is not None:
                self._rewire = None
                if port.is_input:  # grabbing a connected input picks its wire up by the end
                    wire = next((x for x in self._edges_of.get(port.node_id, ())
                                 if x.dst == port.node_id and x.dst_port == port.name), None)
                    if wire is not None and wire.src in self.node_items:
                        self._rewire = wire
                        self.edge_items[wire].setVisible(False)
                        port = self.node_items[wire.src].ports.get((wire.src_port, False), port)
                self._drag_port = port
                self._drag_path = QGraphicsPathItem()
                self._drag_path.setPen(QPen(QColor(self.theme.selected), 2, Qt.DashLine))
                self._drag_path.setZValue(5)
                self.addItem(self._drag_path)
                e.accept()
                return
        super().mousePressEvent(e)

    def mouseMoveEvent(self, e) -> None:
        if self._drag_port is not None:
            a = self._drag_port.scenePos()
            b = e.scenePos()
            if self._drag_port.is_input:
                a, b = b, a
            self._drag_path.setPath(wire_path(a, b, self.top_down))
            e.accept()
            return
        super().mouseMoveEvent(e)

    def mouseReleaseEvent(self, e) -> None:
        if self._drag_port is not None:
            start = self._drag_port
            self.removeItem(self._drag_path)
            self._drag_port = self._drag_path = None
            end = self._port_at(e.scenePos())
            e.accept()
            wire, self._rewire = self._rewire, None
            if wire is not None:
                if wire in self.edge_items:
                    self.edge_items[wire].setVisible(self.detail)
                if end is None:
                    self.rewire_requested.emit(wire, None)
                elif end.is_input and (end.node_id, end.name) != (wire.dst, wire.dst_port):
                    self.rewire_requested.emit(wire, (end.node_id, end.name))
                return
            if end is None:
                self.port_released_on_empty.emit(start.node_id, start.name, start.is_input, e.scenePos())
            elif end is not start:
                # whichever end was grabbed first, the model wants output -> input
                a, b = (end, start) if start.is_input else (start, end)
                self.connect_requested.emit(a.node_id, a.name, b.node_id, b.name)
            return
        super().mouseReleaseEvent(e)
        moves = {}
        for g in self.group_items.values():
            if g.collapsed and g.pos() != QPointF(0, 0):
                d = g.pos()
                for nid in g.members():
                    x, y = self.graph.nodes[nid].pos
                    moves[nid] = ((x, y), (x + d.x(), y + d.y()))
        for nid, item in self.node_items.items():
            if nid in moves:
                continue
            model = self.graph.nodes[nid].pos
            now = (item.pos().x(), item.pos().y())
            if now != model:
                moves[nid] = (model, now)
        if moves:
            self.nodes_moved.emit(moves)
