"""Names on the canvas stay readable at every zoom and in both directions (issue 42,
item 7), in the real window at 1440x900 with an imported ResNet-50: a name too long for
its card is cut at its end with "…" after a meaningful start (or not drawn at all far
out), never a stub like "a…l"; the whole name is in the tooltip; block cards show the
user's names on their ports, not ids made up by the import (layer1_0_relu_call3); the
view is fitted again after the direction changes and after its undo; the minimap never
covers a card."""
from __future__ import annotations


import pytest
from PySide6.QtWidgets import QApplication

from real_models import ResNet50

pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def resnet_project():
    from engine.interop.module.importer import from_module

    return from_module(ResNet50(layers=(1, 2, 3, 1)), [[3, 32, 32]], name="resnet50").project


@pytest.fixture
def w(qtbot, asked, resnet_project):
    from app.window import MainWindow

    w = MainWindow(resnet_project.copy(), recover=False)
    qtbot.addWidget(w)
    w.resize(1440, 900)
    w.show()
    qtbot.waitExposed(w)
    w.default_dock_sizes()
    QApplication.processEvents()
    w.controller.flush()
    return w


def paint(w):
    """Paint the canvas as the screen would (the items record the names they drew)."""
    for _ in range(3):
        QApplication.processEvents()
    w.view.viewport().grab()


def drawn_names(w) -> list[tuple[str, str | None]]:
    """(full name, what was drawn for it) of every card and frame the canvas painted."""
    out = []
    scene = w.scene
    if not scene.detail:
        out += [(n, label) for n, label in scene.overview.labels.items()
                if n in scene.node_items and scene.node_items[n].isVisible()]
    for g in scene.group_items.values():
        if g.isVisible() and hasattr(g, "far_labels"):
            full = g.card_name(short=True) if g.collapsed else g.title()
            out.append((full, g.far_labels[0]))
    return out


def assert_readable(pairs):
    assert pairs
    for full, label in pairs:
        if label is None or label == full:
            continue
        text = label.removeprefix("▾ ")
        assert text.endswith("…") and "…" not in text[:-1], f"{full!r} drawn as {label!r}: cut in the middle"
        start = text[:-1]
        assert full.startswith(start), f"{full!r} drawn as {label!r}"
        assert len(start) >= min(4, len(full)), f"{full!r} drawn as the stub {label!r}"


def test_names_far_out_are_whole_or_a_meaningful_start(w):
    v = w.view
    w.actions["fit"].trigger()
    paint(w)
    fitted = drawn_names(w)
    assert_readable(fitted)
    assert any(label == full for full, label in fitted)  # the short names are whole ("maxpool", "layer1")
    w.actions["top_down"].trigger()
    for zoom in (None, 0.16, 0.1, 0.3):
        if zoom is None:
            w.actions["fit"].trigger()
        else:
            v.set_zoom(zoom)
        paint(w)
        assert_readable(drawn_names(w))


def test_cut_names_keep_their_start_or_are_not_drawn():
    from widgets.node_scene.painting import fit_name

    assert fit_name("maxpool", 200)[0] == "maxpool"
    small = fit_name("maxpool", 40)
    assert small is None or small[0] == "maxpool" or (small[0].endswith("…") and len(small[0]) >= 5)
    assert fit_name("layer1_0_relu_call3", 45)[0].startswith("laye")
    assert fit_name("anything_long", 10) is None  # no room for four characters: nothing, not "a…g"


def test_full_names_on_hover_and_user_names_on_card_ports(w, qtbot):
    scene = w.scene
    for nid, item in scene.node_items.items():
        assert item.toolTip().startswith(nid)
    w.controller.toggle_block("layer3")  # expand a stage: its blocks show as cards
    qtbot.waitUntil(lambda: scene.group_items["layer3/layer3.0"].isVisible())
    QApplication.processEvents()
    ids = set(scene.graph.nodes)
    cards = [g for g in scene.group_items.values() if g.isVisible() and g.collapsed]
    labels = [(g.name, g.port_label(v, inp)) for g in cards for vals, inp in ((g.ins, True), (g.outs, False))
              for v in vals]
    assert labels
    for card, label in labels:
        assert label not in ids or label in ("x", "maxpool", "relu", "fc", "flatten", "avgpool"), \
            f"{card}: port named by the import's node id {label!r}"
        assert "_call" not in label
    first = scene.group_items["layer3/layer3.0"]
    assert first.port_label(first.ins[0], True) == "layer2" and first.port_label(first.outs[0], False) == "out"
    frame = scene.group_items["layer3"]
    assert not frame.collapsed and frame.toolTip() == frame.title()  # an expanded frame: its whole name on hover


def all_cards_in_view(w) -> bool:
    vis = w.view.visible_scene_rect()
    cards = [it.body() for it in w.scene.node_items.values() if it.isVisible()]
    cards += [g.mapRectToScene(g._rect) for g in w.scene.group_items.values() if g.isVisible() and g.collapsed]
    return all(vis.contains(c) for c in cards)


def minimap_clear(w) -> bool:
    mm = w.view.minimap
    if not mm.isVisible():
        return all(w.view.cards_under(c) for c in w.view.minimap_corners())  # hidden only when no corner is free
    return not w.view.cards_under(mm.geometry())


def test_fit_after_direction_change_and_its_undo_and_the_minimap_clear_of_cards(w, qtbot):
    v = w.view
    w.actions["fit"].trigger()
    paint(w)
    assert all_cards_in_view(w) and minimap_clear(w) and v.minimap.isVisible()
    fitted_lr = v.zoom()
    v.set_zoom(2.0)  # the user zoomed in somewhere
    v.centerOn(0, 0)
    w.actions["top_down"].trigger()
    qtbot.waitUntil(lambda: all_cards_in_view(w) or v.zoom() == pytest.approx(v.READABLE))
    paint(w)
    assert minimap_clear(w)
    v.set_zoom(2.0)
    w.controller.stack.undo()  # back to left to right: fitted again, not left where it was
    qtbot.waitUntil(lambda: w.project.graph.direction == "LR" and all_cards_in_view(w))
    assert v.zoom() == pytest.approx(fitted_lr, rel=0.05)
    paint(w)
    assert minimap_clear(w)
    w.controller.stack.redo()
    qtbot.waitUntil(lambda: w.project.graph.direction == "TB")
    qtbot.waitUntil(lambda: all_cards_in_view(w) or v.zoom() == pytest.approx(v.READABLE))
    # the minimap moves out of a corner a card comes under, or hides
    for dx in range(-600, 601, 200):
        v.centerOn(v.visible_scene_rect().center().x() + dx, v.visible_scene_rect().center().y())
        QApplication.processEvents()
        assert minimap_clear(w)
