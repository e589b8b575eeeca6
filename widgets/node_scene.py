"""The node editor's scene: a view of engine.graph.Graph.

Items are drawn from the model and from the last compile result; they hold no
diagram state of their own. The scene subscribes to the graph's events and adds,
removes or repaints items. User gestures (a finished drag, a port-to-port drag)
are reported as signals; the controller turns them into undo commands, which
change the model, whose events come back here.
"""
from __future__ import annotations

import atexit
import os
import contextlib
import functools

import shiboken6
from PySide6.QtCore import QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QGraphicsItem, QGraphicsPathItem, QGraphicsScene

from engine.graph import BLOCK_SEP, Edge, Graph, GraphEvent, block_name, block_path, block_type, ports_of
from engine.layout import CARD_EXTRA, card_of, folded, repeated_runs
from engine.runtime.ops import describe
from widgets.style import LIGHT, SceneTheme, human, stage_color

NODE_W = 152.0
HEADER_H = 26.0
BODY_TOP = 48.0  # first port row starts here (header + type line)
ROW_H = 18.0
PORT_R = 5.0
GRID = 20.0
LOD_DETAIL = 0.35  # below this zoom nodes are plain cards and ports are hidden

_TITLE_FONT = QFont()
_TITLE_FONT.setPointSizeF(9.5)
_TITLE_FONT.setBold(True)
_TEXT_FONT = QFont()
_TEXT_FONT.setPointSizeF(8.5)
_SMALL_FONT = QFont()
_SMALL_FONT.setPointSizeF(7.5)
_NO_BRUSH = QBrush()
_NO_PEN = QPen(Qt.NoPen)


def _count(n: float) -> str:
    """12,345,678 -> 12.3M (a block card's figures)."""
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


LABEL_PX = 11.0  # names far out: this many pixels high on the screen, whatever the zoom
READABLE_LOD = 0.6  # below this zoom a name drawn at its own size is too small to read


@functools.lru_cache(maxsize=64)
def _far_font(points: float) -> tuple[QFont, QFontMetricsF]:
    font = QFont(_TITLE_FONT)
    font.setPointSizeF(points)
    return font, QFontMetricsF(font)


# Qt objects must not outlive the application: drop the cached fonts first at exit
atexit.register(_far_font.cache_clear)


def draw_far_label(p: QPainter, rect: QRectF, text: str, color: QColor, lod: float, left: bool = False) -> None:
    """A name that stays readable when zoomed far out: drawn at a fixed screen size
    over its card (centred, elided to a little more than the card's width; `left`:
    along the top of a frame, elided to its width)."""
    if rect.width() * lod < 24:  # the card is a few pixels (the minimap): no room for a name
        return
    font, fm = _far_font(round(max(1.0, LABEL_PX / max(lod, 1e-3) * 0.75), 1))
    width = rect.width() * (1.0 if left else 1.6)
    label = fm.elidedText(text, Qt.ElideMiddle, width)
    if left:
        p.setFont(font)
        p.setPen(color)
        p.drawText(QRectF(rect.left(), rect.top(), width, fm.height()), Qt.AlignLeft | Qt.AlignVCenter, label)
        return
    top = min(rect.center().y() - fm.height() / 2, rect.bottom() - fm.height()) if rect.height() >= fm.height() \
        else rect.top()
    box = QRectF(rect.center().x() - width / 2, top, width, fm.height())
    p.setFont(font)
    p.setPen(color)
    p.drawText(box, Qt.AlignCenter, label)


def node_height(n_in: int, n_out: int) -> float:
    return BODY_TOP + max(n_in, n_out, 1) * ROW_H + 6.0


def port_point(rect: QRectF, i: int, n: int, is_input: bool, row_y: float, top_down: bool) -> QPointF:
    """Where port `i` of `n` sits on a card: on the left/right side at its row, or top
    down, spread along the top (inputs) or bottom (outputs) edge."""
    if top_down:
        return QPointF(rect.left() + rect.width() * (i + 1) / (n + 1), rect.top() if is_input else rect.bottom())
    return QPointF(rect.left() if is_input else rect.right(), row_y)


def wire_path(a: QPointF, b: QPointF, top_down: bool, obstacles: list[QRectF] = ()) -> QPainterPath:
    """An edge's curve from an output at `a` to an input at `b`, leaving and entering
    along the flow (rightwards, or downwards top down). Where that curve would run
    under a card of `obstacles` (a skip connection along a chain), it takes a lane
    instead: it bends into a free line parallel to the flow right after leaving, runs
    along it past the cards and bends into its input at the end."""
    def pt(u: float, v: float) -> QPointF:  # flow coordinates: u along the flow, v across
        return QPointF(v, u) if top_down else QPointF(u, v)

    (au, av), (bu, bv) = ((a.y(), a.x()), (b.y(), b.x())) if top_down else ((a.x(), a.y()), (b.x(), b.y()))
    path = QPainterPath(a)
    d = max(30.0 if top_down else 40.0, abs(bu - au) * 0.5)
    path.cubicTo(pt(au + d, av), pt(bu - d, bv), b)
    bend = 24.0 if top_down else 40.0  # half of the gap between layers
    if bu - au <= 4 * bend or not obstacles:
        return path
    hit = [r for r in obstacles if path.intersects(r.adjusted(2, 2, -2, -2))]
    if not hit:
        return path
    lo, hi = au + 2 * bend, bu - 2 * bend
    spans = [(r.top(), r.bottom(), r.left(), r.right()) if top_down else (r.left(), r.right(), r.top(), r.bottom())
             for r in obstacles]
    spans = [(v0, v1) for u0, u1, v0, v1 in spans if u0 < hi and u1 > lo]  # the cards beside the lane's run

    def free(v: float) -> bool:
        return all(not (v0 - 10 < v < v1 + 10) for v0, v1 in spans)

    mid = (av + bv) / 2
    lanes = [bv, av, *sorted((x for v0, v1 in spans for x in (v0 - 20, v1 + 20)), key=lambda x: abs(x - mid))]
    lane = next((v for v in lanes if free(v)), None)
    if lane is None:
        return path
    path = QPainterPath(a)
    path.cubicTo(pt(au + bend, av), pt(au + bend, lane), pt(au + 2 * bend, lane))
    path.lineTo(pt(bu - 2 * bend, lane))
    path.cubicTo(pt(bu - bend, lane), pt(bu - bend, bv), b)
    return path


class PortItem(QGraphicsItem):
    """A connection point: hit area and hover only; its node paints it (one
    paint call per node instead of one per port keeps big diagrams fast)."""

    _RECT = QRectF(-PORT_R - 4, -PORT_R - 4, 2 * PORT_R + 8, 2 * PORT_R + 8)

    def __init__(self, parent: "NodeItem", name: str, is_input: bool, at: QPointF, row_y: float):
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
        p.setFont(_TITLE_FONT)
        p.drawText(QRectF(-8, -8, 16, 16), Qt.AlignCenter, "!")


class NodeItem(QGraphicsItem):
    def __init__(self, node_id: str, scene: "NodeScene"):
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
        tip = [str(e) for e in (*errors, *warnings)] + ([f"Since the compared version:\n{mark[1]}"] if mark else [])
        self.setToolTip("\n".join(tip))
        self.update()

    def boundingRect(self) -> QRectF:
        return self._rect

    def body(self) -> QRectF:
        """The card itself in scene coordinates (without the port dots)."""
        return QRectF(self.pos().x(), self.pos().y(), NODE_W, self._h)

    def paint(self, p: QPainter, opt, widget=None) -> None:
        scene: NodeScene = self.scene()
        t = scene.theme
        node = self.node
        info = scene.result.nodes.get(self.node_id) if scene.result else None
        lod = opt.levelOfDetailFromTransform(p.worldTransform())
        rect = QRectF(0, 0, NODE_W, self._h)
        head = stage_color(node.stage, t)
        sel = self.isSelected()
        if lod < LOD_DETAIL:  # far away (and not in overview mode): a coloured card and its name
            p.fillRect(rect, QColor(t.selected) if sel else head)
            draw_far_label(p, rect, self.node_id, QColor(t.header_text), lod)
            mark = scene.diff_marks.get(self.node_id)
            if mark:
                p.setPen(QPen(DIFF_COLORS[mark[0]], 3 / max(lod, 0.05)))  # thick at any zoom
                p.setBrush(_NO_BRUSH)
                p.drawRect(rect.adjusted(-4, -4, 4, 4))
            return
        p.setRenderHint(QPainter.Antialiasing)
        p.setPen(QPen(QColor(t.selected), 2.2) if sel else QPen(QColor(t.node_border), 1))
        p.setBrush(QColor(t.node_body))
        p.drawRoundedRect(rect, 7, 7)
        # header band in the stage colour: rounded on top, square where it meets the body
        p.setPen(_NO_PEN)
        p.setBrush(head)
        p.drawRoundedRect(QRectF(0, 0, NODE_W, HEADER_H), 7, 7)
        p.fillRect(QRectF(0, HEADER_H - 8, NODE_W, 8), head)
        if sel:
            p.setPen(QPen(QColor(t.selected), 2.2))
            p.setBrush(_NO_BRUSH)
            p.drawRoundedRect(rect, 7, 7)
        mark = scene.diff_marks.get(self.node_id)
        if mark:  # compared with another version: added green, changed amber, outside the card
            p.setPen(QPen(DIFF_COLORS[mark[0]], 4))
            p.setBrush(_NO_BRUSH)
            p.drawRoundedRect(rect.adjusted(-5, -5, 5, 5), 10, 10)
        # title, then a parameter-count badge on the right of the header
        badge = human(info.n_params) if info and info.n_params else ""
        bw = 0.0
        if badge:
            p.setFont(_SMALL_FONT)
            bw = QFontMetricsF(_SMALL_FONT).horizontalAdvance(badge) + 10
            br = QRectF(NODE_W - bw - 6, 6, bw, HEADER_H - 12)
            p.setPen(_NO_PEN)
            p.setBrush(QColor(255, 255, 255, 60))
            p.drawRoundedRect(br, 6, 6)
            p.setPen(QColor(t.header_text))
            p.drawText(br, Qt.AlignCenter, badge)
        p.setFont(_TITLE_FONT)
        p.setPen(QColor(t.header_text))
        title = QFontMetricsF(_TITLE_FONT).elidedText(self.node_id, Qt.ElideRight, NODE_W - bw - 20)
        p.drawText(QRectF(10, 0, NODE_W - 20, HEADER_H), Qt.AlignVCenter | Qt.AlignLeft, title)
        # type line: type on the left, stage/TP on the right
        p.setFont(_TEXT_FONT)
        p.setPen(QColor(t.subtext))
        tags = []
        if node.stage is not None:
            tags.append(f"S{node.stage}")  # the header colour says it too
        if node.tp:
            tags.append(node.tp)
        if node.checkpoint:
            tags.append("ckpt")
        line = QRectF(10, HEADER_H, NODE_W - 20, BODY_TOP - HEADER_H - 2)
        fm = QFontMetricsF(_TEXT_FONT)
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


DIFF_COLORS = {"added": QColor("#2e9e44"), "changed": QColor("#e0a000"), "removed": QColor("#d04040")}


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
        p.setFont(_TITLE_FONT)
        p.drawText(self._rect.adjusted(10, 0, -10, -self._rect.height() / 2), Qt.AlignVCenter | Qt.AlignLeft,
                   self.node_id)
        p.setFont(_TEXT_FONT)
        p.drawText(self._rect.adjusted(10, self._rect.height() / 2, -10, 0), Qt.AlignVCenter | Qt.AlignLeft,
                   f"{self.kind} (removed)")


class EdgeItem(QGraphicsPathItem):
    """A curve from an output port to an input port with the tensor shape as label."""

    def __init__(self, edge: Edge, scene: "NodeScene"):
        super().__init__()
        self.edge = edge
        self.setFlags(QGraphicsItem.ItemIsSelectable)
        self.setZValue(0)
        self.label = ""
        self.note = ""  # communication inserted by the plan
        self._label_rect = QRectF()
        self._brect = QRectF()
        self._hover = False
        self.setAcceptHoverEvents(True)
        scene.addItem(self)
        self.update_path()

    def hoverEnterEvent(self, e) -> None:
        self._hover = True
        self.setZValue(1.5)  # the label above the nodes while pointed at
        self.update()

    def hoverLeaveEvent(self, e) -> None:
        self._hover = False
        self.setZValue(1.5 if self.note else 0)
        self.update()

    def update_path(self) -> None:
        scene = self.scene()
        a, b = scene.edge_ends(self.edge)
        self.setPath(wire_path(a, b, scene.top_down, scene.cards_between(self.edge, a, b)))
        self._update_label_rect()

    def set_label(self, label: str, note: str = "") -> None:
        if (label, note) != (self.label, self.note):
            self.label, self.note = label, note
            self.setToolTip("\n".join(t for t in (label, note) if t))
            self.setZValue(1.5 if note else 0)
            self._update_label_rect()
            self.update()

    def label_fits(self) -> bool:
        """A shape label wider than the gap between two close nodes would sit on
        them: then it shows only on hover/selection (and always as the tooltip).
        Communication notes always show, above the nodes."""
        a, b = self.path().elementAt(0), self.path().elementAt(self.path().elementCount() - 1)
        if self.scene() is not None and self.scene().top_down:
            return bool(self.note) or b.y - a.y >= self._label_rect.height() + 16
        return bool(self.note) or b.x - a.x >= self._label_rect.width() + 16

    def _update_label_rect(self) -> None:
        self.prepareGeometryChange()
        text = self.label if not self.note else f"{self.label}\n{self.note}"
        if not text:
            self._label_rect = QRectF()
            self._brect = self.path().controlPointRect().adjusted(-3, -3, 3, 3)
            return
        fm = QFontMetricsF(_SMALL_FONT)
        lines = text.split("\n")
        w = max(fm.horizontalAdvance(s) for s in lines) + 10
        h = fm.height() * len(lines) + 4
        mid = self.path().pointAtPercent(0.5)
        self._label_rect = QRectF(mid.x() - w / 2, mid.y() - h / 2, w, h)
        self._brect = self.path().controlPointRect().adjusted(-3, -3, 3, 3).united(self._label_rect)

    def boundingRect(self) -> QRectF:
        return self._brect

    def setPath(self, path: QPainterPath) -> None:  # noqa: N802 (Qt API)
        super().setPath(path)
        self._brect = path.controlPointRect().adjusted(-3, -3, 3, 3).united(self._label_rect)

    def shape(self) -> QPainterPath:
        from PySide6.QtGui import QPainterPathStroker

        s = QPainterPathStroker()
        s.setWidth(10)
        return s.createStroke(self.path())

    def paint(self, p: QPainter, opt, widget=None) -> None:
        t = self.scene().theme
        lod = opt.levelOfDetailFromTransform(p.worldTransform())
        p.setRenderHint(QPainter.Antialiasing, lod >= LOD_DETAIL)
        sel = self.isSelected()
        color = QColor(t.edge_selected if sel else (t.comm_text if self.note else t.edge))
        p.setPen(QPen(color, 2.4 if sel else 1.6))
        p.setBrush(_NO_BRUSH)
        p.drawPath(self.path())
        if self._label_rect.isNull() or lod < 0.5 or not (sel or self._hover or self.label_fits()):
            return
        p.setPen(QPen(QColor(t.node_border), 0.8))
        p.setBrush(QColor(t.label_bg))
        p.drawRoundedRect(self._label_rect, 4, 4)
        p.setFont(_SMALL_FONT)
        fm = QFontMetricsF(_SMALL_FONT)
        r = QRectF(self._label_rect.x(), self._label_rect.y() + 2, self._label_rect.width(), fm.height())
        p.setPen(QColor(t.label_text))
        p.drawText(r, Qt.AlignCenter, self.label)
        if self.note:
            p.setPen(QColor(t.comm_text))
            p.drawText(r.translated(0, fm.height()), Qt.AlignCenter, self.note)


class GroupItem(QGraphicsItem):
    """One named block. Expanded: a frame around its nodes, drawn behind them.
    Collapsed (double-click the title): a card in place of its nodes, with one
    input port per value entering the block and one output per value leaving it;
    dragging the card moves every node of the block (one undo step)."""

    def __init__(self, name: str, scene: "NodeScene"):
        super().__init__()
        self.name = name
        self.depth = name.count(BLOCK_SEP)  # nested frames sit above the frames that hold them
        self.setZValue(-1 + 0.01 * self.depth)
        self._rect = QRectF()
        self.ins: list[tuple[str, str]] = []  # values (node, port) entering the block
        self.outs: list[tuple[str, str]] = []  # values leaving it
        scene.addItem(self)

    @property
    def collapsed(self) -> bool:
        return self.name in self.scene().collapsed

    @property
    def hidden_inside(self) -> bool:
        """A block inside a collapsed block, or a folded repeat after the first: not drawn."""
        scene: NodeScene = self.scene()
        run = scene.folded_run(self.name)
        return any(b in scene.collapsed for b in block_path(self.name)[:-1]) or (run is not None and run[0] != self.name)

    @property
    def run(self) -> list[str] | None:
        """The run of repeats this card stands for (it is the first of them), if folded."""
        run = self.scene().folded_run(self.name)
        return run if run is not None and run[0] == self.name else None

    def members(self) -> list[str]:
        """Its nodes, those of the blocks it holds included (a folded run: all of the run's)."""
        scene: NodeScene = self.scene()
        if self.run and self.collapsed:
            return [n for b in self.run for n in scene.block_members(b)]
        return scene.block_members(self.name)

    def stages(self) -> list[int]:
        """The pipeline stages its nodes are placed on (set on the nodes, or on the block)."""
        g = self.scene().graph
        return sorted({g.nodes[n].stage for n in self.members() if g.nodes[n].stage is not None})

    def stage_colour(self) -> QColor:
        """A card's header: its stage's colour when its nodes share one, else the block colour."""
        t = self.scene().theme
        st = self.stages()
        return QColor(stage_color(st[0], t)) if len(st) == 1 else QColor(t.group_border)

    def placement_tags(self) -> tuple[str, list[str]]:
        """What a card says of its placement on its type line: its stages (S1, S0–2), its
        tensor-parallel styles, and the communication the plan puts on the edges it hides
        ("⇄ 3"); the hidden notes themselves go in its tooltip."""
        scene: NodeScene = self.scene()
        g, members = scene.graph, set(self.members())
        tags = []
        st = self.stages()
        if st:
            tags.append(f"S{st[0]}" if len(st) == 1 else f"S{st[0]}–{st[-1]}")
        styles = sorted({g.nodes[n].tp for n in members if g.nodes[n].tp and g.nodes[n].tp != "replicate"})
        if styles:  # (short: the card's line holds its type too)
            tags.append("tp " + "/".join({"colwise": "col", "rowwise": "row", "sequence": "seq"}.get(s, s) for s in styles))
        inside = [(e, note) for e, note in scene.edge_notes.items() if e.src in members and e.dst in members]
        if inside:
            tags.append(f"⇄ {len(inside)}")
        return " · ".join(tags), [f"{e.src} → {e.dst}: {note}" for e, note in inside]

    def update_tip(self) -> None:
        """A card's tooltip: its name and type, figures, and the communication it hides."""
        size, shapes = self.figures()
        tags, hidden = self.placement_tags()
        lines = [self.title(), size, shapes, tags]
        marks = self.scene().diff_marks
        changed = [marks[n][1] for n in self.scene().block_members(self.name) if n in marks]
        if changed:
            lines += [f"changed inside since the compared version ({len(changed)} node(s)):", *changed[:8]]
        if hidden:
            lines += ["inside (where the plan communicates):", *hidden[:12]] + ([f"… {len(hidden) - 12} more"] if len(hidden) > 12 else [])
        self.setToolTip("\n".join(x for x in lines if x))

    def title(self) -> str:
        kind = block_type(self.scene().graph, self.name, self.scene().block_members(self.name))
        return f"{self.card_name()}" + (f"  {kind}" if kind else "")

    def card_name(self, short: bool = False) -> str:
        """layer3.1, or for a folded run layer3.1 … layer3.5 ×5 (`short`: layer3.1–5, for
        the label drawn far out, where a card has room for a few characters)."""
        run = self.run if self.collapsed else None
        if not run:
            return block_name(self.name)
        a, b = block_name(run[0]), block_name(run[-1])
        if short:  # (the count goes on the line below)
            return f"{a}–{b[len(os.path.commonprefix([a, b])):] or b}"
        return f"{a} … {b} ×{len(run)}"

    def figures(self) -> tuple[str, str]:
        """Its size (layers, parameters, FLOPs) and the shapes going in and out."""
        scene: NodeScene = self.scene()
        members = self.members()
        r = scene.result
        infos = [r.nodes.get(n) for n in members] if r is not None else []
        infos = [i for i in infos if i is not None]
        size = f"{len(members)} layers"
        if infos:
            size += f" · {_count(sum(i.n_params for i in infos))} params · {_count(sum(i.flops for i in infos))}FLOPs"
        shapes = ""
        if r is not None:
            def shape(src, port):
                info = r.nodes.get(src)
                out = info.out if info is not None else None
                return "(" + ", ".join(map(str, out.shape)) + ")" if out is not None else "?"
            ins = ", ".join(shape(*v) for v in self.ins[:2]) + (" …" if len(self.ins) > 2 else "")
            outs = ", ".join(shape(*v) for v in self.outs[:2]) + (" …" if len(self.outs) > 2 else "")
            shapes = f"{ins} → {outs}" if self.ins or self.outs else ""
        return size, shapes

    def refit(self) -> None:
        scene: NodeScene = self.scene()
        members = set(self.members())
        rect = QRectF()
        for nid in members:
            rect = rect.united(scene.node_items[nid].body())
        self.prepareGeometryChange()
        self.setPos(0, 0)
        if self.collapsed and not rect.isNull():
            g = scene.graph
            self.ins = list(dict.fromkeys((e.src, e.src_port) for e in g.edges if e.dst in members and e.src not in members))
            self.outs = list(dict.fromkeys((e.src, e.src_port) for e in g.edges if e.src in members and e.dst not in members))
            self._rect = QRectF(rect.x(), rect.y(), NODE_W, node_height(len(self.ins), len(self.outs)) + CARD_EXTRA)
            self.setZValue(1)
            self.setFlags(QGraphicsItem.ItemIsMovable | QGraphicsItem.ItemIsSelectable | QGraphicsItem.ItemSendsGeometryChanges)
            self.update_tip()
        else:
            for child in scene.group_items.values():  # the frames and cards of blocks inside it
                if child.depth == self.depth + 1 and child.name.startswith(self.name + BLOCK_SEP) and \
                        child.isVisible() and not child._rect.isNull():
                    rect = rect.united(child._rect.adjusted(-4, -4, 4, 4))
            self._rect = rect.adjusted(-16, -34, 16, 16) if not rect.isNull() else QRectF()
            self.setZValue(-1 + 0.01 * self.depth)
            self.setFlags(QGraphicsItem.GraphicsItemFlag(0))
            self.setToolTip("")
        self.update()

    def _port_point(self, i: int, is_input: bool) -> QPointF:
        values = self.ins if is_input else self.outs
        row = self._rect.top() + BODY_TOP + CARD_EXTRA + (i + 0.5) * ROW_H
        return port_point(self._rect, i, len(values), is_input, row, self.scene().top_down)

    def port_pos(self, value: tuple[str, str], is_input: bool) -> QPointF:
        values = self.ins if is_input else self.outs
        return self.mapToScene(self._port_point(values.index(value) if value in values else 0, is_input))

    def boundingRect(self) -> QRectF:
        m = PORT_R + 3
        return self._rect.adjusted(-m, -m, m, m) if self.collapsed else self._rect

    def itemChange(self, change, value):
        scene = self.scene()
        if change == QGraphicsItem.ItemPositionChange and scene is not None and scene.snap:
            return QPointF(round(value.x() / GRID) * GRID, round(value.y() / GRID) * GRID)
        if change == QGraphicsItem.ItemPositionHasChanged and scene is not None:
            for nid in self.members():
                scene._item_moved(nid, refit=False)
        return super().itemChange(change, value)

    def on_arrow(self, pos: QPointF) -> bool:
        """Where a click collapses or expands the block: an expanded frame's ▾ and name, a
        collapsed card's ▸ (the rest of its title drags it; a double-click expands it)."""
        r = self._rect
        if pos.y() < r.top() or pos.y() > r.top() + (HEADER_H if self.collapsed else 30):
            return False
        fm = QFontMetricsF(_TITLE_FONT)
        hot = fm.horizontalAdvance("▸ ") + 12 if self.collapsed else fm.horizontalAdvance(f"▾ {self.title()}") + 16
        return r.left() <= pos.x() < r.left() + hot

    def mousePressEvent(self, e) -> None:
        if e.button() == Qt.LeftButton and self.on_arrow(e.pos()):
            self.scene().toggle_collapsed(self.name)
            e.accept()
            return
        super().mousePressEvent(e)

    def mouseDoubleClickEvent(self, e) -> None:
        # Qt hands a double-click to the item that took the last press while it still
        # holds the point: an expanded frame around a card. The card under it is meant.
        top = next((i for i in self.scene().items(e.scenePos()) if isinstance(i, GroupItem) and i.isVisible()), None)
        if top is not None and top is not self:
            top.mouseDoubleClickEvent(e)
            return
        if self.on_arrow(e.pos()):  # its first click toggled it already
            e.accept()
            return
        if self.collapsed or e.pos().y() < self._rect.top() + 30:  # the title bar
            self.scene().toggle_collapsed(self.name)
            e.accept()
            return
        super().mouseDoubleClickEvent(e)

    def diff_mark(self) -> str | None:
        """A collapsed card holding nodes that changed since the compared version: added
        when all of those are new, else changed; None when nothing inside changed."""
        marks = self.scene().diff_marks
        if not marks or not self.collapsed:
            return None
        inside = [marks[n][0] for n in self.scene().block_members(self.name) if n in marks]
        if not inside:
            return None
        return "added" if all(k == "added" for k in inside) else "changed"

    def paint(self, p: QPainter, opt, widget=None) -> None:
        self._paint(p, opt)
        mark = self.diff_mark()
        if mark:  # drawn over the card, inside its bounds
            p.setPen(QPen(DIFF_COLORS[mark], 4))
            p.setBrush(_NO_BRUSH)
            p.drawRoundedRect(self._rect.adjusted(2, 2, -2, -2), 9, 9)

    def _paint(self, p: QPainter, opt) -> None:
        t = self.scene().theme
        p.setRenderHint(QPainter.Antialiasing)
        if not self.collapsed:
            p.setPen(QPen(QColor(t.group_border), 1.2, Qt.DashLine))
            p.setBrush(QColor(t.group_fill))
            p.drawRoundedRect(self._rect, 10, 10)
            p.setPen(QColor(t.group_text))
            p.setFont(_TITLE_FONT)
            lod = opt.levelOfDetailFromTransform(p.worldTransform())
            if lod < READABLE_LOD:
                line = LABEL_PX * 1.2 / max(lod, 1e-3)
                head = QRectF(self._rect.left() + 8, self._rect.top() - line, self._rect.width(), line)
                draw_far_label(p, head, f"▾ {self.title()}", QColor(t.group_text), lod, left=True)
            else:
                p.drawText(self._rect.adjusted(12, 6, -12, 0), Qt.AlignLeft | Qt.AlignTop, f"▾ {self.title()}")
            return
        r = self._rect
        sel = self.isSelected()
        lod = opt.levelOfDetailFromTransform(p.worldTransform())
        if lod < READABLE_LOD:  # far out: the card in its colour, its name and type readable
            p.fillRect(r, QColor(t.selected) if sel else self.stage_colour())
            kind = block_type(self.scene().graph, self.name, self.scene().block_members(self.name))
            run = self.run
            if run:  # "layer3.1–5" over "Bottleneck ×5": the count is what a folded card says first
                kind = f"{kind or 'block'} ×{len(run)}"
            line = LABEL_PX * 1.2 / max(lod, 1e-3)
            draw_far_label(p, r.translated(0, -line / 2 if kind else 0), self.card_name(short=True), QColor(t.header_text), lod)
            if kind:
                draw_far_label(p, r.translated(0, line / 2), kind, QColor(t.header_text), lod)
            return
        p.setPen(QPen(QColor(t.selected), 2.2) if sel else QPen(QColor(t.group_border), 1.4, Qt.DashLine))
        p.setBrush(QColor(t.node_body))
        p.drawRoundedRect(r, 7, 7)
        p.setPen(_NO_PEN)
        head = self.stage_colour()
        p.setBrush(head)
        p.drawRoundedRect(QRectF(r.x(), r.y(), r.width(), HEADER_H), 7, 7)
        p.fillRect(QRectF(r.x(), r.y() + HEADER_H - 8, r.width(), 8), head)
        p.setFont(_TITLE_FONT)
        p.setPen(QColor(t.header_text))
        p.drawText(QRectF(r.x() + 10, r.y(), r.width() - 20, HEADER_H), Qt.AlignVCenter | Qt.AlignLeft,
                   QFontMetricsF(_TITLE_FONT).elidedText(f"▸ {self.card_name()}", Qt.ElideMiddle, r.width() - 20))
        p.setFont(_TEXT_FONT)
        p.setPen(QColor(t.subtext))
        kind = block_type(self.scene().graph, self.name, self.scene().block_members(self.name)) or "block"
        if self.run:
            kind += f" ×{len(self.run)} (double-click: one by one)"
        size, shapes = self.figures()
        line = QRectF(r.x() + 10, r.y() + HEADER_H, r.width() - 20, BODY_TOP - HEADER_H - 2)
        tags, _ = self.placement_tags()
        fm = QFontMetricsF(_TEXT_FONT)
        tag_w = min(fm.horizontalAdvance(tags) + 8, 0.7 * line.width()) if tags else 0.0
        if tags:  # the tags on the right, the type in what is left (both elided if need be; the tooltip has all)
            p.drawText(line, Qt.AlignVCenter | Qt.AlignRight, fm.elidedText(tags, Qt.ElideRight, tag_w))
        p.drawText(line, Qt.AlignVCenter | Qt.AlignLeft, fm.elidedText(kind, Qt.ElideRight, line.width() - tag_w))
        for k, text in enumerate((size, shapes)):
            p.drawText(line.translated(0, (k + 1) * ROW_H), Qt.AlignVCenter | Qt.AlignLeft,
                       QFontMetricsF(_TEXT_FONT).elidedText(text, Qt.ElideRight, line.width()))
        p.setPen(QColor(t.text))
        for values, is_input in ((self.ins, True), (self.outs, False)):
            for i, (src, _) in enumerate(values):
                y = r.top() + BODY_TOP + CARD_EXTRA + (i + 0.5) * ROW_H
                box = QRectF(r.x() + 12, y - ROW_H / 2, r.width() / 2 - 12, ROW_H) if is_input else \
                    QRectF(r.center().x(), y - ROW_H / 2, r.width() / 2 - 12, ROW_H)
                p.drawText(box, Qt.AlignVCenter | (Qt.AlignLeft if is_input else Qt.AlignRight), src)
        p.setPen(QPen(QColor(t.node_body), 1.5))
        p.setBrush(QColor(t.port_in))
        for values, is_input in ((self.ins, True), (self.outs, False)):
            for i in range(len(values)):
                p.drawEllipse(self._port_point(i, is_input), PORT_R, PORT_R)


class OverviewItem(QGraphicsItem):
    """Far out, the whole diagram in one paint call: node cards and edges as one
    cached path. Node items stay (selectable, movable) but paint nothing, edge
    items are hidden; a thousand Python paint calls per frame would be slow."""

    def __init__(self, scene: "NodeScene"):
        super().__init__()
        self.setZValue(-0.5)
        self.setAcceptedMouseButtons(Qt.NoButton)
        self._path: QPainterPath | None = None
        self._rect = QRectF()
        scene.addItem(self)

    def invalidate(self) -> None:
        if self._path is not None or self._rect.isNull():
            self.prepareGeometryChange()
        self._path = None
        self.update()

    def _build(self) -> None:
        scene: NodeScene = self.scene()
        path = QPainterPath()
        for e in scene.edge_items:
            gs, gd = scene._collapsed_group(e.src), scene._collapsed_group(e.dst)
            if gs is not None and gs is gd:
                continue  # inside a collapsed block
            a, b = scene.edge_ends(e)
            path.moveTo(a)
            path.lineTo(b)
        rect = path.boundingRect()
        for item in scene.node_items.values():
            rect = rect.united(item.sceneBoundingRect())
        self._path, self._rect = path, rect.adjusted(-4, -4, 4, 4)

    def boundingRect(self) -> QRectF:
        if self._path is None:
            self._build()
        return self._rect

    def paint(self, p: QPainter, opt, widget=None) -> None:
        scene: NodeScene = self.scene()
        if scene.detail:
            return
        if self._path is None:
            self._build()
        t = scene.theme
        p.setRenderHint(QPainter.Antialiasing, False)
        p.setPen(QPen(QColor(t.edge), 0))  # cosmetic: one pixel at any zoom
        p.setBrush(_NO_BRUSH)
        p.drawPath(self._path)
        sel = QColor(t.selected)
        lod = opt.levelOfDetailFromTransform(p.worldTransform())
        exposed = opt.exposedRect if opt.exposedRect.isValid() else self._rect
        text = QColor(t.header_text)
        for item in scene.node_items.values():
            if not item.isVisible():
                continue
            node = item.node
            card = item.body()
            p.fillRect(card, sel if item.isSelected() else stage_color(node.stage, t))
            if exposed.intersects(card):
                draw_far_label(p, card, item.node_id, text, lod)


class NodeScene(QGraphicsScene):
    connect_requested = Signal(str, str, str, str)  # src, src_port, dst, dst_port
    nodes_moved = Signal(dict)  # {id: ((x0, y0), (x1, y1))}, one user drag
    port_released_on_empty = Signal(str, str, bool, QPointF)  # node, port, is_input, scene pos
    rewire_requested = Signal(object, object)  # old Edge, new (dst, dst_port) or None: remove the wire
    collapsed_changed = Signal(str)  # a block collapsed or expanded (saved with the diagram)

    def __init__(self, graph: Graph | None = None, parent=None):
        super().__init__(parent)
        self.theme: SceneTheme = LIGHT
        self.snap = True
        self.graph: Graph | None = None
        self.result = None  # engine.compile.CompileResult of the current graph
        self.edge_notes: dict[Edge, str] = {}
        self.node_items: dict[str, NodeItem] = {}
        self.edge_items: dict[Edge, EdgeItem] = {}
        self.group_items: dict[str, GroupItem] = {}
        self.toggle_handler = None  # callable(block name) that collapses/expands it (the editor's undo step)
        self._members: dict[str, list[str]] | None = None  # block -> its nodes (block_members)
        self._defer = False  # inside deferred(): no refit per moved node
        self._outer: dict[str, GroupItem | None] | None = None  # node -> its card, while collapse is unchanged
        self._edges_of: dict[str, set[Edge]] = {}
        self._syncing = False
        self.detail = True  # zoomed in enough for ports, labels and text
        self.overview: OverviewItem | None = None
        self._drag_port: PortItem | None = None
        self._drag_path: QGraphicsPathItem | None = None
        self._rewire: Edge | None = None  # the wire picked up from a connected input
        # a comparison with another version (app/compare_ui.py): node -> (added|changed, what), removed nodes
        self.diff_marks: dict[str, tuple[str, str]] = {}
        self.ghosts: list[tuple[dict, str]] = []
        self.ghost_items: dict[str, GhostItem] = {}
        self.setSceneRect(-50000, -50000, 100000, 100000)  # pan freely
        self.selectionChanged.connect(self._repaint_overview)
        self.setItemIndexMethod(QGraphicsScene.BspTreeIndex)
        if graph is not None:
            self.set_graph(graph)

    @property
    def top_down(self) -> bool:
        """Data flows down the canvas (ports on top and bottom), not left to right."""
        return self.graph is not None and self.graph.direction == "TB"

    # ----- model -> items -----------------------------------------------------
    def set_graph(self, graph: Graph) -> None:
        if self.graph is not None:
            self.graph.unsubscribe(self._on_event)
        self.graph = graph
        graph.subscribe(self._on_event)
        self.result = None
        self._rebuild()

    def detach(self) -> None:
        if self.graph is not None:
            self.graph.unsubscribe(self._on_event)

    def _repaint_overview(self) -> None:
        if self.overview is not None and not self.detail and shiboken6.isValid(self.overview):
            self.overview.update()

    def _rebuild(self) -> None:
        self._drag_port = None
        self._drag_path = None
        self.overview = None
        self.clear()
        self.node_items, self.edge_items, self.group_items, self._edges_of = {}, {}, {}, {}
        self.overview = OverviewItem(self)
        for nid in self.graph.nodes:
            self._add_node(nid)
        for e in self.graph.edges:
            self._add_edge(e)
        self._refit_groups()
        self.apply_result()
        self.ghost_items = {}
        self._place_ghosts()

    def set_diff(self, marks: dict[str, tuple[str, str]], ghosts: list[tuple[dict, str]]) -> None:
        """Show a comparison: marks on this version's nodes, ghosts of removed ones."""
        self.diff_marks = dict(marks)
        self.ghosts = list(ghosts)
        self._place_ghosts()
        self.apply_result()  # tooltips (collapsed cards' too)
        for item in (*self.node_items.values(), *self.group_items.values()):
            item.update()

    def _place_ghosts(self) -> None:
        for item in self.ghost_items.values():
            if item.scene() is self:
                self.removeItem(item)
        self.ghost_items = {}
        for node, tip in self.ghosts:
            item = self.ghost_items[node["id"]] = GhostItem(node, tip)
            self.addItem(item)

    def _add_node(self, nid: str) -> None:
        item = NodeItem(nid, self)
        item.setFlag(QGraphicsItem.ItemHasNoContents, not self.detail)
        self._syncing = True
        item.setPos(*self.graph.nodes[nid].pos)
        self._syncing = False
        self.node_items[nid] = item
        self._edges_of.setdefault(nid, set())

    def _add_edge(self, e: Edge) -> None:
        if e.src not in self.node_items or e.dst not in self.node_items:
            return
        self.edge_items[e] = item = EdgeItem(e, self)
        item.setVisible(self.detail)
        self._edges_of.setdefault(e.src, set()).add(e)
        self._edges_of.setdefault(e.dst, set()).add(e)

    def _remove_edge(self, e: Edge) -> None:
        item = self.edge_items.pop(e, None)
        if item is not None:
            self.removeItem(item)
        for end in (e.src, e.dst):
            self._edges_of.get(end, set()).discard(e)

    def _on_event(self, ev: GraphEvent) -> None:
        k = ev.kind
        if k == "collapsed_changed":
            self._outer = None
            # Written through `collapsed`, the writer redraws (once, after its layout);
            # written by someone else (a script, the engine), the cards follow here, once.
            if not getattr(self, "_writing_collapsed", False) and not getattr(self, "_collapse_due", False):
                self._collapse_due = True
                QTimer.singleShot(0, self, self._apply_due_collapse)  # not after the scene is gone
            return
        if k not in ("moved", "placement_changed"):
            self._members = self._outer = None  # nodes or blocks changed
        if not self.detail and k not in ("reset", "param_changed"):
            self.overview.invalidate()
        if k == "reset":
            self._rebuild()
        elif k == "node_added":
            self._add_node(ev.node)
            if self.graph.nodes[ev.node].group:
                self._refit_groups()
        elif k == "node_removed":
            for e in list(self._edges_of.get(ev.node, ())):
                self._remove_edge(e)
            item = self.node_items.pop(ev.node, None)
            self._edges_of.pop(ev.node, None)
            if item is not None:
                self.removeItem(item)
            if ev.old is not None and getattr(ev.old, "group", None):
                self._refit_groups()
        elif k == "node_renamed":
            # ids are baked into items and edges: rebuilding this node's pieces is simplest
            item = self.node_items.pop(ev.old)
            for e in list(self._edges_of.pop(ev.old, ())):
                self._remove_edge(e)
            self.removeItem(item)
            self._add_node(ev.new)
            for e in self.graph.edges:
                if ev.new in (e.src, e.dst) and e not in self.edge_items:
                    self._add_edge(e)
            self._refit_groups()
        elif k == "edge_added":
            self._add_edge(ev.edge)
            if self.collapsed:
                self.apply_collapse()
        elif k == "edge_removed":
            self._remove_edge(ev.edge)
            if self.collapsed:
                self.apply_collapse()
        elif k == "param_changed":
            item = self.node_items.get(ev.node)
            if item is not None:
                item.rebuild_ports()
                for e in self._edges_of.get(ev.node, ()):
                    self.edge_items[e].update_path()
                item.update()
        elif k == "moved":
            item = self.node_items.get(ev.node)
            if item is not None and item.pos() != QPointF(*ev.new):
                self._syncing = True
                item.setPos(*ev.new)
                self._syncing = False
            elif item is not None and self._collapsed_group(ev.node) is not None:
                self._item_moved(ev.node)
        elif k in ("placement_changed",):
            item = self.node_items.get(ev.node)
            if item is not None:
                item.update()
            node = self.graph.nodes.get(ev.node)
            for b in block_path(node.group if node else None):  # a card shows its nodes' stage
                if b in self.group_items:
                    self.group_items[b].update()
        elif k == "group_changed":
            self._refit_groups()
        elif k == "direction_changed":  # every port moves to another side
            for item in self.node_items.values():
                item.rebuild_ports()
                item.update()
            self._refit_groups()
            if not self._defer:  # (else deferred() draws them once at its end)
                for item in self.edge_items.values():
                    item.update_path()

    def block_members(self, block: str) -> list[str]:
        """The nodes of a block (nested ones' included), from an index kept until the
        diagram's nodes or blocks change: refits and paints ask for it often."""
        if self._members is None:
            index: dict[str, list[str]] = {}
            for nid, node in self.graph.nodes.items():
                if nid in self.node_items:
                    for b in block_path(node.group):
                        index.setdefault(b, []).append(nid)
            self._members = index
        return self._members.get(block, [])

    def folded_run(self, block: str) -> list[str] | None:
        """The folded run of repeats a block is part of (engine.layout.repeated_runs)."""
        run = repeated_runs(self.graph).get(block) if self.graph is not None else None  # (kept on the graph)
        return run if run is not None and folded(self.graph, run) else None

    @contextlib.contextmanager
    def deferred(self):
        """Many moves at once (a layout): blocks are refitted once at the end, not per node."""
        self._defer = True
        try:
            yield
        finally:
            self._defer = False
            self._refit_groups()  # (it applies a collapse state with blocks collapsed)
            if not self.collapsed:
                self.apply_collapse()  # every node shown again, every edge redrawn

    def _item_moved(self, nid: str, refit: bool = True) -> None:
        if not self.detail:
            self.overview.invalidate()
        if self._defer:
            return  # deferred(): edges and blocks follow once, at its end
        for e in self._edges_of.get(nid, ()):
            item = self.edge_items.get(e)
            if item is not None:
                item.update_path()
        node = self.graph.nodes.get(nid)
        if refit and node is not None:
            for b in block_path(node.group):
                if b in self.group_items:
                    self.group_items[b].refit()

    def _refit_groups(self) -> None:
        self._members = self._outer = None
        names = self.graph.blocks()
        for name in list(self.group_items):
            if name not in names:
                self.removeItem(self.group_items.pop(name))
        for name in names:
            if name not in self.group_items:
                self.group_items[name] = GroupItem(name, self)
        if self.collapsed:
            self.apply_collapse()  # refits the blocks that show
        else:
            for item in sorted(self.group_items.values(), key=lambda i: -i.depth):  # inner blocks first
                item.refit()

    # ----- compile results ----------------------------------------------------
    def set_result(self, result, edge_notes: dict[Edge, str] | None = None, more_problems=()) -> None:
        """A compile result; the notes the plan puts on edges; problems found beyond the
        compiler's (the placement's), badged on their nodes like its own."""
        self.result = result
        self.edge_notes = dict(edge_notes or {})
        self.more_problems = list(more_problems)
        self.apply_result()

    def apply_result(self) -> None:
        r = self.result
        more: dict[str, list] = {}
        for p in getattr(self, "more_problems", ()):
            if p.node:
                more.setdefault(p.node, []).append(p)
        for nid, item in self.node_items.items():
            errs = r.errors_for(nid) if r else []
            warns = [w for w in r.warnings if w.node == nid] if r else []
            extra = more.get(nid, [])
            item.set_problems(errs + [p for p in extra if p.severity == "error"],
                              warns + [p for p in extra if p.severity != "error"])
        for e, item in self.edge_items.items():
            info = r.edge_info(e) if r else None
            item.set_label(info.label() if info else "", self.edge_notes.get(e, ""))
        for item in self.group_items.values():
            if item.collapsed and item.isVisible():
                item.update_tip()
                item.update()

    def set_detail_for_zoom(self, zoom: float) -> None:
        """Hide the port items when zoomed far out: thousands fewer items to visit."""
        detail = zoom >= LOD_DETAIL
        if detail != self.detail:
            self.detail = detail
            for item in self.node_items.values():
                item.setFlag(QGraphicsItem.ItemHasNoContents, not detail)
                for port in item.ports.values():
                    port.setVisible(detail)
            for item in self.edge_items.values():
                item.setVisible(detail)
            if self.collapsed:
                self.apply_collapse()
            self.overview.invalidate()

    def set_theme(self, t: SceneTheme) -> None:
        self.theme = t
        self.update()

    # ----- queries ------------------------------------------------------------
    def _collapsed_group(self, nid: str) -> GroupItem | None:
        """The card that stands for a node: its outermost collapsed block's (a folded
        run's first block's)."""
        if self._outer is not None and nid in self._outer:
            return self._outer[nid]
        b = card_of(self.graph, nid) if self.graph is not None and nid in self.graph.nodes else None
        return self.group_items.get(b) if b is not None else None

    def edge_ends(self, e: Edge) -> tuple[QPointF, QPointF]:
        """Where an edge starts and ends: at its ports, or at the card of a
        collapsed block that holds one end."""
        gs, gd = self._collapsed_group(e.src), self._collapsed_group(e.dst)
        a = gs.port_pos((e.src, e.src_port), False) if gs is not None and gs is not gd else \
            self.port_pos(e.src, e.src_port, False)
        b = gd.port_pos((e.src, e.src_port), True) if gd is not None and gs is not gd else \
            self.port_pos(e.dst, e.dst_port, True)
        return a, b

    @property
    def collapsed(self) -> set[str]:
        """Blocks shown as one card: the graph's, so they are saved with the project."""
        return self.graph.collapsed if self.graph is not None else set()

    @collapsed.setter
    def collapsed(self, names: set[str]) -> None:
        if self.graph is not None:  # the scene's own write: its caller redraws the cards
            self._writing_collapsed = True
            try:
                self.graph.set_collapsed(names)
            finally:
                self._writing_collapsed = False

    def toggle_collapsed(self, name: str) -> None:
        """Collapse or expand a block: through `toggle_handler` when the editor set one
        (an undo step that may lay the diagram out again), else here and now."""
        if self.toggle_handler is not None:
            self.toggle_handler(name)
            return
        self.set_collapsed(name, name not in self.collapsed)

    def folds_changed(self) -> None:
        """graph.unfolded changed: which cards stand for which nodes, shown again."""
        self._outer = None
        self.apply_collapse()
        self.collapsed_changed.emit("")

    def set_collapsed(self, name: str, collapsed: bool) -> None:
        self._outer = None
        self.collapsed = (self.collapsed | {name}) if collapsed else (self.collapsed - {name})
        self.apply_collapse()
        self.collapsed_changed.emit(name)

    def _apply_due_collapse(self) -> None:
        self._collapse_due = False
        self.apply_collapse()
        self.collapsed_changed.emit("")

    def apply_collapse(self) -> None:
        """Show or hide block members, internal edges and cards per self.collapsed."""
        if self._defer:
            return  # deferred() applies it once at its end
        # names of blocks that no longer exist carry no state anyone sees: dropped in place,
        # with no event (the saved file never lists them: Graph.to_dict writes live blocks only)
        if self.graph is not None:
            self.graph.collapsed.intersection_update(self.group_items)
        self._outer = None
        self._outer = {nid: self._collapsed_group(nid) for nid in self.node_items}  # one lookup per node
        for item in sorted(self.group_items.values(), key=lambda i: -i.depth):  # inner blocks first
            hidden = item.hidden_inside
            item.setVisible(not hidden)
            if not hidden:
                item.refit()
        for nid, item in self.node_items.items():
            hidden = self._outer[nid] is not None
            item.setVisible(not hidden)
            if hidden:
                item.setSelected(False)
        for e, item in self.edge_items.items():
            gs, gd = self._outer.get(e.src), self._outer.get(e.dst)
            inside = gs is not None and gs is gd
            item.setVisible(self.detail and not inside)
            if not inside:  # an edge inside a card is drawn again when its block opens
                item.update_path()

    def cards_between(self, e: Edge, a: QPointF, b: QPointF) -> list[QRectF]:
        """The cards (nodes, collapsed blocks) shown in the stretch an edge from `a` to `b`
        crosses, and beside it, that are neither of its ends: what a wire must not run under."""
        if abs(b.x() - a.x()) + abs(b.y() - a.y()) < 200:
            return []
        ends = {self._collapsed_group(e.src) or self.node_items.get(e.src),
                self._collapsed_group(e.dst) or self.node_items.get(e.dst)}
        reach = 400.0  # across the flow: far enough for a lane beside a wide frame
        rect = QRectF(a, b).normalized().adjusted(-reach, -reach, reach, reach)
        out = []
        for it in self.items(rect, Qt.IntersectsItemBoundingRect):
            if it in ends or not it.isVisible():
                continue
            if isinstance(it, NodeItem):
                out.append(it.body())
            elif isinstance(it, GroupItem) and it.collapsed:
                out.append(it.mapRectToScene(it._rect))
        return out

    def port_pos(self, nid: str, port: str, is_input: bool) -> QPointF:
        item = self.node_items[nid]
        p = item.ports.get((port, is_input))
        if p is None:  # an edge to a port that vanished: attach to the side (top, bottom)
            return port_point(item.body(), 0, 1, is_input, item.pos().y() + BODY_TOP, self.top_down)
        return p.scenePos()

    def selected_ids(self) -> list[str]:
        sel = {i.node_id for i in self.selectedItems() if isinstance(i, NodeItem)}
        for i in self.selectedItems():
            if isinstance(i, GroupItem) and i.collapsed:
                sel.update(i.members())
        return [n for n in self.graph.nodes if n in sel]  # model order: stable

    def selected_edges(self) -> list[Edge]:
        return [i.edge for i in self.selectedItems() if isinstance(i, EdgeItem)]

    def selected_groups(self) -> list[str]:
        """Blocks of the selection: selected cards and the blocks of selected nodes."""
        names = {i.name for i in self.selectedItems() if isinstance(i, GroupItem)}
        direct = [i.node_id for i in self.selectedItems() if isinstance(i, NodeItem)]  # (not a card's inside)
        names |= {self.graph.nodes[n].group for n in direct if n in self.graph.nodes} - {None}
        return sorted(names)

    def select_nodes(self, ids) -> None:
        ids = set(ids)
        self.blockSignals(True)
        self.clearSelection()
        for nid in ids:
            if nid in self.node_items:
                self.node_items[nid].setSelected(True)
        self.blockSignals(False)
        self.selectionChanged.emit()

    def edge_label(self, e: Edge) -> str:
        return self.edge_items[e].label

    # ----- gestures -----------------------------------------------------------
    def _port_at(self, pos: QPointF) -> PortItem | None:
        for it in self.items(QRectF(pos.x() - 6, pos.y() - 6, 12, 12)):
            if isinstance(it, PortItem):
                return it
        return None

    def mousePressEvent(self, e) -> None:
        if e.button() == Qt.LeftButton:
            port = self._port_at(e.scenePos())
            if port is not None:
                self._rewire = None
                if port.is_input:  # grabbing a connected input picks its wire up by the end
                    wire = next((x for x in self._edges_of.get(port.node_id, ())
                                 if x.dst == port.node_id and x.dst_port == port.name), None)
                    if wire is not None and wire.src in self.node_items:
                        self._rewire = wire
                        self.edge_items[wire].setVisible(False)
                        port = self.node_items[wire.src].ports.get((wire.src_port, False), port)
                self._drag_port = port
                self._drag_path = QGraphicsPathItem()
                self._drag_path.setPen(QPen(QColor(self.theme.selected), 2, Qt.DashLine))
                self._drag_path.setZValue(5)
                self.addItem(self._drag_path)
                e.accept()
                return
        super().mousePressEvent(e)

    def mouseMoveEvent(self, e) -> None:
        if self._drag_port is not None:
            a = self._drag_port.scenePos()
            b = e.scenePos()
            if self._drag_port.is_input:
                a, b = b, a
            self._drag_path.setPath(wire_path(a, b, self.top_down))
            e.accept()
            return
        super().mouseMoveEvent(e)

    def mouseReleaseEvent(self, e) -> None:
        if self._drag_port is not None:
            start = self._drag_port
            self.removeItem(self._drag_path)
            self._drag_port = self._drag_path = None
            end = self._port_at(e.scenePos())
            e.accept()
            wire, self._rewire = self._rewire, None
            if wire is not None:
                if wire in self.edge_items:
                    self.edge_items[wire].setVisible(self.detail)
                if end is None:
                    self.rewire_requested.emit(wire, None)
                elif end.is_input and (end.node_id, end.name) != (wire.dst, wire.dst_port):
                    self.rewire_requested.emit(wire, (end.node_id, end.name))
                return
            if end is None:
                self.port_released_on_empty.emit(start.node_id, start.name, start.is_input, e.scenePos())
            elif end is not start:
                # whichever end was grabbed first, the model wants output -> input
                a, b = (end, start) if start.is_input else (start, end)
                self.connect_requested.emit(a.node_id, a.name, b.node_id, b.name)
            return
        super().mouseReleaseEvent(e)
        moves = {}
        for g in self.group_items.values():
            if g.collapsed and g.pos() != QPointF(0, 0):
                d = g.pos()
                for nid in g.members():
                    x, y = self.graph.nodes[nid].pos
                    moves[nid] = ((x, y), (x + d.x(), y + d.y()))
        for nid, item in self.node_items.items():
            if nid in moves:
                continue
            model = self.graph.nodes[nid].pos
            now = (item.pos().x(), item.pos().y())
            if now != model:
                moves[nid] = (model, now)
        if moves:
            self.nodes_moved.emit(moves)
