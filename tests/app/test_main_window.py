"""The editor driven like a person would: palette drops, Tab search, port-to-port
drags and key presses on a real (offscreen) main window; every step undone and
redone with the model compared to the state it had."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QCursor, QDragEnterEvent, QDropEvent
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QMessageBox

from app.window import MainWindow
from engine.diagram.graph import Edge, Graph
from engine.project import Project

pytestmark = pytest.mark.gui
B = QMessageBox.StandardButton



def make_window(qtbot, project=None, recover=False) -> MainWindow:
    w = MainWindow(project or Project(), recover=recover)
    qtbot.addWidget(w)
    w.resize(1300, 850)
    w.show()
    qtbot.waitExposed(w)
    QApplication.processEvents()  # the deferred fit-to-view runs first
    w.view.set_zoom(1.0)
    w.view.centerOn(QPointF(300, 100))
    activate(qtbot, w)
    return w


@pytest.fixture
def win(qtbot, asked):
    return make_window(qtbot)


def activate(qtbot, w: MainWindow) -> None:
    """Window shortcuts (Ctrl+C ...) fire in the active window only."""
    w.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is w, timeout=15000)
    w.view.setFocus()


def vp_pos(w: MainWindow, scene_pt: QPointF) -> QPoint:
    return w.view.mapFromScene(scene_pt)


def drop_layer(w: MainWindow, layer: str, scene_pt: QPointF) -> None:
    """A palette drag ends in a drop on the canvas: the palette's own mime data,
    delivered to the view's viewport (QDrag.exec would block the test)."""
    mime = w.palette.tree.mimeData([w.palette.items[layer]])
    p = vp_pos(w, scene_pt)
    enter = QDragEnterEvent(p, Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(w.view.viewport(), enter)
    assert enter.isAccepted()
    drop = QDropEvent(QPointF(p), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(w.view.viewport(), drop)
    assert drop.isAccepted()


def tab_add(qtbot, w: MainWindow, text: str, scene_pt: QPointF) -> None:
    QCursor.setPos(w.view.viewport().mapToGlobal(vp_pos(w, scene_pt)))
    w.view.setFocus()
    qtbot.keyClick(w.view, Qt.Key_Tab)
    assert w.view.search.isVisible()
    qtbot.keyClicks(w.view.search.edit, text)
    qtbot.keyClick(w.view.search.edit, Qt.Key_Return)
    assert not w.view.search.isVisible()


def port_point(w: MainWindow, node: str, port: str, is_input: bool) -> QPoint:
    return vp_pos(w, w.scene.port_pos(node, port, is_input))


def drag(w: MainWindow, a: QPoint, b: QPoint) -> None:
    vp = w.view.viewport()
    QTest.mousePress(vp, Qt.LeftButton, Qt.NoModifier, a)
    mid = (a + b) / 2
    QTest.mouseMove(vp, mid)
    QTest.mouseMove(vp, b)
    QTest.mouseRelease(vp, Qt.LeftButton, Qt.NoModifier, b)


def drag_port(w, src, sport, dst, dport):
    drag(w, port_point(w, src, sport, False), port_point(w, dst, dport, True))


def snapshot(w: MainWindow) -> dict:
    return w.project.graph.to_dict()


def test_build_by_mouse_and_keyboard_then_undo_and_redo_every_step(qtbot, win):
    w = win
    states = [snapshot(w)]
    drop_layer(w, "Input", QPointF(0, 0))
    states.append(snapshot(w))
    drop_layer(w, "Linear", QPointF(260, 0))
    states.append(snapshot(w))
    w.scene.clearSelection()  # (Tab-add with a node selected wires it: tests/app/test_stale_state.py)
    tab_add(qtbot, w, "outp", QPointF(520, 0))
    states.append(snapshot(w))
    g = w.project.graph
    assert [n.type for n in g.nodes.values()] == ["Input", "Linear", "Output"]
    assert g.nodes["linear1"].pos == (260.0, 0.0)
    drag_port(w, "input1", "out", "linear1", "in")
    states.append(snapshot(w))
    drag(w, port_point(w, "output1", "in", True), port_point(w, "linear1", "out", False))  # from the input end
    states.append(snapshot(w))
    assert g.edges == [Edge("input1", "out", "linear1", "in"), Edge("linear1", "out", "output1", "in")]
    # drag a node by its header: one undo step, snapped to the grid
    head = vp_pos(w, QPointF(260 + 60, 10))
    drag(w, head, head + QPoint(43, 61))
    states.append(snapshot(w))
    assert g.nodes["linear1"].pos == (300.0, 60.0)
    # the diagram compiles, the edge shows the shape
    w.controller.flush()
    assert w.controller.result.ok
    assert w.scene.edge_label(g.edges[1]) == "(B, 64)"
    assert w.actions["undo"].text() == "&Undo Move linear1"
    n = len(states) - 1
    assert w.controller.stack.count() == n
    for i in range(n, 0, -1):
        assert snapshot(w) == states[i]
        qtbot.keyClick(w.view, Qt.Key_Z, Qt.ControlModifier)
    assert snapshot(w) == states[0] and not g.nodes
    for i in range(1, n + 1):
        qtbot.keyClick(w.view, Qt.Key_Z, Qt.ControlModifier | Qt.ShiftModifier)
        assert snapshot(w) == states[i]
    # items follow the model (a view, no state of its own)
    assert set(w.scene.node_items) == set(g.nodes)
    assert set(w.scene.edge_items) == set(g.edges)
    assert w.scene.node_items["linear1"].pos() == QPointF(300, 60)


def chain_project(*types, params=None) -> Project:
    g = Graph()
    ids = []
    for i, t in enumerate(types):
        ids.append(g.add_node(t, (params or {}).get(t, {}), pos=(i * 240.0, 0.0)).id)
    for a, b in zip(ids, ids[1:]):
        g.connect(a, "out", b, "in" if g.nodes[b].type not in ("Add", "Mul") else "a")
    return Project(g)


def test_refused_connections_say_why_in_the_status_bar(qtbot, asked):
    w = make_window(qtbot, chain_project("Input", "Linear", "ReLU", "Output", params={"Input": {"shape": [8]}}))
    g = w.project.graph
    before = snapshot(w)
    drag_port(w, "relu1", "out", "linear1", "in")  # would close a loop
    assert "would make a cycle" in w.statusBar().currentMessage()
    drag(w, port_point(w, "input1", "out", False), port_point(w, "relu1", "out", False))  # output to output
    assert "has no input port" in w.statusBar().currentMessage()
    assert snapshot(w) == before and w.controller.stack.count() == 0


def test_a_wire_dropped_on_a_taken_input_replaces_its_wire_in_one_undo_step(qtbot, asked):
    """As in node editors: the input's old wire goes, the new one comes, one undo step
    named in the Edit menu; the same wire dropped again changes nothing."""
    w = make_window(qtbot, chain_project("Input", "Linear", "ReLU", "Output", params={"Input": {"shape": [8]}}))
    g = w.project.graph
    before = snapshot(w)
    drag_port(w, "input1", "out", "relu1", "in")  # relu1.in is taken by linear1
    assert Edge("input1", "out", "relu1", "in") in g.edges and Edge("linear1", "out", "relu1", "in") not in g.edges
    assert "in place of linear1.out" in w.statusBar().currentMessage()
    assert w.actions["undo"].text() == "&Undo Replace linear1.out → relu1.in with input1.out"
    assert w.controller.stack.count() == 1
    drag_port(w, "input1", "out", "relu1", "in")  # the same wire again
    assert w.controller.stack.count() == 1
    w.controller.stack.undo()
    assert snapshot(w) == before


def test_inspector_edit_changes_the_shape_on_the_next_edge(qtbot, asked):
    w = make_window(qtbot, chain_project("Input", "Linear", "Output", params={"Input": {"shape": [16]}}))
    g = w.project.graph
    out_edge = g.edges[1]
    assert w.scene.edge_label(out_edge) == "(B, 64)"
    w.scene.select_nodes(["linear1"])
    spin = w.inspector.editors["out_features"]
    assert spin.value() == 64
    assert w.inspector.editors["in_features"].text() == "auto (16)"
    spin.lineEdit().selectAll()
    qtbot.keyClicks(spin.lineEdit(), "32")
    qtbot.keyClick(spin.lineEdit(), Qt.Key_Return)
    assert g.nodes["linear1"].params["out_features"] == 32
    qtbot.waitUntil(lambda: w.scene.edge_label(out_edge) == "(B, 32)", timeout=15000)
    assert "32" in w.summary.fields["params"].text() or w.controller.result.total_params == 16 * 32 + 32
    # rename from the inspector: edges follow, one undo step
    name = w.inspector.editors["__name__"]
    name.setText("dense")
    name.editingFinished.emit()
    assert "dense" in g.nodes and Edge("dense", "out", "output1", "in") in g.edges
    assert w.inspector.node_id == "dense"
    w.controller.stack.undo()
    assert "linear1" in g.nodes and w.scene.selected_ids() in ([], ["linear1"])
    # a bad value in a text field is shown inline and changes nothing
    w.scene.select_nodes(["input1"])
    shape = w.inspector.editors["shape"]
    shape.setText("1, x")
    shape.editingFinished.emit()
    assert "integers" in w.inspector.error_labels["shape"].text()
    assert g.nodes["input1"].params["shape"] == [16]
    # a compile error is shown on the node (tooltip), in the problems list and inline
    w.controller.set_param("input1", "shape", [2, 16])
    w.controller.set_param("linear1", "in_features", 5)
    w.controller.flush()
    msgs = w.problems.messages()
    assert any("in_features" in m for m in msgs)
    assert "in_features" in w.scene.node_items["linear1"].badge.toolTip()
    w.scene.select_nodes(["linear1"])
    assert "in_features" in w.inspector.error_labels["in_features"].text()
    # clicking a problem selects its node
    w.scene.clearSelection()
    item = next(w.problems.topLevelItem(i) for i in range(w.problems.topLevelItemCount())
                if w.problems.topLevelItem(i).text(1) == "linear1")
    w.problems.itemClicked.emit(item, 0)
    assert w.scene.selected_ids() == ["linear1"]


def test_copy_paste_between_two_windows_through_the_clipboard(qtbot, asked):
    a = make_window(qtbot, chain_project("Input", "Linear", "ReLU", "Output", params={"Input": {"shape": [8]}}))
    b = make_window(qtbot, chain_project("Input", "Linear"))
    a.scene.select_nodes(["linear1", "relu1"])
    activate(qtbot, a)
    qtbot.keyClick(a.view, Qt.Key_C, Qt.ControlModifier)
    activate(qtbot, b)
    QCursor.setPos(b.view.viewport().mapToGlobal(vp_pos(b, QPointF(100, 300))))
    qtbot.keyClick(b.view, Qt.Key_V, Qt.ControlModifier)
    gb = b.project.graph
    assert list(gb.nodes) == ["input1", "linear1", "linear1_2", "relu1"]
    assert gb.nodes["linear1_2"].params == a.project.graph.nodes["linear1"].params
    assert Edge("linear1_2", "out", "relu1", "in") in gb.edges
    assert b.scene.selected_ids() == ["linear1_2", "relu1"]
    qtbot.keyClick(b.view, Qt.Key_D, Qt.ControlModifier)  # duplicate
    assert len(gb.nodes) == 6
    b.controller.stack.undo()
    b.controller.stack.undo()
    assert list(gb.nodes) == ["input1", "linear1"]
    # cut removes, paste brings back, under fresh names
    a.scene.select_nodes(["relu1"])
    a.controller.cut()
    assert "relu1" not in a.project.graph.nodes
    a.controller.paste()
    assert "relu1" in a.project.graph.nodes


def transformer_block_project() -> Project:
    """x -> [ln -> lin -> add(x)] -> out : a residual block with one value in and out."""
    g = Graph()
    g.add_node("Input", {"shape": [4, 16]}, pos=(0, 0), id="x")
    g.add_node("LayerNorm", {}, pos=(240, 0), id="ln")
    g.add_node("Linear", {"out_features": 16}, pos=(480, 0), id="lin")
    g.add_node("Add", {}, pos=(720, 0), id="res")
    g.add_node("Output", {"loss": "mse"}, pos=(960, 0), id="out")
    g.connect("x", "out", "ln", "in")
    g.connect("ln", "out", "lin", "in")
    g.connect("lin", "out", "res", "a")
    g.connect("x", "out", "res", "b")
    g.connect("res", "out", "out", "in")
    return Project(g)


def test_group_ungroup_and_repeat_a_block(qtbot, asked):
    w = make_window(qtbot, transformer_block_project())
    g = w.project.graph
    start = snapshot(w)
    w.scene.select_nodes(["ln", "lin", "res"])
    assert w.controller.group_selected("layer") == "layer"
    assert [g.nodes[n].group for n in ("x", "ln", "lin", "res")] == [None, "layer", "layer", "layer"]
    frame = w.scene.group_items["layer"]
    assert frame.boundingRect().contains(w.scene.node_items["lin"].sceneBoundingRect())
    grouped = snapshot(w)
    w.scene.select_nodes(["lin"])
    w.controller.ungroup_selected()
    assert all(n.group is None for n in g.nodes.values()) and not w.scene.group_items
    w.controller.stack.undo()
    assert snapshot(w) == grouped
    # repeat: 3 stacked layers, chained value to value, one undo step
    w.controller.repeat_block("layer", 3)
    w.controller.flush()
    assert w.controller.result.ok, w.controller.result.errors
    assert len(g.nodes) == 2 + 3 * 3
    assert sorted({n.group for n in g.nodes.values()} - {None}) == ["layer", "layer_2", "layer_3"]
    assert Edge("res", "out", "ln_2", "in") in g.edges and Edge("res", "out", "res_2", "b") in g.edges
    assert Edge("res_3", "out", "out", "in") in g.edges
    assert w.actions["undo"].text() == "&Undo Repeat block 'layer' ×3"
    w.controller.stack.undo()
    assert snapshot(w) == grouped
    w.controller.stack.undo()
    assert snapshot(w) == start


def test_a_wire_dropped_on_empty_canvas_adds_a_connected_layer(qtbot, asked):
    w = make_window(qtbot, chain_project("Input", "Linear", params={"Input": {"shape": [8]}}))
    g = w.project.graph
    before = snapshot(w)
    a = port_point(w, "linear1", "out", False)
    drag(w, a, a + QPoint(150, 0))
    assert w.view.search.isVisible()
    qtbot.keyClicks(w.view.search.edit, "relu")
    qtbot.keyClick(w.view.search.edit, Qt.Key_Return)
    assert Edge("linear1", "out", "relu1", "in") in g.edges
    assert w.scene.port_pos("relu1", "in", True).x() == pytest.approx(w.scene.port_pos("linear1", "out", False).x() + 150, abs=20)
    w.controller.stack.undo()  # one step: the node and its wire
    assert snapshot(w) == before


def test_a_collapsed_block_is_one_card_that_moves_its_nodes(qtbot, asked):
    from widgets.node_scene import GroupItem

    w = make_window(qtbot, transformer_block_project())
    g = w.project.graph
    w.scene.select_nodes(["ln", "lin", "res"])
    w.controller.group_selected("layer")
    qtbot.keyClick(w.view, Qt.Key_E, Qt.ControlModifier)  # collapse
    card: GroupItem = w.scene.group_items["layer"]
    assert card.collapsed and not w.scene.node_items["lin"].isVisible()
    assert card.ins == [("x", "out")] and card.outs == [("res", "out")]  # one value in, one out
    assert not w.scene.edge_items[Edge("ln", "out", "lin", "in")].isVisible()
    ext = w.scene.edge_items[Edge("res", "out", "out", "in")]
    assert ext.path().elementAt(0).x == pytest.approx(card.mapRectToScene(card._rect).right(), abs=1)
    before = snapshot(w)
    # drag the card by its title: every node of the block moves, one undo step
    title = vp_pos(w, card.mapToScene(card._rect.topLeft()) + QPointF(60, 12))  # (the card, not its far label's room)
    drag(w, title, title + QPoint(0, 100))
    assert [g.nodes[n].pos[1] for n in ("ln", "lin", "res")] == [100.0, 100.0, 100.0]
    assert g.nodes["x"].pos == (0.0, 0.0)
    w.controller.stack.undo()
    assert snapshot(w) == before
    # a selected card acts for its nodes (copy, delete); double-click the title expands it
    card.setSelected(True)
    assert w.scene.selected_ids() == ["ln", "lin", "res"]
    QTest.mouseDClick(w.view.viewport(), Qt.LeftButton, Qt.NoModifier, title)
    assert not card.collapsed and w.scene.node_items["lin"].isVisible()
    assert w.scene.edge_items[Edge("ln", "out", "lin", "in")].isVisible()


def test_a_collapsed_block_is_saved_with_the_project(qtbot, asked, tmp_path):
    import json

    from engine.project import load_project

    w = make_window(qtbot, transformer_block_project())
    w.scene.select_nodes(["ln", "lin", "res"])
    w.controller.group_selected("layer")
    assert w.save_as(tmp_path / "b.lflow") and not w.is_dirty()
    qtbot.keyClick(w.view, Qt.Key_E, Qt.ControlModifier)  # collapse: the project is modified
    assert w.is_dirty() and w.isWindowModified()
    assert w.save() and not w.is_dirty()
    assert json.loads((tmp_path / "b.lflow").read_text())["diagram"]["collapsed"] == ["layer"]
    again = make_window(qtbot, load_project(tmp_path / "b.lflow"))
    assert again.scene.group_items["layer"].collapsed and not again.scene.node_items["lin"].isVisible()
    assert not again.is_dirty()
    # The state is the model's: written as a script would, the card opens and the window knows
    again.project.graph.set_collapsed(set())
    qtbot.waitUntil(lambda: again.scene.node_items["lin"].isVisible())
    assert not again.scene.group_items["layer"].collapsed and again.is_dirty()


def test_slow_diagrams_compile_on_a_worker_thread(qtbot, asked):
    w = make_window(qtbot, chain_project("Input", "Linear", "Output", params={"Input": {"shape": [16]}}))
    c = w.controller
    c._slow = True  # as after a compile that took longer than SLOW_S
    out_edge = w.project.graph.edges[1]
    with qtbot.waitSignal(c.compiled, timeout=20000):
        c.set_param("linear1", "out_features", 12)
        c.set_param("linear1", "out_features", 13)  # two edits, the latest wins
    qtbot.waitUntil(lambda: w.scene.edge_label(out_edge) == "(B, 13)", timeout=20000)
    assert c.result.graph is not w.project.graph  # it compiled a snapshot
    c.set_param("linear1", "out_features", 14)
    c.flush()  # waits for any worker, then shows the current state
    assert w.scene.edge_label(out_edge) == "(B, 14)"


def test_a_wire_picked_up_by_its_input_end_moves_or_goes(qtbot, asked):
    w = make_window(qtbot, transformer_block_project())
    g = w.project.graph
    before = snapshot(w)
    # move res.b's wire (from x) onto out.in, which has a wire: this one takes its place, one step
    taken = g.incoming("out")["in"]
    drag(w, port_point(w, "res", "b", True), port_point(w, "out", "in", True))
    assert Edge("x", "out", "out", "in") in g.edges and taken not in g.edges
    assert Edge("x", "out", "res", "b") not in g.edges
    w.controller.stack.undo()
    assert snapshot(w) == before
    assert w.scene.edge_items[Edge("x", "out", "res", "b")].isVisible()
    # drop it on empty canvas: the wire is removed (one undo step)
    a = port_point(w, "res", "b", True)
    drag(w, a, a + QPoint(0, 200))
    assert Edge("x", "out", "res", "b") not in g.edges
    w.controller.stack.undo()
    assert snapshot(w) == before
    # reconnect res.b's wire to ln.in after freeing ln.in: one step, named in the Edit menu
    w.controller.push(__import__("app.undo_commands", fromlist=["Disconnect"]).Disconnect(g, [Edge("x", "out", "ln", "in")]))
    drag(w, port_point(w, "res", "b", True), port_point(w, "ln", "in", True))
    assert Edge("x", "out", "ln", "in") in g.edges and Edge("x", "out", "res", "b") not in g.edges
    assert w.actions["undo"].text() == "&Undo Reconnect x.out → ln.in"


def test_a_click_on_the_arrow_collapses_and_expands_and_a_copy_keeps_the_state(qtbot, asked):
    w = make_window(qtbot, transformer_block_project())
    w.scene.select_nodes(["ln", "lin", "res"])
    w.controller.group_selected("layer")
    frame = w.scene.group_items["layer"]
    arrow = vp_pos(w, frame.mapToScene(frame._rect.topLeft()) + QPointF(14, 14))  # (the frame, not the room its far label takes)
    QTest.mouseClick(w.view.viewport(), Qt.LeftButton, Qt.NoModifier, arrow)
    assert frame.collapsed and not w.scene.node_items["lin"].isVisible()
    arrow = vp_pos(w, frame.mapToScene(frame._rect.topLeft()) + QPointF(8, 10))
    QTest.mouseClick(w.view.viewport(), Qt.LeftButton, Qt.NoModifier, arrow)
    assert not frame.collapsed and w.scene.node_items["lin"].isVisible()
    QTest.mouseClick(w.view.viewport(), Qt.LeftButton, Qt.NoModifier,
                     vp_pos(w, frame.mapToScene(frame._rect.topLeft()) + QPointF(14, 14)))
    assert frame.collapsed
    w.controller.repeat_block("layer", 2)  # two in the stack, this one included
    groups = sorted({n.group for n in w.project.graph.nodes.values()} - {None})
    assert groups == ["layer", "layer_2"]
    assert w.scene.group_items["layer_2"].collapsed  # the copy arrives as the original is
