"""An imported ResNet-50 in the real editor: nested blocks opened and closed with the
mouse, each one undo step that lays the view out again, saved with the project."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QPointF, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from real_models import ResNet50  # noqa: E402

pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def resnet_project():
    from engine.interop.module.importer import from_module

    return from_module(ResNet50(layers=(1, 2, 3, 1)), [[3, 32, 32]], name="resnet50").project


def card_title(w, name):
    card = w.scene.group_items[name]
    return w.view.mapFromScene(card.mapToScene(card._rect.topLeft()) + QPointF(60, 12))


def shown(w):
    """The nodes and block cards the canvas shows."""
    cards = sorted(n for n, g in w.scene.group_items.items() if g.collapsed and g.isVisible())
    return cards, sorted(n for n, it in w.scene.node_items.items() if it.isVisible())


def test_expand_a_stage_then_a_block_with_the_mouse_and_undo(qtbot, resnet_project, asked, editor):
    w = editor(resnet_project)
    g = w.project.graph
    cards, nodes = shown(w)
    assert cards == ["layer1", "layer2", "layer3", "layer4"] and "layer3_0_conv1" not in nodes
    card = w.scene.group_items["layer3"]
    assert card.figures()[0].startswith(f"{len(g.block_members('layer3'))} layers · ")
    assert "→" in card.figures()[1]  # its input and output shapes
    before = g.to_dict()
    w.view.set_zoom(0.8)
    w.view.centerOn(card.sceneBoundingRect().center())
    QTest.mouseDClick(w.view.viewport(), Qt.LeftButton, Qt.NoModifier, card_title(w, "layer3"))
    cards, nodes = shown(w)
    # layer3.0 (it has the downsample) and the run of identical bottlenecks after it as one card
    assert cards == ["layer1", "layer2", "layer3/layer3.0", "layer3/layer3.1", "layer4"]
    run = w.scene.group_items["layer3/layer3.1"]
    assert run.card_name() == "layer3.1 … layer3.2 ×2" and not w.scene.group_items["layer3/layer3.2"].isVisible()
    assert set(run.members()) == set(g.block_members("layer3/layer3.1")) | set(g.block_members("layer3/layer3.2"))
    assert "layer3_0_conv1" not in nodes
    # the view was laid out again: the next stage moved right to make room for the expanded one
    assert g.nodes["layer4_0_conv1"].pos[0] > before_pos(before, "layer4_0_conv1")[0]
    assert w.controller.stack.undoText() == "Expand layer3"

    def dclick(name):
        w.view.centerOn(w.scene.group_items[name].sceneBoundingRect().center())
        qtbot.wait(QApplication.doubleClickInterval() + 50)  # a new double-click, not the third click of the last
        QTest.mouseDClick(w.view.viewport(), Qt.LeftButton, Qt.NoModifier, card_title(w, name))

    dclick("layer3/layer3.1")  # the run unfolds: one card per block
    assert shown(w)[0] == ["layer1", "layer2", "layer3/layer3.0", "layer3/layer3.1", "layer3/layer3.2", "layer4"]
    assert w.controller.stack.undoText() == "Unfold layer3.1 repeats" and g.unfolded == {"layer3/layer3.1"}
    dclick("layer3/layer3.1")
    cards, nodes = shown(w)
    assert "layer3/layer3.1" not in cards and "layer3_1_conv2" in nodes and "layer3_0_conv2" not in nodes
    frame = w.scene.group_items["layer3/layer3.1"]
    outer = w.scene.group_items["layer3"]
    assert outer.sceneBoundingRect().contains(frame.sceneBoundingRect())  # nested frames
    for _ in range(3):
        w.controller.stack.undo()
    assert g.to_dict() == before and shown(w)[0] == ["layer1", "layer2", "layer3", "layer4"]
    w.controller.stack.redo()
    assert "layer3/layer3.0" in shown(w)[0]


def before_pos(d, nid):
    return next(n["pos"] for n in d["nodes"] if n["id"] == nid)


def test_open_blocks_are_saved_and_the_file_opens_as_it_was_left(qtbot, resnet_project, asked, editor, tmp_path):
    import json

    from engine.project import load_project

    w = editor(resnet_project)
    w.controller.toggle_block("layer2")
    assert w.save_as(tmp_path / "r.lflow")
    saved = json.loads((tmp_path / "r.lflow").read_text())["diagram"]
    assert "layer2" not in saved["collapsed"] and "layer2/layer2.0" in saved["collapsed"]
    assert saved["layout"] == "hierarchy"
    again = editor(load_project(tmp_path / "r.lflow"))
    assert shown(again) == shown(w)


def test_a_warning_about_many_nodes_is_one_row_that_unfolds(qtbot, resnet_project, asked, editor):
    w = editor(resnet_project)
    w.controller.set_mesh("dp", 2)
    w.controller.flush()
    qtbot.waitUntil(lambda: any("BatchNorm2d nodes" in m for m in w.problems.messages()), timeout=20000)
    n_bn = sum(1 for n in w.project.graph.nodes.values() if n.type == "BatchNorm2d")
    rows = [w.problems.topLevelItem(i) for i in range(w.problems.topLevelItemCount())]
    bn = [r for r in rows if "BatchNorm2d" in r.text(2)]
    assert len(bn) == 1 and bn[0].text(1) == f"{n_bn} nodes" and bn[0].childCount() == n_bn
    child = next(bn[0].child(i) for i in range(n_bn) if bn[0].child(i).text(1).startswith("layer3_1"))
    nid = child.text(1)
    assert w.project.graph.outermost_collapsed(nid) == "layer3"
    w.problems.itemClicked.emit(child, 1)  # a node of the group: revealed and selected on the canvas
    assert w.scene.node_items[nid].isVisible() and w.scene.selected_ids() == [nid]
    assert w.project.graph.outermost_collapsed(nid) is None
    assert w.controller.stack.undoText() == f"Reveal {nid}"


def test_ctrl_f_finds_a_block_by_name_and_shows_where_it_sits(qtbot, resnet_project, asked, editor):
    w = editor(resnet_project)
    w.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is w, timeout=15000)
    w.view.setFocus()
    qtbot.keyClick(w.view, Qt.Key_F, Qt.ControlModifier)
    assert w.find_box.hasFocus()
    qtbot.keyClicks(w.find_box, "layer2.1")
    qtbot.keyClick(w.find_box, Qt.Key_Return)
    card = w.scene.group_items["layer2/layer2.1"]
    assert card.isVisible() and card.collapsed and card.isSelected()  # layer2 opened to show it
    assert "layer2" not in w.project.graph.collapsed
    assert w.view.visible_scene_rect().contains(card.sceneBoundingRect().center())
    assert w.crumbs.text() == "resnet50  ›  layer2  ›  layer2.1"
    w.find_box.clear()
    qtbot.keyClicks(w.find_box, "no_such_thing")
    qtbot.keyClick(w.find_box, Qt.Key_Return)
    assert "No node or block named 'no_such_thing'" in w.statusBar().currentMessage()


def test_a_stage_given_to_a_collapsed_block_goes_to_what_it_holds_and_colours_its_card(qtbot, resnet_project, asked, editor):
    from PySide6.QtGui import QColor

    from widgets.style import stage_color

    w = editor(resnet_project)
    g = w.project.graph
    card = w.scene.group_items["layer4"]
    before = card.stage_colour().name()
    w.scene.clearSelection()
    card.setSelected(True)
    assert w.scene.selected_ids() == g.block_members("layer4")
    w.controller.set_placement(w.scene.selected_ids(), "stage", 1)  # as the Devices panel does for a selection
    assert {g.nodes[n].stage for n in g.block_members("layer4")} == {1}
    assert card.stages() == [1] and card.stage_colour().name() == QColor(stage_color(1, w.scene.theme)).name() != before
    w.controller.stack.undo()
    assert card.stages() == [] and card.stage_colour().name() == before


def test_drawn_blocks_nest_and_ungroup_one_level_at_a_time(qtbot, asked, editor):
    """Grouping inside a block makes a block within it; ungrouping takes one level away;
    each an undo step; collapsing the outer block hides the inner one too."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_main_window import transformer_block_project

    w = editor(transformer_block_project())
    g = w.project.graph
    w.scene.select_nodes(["ln", "lin", "res"])
    assert w.controller.group_selected("outer") == "outer"
    w.scene.select_nodes(["ln", "lin"])
    assert w.controller.group_selected("inner") == "outer/inner"
    assert {n: g.nodes[n].group for n in ("ln", "lin", "res")} == {"ln": "outer/inner", "lin": "outer/inner",
                                                                   "res": "outer"}
    assert g.blocks() == {"outer", "outer/inner"}
    inner, outer = w.scene.group_items["outer/inner"], w.scene.group_items["outer"]
    assert outer.sceneBoundingRect().contains(inner.sceneBoundingRect())
    w.controller.toggle_block("outer")
    assert not inner.isVisible() and not w.scene.node_items["res"].isVisible() and outer.isVisible()
    w.controller.stack.undo()
    w.scene.select_nodes(["ln"])
    w.controller.ungroup_selected()  # the block of the selected node goes; its nodes stay in outer
    assert {n: g.nodes[n].group for n in ("ln", "lin", "res")} == {"ln": "outer", "lin": "outer", "res": "outer"}
    w.controller.stack.undo()
    assert g.nodes["ln"].group == "outer/inner"


def test_a_copied_nested_block_is_a_new_block_with_its_insides_and_grouping_keeps_what_is_collapsed(qtbot, asked, editor):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_main_window import transformer_block_project

    w = editor(transformer_block_project())
    g, c = w.project.graph, w.controller
    w.scene.select_nodes(["ln", "lin", "res"])
    c.group_selected("outer")
    w.scene.select_nodes(["ln", "lin"])
    c.group_selected("inner")
    c.toggle_block("outer/inner")
    # group the whole block (a collapsed card inside it included) into a new one: the card stays collapsed
    w.scene.select_nodes(["res"])
    w.scene.group_items["outer/inner"].setSelected(True)  # the card and the node beside it
    assert w.scene.selected_ids() == ["ln", "lin", "res"]
    assert c.group_selected("wrap") == "outer/wrap"
    assert "outer/wrap/inner" in g.collapsed and w.scene.group_items["outer/wrap/inner"].collapsed
    c.stack.undo()
    assert g.nodes["ln"].group == "outer/inner" and "outer/inner" in g.collapsed
    # duplicate the outer block: a new block beside it holding its own inner block, collapsed like the original
    w.scene.select_nodes(["res"])
    w.scene.group_items["outer/inner"].setSelected(True)
    c.duplicate()
    copies = [n for n in g.nodes if n not in ("x", "ln", "lin", "res", "out")]
    assert sorted({g.nodes[n].group for n in copies}) == ["outer_2", "outer_2/inner"]
    assert "outer_2/inner" in g.collapsed
    # a copy of part of a block joins it
    w.scene.select_nodes(["res"])
    c.duplicate()
    assert g.nodes[next(n for n in g.nodes if n not in copies and n.startswith("res") and n != "res")].group == "outer"
