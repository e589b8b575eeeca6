"""Colours and fonts for the node editor, per theme.

One place for every colour the canvas paints, so light and dark stay consistent.
Stage colours are the same in both themes: a node's colour says where it runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtGui import QColor

from engine.units import human  # noqa: F401  (re-exported for the widgets)

# Tableau-like, distinguishable, readable with white text.
STAGE_COLORS = ["#3b82c4", "#d9822b", "#3a9e5c", "#c94f4f", "#8a63b8", "#8c6d4f", "#c462a8", "#4f9ea8"]


@dataclass(frozen=True)
class SceneTheme:
    name: str
    background: str
    grid_minor: str
    grid_major: str
    node_body: str
    node_border: str
    node_header: str  # nodes without a stage
    header_text: str
    text: str
    subtext: str
    selected: str
    port_in: str
    port_out: str
    edge: str
    edge_selected: str
    label_bg: str
    label_text: str
    comm_text: str
    error: str
    warning: str
    badge_bg: str
    badge_text: str
    group_fill: str  # #AARRGGBB (Qt's order for 8 hex digits)
    group_border: str
    group_text: str


LIGHT = SceneTheme(
    name="light", background="#f4f5f7", grid_minor="#e6e8ec", grid_major="#d5d9e0",
    node_body="#ffffff", node_border="#c3c8d0", node_header="#5b6677", header_text="#ffffff",
    text="#1f2430", subtext="#667085", selected="#111827", port_in="#6b7a90", port_out="#6b7a90",
    edge="#7d8797", edge_selected="#111827", label_bg="#ffffff", label_text="#344054", comm_text="#b42318",
    error="#d92d20", warning="#dc8a00", badge_bg="#eef1f5", badge_text="#344054",
    group_fill="#141d4ed8", group_border="#7b93c9", group_text="#3b4f7a",
)
DARK = SceneTheme(
    name="dark", background="#1e2127", grid_minor="#262a31", grid_major="#30353e",
    node_body="#2b3038", node_border="#434a56", node_header="#4a5363", header_text="#ffffff",
    text="#e6e9ef", subtext="#98a2b3", selected="#f8fafc", port_in="#9aa4b5", port_out="#9aa4b5",
    edge="#8a94a6", edge_selected="#f8fafc", label_bg="#2b3038", label_text="#d0d5dd", comm_text="#ff8a80",
    error="#f04438", warning="#f5b942", badge_bg="#3a404b", badge_text="#d0d5dd",
    group_fill="#206e8cd0", group_border="#6e8cd0", group_text="#b7c6ea",
)
THEMES = {"light": LIGHT, "dark": DARK}


def theme(name: str) -> SceneTheme:
    return THEMES.get(name, LIGHT)


def stage_color(stage: int | None, t: SceneTheme) -> QColor:
    if stage is None:
        return QColor(t.node_header)
    return QColor(STAGE_COLORS[stage % len(STAGE_COLORS)])


AUTO_MIX = 0.3  # how far a planned stage's colour goes towards the canvas


def auto_stage_color(stage: int | None, t: SceneTheme) -> QColor:
    """The colour of a stage the planner chose (the automatic pipeline cut, no stage set by
    the user): the stage's own colour, lighter (darker on a dark canvas), so an assigned
    stage and a planned one read as the same stage and still differ."""
    c = stage_color(stage, t)
    if stage is None:
        return c
    bg = QColor(t.background)
    return QColor(*(round(a + (b - a) * AUTO_MIX) for a, b in ((c.red(), bg.red()), (c.green(), bg.green()),
                                                               (c.blue(), bg.blue()))))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} PiB"
