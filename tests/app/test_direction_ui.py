"""Top down or left to right, picked in the real editor: ports move to the top and
bottom, the diagram is laid out again as one undo step, the choice is saved with the
project and remembered for the next one; a skip connection takes a lane beside the
chain instead of running under its cards."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from engine.project import Project, load_project

from tests.engine.diagram.test_direction import chain_with_skip  # noqa: E402

pytestmark = pytest.mark.gui
EXAMPLE = Path(__file__).resolve().parents[2] / "resources" / "examples" / "resnet_synthetic.lflow"


def ports_on(w, top_down: bool) -> bool:
    for item in w.scene.node_items.values():
        body = item.body()
        for port in item.ports.values():
            at = port.scenePos()
            if top_down:
                want_y = body.top() if port.is_input else body.bottom()
                if abs(at.y() - want_y) > 0.01 or not body.left() < at.x() < body.right():
                    return False
            else:
                want_x = body.left() if port.is_input else body.right()
                if abs(at.x() - want_x) > 0.01:
                    return False
    return True


def runs_under_a_card(w, e) -> list[str]:
    """The cards (other than its ends) that an edge's drawn curve passes under."""
    path = w.scene.edge_items[e].path()
    pts = [path.pointAtPercent(k / 200) for k in range(201)]
    return [nid for nid, item in w.scene.node_items.items()
            if nid not in (e.src, e.dst) and any(item.body().adjusted(2, 2, -2, -2).contains(p) for p in pts)]


def test_top_down_with_the_shortcut_undo_and_remembered(qtbot, asked, editor, tmp_path):
    w = editor(load_project(EXAMPLE))
    g = w.project.graph
    before = g.to_dict()
    assert g.direction == "LR" and ports_on(w, False)
    qtbot.keyClick(w, Qt.Key_T, Qt.ControlModifier | Qt.ShiftModifier)
    w.controller.flush()
    assert g.direction == "TB" and w.actions["top_down"].isChecked()
    assert ports_on(w, True)
    for e, item in w.scene.edge_items.items():  # laid out again: every wire runs down the canvas
        path = item.path()
        assert path.pointAtPercent(1).y() > path.pointAtPercent(0).y(), e
        assert not runs_under_a_card(w, e), e
    assert w.isWindowModified()
    assert w.controller.stack.undoText() == "Lay Out Top Down"
    w.controller.stack.undo()
    assert g.to_dict() == before and ports_on(w, False) and not w.actions["top_down"].isChecked()
    w.controller.stack.redo()
    assert g.direction == "TB" and ports_on(w, True)
    # saved with the project, and the next new project flows the same way
    path = tmp_path / "tb.lflow"
    assert w.save_as(path)
    assert load_project(path).graph.direction == "TB"
    w.new_project()
    assert w.project.graph.direction == "TB" and w.actions["top_down"].isChecked()


def test_a_skip_connection_takes_a_lane_left_to_right(qtbot, asked, editor):
    """The bundled ResNet's skips, as drawn (left to right), do not hide under the
    chain's cards they jump over."""
    w = editor(load_project(EXAMPLE))
    g = w.project.graph
    skips = [e for e in g.edges if g.nodes[e.dst].type == "Add"]
    assert skips
    for e in g.edges:
        assert not runs_under_a_card(w, e), (e, runs_under_a_card(w, e))


def test_a_collapsed_block_takes_its_ports_top_and_bottom(qtbot, asked, editor):
    g = chain_with_skip()  # x -> fc0 -> fc1 -> fc2 -> add, and x -> add
    for n in ("fc0", "fc1"):
        g.set_group(n, "body")
    g.collapsed = {"body"}
    w = editor(Project(g, name="blocks"))
    w.controller.set_direction("TB")
    w.controller.flush()
    card = w.scene.group_items["body"]
    assert card.collapsed and card.isVisible()
    r = card.mapRectToScene(card._rect)
    into = [e for e in g.edges if e.dst == "fc0"][0]
    out = [e for e in g.edges if e.src == "fc1"][0]
    a, b = w.scene.edge_ends(into)
    assert abs(b.y() - r.top()) < 0.01 and r.left() < b.x() < r.right()
    a, b = w.scene.edge_ends(out)
    assert abs(a.y() - r.bottom()) < 0.01 and b.y() > a.y()
