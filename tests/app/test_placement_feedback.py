"""Placement feedback in the user's terms (issue 42, item 8), on the real window with a
project of two collapsed blocks placed with the mouse: the Devices panel's stage list
shows what the plan puts on each stage (the planner's own cut included, never "(empty)"
while the plan fills them); an error names the block the user assigned, with the inner
node in its detail, and wraps instead of being cut off; nodes left on a stage beyond pp
are a problem on their nodes; the panel fits its dock or scrolls."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QHelpEvent
from PySide6.QtWidgets import QApplication, QToolTip

from tests.app.test_block_placement import click_card, two_blocks

pytestmark = pytest.mark.gui


@pytest.fixture
def w(asked, editor):
    win = editor(two_blocks())
    win.resize(1440, 900)
    win.show_workspace("Place")  # the Devices panel's workspace (app/workspaces.py)
    win.devices_dock.raise_()
    QApplication.processEvents()
    return win


def lanes(w) -> list[tuple[str, str]]:
    lane = w.devices.lanes
    return [(title, lane.lane_text(i)) for i, (title, _, _) in enumerate(lane.lanes)]


def assign(qtbot, w, block: str, stage: int) -> None:
    """Click the block's card, choose the stage, press Assign selected."""
    d = w.devices
    click_card(qtbot, w, block)
    d.stage_combo.setCurrentIndex(d.stage_combo.findData(stage))
    d.assign_btn.click()
    w.controller.flush()
    QApplication.processEvents()


def placement_rows(w) -> list:
    items = [w.problems.topLevelItem(i) for i in range(w.problems.topLevelItemCount())]
    return [i for i in items if "training.dataset" not in i.text(2) and "data set" not in i.text(2)]


def test_the_stage_list_shows_the_plans_stages_in_blocks(qtbot, w):
    w.devices.spins["pp"].setValue(2)  # no node has a stage: the planner cuts the model itself
    w.controller.flush()
    QApplication.processEvents()
    stages = w.controller.plan.run.stages
    assert all(stages) and len(stages) == 2
    shown = lanes(w)
    assert len(shown) == 2 and all("(empty)" not in text for _, text in shown), shown
    assert all("planner's cut" in title for title, _ in shown)
    # the cut falls inside mlp: the block is named with the layers on each side; head whole
    assert shown[0][1] == "mlp (fc1, act)" and shown[1][1] == "mlp (fc2, norm), head", shown
    assert "auto (planner decides)" not in [t for t, _ in shown]

    assign(qtbot, w, "mlp", 0)  # the user's cut: blocks by name, nothing "planner's"
    assign(qtbot, w, "head", 1)
    assert lanes(w) == [("stage 0  ·  1 device(s)", "mlp"), ("stage 1  ·  1 device(s)", "head")]

    # a lane's full list is its tooltip (its painted line may be elided)
    lane = w.devices.lanes
    event_pos = QPoint(10, 46 + 20)
    lane.event(QHelpEvent(QEvent.ToolTip, event_pos, lane.mapToGlobal(event_pos)))
    assert "head" in QToolTip.text() and "stage 1" in QToolTip.text()


def test_an_error_names_the_block_the_user_assigned_and_is_not_cut_off(qtbot, w):
    w.devices.spins["pp"].setValue(2)
    assign(qtbot, w, "head", 0)  # against the data flow: head takes mlp's output
    assign(qtbot, w, "mlp", 1)
    rows = placement_rows(w)
    assert len(rows) == 1, [r.text(2) for r in rows]
    row = rows[0]
    assert row.text(1) == "head"
    text = row.text(2)
    assert text.startswith("block 'head' is on stage 0 but takes its input from block 'mlp' on stage 1")
    assert "set 'head' to stage 1 or later" in text and "inside: edge norm -> fc3" in text  # the detail
    blocker = w.controller.run_blocker()
    assert "block 'head'" in blocker
    assert "block 'head'" in w.run_ui.toolbar.run_action.toolTip()
    # the inner node keeps its badge (the engine found it there)
    assert w.scene.node_items["fc3"].badge is not None

    # wrapped, not elided: a narrow list shows the text on several lines
    w.problems_dock.raise_()
    w.problems.setColumnWidth(1, 80)
    w.resizeDocks([w.problems_dock], [900], Qt.Horizontal)
    QApplication.processEvents()
    w.problems.doItemsLayout()
    QApplication.processEvents()
    line = w.problems.fontMetrics().height()
    width = w.problems.header().sectionSize(2)
    need = w.problems.fontMetrics().horizontalAdvance(text)
    height = w.problems.visualItemRect(row).height()
    assert need > width and height >= line * min(3, -(-need // width)), (height, line, need, width)
    assert row.toolTip(2) == text

    # a click on the row selects the block the user assigned
    w.scene.clearSelection()
    w.problems._clicked(row)
    assert w.scene.selected_groups() == ["head"]
    # collapsed, the block's card carries the badge of the layer it hides, its message on hover
    w.scene.set_collapsed("head", True)
    w.controller.flush()
    QApplication.processEvents()
    card = w.scene.group_items["head"]
    assert card.badge is not None and card.badge.isVisible() and card.badge.kind == "error"
    assert "block 'head'" in card.badge.toolTip() or "fc3" in card.badge.toolTip(), card.badge.toolTip()
    w.scene.set_collapsed("head", False)
    w.controller.flush()
    QApplication.processEvents()
    assert card.badge is None or not card.badge.isVisible()

    w.controller.stack.undo()  # mlp back to auto: still wrong, said of head
    w.controller.stack.undo()  # head back to auto
    w.controller.flush()
    assert placement_rows(w) == []


def test_nodes_left_on_a_stage_beyond_pp_are_a_problem(qtbot, w):
    w.devices.spins["pp"].setValue(2)
    assign(qtbot, w, "mlp", 0)
    assign(qtbot, w, "head", 1)
    assert placement_rows(w) == []
    w.devices.spins["pp"].setValue(1)  # head is left on stage 1
    w.controller.flush()
    QApplication.processEvents()
    rows = placement_rows(w)
    assert len(rows) == 1 and rows[0].text(1) == "head", [r.text(2) for r in rows]
    text = rows[0].text(2)
    assert text.startswith("block 'head': stage 1 is ignored: placement.pp is 1")
    assert "fc3 (Linear), act2 (ReLU), fc4 (Linear)" in text
    assert rows[0].childCount() == 3  # its nodes under it
    for n in ("fc3", "act2", "fc4"):  # on the nodes too
        badge = w.scene.node_items[n].badge
        assert badge is not None and "placement.pp is 1" in w.scene.node_items[n].toolTip()
    title = [t for t, _ in lanes(w)]
    assert title[-1].startswith("stage ≥ 1: beyond pp=1")
    assert w.problems.counts[1] == 1  # one warning: the block's, on its three nodes

    w.devices.spins["pp"].setValue(3)  # under pp > 1 the cut refuses it: an error, said of the block
    assign(qtbot, w, "head", 2)
    w.devices.spins["pp"].setValue(2)
    w.controller.flush()
    QApplication.processEvents()
    rows = placement_rows(w)
    assert any(r.text(1) == "head" and r.text(2).startswith("block 'head': stage 2 but placement.pp is 2")
               for r in rows), [r.text(2) for r in rows]
    errors = [e for e in w.controller.problems()[0] if e.field == "placement"]
    assert len(errors) == 3 and len({e.message for e in errors}) == 1  # on fc3, act2 and fc4, said once
    blocker = w.controller.run_blocker()
    total = len(w.controller.problems()[0]) - 2  # the block's three are one problem
    assert blocker.endswith(f"(and {total - 1} more in Problems)") if total > 1 else "more in" not in blocker


def test_the_devices_panel_fits_its_dock_or_scrolls(qtbot, w):
    d = w.devices
    d.spins["pp"].setValue(2)
    w.controller.flush()
    QApplication.processEvents()
    assert d.plan_view.isVisible() and d.plan_view.toPlainText().startswith("mesh: pp=2")
    page, view = d.scroll.widget(), d.scroll.viewport()
    assert page.width() <= view.width()  # never wider than the dock: nothing cut off at the right
    plan = d.plan_view
    assert plan.horizontalScrollBar().maximum() > 0 or plan.document().idealWidth() <= plan.viewport().width()
    # a short dock: the panel scrolls, and the plan can be scrolled to
    w.resizeDocks([w.devices_dock], [300], Qt.Vertical)
    QApplication.processEvents()
    if page.height() > view.height():
        assert d.scroll.verticalScrollBar().isVisible()
    d.scroll.ensureWidgetVisible(plan)
    QApplication.processEvents()
    top = plan.mapTo(view, QPoint(0, 0)).y()
    assert top < view.height() and not plan.visibleRegion().isEmpty()
