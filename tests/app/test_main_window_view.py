"""The canvas: wheel zoom, pan, rubber band, grid snap, fit (F), minimap,
auto-layout, delete, and the devices panel placing nodes on stages."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QMessageBox

from app.window import MainWindow
from engine.diagram.graph import Graph
from engine.project import Project

pytestmark = pytest.mark.gui
B = QMessageBox.StandardButton


@pytest.fixture
def w(qtbot, monkeypatch, tmp_path):
    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / "home"))
    monkeypatch.setattr(MainWindow, "ask", lambda self, *a: B.Discard)
    g = Graph()
    g.add_node("Input", {"shape": [4, 16]}, pos=(0, 0), id="x")
    g.add_node("LayerNorm", {}, pos=(-300, 200), id="ln")  # deliberately out of order
    g.add_node("Linear", {"out_features": 16}, pos=(100, -200), id="lin")
    g.add_node("Add", {}, pos=(600, 300), id="res")
    g.add_node("Output", {"loss": "mse"}, pos=(200, 400), id="out")
    for a, b, port in (("x", "ln", "in"), ("ln", "lin", "in"), ("lin", "res", "a"), ("x", "res", "b"), ("res", "out", "in")):
        g.connect(a, "out", b, port)
    win = MainWindow(Project(g), recover=False)
    qtbot.addWidget(win)
    win.resize(1200, 800)
    win.show()
    qtbot.waitExposed(win)
    QApplication.processEvents()
    win.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is win, timeout=15000)
    win.view.setFocus()
    return win


def wheel(view, steps: int) -> None:
    pos = QPointF(view.viewport().rect().center())
    ev = QWheelEvent(pos, QPointF(view.viewport().mapToGlobal(pos.toPoint())), QPoint(), QPoint(0, 120 * steps),
                     Qt.NoButton, Qt.NoModifier, Qt.NoScrollPhase, False)
    QApplication.sendEvent(view.viewport(), ev)


def test_zoom_pan_fit_and_minimap(qtbot, w):
    v = w.view
    v.set_zoom(1.0)
    wheel(v, 2)
    assert v.zoom() == pytest.approx(1.15 ** 2)
    wheel(v, -4)
    assert v.zoom() == pytest.approx(1.15 ** -2)
    # middle-button pan moves the view by the drag distance (in scene units / zoom)
    v.set_zoom(1.0)
    c0 = v.visible_scene_rect().center()
    vp = v.viewport()
    QTest.mousePress(vp, Qt.MiddleButton, Qt.NoModifier, QPoint(400, 300))
    QTest.mouseMove(vp, QPoint(300, 250))
    QTest.mouseRelease(vp, Qt.MiddleButton, Qt.NoModifier, QPoint(300, 250))
    c1 = v.visible_scene_rect().center()
    assert (c1.x() - c0.x(), c1.y() - c0.y()) == pytest.approx((100, 50), abs=2)
    # F fits everything in view
    v.set_zoom(2.5)
    qtbot.keyClick(v, Qt.Key_F)
    vis = v.visible_scene_rect()
    for item in w.scene.node_items.values():
        assert vis.contains(item.sceneBoundingRect())
    # minimap: a click centres the view on that spot of the diagram
    mm = v.minimap
    assert mm.isVisible()
    mm._render()
    target = mm.to_scene(QPointF(20, 20))
    QTest.mouseClick(mm, Qt.LeftButton, Qt.NoModifier, QPoint(20, 20))
    centre = v.visible_scene_rect().center()
    assert (centre.x(), centre.y()) == pytest.approx((target.x(), target.y()), abs=3 / v.zoom())
    w.actions["minimap"].trigger()
    assert not mm.isVisible()


def test_rubber_band_selects_and_delete_removes_with_undo(qtbot, w):
    v = w.view
    v.set_zoom(0.5)
    v.centerOn(QPointF(150, 100))
    vp = v.viewport()
    a = v.mapFromScene(QPointF(-20, -20))  # around x (0,0) only
    b = v.mapFromScene(QPointF(170, 110))
    QTest.mousePress(vp, Qt.LeftButton, Qt.NoModifier, a)
    QTest.mouseMove(vp, (a + b) / 2)
    QTest.mouseMove(vp, b)
    QTest.mouseRelease(vp, Qt.LeftButton, Qt.NoModifier, b)
    assert w.scene.selected_ids() == ["x"]
    crossing = set(w.scene.selected_edges())  # edges through the band are picked up too
    before = w.project.graph.to_dict()
    qtbot.keyClick(v, Qt.Key_Delete)
    left = [e for e in w.project.graph.edges]
    assert "x" not in w.project.graph.nodes
    assert not any("x" in (e.src, e.dst) for e in left) and not crossing & set(left)
    assert len(left) == 3 - len({e for e in crossing if "x" not in (e.src, e.dst)})
    w.controller.stack.undo()
    assert w.project.graph.to_dict() == before
    # Ctrl+A then delete, and back
    qtbot.keyClick(v, Qt.Key_A, Qt.ControlModifier)
    assert len(w.scene.selected_ids()) == 5
    qtbot.keyClick(v, Qt.Key_Delete)
    from widgets.node_scene import EdgeItem, NodeItem

    assert not w.project.graph.nodes
    assert not [i for i in w.scene.items() if isinstance(i, (NodeItem, EdgeItem))]
    w.controller.stack.undo()
    assert w.project.graph.to_dict() == before


def test_grid_snap_on_and_off(qtbot, w):
    item = w.scene.node_items["lin"]
    item.setPos(113, -187)
    assert item.pos() == QPointF(120, -180)
    w.actions["snap"].trigger()
    item.setPos(113, -187)
    assert item.pos() == QPointF(113, -187)


def test_auto_layout_is_left_to_right_and_one_undo_step(qtbot, w):
    g = w.project.graph
    before = g.to_dict()
    qtbot.keyClick(w.view, Qt.Key_L, Qt.ControlModifier)
    for e in g.edges:
        assert g.nodes[e.dst].pos[0] > g.nodes[e.src].pos[0]
    # nodes do not overlap
    rects = [w.scene.node_items[n].sceneBoundingRect() for n in g.nodes]
    assert not any(r1.intersects(r2) for i, r1 in enumerate(rects) for r2 in rects[i + 1:])
    assert w.actions["undo"].text() == "&Undo Auto-layout"
    w.controller.stack.undo()
    assert g.to_dict() == before


def test_devices_panel_places_nodes_on_stages(qtbot, w):
    d = w.devices
    d.spins["pp"].setValue(2)
    assert w.project.placement.pp == 2
    w.scene.select_nodes(["x", "ln"])
    d.stage_combo.setCurrentIndex(d.stage_combo.findData(0))
    d.assign_btn.click()
    w.scene.select_nodes(["lin", "res", "out"])
    d.stage_combo.setCurrentIndex(d.stage_combo.findData(1))
    d.assign_btn.click()
    assert [n.stage for n in w.project.graph.nodes.values()] == [0, 0, 1, 1, 1]
    assert [(title.split()[0:2], ids) for title, s, ids in d.lanes.lanes] == [
        (["stage", "0"], ["x", "ln"]), (["stage", "1"], ["lin", "res", "out"])]
    # the plan (engine/planning/planner.py) puts its communication on the edges that cross the cut
    d.micro.setValue(2)
    w.controller.flush()
    import importlib.util

    if importlib.util.find_spec("engine.planning.planner") is not None:
        assert w.controller.plan is not None, w.controller.plan_error
        from engine.diagram.graph import Edge

        assert "send/recv" in w.scene.edge_items[Edge("ln", "out", "lin", "in")].note
        assert w.scene.edge_items[Edge("lin", "out", "res", "a")].note == ""
        assert not w.summary.devices.isHidden() and w.summary.devices.rowCount() == 2
        assert any("stage 1" in line for line in d.plan_view.toPlainText().splitlines())
    w.controller.stack.undo()  # micro-batches
    # the node's colour is its stage's colour
    from widgets.style import stage_color
    img = w.scene.node_items["lin"]
    assert stage_color(1, w.scene.theme) != stage_color(0, w.scene.theme)
    assert img.node.stage == 1
    # TP style only where the layer supports it; the others are named in the status bar
    w.scene.select_nodes(["lin", "res"])
    d.tp_combo.setCurrentIndex(d.tp_combo.findData("colwise"))
    d.tp_btn.click()
    assert w.project.graph.nodes["lin"].tp == "colwise" and w.project.graph.nodes["res"].tp is None
    assert "res" in w.statusBar().currentMessage()
    # all of it undoes: tp, two assignments, pp
    for _ in range(4):
        w.controller.stack.undo()
    assert w.project.placement.pp == 1 and d.spins["pp"].value() == 1
    assert all(n.stage is None and n.tp is None for n in w.project.graph.nodes.values())


def test_sequence_parallel_norm_from_the_devices_panel(qtbot, monkeypatch, tmp_path):
    """tp=2 and the norm's style 'sequence' set in the devices panel: the edges show
    the Shard(1) pieces and the collectives at the region's edges; an Input feeding
    the norm directly is refused in the problems list with the fix."""
    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / "home"))
    from engine.diagram.graph import Edge

    g = Graph()
    g.add_node("Input", {"shape": [8, 16]}, id="x")
    g.add_node("Linear", {"out_features": 16}, id="pre")
    g.add_node("LayerNorm", {}, id="ln")
    g.add_node("Linear", {"out_features": 16}, id="lin")
    g.add_node("Add", {}, id="res")
    g.add_node("Mean", {"dim": 1}, id="pool")
    g.add_node("Output", {"loss": "mse"}, id="out")
    for a, b, port in (("x", "pre", "in"), ("pre", "ln", "in"), ("ln", "lin", "in"), ("lin", "res", "a"),
                       ("pre", "res", "b"), ("res", "pool", "in"), ("pool", "out", "in")):
        g.connect(a, "out", b, port)
    win = MainWindow(Project(g), recover=False)
    qtbot.addWidget(win)
    d = win.devices
    d.spins["tp"].setValue(2)
    win.scene.select_nodes(["ln"])
    d.tp_combo.setCurrentIndex(d.tp_combo.findData("sequence"))
    d.tp_btn.click()
    assert win.project.graph.nodes["ln"].tp == "sequence"
    win.controller.flush()
    assert win.controller.plan is not None and win.controller.plan.ok, win.controller.plan_error
    note = win.scene.edge_items[Edge("ln", "out", "lin", "in")].note
    assert "tp Shard(1)" in note and "all-gather" in note  # lin gathers the tokens
    assert "tp Shard(1)" in win.scene.edge_items[Edge("res", "out", "pool", "in")].note
    assert "Shard(1)" in d.plan_view.toPlainText()
    win.controller.stack.undo()  # the style
    assert win.project.graph.nodes["ln"].tp is None
    # a Linear has no 'sequence' style: nothing changes, the status bar says why
    win.scene.select_nodes(["pre"])
    d.tp_btn.click()
    assert win.project.graph.nodes["pre"].tp is None and "pre" in win.statusBar().currentMessage()
    # an Input straight into the norm: refused in the plan view, naming the node and the fix
    win.controller.stack.redo()
    win.controller.rewire(Edge("pre", "out", "ln", "in"), None)
    assert win.controller.connect_ports("x", "out", "ln", "in")
    win.controller.flush()
    text = d.plan_view.toPlainText()
    assert "error: node 'x' (Input) feeds the sequence-parallel region directly" in text and "replicate" in text
