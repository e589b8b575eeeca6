"""The editor controller: turns gestures and menu actions into undo commands on
the project's graph, recompiles after edits (debounced) and hands the results to
the views. Every action here is a plain method, so tests and the CLI call the
same code the buttons do.
"""
from __future__ import annotations

import json

from PySide6.QtCore import QMimeData, QObject, QPointF, Signal
from PySide6.QtGui import QUndoStack
from PySide6.QtWidgets import QApplication

from app import undo_commands as C
from app.analysis import BIG_DIAGRAM, Analysis, data_key
from engine.diagram.editing import EditError, plan_group, plan_paste, plan_repeat, plan_ungroup
from engine.diagram.graph import Edge, GraphError
from engine.diagram.catalog import get_layer, unknown_type
from engine.diagram.layout import lay_out, layered_layout, view_layout
from engine.project import Project
from widgets.node_scene import NodeScene

CLIP_MIME = "application/x-layerflow-nodes"


class EditorController(Analysis, QObject):
    compiled = Signal(object)  # CompileResult
    status = Signal(str)
    placement_changed = Signal()
    training_changed = Signal()
    plan_changed = Signal(object)  # (notes, rows, lines)

    def __init__(self, project: Project | None = None, parent=None):
        super().__init__(parent)
        self.stack = QUndoStack(self)
        self.scene = NodeScene(parent=self)
        self.scene.connect_requested.connect(self.connect_ports)
        self.scene.nodes_moved.connect(self.move_nodes)
        self.scene.rewire_requested.connect(self.rewire)
        self.scene.toggle_handler = self.toggle_block
        self._init_analysis()
        self.project: Project | None = None
        self.set_project(project or Project())

    # ----- project ------------------------------------------------------------
    def set_project(self, project: Project) -> None:
        if self.project is not None:
            self.project.graph.unsubscribe(self._on_graph_event)
            self.project.unsubscribe(self._on_project_event)
        self.project = project
        self._version += 1
        self.stack.clear()
        self.scene.set_graph(project.graph)
        project.graph.subscribe(self._on_graph_event)
        project.subscribe(self._on_project_event)
        if len(project.graph.nodes) >= BIG_DIAGRAM:  # its first compile would hold up the first paint
            self.result = self.plan = self.plan_error = None
            self.plan_info = ({}, [], [])
            self.placement_errors, self.placement_warnings = [], []
            self._slow = True
            self._timer.start()
        else:
            self.compile_now()

    @property
    def graph(self):
        return self.project.graph

    def _on_graph_event(self, ev) -> None:
        if ev.kind == "collapsed_changed":
            return  # how the editor shows blocks: nothing to compile or plan again
        self._version += 1
        self._timer.start()

    def flush(self) -> None:
        """Show the current state's compile now (before saving, screenshots, tests)."""
        if self._timer.isActive() or self._busy or self._applied != self._version:
            self.compile_now()

    def push(self, cmd) -> bool:
        """Push a command; a refused edit becomes a status message, not a crash."""
        try:
            self.stack.push(cmd)
        except GraphError as exc:
            self.status.emit(str(exc))
            # the failed redo left the command on the stack: drop it
            if self.stack.count() and self.stack.command(self.stack.count() - 1) is cmd:
                self.stack.undo()
            return False
        return True

    # ----- nodes and edges ----------------------------------------------------
    def add_node(self, node_type: str, pos: QPointF | tuple = (0.0, 0.0), params: dict | None = None) -> str | None:
        if get_layer(node_type) is None:
            self.status.emit(unknown_type(node_type))
            return None
        if isinstance(pos, QPointF):
            pos = (pos.x(), pos.y())
        pos = (round(pos[0] / 20) * 20.0, round(pos[1] / 20) * 20.0) if self.scene.snap else pos
        if node_type == "Input" and params is None and not any(n.type == "Input" for n in self.graph.nodes.values()):
            from engine.data.describe import sample_shape

            fits = sample_shape(self.project.training.dataset)  # the first Input takes the data set's sample
            if fits:
                params = {"shape": fits[0], "dtype": fits[1]}
        cmd = C.AddNode(self.graph, node_type, pos, params)
        self.push(cmd)
        self.scene.select_nodes([cmd.node.id])
        return cmd.node.id

    def connect_ports(self, src: str, src_port: str, dst: str, dst_port: str) -> bool:
        """A wire dropped on an input. One that already has a wire gets the new one in its
        place (one undo step), as node editors do; a refused wire changes nothing."""
        why = self.graph.check_connect(src, src_port, dst, dst_port, taken_ok=True)
        if why:
            self.status.emit(f"Cannot connect: {why}")
            return False
        old = self.graph.incoming(dst).get(dst_port)
        if old == Edge(src, src_port, dst, dst_port):
            return True  # (the same wire again)
        if old is None:
            ok = self.push(C.Connect(self.graph, Edge(src, src_port, dst, dst_port)))
        else:
            self.stack.beginMacro(f"Replace {old.src}.{old.src_port} → {dst}.{dst_port} with {src}.{src_port}")
            self.push(C.Disconnect(self.graph, [old]))
            ok = self.push(C.Connect(self.graph, Edge(src, src_port, dst, dst_port)))
            self.stack.endMacro()
        if ok:
            self.status.emit(f"Connected {src}.{src_port} → {dst}.{dst_port}"
                             + (f" (in place of {old.src}.{old.src_port})" if old is not None else ""))
        return ok

    def rewire(self, old: Edge, new_end) -> bool:
        """A wire dragged off its input: to another input (one step; an input that has a
        wire gets this one in its place), or dropped on empty canvas (removed). A refused
        target leaves the wire where it was."""
        if new_end is None:
            self.push(C.Disconnect(self.graph, [old]))
            return True
        dst, port = new_end
        # the old wire ends elsewhere and cannot be on a path back to its source,
        # so the usual check applies unchanged
        why = self.graph.check_connect(old.src, old.src_port, dst, port, taken_ok=True)
        if why:
            self.status.emit(f"Cannot connect: {why}")
            return False
        taken = self.graph.incoming(dst).get(port)
        if taken == old:
            return True  # (dropped back where it was)
        self.stack.beginMacro(f"Reconnect {old.src}.{old.src_port} → {dst}.{port}")
        self.push(C.Disconnect(self.graph, [old] + ([taken] if taken is not None else [])))
        self.push(C.Connect(self.graph, Edge(old.src, old.src_port, dst, port)))
        self.stack.endMacro()
        return True

    def move_nodes(self, moves: dict) -> None:
        self.push(C.MoveNodes(self.graph, moves))

    def set_param(self, node_id: str, key: str, value) -> None:
        if self.graph.nodes[node_id].params.get(key) != value:
            self.push(C.SetParam(self.graph, node_id, key, value))

    def rename(self, old: str, new: str) -> bool:
        from engine.diagram.editing import check_rename

        try:
            check_rename(self.graph, old, new)  # the model's one id rule (keywords refused too)
        except EditError as exc:
            self.status.emit(str(exc)[0].upper() + str(exc)[1:])
            return False
        ok = self.push(C.Rename(self.graph, old, new))
        if ok:
            self.scene.select_nodes([new])
        return ok

    def set_placement(self, node_ids: list[str], key: str, value) -> None:
        ids = [n for n in node_ids if getattr(self.graph.nodes[n], key) != value]
        if ids:
            self.push(C.SetPlacement(self.graph, ids, key, value))

    def set_tp(self, node_ids: list[str], style: str | None) -> str:
        """A tensor-parallel style for these nodes (a block's: what it holds), one undo
        step; what could not take it, said in one line (empty when all did)."""
        from engine.planning.autoplace import PAIRS, block_tp

        self.flush()
        if self.result is None or not self.result.ok:
            return "the diagram does not compile: fix its errors before choosing TP styles"
        styles, skipped = block_tp(self.result, node_ids, style, self.project.placement.tp)
        changed = {n: v for n, v in styles.items() if self.graph.nodes[n].tp != v}
        if changed:
            self.stack.beginMacro(f"Set TP style of {len(node_ids)} nodes" if len(node_ids) > 1 else
                                  f"Set TP style of {node_ids[0]}")
            for value in dict.fromkeys(changed.values()):
                self.set_placement([n for n, v in changed.items() if v == value], "tp", value)
            self.stack.endMacro()
        if style == PAIRS and not styles:
            return "no Linear -> Linear pair (nor attention) in the selection whose sizes tensor parallelism divides"
        if skipped:
            n = sum(len(v) for v in skipped.values())
            kinds = ", ".join(f"{t} ×{len(v)}" if len(v) > 1 else f"{t} {v[0]}" for t, v in sorted(skipped.items()))
            return f"TP style '{style}' does not apply to {n} node{'s' if n > 1 else ''}: {kinds}"
        return ""

    def set_mesh(self, key: str, value) -> None:
        if getattr(self.project.placement, key) != value:
            self.push(C.SetProjectPlacement(self.project, key, value))

    def _placement_changed(self) -> None:
        self._version += 1
        self.placement_changed.emit()
        self._timer.start()

    def choose_dataset(self, dataset, info=None, settings: dict | None = None) -> bool:
        """Use this data set (an engine.project Dataset model), one undo step; with its
        description (engine.data.describe.DataInfo), the Input node(s) take the data's shape
        and dtype in the same step. Returns whether anything changed."""
        training = self.project.training.model_copy(update={"dataset": dataset})
        fits = self.input_fixes(info) if info is not None and not isinstance(info, BaseException) else {}
        if settings is not None and info is not None:
            self._data_cache[data_key(settings)] = info
        if training == self.project.training and not fits:
            return False
        name = getattr(dataset, "path", dataset.kind)
        self.stack.beginMacro(f"Use data set {name}")
        if training != self.project.training:
            self.push(C.SetTraining(self.project, training, "dataset (chosen)"))
        self._fit_inputs(fits)
        self.stack.endMacro()
        return True

    def input_fixes(self, info) -> dict[str, dict]:
        """{Input node: {param: value}} that make the diagram's Input nodes take the data
        set's samples (shape and dtype); several named inputs feed the Inputs of their names."""
        inputs = [n for n in self.graph.nodes.values() if n.type == "Input"]
        if info.inputs:
            feeds = {n.id: info.inputs[n.id] for n in inputs if n.id in info.inputs}
        elif len(inputs) == 1:
            feeds = {inputs[0].id: (info.sample_shape, info.x_dtype)}
        else:
            return {}
        out = {}
        for nid, (shape, dtype) in feeds.items():
            params = self.graph.nodes[nid].params
            want = {"shape": [int(s) for s in shape],
                    "dtype": "int64" if str(dtype).startswith(("int", "uint")) else "float32"}
            if str(params.get("dtype", "float32")).startswith(want["dtype"][:3]):
                del want["dtype"]  # an int32 Input takes int64 data too: check_data accepts it
            if list(params.get("shape", [])) == want.get("shape"):
                del want["shape"]
            if want:
                out[nid] = want
        return out

    def fit_inputs(self, info) -> bool:
        """The Input node(s) take the data set's shape and dtype: one undo step."""
        fits = self.input_fixes(info)
        if not fits:
            return False
        self.stack.beginMacro("Input follows the data set")
        self._fit_inputs(fits)
        self.stack.endMacro()
        return True

    def _fit_inputs(self, fits: dict) -> None:
        for nid, params in fits.items():
            for key, value in params.items():
                self.push(C.SetParam(self.graph, nid, key, value))

    def set_training(self, training, what: str = "training") -> None:
        """Replace the training settings (a validated engine.project.Training): one undo step."""
        if training != self.project.training:
            self.push(C.SetTraining(self.project, training, what))

    def resolve_conflict(self, index: int, side: str) -> bool:
        """Take `side` ('ours' / 'theirs') for merge conflict `index`: one undo step; a
        resolution that would not make a valid project is a status message."""
        from engine.project import ProjectError

        try:
            cmd = C.ResolveConflict(self.project, index, side)
        except ProjectError as exc:
            self.status.emit(str(exc))
            return False
        return self.push(cmd)

    def _on_project_event(self, ev) -> None:
        """training or placement replaced (an undo command, a merge resolution, a script)."""
        if ev.what == "placement":
            self._placement_changed()
        else:
            self._training_changed()

    def _training_changed(self) -> None:  # batch size, ...: the plan and the summary follow
        self._version += 1
        self.training_changed.emit()
        self._timer.start()

    def delete_selected(self) -> None:
        ids, edges = self.scene.selected_ids(), self.scene.selected_edges()
        if ids or edges:
            self.push(C.RemoveItems(self.graph, ids, edges))

    def select_all(self) -> None:
        self.scene.select_nodes(self.graph.nodes)

    # ----- clipboard ----------------------------------------------------------
    def copy(self) -> bool:
        ids = self.scene.selected_ids()
        if not ids:
            self.status.emit("Nothing selected to copy")
            return False
        data = json.dumps(self.graph.subgraph_dict(ids))
        m = QMimeData()
        m.setData(CLIP_MIME, data.encode())
        m.setText(data)
        QApplication.clipboard().setMimeData(m)
        self.status.emit(f"Copied {len(ids)} node(s)")
        return True

    def cut(self) -> None:
        if self.copy():
            self.stack.beginMacro("Cut")
            self.delete_selected()
            self.stack.endMacro()

    def paste(self, at: QPointF | None = None) -> list[str]:
        m = QApplication.clipboard().mimeData()
        if m is None or not m.hasFormat(CLIP_MIME):
            self.status.emit("The clipboard holds no Layerflow nodes")
            return []
        try:
            sub = json.loads(bytes(m.data(CLIP_MIME)).decode())
        except (ValueError, UnicodeDecodeError):
            self.status.emit("The clipboard's Layerflow data is damaged")
            return []
        return self.insert_subgraph(sub, at, "Paste")

    def duplicate(self) -> list[str]:
        ids = self.scene.selected_ids()
        return self.insert_subgraph(self.graph.subgraph_dict(ids), None, "Duplicate") if ids else []

    def insert_subgraph(self, sub: dict, at: QPointF | None, text: str, offset=(40.0, 40.0)) -> list[str]:
        """Insert copies with fresh names (engine/diagram/editing.py plans them); one undo step."""
        try:
            paste = plan_paste(self.graph, sub, offset=offset, at=(at.x(), at.y()) if at is not None else None)
        except EditError as exc:
            self.status.emit(str(exc))
            return []
        return self._insert(paste, text)

    def _insert(self, paste, text: str) -> list[str]:
        if not paste.nodes:
            return []
        self.push(C.AddSubgraph(self.graph, {"nodes": paste.nodes, "edges": paste.edges}, text))
        if paste.collapsed:  # a copy of a collapsed block arrives collapsed, like the original
            self.scene.collapsed = self.scene.collapsed | paste.collapsed  # (a new set: set_collapsed sees the change)
            self.scene.apply_collapse()
        self.scene.select_nodes(paste.ids)
        return paste.ids

    # ----- groups -------------------------------------------------------------
    def group_selected(self, name: str | None = None) -> str | None:
        try:
            g = plan_group(self.graph, self.scene.selected_ids(), name)
        except EditError as exc:
            self.status.emit(str(exc)[0].upper() + str(exc)[1:])
            return None
        self.push(C.SetGroup(self.graph, list(g.groups), None, g.text, groups=g.groups, moved=g.moved,
                             scene=self.scene))
        return g.block

    def ungroup_selected(self) -> None:
        """Take the selected blocks away: what they held moves up one level."""
        blocks = self.scene.selected_groups()
        if not blocks:
            return
        g = plan_ungroup(self.graph, blocks)
        if g.groups:
            self.push(C.SetGroup(self.graph, list(g.groups), None, g.text, groups=g.groups, moved=g.moved,
                                 scene=self.scene))

    def members(self, group: str) -> list[str]:
        return self.graph.block_members(group)

    def repeat_block(self, group: str, times: int) -> bool:
        """Stack `times` copies of a block in a chain (engine.diagram.editing.plan_repeat), one undo step."""
        if times < 2 or not self.members(group):
            return False
        try:
            rep = plan_repeat(self.graph, group, times, width=None)
        except EditError as exc:
            self.status.emit(str(exc)[0].upper() + str(exc)[1:])
            return False
        self.stack.beginMacro(rep.text)
        if rep.disconnect:
            self.push(C.Disconnect(self.graph, rep.disconnect))
        for paste, edges in zip(rep.copies, rep.connect):
            self._insert(paste, "Repeat")
            for e in edges:
                self.push(C.Connect(self.graph, e))
        for e in rep.reconnect:
            self.push(C.Connect(self.graph, e))
        self.auto_layout()
        self.stack.endMacro()
        return True

    # ----- layout -------------------------------------------------------------
    def toggle_block(self, name: str) -> None:
        """Collapse or expand a block as one undo step (laid out again for imported models);
        on the card of a folded run of repeats, show its blocks one by one instead."""
        if name not in self.graph.blocks():
            return
        run = self.scene.folded_run(name)
        if run is not None:
            self.push(C.ToggleFold(self.scene, run[0], True, view_layout))
            return
        self.push(C.ToggleBlock(self.scene, name, name not in self.graph.collapsed, view_layout))

    def toggle_fold(self, name: str) -> bool:
        """Fold the run of repeats a block belongs to into one card, or unfold it."""
        from engine.diagram.layout import repeated_runs

        run = repeated_runs(self.graph).get(name)
        if run is None:
            return False
        self.push(C.ToggleFold(self.scene, run[0], run[0] not in self.graph.unfolded, view_layout))
        return True

    def reveal(self, target: str) -> None:
        """Open what hides a node or block (collapsed blocks around it, a folded run of
        repeats it is in), outside in, so the canvas shows it: one undo step."""
        from engine.diagram.graph import block_path

        def hiding():
            if target in self.graph.nodes:
                card = self.scene._collapsed_group(target)
                return card.name if card is not None else None
            run = self.scene.folded_run(target)
            if run is not None and run[0] != target:
                return run[0]  # inside a folded run: unfold it
            closed = next((b for b in block_path(target)[:-1] if b in self.graph.collapsed), None)
            if closed is None:
                return None  # it shows (as a card or a frame)
            members = self.graph.block_members(closed)
            card = self.scene._collapsed_group(members[0]) if members else None
            return card.name if card is not None else closed

        if hiding() is None:
            return
        self.stack.beginMacro(f"Reveal {target.rpartition('/')[2]}")
        for _ in range(4 * (target.count("/") + 8)):  # each step opens one level
            name = hiding()
            if name is None:
                break
            self.toggle_block(name)
        self.stack.endMacro()

    def set_direction(self, direction: str) -> None:
        """Data flows left to right ("LR") or top down ("TB"): the diagram laid out again
        that way, one undo step."""
        if direction != self.graph.direction:
            self.push(C.SetDirection(self.scene, direction, lay_out))

    def auto_layout(self, selection_only: bool = False) -> None:
        ids = self.scene.selected_ids() if selection_only else None
        if selection_only and len(ids) < 2:
            ids = None
        if ids is None:  # the whole diagram (blocks laid out as units, inside out)
            pos = lay_out(self.graph)
        else:
            pos = layered_layout(self.graph, ids)
        moves = {n: (self.graph.nodes[n].pos, p) for n, p in pos.items() if self.graph.nodes[n].pos != p}
        if moves:
            self.push(C.MoveNodes(self.graph, moves, "Auto-layout"))
