"""The widgets on their own: the scene is a view of the graph (items follow model
events, hold no diagram state), compile results become labels and badges, and the
palette/inspector/problems/devices widgets report edits as signals."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QComboBox, QLineEdit, QSpinBox

from engine.diagram.compile import compile_graph
from engine.diagram.graph import Edge, Graph
from engine.diagram.catalog import CATALOG
from engine.project import Placement
from widgets.devices import DevicesPanel
from widgets.inspector import Inspector
from widgets.node_scene import NodeItem, NodeScene
from widgets.palette import LAYER_MIME, LayerPalette, ranked
from widgets.problems import ProblemsList

pytestmark = pytest.mark.gui


def mlp() -> Graph:
    g = Graph()
    g.add_node("Input", {"shape": [8]}, pos=(0, 0), id="x")
    g.add_node("Linear", {"out_features": 4}, pos=(240, 0), id="fc")
    g.add_node("Output", {}, pos=(480, 0), id="y")
    g.connect("x", "out", "fc", "in")
    g.connect("fc", "out", "y", "in")
    return g


def test_scene_follows_every_model_event(qtbot):
    g = mlp()
    s = NodeScene(g)
    assert set(s.node_items) == {"x", "fc", "y"} and set(s.edge_items) == set(g.edges)
    g.add_node("Concat", {}, pos=(0, 300), id="cat")
    assert len(s.node_items["cat"].ports) == 3  # in0, in1, out
    g.connect("x", "out", "cat", "in0")
    g.connect("fc", "out", "cat", "in1")
    g.set_param("cat", "num_inputs", 3)
    assert ("in2", True) in s.node_items["cat"].ports
    g.set_param("cat", "num_inputs", 2)  # a port vanishes
    assert set(s.edge_items) == set(g.edges)
    g.move("fc", (260, 40))
    assert s.node_items["fc"].pos().x() == 260
    e = next(e for e in g.edges if e.src == "fc" and e.dst == "y")
    assert s.edge_items[e].path().elementAt(0).x == pytest.approx(s.port_pos("fc", "out", False).x())
    g.rename_node("fc", "dense")
    assert "dense" in s.node_items and "fc" not in s.node_items
    assert set(s.edge_items) == set(g.edges)
    g.set_group("dense", "head")
    assert "head" in s.group_items
    g.remove_node("dense")
    assert "dense" not in s.node_items and set(s.edge_items) == set(g.edges) and not s.group_items
    g.load_dict(mlp().to_dict())
    assert set(s.node_items) == {"x", "fc", "y"}
    # items keep nothing the model does not have: a fresh scene draws the same
    s2 = NodeScene(g)
    assert {n: i.pos() for n, i in s.node_items.items()} == {n: i.pos() for n, i in s2.node_items.items()}


def test_compile_results_become_labels_badges_and_tooltips(qtbot):
    g = mlp()
    s = NodeScene(g)
    s.set_result(compile_graph(g))
    assert s.edge_label(Edge("x", "out", "fc", "in")) == "(B, 8)"
    assert s.edge_label(Edge("fc", "out", "y", "in")) == "(B, 4)"
    assert s.node_items["fc"].badge is None
    g.set_param("fc", "in_features", 3)
    s.set_result(compile_graph(g))
    badge = s.node_items["fc"].badge
    assert badge is not None and badge.kind == "error" and "in_features" in badge.toolTip()
    # a plan's communication shows on the edge under the shape
    e = Edge("x", "out", "fc", "in")
    g.set_param("fc", "in_features", None)
    s.set_result(compile_graph(g), {e: "all-gather 2 KiB/step"})
    assert s.edge_items[e].note == "all-gather 2 KiB/step"
    # paints without error in both themes and at far zoom
    from PySide6.QtGui import QImage, QPainter
    from widgets.style import DARK

    for theme in (DARK,):
        s.set_theme(theme)
        img = QImage(400, 200, QImage.Format_ARGB32)
        p = QPainter(img)
        s.render(p)
        p.end()


def test_palette_filters_and_drags_the_layer_type(qtbot):
    p = LayerPalette()
    qtbot.addWidget(p)
    assert set(p.items) == set(CATALOG)
    qtbot.keyClicks(p.search, "norm")
    vis = p.visible_types()
    assert "LayerNorm" in vis and "BatchNorm2d" in vis and "Linear" not in vis
    mime = p.tree.mimeData([p.items["LayerNorm"]])
    assert bytes(mime.data(LAYER_MIME)).decode() == "LayerNorm"
    qtbot.keyClicks(p.search, "\b" * 4 + "layern")
    with qtbot.waitSignal(p.add_requested) as sig:
        qtbot.keyClick(p.search, Qt.Key_Return)
    assert sig.args == ["LayerNorm"]
    assert ranked("lin")[0] == "Linear"


@pytest.mark.parametrize("layer", sorted(CATALOG))
def test_inspector_builds_an_editor_for_every_parameter(qtbot, layer):
    g = Graph()
    g.add_node(layer, id="n")
    ins = Inspector()
    qtbot.addWidget(ins)
    ins.show_node(g, "n", compile_graph(g))
    kinds = {"int": QSpinBox, "bool": QCheckBox, "choice": QComboBox}
    for ps in CATALOG[layer].params:
        assert isinstance(ins.editors[ps.name], kinds.get(ps.kind, QLineEdit)), ps.name


def test_inspector_reports_edits_and_shows_parse_errors_inline(qtbot):
    g = mlp()
    ins = Inspector()
    qtbot.addWidget(ins)
    ins.show_node(g, "fc", compile_graph(g))
    with qtbot.waitSignal(ins.param_edited) as sig:
        ins.editors["bias"].setChecked(False)
    assert sig.args == ["fc", "bias", False]
    with qtbot.waitSignal(ins.param_edited) as sig:
        ins.editors["in_features"].setValue(8)
    assert sig.args == ["fc", "in_features", 8]
    with qtbot.waitSignal(ins.param_edited) as sig:  # back to "auto"
        ins.editors["in_features"].setValue(ins.editors["in_features"].minimum())
    assert sig.args == ["fc", "in_features", None]
    with qtbot.waitSignal(ins.placement_edited) as sig:
        ins.editors["__tp__"].setCurrentIndex(ins.editors["__tp__"].findData("rowwise"))
    assert sig.args == ["fc", "tp", "rowwise"]
    with qtbot.waitSignal(ins.rename_requested) as sig:
        ins.editors["__name__"].setText("head")
        ins.editors["__name__"].editingFinished.emit()
    assert sig.args == ["fc", "head"]
    g.add_node("Custom", {}, id="c")
    g.connect("x", "out", "c", "in")
    ins.show_node(g, "c", compile_graph(g))
    ins.editors["kwargs"].setText("{not json")
    with qtbot.assertNotEmitted(ins.param_edited):
        ins.editors["kwargs"].editingFinished.emit()
    assert "not valid JSON" in ins.error_labels["kwargs"].text()
    assert "path is empty" in ins.error_labels["path"].text()  # compile error, inline


def test_inspector_edits_a_kernel_as_one_number_or_a_pair(qtbot):
    g = Graph()
    g.add_node("Input", {"shape": [3, 8, 8]}, id="x")
    g.add_node("Conv2d", {"kernel_size": [3, 5], "padding": [1, 2]}, id="conv")
    g.add_node("MaxPool2d", {"stride": 2}, id="pool")
    g.connect("x", "out", "conv", "in")
    g.connect("conv", "out", "pool", "in")
    ins = Inspector()
    qtbot.addWidget(ins)
    ins.show_node(g, "conv", compile_graph(g))
    k = ins.editors["kernel_size"]
    assert isinstance(k, QLineEdit) and k.text() == "3, 5" and ins.editors["padding"].text() == "1, 2"
    for text, value in (("5, 3", [5, 3]), ("[1, 7]", [1, 7]), ("3", 3)):
        k.setText(text)
        with qtbot.waitSignal(ins.param_edited) as sig:
            k.editingFinished.emit()
        assert sig.args == ["conv", "kernel_size", value]
        g.set_param("conv", "kernel_size", value)
    k.setText("3, 5, 7")
    with qtbot.assertNotEmitted(ins.param_edited):
        k.editingFinished.emit()
    assert "e.g. 3 or 3, 5" in ins.error_labels["kernel_size"].text()
    g.set_param("conv", "kernel_size", [3, 13])  # wider than the padded input: the compile error shows under the field
    ins.set_result(compile_graph(g))
    assert "does not fit the input's width 8" in ins.error_labels["kernel_size"].text()
    ins.show_node(g, "pool", compile_graph(g))
    st = ins.editors["stride"]
    assert st.text() == "2"
    st.setText("")
    with qtbot.waitSignal(ins.param_edited) as sig:  # empty: back to "the window size"
        st.editingFinished.emit()
    assert sig.args == ["pool", "stride", None]


def test_problems_list_click_names_the_node(qtbot):
    g = mlp()
    g.set_param("fc", "out_features", 0)
    r = compile_graph(g)
    pl = ProblemsList()
    qtbot.addWidget(pl)
    pl.set_problems(r.errors, r.warnings)
    assert any("out_features" in m for m in pl.messages())
    with qtbot.waitSignal(pl.node_clicked) as sig:
        pl.itemClicked.emit(pl.topLevelItem(0), 0)
    assert sig.args == ["fc"]


def test_devices_panel_signals_and_lanes(qtbot):
    g = mlp()
    g.set_placement("x", stage=0)
    g.set_placement("fc", stage=3)
    d = DevicesPanel()
    qtbot.addWidget(d)
    d.set_state(Placement(pp=2, dp=2, tp=2), g.nodes, ["fc"], ["stage 0: 1.2 MiB"])
    assert d.world.text().startswith("8")
    titles = [t for t, _, _ in d.lanes.lanes]
    assert titles[0].startswith("stage 0") and titles[-1].startswith("stage ≥ 2")  # fc is beyond pp
    assert not d.plan_view.isHidden()
    with qtbot.waitSignal(d.mesh_edited) as sig:
        d.spins["tp"].setValue(4)
    assert sig.args == ["tp", 4]
    with qtbot.waitSignal(d.assign_requested) as sig:
        d.stage_combo.setCurrentIndex(d.stage_combo.findData(1))
        d.assign_btn.click()
    assert sig.args == [1]
    d.set_state(Placement(), g.nodes, [])
    assert not d.assign_btn.isEnabled()


def test_node_item_is_a_view_of_the_model(qtbot):
    g = mlp()
    s = NodeScene(g)
    item: NodeItem = s.node_items["fc"]
    assert item.node is g.nodes["fc"]
    g.set_placement("fc", stage=2)
    assert item.node.stage == 2  # read at paint time, not copied


def test_far_zoom_switches_to_one_overview_item_and_back(qtbot):
    from PySide6.QtWidgets import QGraphicsItem

    from widgets.node_view import NodeView

    g = mlp()
    s = NodeScene(g)
    v = NodeView(s)
    qtbot.addWidget(v)
    v.set_zoom(0.2)
    assert not s.detail
    assert all(not e.isVisible() for e in s.edge_items.values())
    assert all(i.flags() & QGraphicsItem.ItemHasNoContents for i in s.node_items.values())
    assert s.overview.boundingRect().contains(s.node_items["y"].sceneBoundingRect())
    g.add_node("ReLU", pos=(0, 900), id="late")  # added while far out: follows the mode
    g.connect("fc", "out", "late", "in")
    assert not s.edge_items[Edge("fc", "out", "late", "in")].isVisible()
    assert s.overview.boundingRect().contains(s.node_items["late"].sceneBoundingRect())
    v.grab()  # paints
    v.set_zoom(1.0)
    assert s.detail and all(e.isVisible() for e in s.edge_items.values())
    assert all(p.isVisible() for p in s.node_items["late"].ports.values())


def test_void_calls_and_emits_leave_none_and_true_alone():
    """PySide6-Essentials 6.12.0 on Python 3.10/3.11 drops a reference from None on every
    void call and from True on every emit, and the process aborts (none_dealloc); the pin
    in pyproject.toml keeps it out. An upgrade that brings the bug back fails here."""
    import sys

    from PySide6.QtCore import QObject, QPointF, Signal

    class Emitter(QObject):
        ping = Signal()

    p, e = QPointF(), Emitter()
    none0, true0 = sys.getrefcount(None), sys.getrefcount(True)
    for _ in range(300_000):
        p.setX(1.0)  # a void C++ method
        e.ping.emit()
    # other threads may take or drop a few references meanwhile; the bug drops 300,000
    assert abs(sys.getrefcount(None) - none0) < 1000
    assert abs(sys.getrefcount(True) - true0) < 1000
