"""A node of the diagram on the canvas: its card (NodeItem), the ports on it
(PortItem: hit areas only, the card paints them), the error/warning badge on its
corner (Badge), and the ghost of a node that a compared version has and this one
does not (GhostItem).

A card draws its node from the model (scene.graph) and the last compile result
(scene.result); it holds no diagram state of its own. A drag is snapped to the grid
and reported to the scene, which turns a finished drag into one `nodes_moved`.

`self.scene()` is always the NodeScene of scene.py, which imports this module; it
is not imported back (the package has no import cycle), so the scene is typed here
as a plain QGraphicsScene.
"""
from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFontMetricsF, QPainter, QPen
from PySide6.QtWidgets import QGraphicsItem, QGraphicsScene

from engine.diagram.graph import ports_of
from engine.runtime.ops import describe
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
)
from widgets.node_scene.painting import (
    DIFF_COLORS,
    NO_BRUSH,
    NO_PEN,
    READABLE_LOD,
    SMALL_FONT,
    TEXT_FONT,
    TITLE_FONT,
    draw_far_label,
    elide,
)
from widgets.style import auto_stage_color, human, stage_color


class PortItem(QGraphicsItem):
    """A connection point: hit area and hover only; its node paints it (one
    paint call per node instead of one per port keeps big diagrams fast)."""

    _RECT = QRectF(-PORT_R - 4, -PORT_R - 4, 2 * PORT_R + 8, 2 * PORT_R + 8)

    def __init__(self, parent: NodeItem, name: str, is_input: bool, at: QPointF, row_y: float):
        super().__init__(parent)
        self.node_id = parent.node_id
        self.name = name
        self.is_input = is_input
        self.row_y = row_y  # the row of the node's body that shows its name
        self.setPos(at)
        self.setFlag(QGraphicsItem.ItemHasNoContents)
        self.setAcceptHoverEvents(True)
        self.hover = False
        self.setZValue(2)
        self.setCursor(Qt.CrossCursor)

    def boundingRect(self) -> QRectF:
        return self._RECT

    def paint(self, p: QPainter, opt, widget=None) -> None:  # never called (no contents)
        pass

    def hoverEnterEvent(self, e) -> None:
        self.hover = True
        self.parentItem().update()

    def hoverLeaveEvent(self, e) -> None:
        self.hover = False
        self.parentItem().update()


class Badge(QGraphicsItem):
    """A round error/warning marker; its tooltip is the message."""

    def __init__(self, parent: QGraphicsItem, kind: str):
        super().__init__(parent)
        self.kind = kind
        self.setZValue(3)

    def boundingRect(self) -> QRectF:
        return QRectF(-9, -9, 18, 18)

    def paint(self, p: QPainter, opt, widget=None) -> None:
        t = self.scene().theme
        p.setRenderHint(QPainter.Antialiasing)
        p.setPen(QPen(QColor(t.node_body), 2))
        p.setBrush(QColor(t.error if self.kind == "error" else t.warning))
        p.drawEllipse(QPointF(0, 0), 8, 8)
        p.setPen(QColor("#ffffff"))
        p.setFont(TITLE_FONT)
        p.drawText(QRectF(-8, -8, 16, 16), Qt.AlignCenter, "!")


class NodeItem(QGraphicsItem):
    def __init__(self, node_id: str, scene: QGraphicsScene):
        super().__init__()
        self.node_id = node_id
        self.setFlags(QGraphicsItem.ItemIsMovable | QGraphicsItem.ItemIsSelectable
                      | QGraphicsItem.ItemSendsGeometryChanges)
        self.setZValue(1)
        self.ports: dict[tuple[str, bool], PortItem] = {}
        self._h = node_height(1, 1)
        self._rect = QRectF()
        self.badge: Badge | None = None
        scene.addItem(self)
        self.rebuild_ports()
        self.setToolTip(self.name_tip())  # (with its problems once compiled: set_problems)

    @property
    def node(self):
        return self.scene().graph.nodes[self.node_id]

    def rebuild_ports(self) -> None:
        """Port items follow the node's type and params (Concat.num_inputs)."""
        node = self.node
        ins, outs = ports_of(node.type, node.params)
        for item in self.ports.values():
            item.setParentItem(None)
            if item.scene():
                item.scene().removeItem(item)
        self.ports = {}
        self.prepareGeometryChange()
        self._h = node_height(len(ins), len(outs))
        scene = self.scene()
        top_down = scene is not None and scene.top_down
        m = PORT_R + 3  # the port dots stick out of the card
        self._rect = QRectF(-2, -m, NODE_W + 4, self._h + 2 * m) if top_down else QRectF(-m, -2, NODE_W + 2 * m, self._h + 4)
        body = QRectF(0, 0, NODE_W, self._h)
        detail = scene.detail if scene is not None else True
        for names, is_input in ((ins, True), (outs, False)):
            for i, name in enumerate(names):
                row = BODY_TOP + (i + 0.5) * ROW_H
                at = port_point(body, i, len(names), is_input, row, top_down)
                self.ports[(name, is_input)] = PortItem(self, name, is_input, at, row)
        for port in self.ports.values():
            port.setVisible(detail)

    def set_problems(self, errors: list, warnings: list) -> None:
        if self.badge is not None:
            self.scene().removeItem(self.badge)
            self.badge = None
        if errors or warnings:
            self.badge = Badge(self, "error" if errors else "warning")
            self.badge.setPos(NODE_W - 4, 0)
            self.badge.setToolTip("\n".join(str(e) for e in (errors or warnings)))
        mark = self.scene().diff_marks.get(self.node_id)
        tip = [self.name_tip()] + [str(e) for e in (*errors, *warnings)] + \
            ([f"Since the compared version:\n{mark[1]}"] if mark else [])
        self.setToolTip("\n".join(tip))
        self.update()

    def name_tip(self) -> str:
        """The first line of its tooltip: its whole name (a card may show it cut), its
        type, and the module it came from in an imported model."""
        node = self.node
        origin = node.scope[-1][0] if getattr(node, "scope", None) else ""
        name = f"{self.node_id} ({node.type})" + (f" · {origin}" if origin and origin != self.node_id else "")
        scene = self.scene()
        stage, auto = scene.stage_of(self.node_id) if scene is not None and hasattr(scene, "stage_of") else (None, False)
        return name + (f"\nstage {stage}: the plan's automatic cut (no stage set)" if auto else "")

    def boundingRect(self) -> QRectF:
        return self._rect

    def body(self) -> QRectF:
        """The card itself in scene coordinates (without the port dots)."""
        return QRectF(self.pos().x(), self.pos().y(), NODE_W, self._h)

    def paint(self, p: QPainter, opt, widget=None) -> None:
        scene = self.scene()
        t = scene.theme
        node = self.node
        info = scene.result.nodes.get(self.node_id) if scene.result else None
        lod = opt.levelOfDetailFromTransform(p.worldTransform())
        rect = QRectF(0, 0, NODE_W, self._h)
        stage, auto = scene.stage_of(self.node_id)  # auto: the plan's cut, not the user's
        head = auto_stage_color(stage, t) if auto else stage_color(stage, t)
        sel = self.isSelected()
        if lod < LOD_DETAIL:  # far away (and not in overview mode): a coloured card and its name
            p.fillRect(rect, QColor(t.selected) if sel else head)
            self.far_label = draw_far_label(p, rect, self.node_id, QColor(t.header_text), lod,
                                            bg=QColor(t.selected) if sel else head)
            mark = scene.diff_marks.get(self.node_id)
            if mark:
                p.setPen(QPen(DIFF_COLORS[mark[0]], 3 / max(lod, 0.05)))  # thick at any zoom
                p.setBrush(NO_BRUSH)
                p.drawRect(rect.adjusted(-4, -4, 4, 4))
            return
        p.setRenderHint(QPainter.Antialiasing)
        p.setPen(QPen(QColor(t.selected), 2.2) if sel else QPen(QColor(t.node_border), 1))
        p.setBrush(QColor(t.node_body))
        p.drawRoundedRect(rect, 7, 7)
        # header band in the stage colour: rounded on top, square where it meets the body
        p.setPen(NO_PEN)
        p.setBrush(head)
        p.drawRoundedRect(QRectF(0, 0, NODE_W, HEADER_H), 7, 7)
        p.fillRect(QRectF(0, HEADER_H - 8, NODE_W, 8), head)
        if sel:
            p.setPen(QPen(QColor(t.selected), 2.2))
            p.setBrush(NO_BRUSH)
            p.drawRoundedRect(rect, 7, 7)
        elif auto:  # a planned stage: the stage's own colour, dashed, around the card
            p.setPen(QPen(stage_color(stage, t), 1.6, Qt.DashLine))
            p.setBrush(NO_BRUSH)
            p.drawRoundedRect(rect, 7, 7)
        mark = scene.diff_marks.get(self.node_id)
        if mark:  # compared with another version: added green, changed amber, outside the card
            p.setPen(QPen(DIFF_COLORS[mark[0]], 4))
            p.setBrush(NO_BRUSH)
            p.drawRoundedRect(rect.adjusted(-5, -5, 5, 5), 10, 10)
        # title, then a parameter-count badge on the right of the header
        badge = human(info.n_params) if info and info.n_params else ""
        bw = 0.0
        if badge:
            p.setFont(SMALL_FONT)
            bw = QFontMetricsF(SMALL_FONT).horizontalAdvance(badge) + 10
            br = QRectF(NODE_W - bw - 6, 6, bw, HEADER_H - 12)
            p.setPen(NO_PEN)
            p.setBrush(QColor(255, 255, 255, 60))
            p.drawRoundedRect(br, 6, 6)
            p.setPen(QColor(t.header_text))
            p.drawText(br, Qt.AlignCenter, badge)
        if lod < READABLE_LOD:  # the card whole but its name too small at its own size: drawn at
            # a readable screen size in the header (as far out), so a whole diagram reads at a fit
            self.far_label = draw_far_label(p, QRectF(8, 0, NODE_W - bw - 14, HEADER_H), self.node_id,
                                            QColor(t.header_text), lod, left=True)
        else:
            self.far_label = None
            p.setFont(TITLE_FONT)
            p.setPen(QColor(t.header_text))
            title = elide(self.node_id, TITLE_FONT, NODE_W - bw - 20)  # (the tooltip has it whole)
            p.drawText(QRectF(10, 0, NODE_W - 20, HEADER_H), Qt.AlignVCenter | Qt.AlignLeft, title)
        # type line: type on the left, stage/TP on the right
        p.setFont(TEXT_FONT)
        p.setPen(QColor(t.subtext))
        tags = []
        if stage is not None:
            tags.append(f"auto S{stage}" if auto else f"S{stage}")  # the header colour says it too
        if node.tp:
            tags.append(node.tp)
        if node.checkpoint:
            tags.append("ckpt")
        line = QRectF(10, HEADER_H, NODE_W - 20, BODY_TOP - HEADER_H - 2)
        fm = QFontMetricsF(TEXT_FONT)
        tag_w = 0.0
        if tags:
            tag_text = " · ".join(tags)
            tag_w = fm.horizontalAdvance(tag_text) + 8
            p.drawText(line, Qt.AlignVCenter | Qt.AlignRight, tag_text)
        kind = describe(node.params) if node.type == "Op" else node.type  # a generic op shows its call
        p.drawText(line, Qt.AlignVCenter | Qt.AlignLeft, fm.elidedText(kind, Qt.ElideRight, line.width() - tag_w))
        p.setPen(QPen(QColor(t.node_border), 0.8))
        p.drawLine(QPointF(1, BODY_TOP - 2), QPointF(NODE_W - 1, BODY_TOP - 2))
        # port names and dots
        p.setPen(QColor(t.text))
        for (name, is_input), port in self.ports.items():
            y = port.row_y
            r = QRectF(12, y - ROW_H / 2, NODE_W / 2 - 12, ROW_H) if is_input else QRectF(NODE_W / 2, y - ROW_H / 2, NODE_W / 2 - 12, ROW_H)
            p.drawText(r, Qt.AlignVCenter | (Qt.AlignLeft if is_input else Qt.AlignRight), name)
        p.setPen(QPen(QColor(t.node_body), 1.5))
        for (name, is_input), port in self.ports.items():
            rad = PORT_R + (1.5 if port.hover else 0)
            p.setBrush(QColor(t.selected if port.hover else (t.port_in if is_input else t.port_out)))
            p.drawEllipse(port.pos(), rad, rad)

    def itemChange(self, change, value):
        scene = self.scene()
        if change == QGraphicsItem.ItemPositionChange and scene is not None and scene.snap and not scene._syncing:
            return QPointF(round(value.x() / GRID) * GRID, round(value.y() / GRID) * GRID)
        if change == QGraphicsItem.ItemPositionHasChanged and scene is not None:
            scene._item_moved(self.node_id)
        return super().itemChange(change, value)


class GhostItem(QGraphicsItem):
    """A node the compared version has and this one does not: a dashed red outline
    where it was, with its name; not selectable, not part of the diagram."""

    def __init__(self, node: dict, tip: str):
        super().__init__()
        self.node_id = node["id"]
        self.kind = node["type"]
        self._rect = QRectF(0, 0, NODE_W, node_height(1, 1))
        self.setPos(*node.get("pos", (0, 0)))
        self.setZValue(0.5)
        self.setToolTip(f"Removed since the compared version:\n{tip}")

    def boundingRect(self) -> QRectF:
        return self._rect.adjusted(-3, -3, 3, 3)

    def paint(self, p: QPainter, opt, widget=None) -> None:
        red = DIFF_COLORS["removed"]
        p.setRenderHint(QPainter.Antialiasing)
        fill = QColor(red)
        fill.setAlpha(40)
        p.setBrush(fill)
        p.setPen(QPen(red, 2.5, Qt.DashLine))
        p.drawRoundedRect(self._rect, 7, 7)
        p.setPen(red)
        p.setFont(TITLE_FONT)
        p.drawText(self._rect.adjusted(10, 0, -10, -self._rect.height() / 2), Qt.AlignVCenter | Qt.AlignLeft,
                   self.node_id)
        p.setFont(TEXT_FONT)
        p.drawText(self._rect.adjusted(10, self._rect.height() / 2, -10, 0), Qt.AlignVCenter | Qt.AlignLeft,
                   f"{self.kind} (removed)")
