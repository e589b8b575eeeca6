"""The node editor's canvas: a Qt view of engine.diagram.graph.Graph.

Items are drawn from the model and from the last compile result; they hold no
diagram state of their own. The scene subscribes to the graph's events and adds,
removes or repaints items. User gestures (a finished drag, a port-to-port drag)
are reported as signals; the controller turns them into undo commands, which
change the model, whose events come back here.

The modules, leaves first (none imports one listed after it):

- geometry.py: card sizes, port positions, the grid, the curve an edge takes
- painting.py: shared fonts and pens, comparison colours, names drawn far out
- node_item.py: NodeItem (a node's card), PortItem, Badge, GhostItem
- edge_item.py: EdgeItem
- group_item.py: GroupItem (a block's frame, or its collapsed card)
- overview_item.py: OverviewItem (the whole diagram in one paint far out)
- scene.py: NodeScene, which owns the items and dispatches the graph's events

Callers import from here (`from widgets.node_scene import NodeScene`).
"""
from __future__ import annotations

from widgets.node_scene.edge_item import EdgeItem
from widgets.node_scene.geometry import (
    BODY_TOP,
    GRID,
    HEADER_H,
    LOD_DETAIL,
    NODE_W,
    PORT_R,
    ROW_H,
    node_height,
    port_point,
    wire_path,
)
from widgets.node_scene.group_item import GroupItem
from widgets.node_scene.node_item import Badge, GhostItem, NodeItem, PortItem
from widgets.node_scene.overview_item import OverviewItem
from widgets.node_scene.painting import (
    DIFF_COLORS,
    LABEL_PX,
    READABLE_LOD,
    draw_far_label,
)
from widgets.node_scene.painting import (
    _far_font as _far_font,  # (a test reads the cached far-out fonts)
)
from widgets.node_scene.scene import NodeScene

__all__ = [
    "BODY_TOP", "DIFF_COLORS", "GRID", "HEADER_H", "LABEL_PX", "LOD_DETAIL", "NODE_W", "PORT_R",
    "READABLE_LOD", "ROW_H", "Badge", "EdgeItem", "GhostItem", "GroupItem", "NodeItem", "NodeScene",
    "OverviewItem", "PortItem", "draw_far_label", "node_height", "port_point", "wire_path",
]
