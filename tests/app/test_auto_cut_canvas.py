"""The plan's automatic pipeline cut is coloured on the canvas (issue 42, item 8, its
canvas part): with two pipeline stages and no stage set by the user, each node shows the
stage the plan put it on, in that stage's colour made lighter (and a dashed outline);
a stage the user sets shows in the full colour; one stage again: no colours."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QPointF
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QApplication

pytestmark = pytest.mark.gui
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def w(qtbot, asked):
    from app.window import MainWindow
    from engine.project import load_project

    w = MainWindow(load_project(ROOT / "resources/examples/cnn_digits.lflow"), recover=False)
    qtbot.addWidget(w)
    w.resize(1440, 900)
    w.show()
    qtbot.waitExposed(w)
    w.controller.flush()
    return w


def header_pixel(w, nid) -> QColor:
    """The colour the canvas shows in a node's header band (away from its text)."""
    v = w.view
    v.set_zoom(1.0)
    item = w.scene.node_items[nid]
    v.centerOn(item.body().center())
    QApplication.processEvents()
    image = v.viewport().grab().toImage()
    at = v.mapFromScene(item.body().topLeft() + QPointF(4, 14))
    return image.pixelColor(at)


def close(a: QColor, b: QColor, tol=6) -> bool:
    return all(abs(x - y) <= tol for x, y in zip(a.getRgb()[:3], b.getRgb()[:3]))


def test_the_automatic_cut_is_coloured_and_an_assigned_stage_wins(w, qtbot):
    from widgets.style import auto_stage_color, stage_color

    scene, c = w.scene, w.controller
    assert scene.auto_stages == {}
    grey = header_pixel(w, "conv1")
    c.set_mesh("pp", 2)
    c.flush()
    qtbot.waitUntil(lambda: bool(scene.auto_stages))
    plan = c.plan.run.stages
    assert len(plan) == 2
    for i, ids in enumerate(plan):
        for nid in ids:
            assert scene.stage_of(nid) == (i, True)
    first, last = plan[0][0], plan[1][-1]
    t = scene.theme
    assert close(header_pixel(w, first), auto_stage_color(0, t))
    assert close(header_pixel(w, last), auto_stage_color(1, t))
    assert not close(auto_stage_color(0, t), stage_color(0, t)) and not close(header_pixel(w, first), grey)
    assert "automatic cut" in scene.node_items[first].toolTip()
    # far out (the overview draws every card): the same colours
    w.view.set_zoom(0.2)
    body = scene.node_items[last].body()
    w.view.centerOn(body.center())
    QApplication.processEvents()
    image = w.view.viewport().grab().toImage()
    assert close(image.pixelColor(w.view.mapFromScene(body.topLeft() + QPointF(6, 6))), auto_stage_color(1, t))
    # the user puts a node on a stage: the full colour, no longer "auto"
    c.set_placement([first], "stage", 1)
    c.flush()
    qtbot.waitUntil(lambda: scene.stage_of(first) == (1, False))
    assert close(header_pixel(w, first), stage_color(1, t))
    # one stage again: nothing planned to colour
    c.stack.undo()
    c.set_mesh("pp", 1)
    c.flush()
    qtbot.waitUntil(lambda: scene.auto_stages == {})
    assert close(header_pixel(w, first), grey)


def test_a_collapsed_block_shows_the_stage_the_plan_puts_it_on(w, qtbot):
    from widgets.style import auto_stage_color

    scene, c = w.scene, w.controller
    c.set_mesh("pp", 2)
    c.flush()
    qtbot.waitUntil(lambda: bool(scene.auto_stages))
    ids = c.plan.run.stages[1][-2:]
    scene.select_nodes(ids)
    c.group_selected("tail")
    c.flush()
    qtbot.waitUntil(lambda: "tail" in scene.group_items)
    scene.set_collapsed("tail", True)
    card = scene.group_items["tail"]
    qtbot.waitUntil(lambda: card.planned_stages() == ([1], True))
    assert card.stage_colour().name() == auto_stage_color(1, scene.theme).name()
    assert card.placement_tags()[0].startswith("auto S1")
