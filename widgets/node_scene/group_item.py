"""A named block on the canvas (GroupItem): expanded, a frame around its nodes;
collapsed, one card in their place, with a port per value going in and out, its
figures (layers, parameters, FLOPs), its placement, and the communication it hides.
A folded run of repeats (layer3.1 ... layer3.5) shows as one such card.

Which blocks are collapsed is graph state (scene.collapsed); a click on the arrow or
a double-click on the title asks the scene to toggle it.

`self.scene()` is always the NodeScene of scene.py, which imports this module; it
is not imported back (the package has no import cycle), so the scene is typed here
as a plain QGraphicsScene.
"""
from __future__ import annotations

import os

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFontMetricsF, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QGraphicsItem, QGraphicsScene

from engine.diagram.graph import BLOCK_SEP, block_name, block_path, block_type
from engine.diagram.layout import CARD_EXTRA
from widgets.node_scene.geometry import (
    BODY_TOP,
    GRID,
    HEADER_H,
    NODE_W,
    PORT_R,
    ROW_H,
    node_height,
    port_point,
)
from widgets.node_scene.painting import (
    DIFF_COLORS,
    FAR_SPREAD,
    LABEL_PX,
    NO_BRUSH,
    NO_PEN,
    READABLE_LOD,
    TEXT_FONT,
    TITLE_FONT,
    draw_far_label,
    elide,
)
from widgets.style import auto_stage_color, stage_color

FRAME_LABEL_ROOM = 90.0  # scene units above an expanded frame where its name goes far out


def _count(n: float) -> str:
    """12,345,678 -> 12.3M (a block card's figures)."""
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


class GroupItem(QGraphicsItem):
    """One named block. Expanded: a frame around its nodes, drawn behind them.
    Collapsed (double-click the title): a card in place of its nodes, with one
    input port per value entering the block and one output per value leaving it;
    dragging the card moves every node of the block (one undo step)."""

    def __init__(self, name: str, scene: QGraphicsScene):
        super().__init__()
        self.name = name
        self.depth = name.count(BLOCK_SEP)  # nested frames sit above the frames that hold them
        self.setZValue(-1 + 0.01 * self.depth)
        self._rect = QRectF()
        self.ins: list[tuple[str, str]] = []  # values (node, port) entering the block
        self.outs: list[tuple[str, str]] = []  # values leaving it
        self.badge = None  # collapsed: the worst problem of the nodes it hides
        scene.addItem(self)

    def set_problems(self, errors: list, warnings: list) -> None:
        """A collapsed card's badge: the problems of the layers inside it (they are hidden),
        their messages in its tooltip; none when expanded (the layers show their own)."""
        from widgets.node_scene.node_item import Badge

        if self.badge is not None:
            if self.badge.scene() is not None:
                self.badge.scene().removeItem(self.badge)
            self.badge = None
        if self.scene() is not None and self.collapsed and (errors or warnings):
            self.badge = Badge(self, "error" if errors else "warning")
            self.badge.setPos(self._rect.right() - 4, self._rect.top())
            self.badge.setToolTip("\n".join(str(e) for e in (errors or warnings)))

    @property
    def collapsed(self) -> bool:
        return self.name in self.scene().collapsed

    @property
    def hidden_inside(self) -> bool:
        """A block inside a collapsed block, or a folded repeat after the first: not drawn."""
        scene = self.scene()
        run = scene.folded_run(self.name)
        return any(b in scene.collapsed for b in block_path(self.name)[:-1]) or (run is not None and run[0] != self.name)

    @property
    def run(self) -> list[str] | None:
        """The run of repeats this card stands for (it is the first of them), if folded."""
        run = self.scene().folded_run(self.name)
        return run if run is not None and run[0] == self.name else None

    def members(self) -> list[str]:
        """Its nodes, those of the blocks it holds included (a folded run: all of the run's)."""
        scene = self.scene()
        if self.run and self.collapsed:
            return [n for b in self.run for n in scene.block_members(b)]
        return scene.block_members(self.name)

    def stages(self) -> list[int]:
        """The pipeline stages its nodes are placed on (set on the nodes, or on the block)."""
        g = self.scene().graph
        return sorted({g.nodes[n].stage for n in self.members() if g.nodes[n].stage is not None})

    def planned_stages(self) -> tuple[list[int], bool]:
        """The stages its nodes run on, the plan's automatic cut included for the nodes the
        user put on none, and whether all of those came from the plan."""
        scene = self.scene()
        found = [scene.stage_of(n) for n in self.members()]
        stages = sorted({s for s, _ in found if s is not None})
        return stages, bool(stages) and all(auto for s, auto in found if s is not None)

    def stage_colour(self) -> QColor:
        """A card's header: its stage's colour when its nodes share one (lighter when the
        plan chose it), else the block colour."""
        t = self.scene().theme
        st = self.stages()
        if not st:
            st, auto = self.planned_stages()
            if len(st) == 1 and auto:
                return auto_stage_color(st[0], t)
        return QColor(stage_color(st[0], t)) if len(st) == 1 else QColor(t.group_border)

    def placement_tags(self) -> tuple[str, list[str]]:
        """What a card says of its placement on its type line: its stages (S1, S0–2), its
        tensor-parallel styles, and the communication the plan puts on the edges it hides
        ("⇄ 3"); the hidden notes themselves go in its tooltip."""
        scene = self.scene()
        g, members = scene.graph, set(self.members())
        tags = []
        st, auto = self.stages(), False
        if not st:
            st, auto = self.planned_stages()
        if st:
            tags.append(("auto " if auto else "") + (f"S{st[0]}" if len(st) == 1 else f"S{st[0]}–{st[-1]}"))
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
        scene = self.scene()
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
        scene = self.scene()
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
            self.setToolTip(self.title())  # its whole name where the frame shows it cut
        if self.badge is not None:
            self.badge.setVisible(self.collapsed)
            self.badge.setPos(self._rect.right() - 4, self._rect.top())
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
        if self.collapsed:  # far out, its name may reach past its sides (draw_far_label)
            side = max(m, FAR_SPREAD * self._rect.width() + 2)
            return self._rect.adjusted(-side, -m, side, m)
        return self._rect.adjusted(0, -FRAME_LABEL_ROOM, 0, 0)  # far out, its name sits above it

    def shape(self) -> QPainterPath:
        """What takes the mouse: the card and its port dots, or the frame (not the room
        its name may take far out)."""
        path = QPainterPath()
        m = PORT_R + 3
        path.addRect(self._rect.adjusted(-m, -m, m, m) if self.collapsed else self._rect)
        return path

    def port_label(self, value: tuple[str, str], is_input: bool) -> str:
        """What a card's port says: the user's names, not node ids made up by an import
        (layer1_0_relu_call3). An input: where its value comes from (the card that holds
        that node, or the module the node came from); the card's one output: "out";
        of several, each one's module, relative to the block."""
        scene = self.scene()
        src = value[0]
        values = self.ins if is_input else self.outs
        if not is_input and len(values) == 1:
            return "out"
        if is_input:
            card = scene._collapsed_group(src)
            if card is not None and card is not self:
                return card.card_name()
        node = scene.graph.nodes.get(src)
        origin = node.scope[-1][0] if node is not None and getattr(node, "scope", None) else src
        prefix = block_name(self.name) + "."
        return origin.removeprefix(prefix)

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
        fm = QFontMetricsF(TITLE_FONT)
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
            p.setBrush(NO_BRUSH)
            p.drawRoundedRect(self._rect.adjusted(2, 2, -2, -2), 9, 9)

    def _paint(self, p: QPainter, opt) -> None:
        t = self.scene().theme
        p.setRenderHint(QPainter.Antialiasing)
        if not self.collapsed:
            p.setPen(QPen(QColor(t.group_border), 1.2, Qt.DashLine))
            p.setBrush(QColor(t.group_fill))
            p.drawRoundedRect(self._rect, 10, 10)
            p.setPen(QColor(t.group_text))
            p.setFont(TITLE_FONT)
            lod = opt.levelOfDetailFromTransform(p.worldTransform())
            if lod < READABLE_LOD:
                line = min(LABEL_PX * 1.2 / max(lod, 1e-3), FRAME_LABEL_ROOM)
                head = QRectF(self._rect.left() + 8, self._rect.top() - line, self._rect.width() - 8, line)
                self.far_labels = [draw_far_label(p, head, self.title(), QColor(t.group_text), lod, left=True,
                                                  mark="▾ ")]
            else:
                text = elide(self.title(), TITLE_FONT, self._rect.width() - 24 - QFontMetricsF(TITLE_FONT).horizontalAdvance("▾ "))
                p.drawText(self._rect.adjusted(12, 6, -12, 0), Qt.AlignLeft | Qt.AlignTop, f"▾ {text}")
            return
        r = self._rect
        sel = self.isSelected()
        lod = opt.levelOfDetailFromTransform(p.worldTransform())
        if lod < READABLE_LOD:  # far out: the card in its colour, its name and type readable
            fill = QColor(t.selected) if sel else self.stage_colour()
            p.fillRect(r, fill)
            kind = block_type(self.scene().graph, self.name, self.scene().block_members(self.name))
            run = self.run
            if run:  # "layer3.1–5" over "Bottleneck ×5": the count is what a folded card says first
                kind = f"{kind or 'block'} ×{len(run)}"
            line = LABEL_PX * 1.2 / max(lod, 1e-3)
            two = kind and r.height() * lod >= 2.4 * LABEL_PX  # room for a second line
            self.far_labels = [draw_far_label(p, r.translated(0, -line / 2 if two else 0), self.card_name(short=True),
                                              QColor(t.header_text), lod, bg=fill)]
            if two:
                self.far_labels.append(draw_far_label(p, r.translated(0, line / 2), kind, QColor(t.header_text), lod,
                                                      bg=fill))
            return
        p.setPen(QPen(QColor(t.selected), 2.2) if sel else QPen(QColor(t.group_border), 1.4, Qt.DashLine))
        p.setBrush(QColor(t.node_body))
        p.drawRoundedRect(r, 7, 7)
        p.setPen(NO_PEN)
        head = self.stage_colour()
        p.setBrush(head)
        p.drawRoundedRect(QRectF(r.x(), r.y(), r.width(), HEADER_H), 7, 7)
        p.fillRect(QRectF(r.x(), r.y() + HEADER_H - 8, r.width(), 8), head)
        p.setFont(TITLE_FONT)
        p.setPen(QColor(t.header_text))
        p.drawText(QRectF(r.x() + 10, r.y(), r.width() - 20, HEADER_H), Qt.AlignVCenter | Qt.AlignLeft,
                   "▸ " + elide(self.card_name(), TITLE_FONT, r.width() - 20 - QFontMetricsF(TITLE_FONT).horizontalAdvance("▸ ")))
        p.setFont(TEXT_FONT)
        p.setPen(QColor(t.subtext))
        kind = block_type(self.scene().graph, self.name, self.scene().block_members(self.name)) or "block"
        if self.run:
            kind += f" ×{len(self.run)} (double-click: one by one)"
        size, shapes = self.figures()
        line = QRectF(r.x() + 10, r.y() + HEADER_H, r.width() - 20, BODY_TOP - HEADER_H - 2)
        tags, _ = self.placement_tags()
        fm = QFontMetricsF(TEXT_FONT)
        tag_w = min(fm.horizontalAdvance(tags) + 8, 0.7 * line.width()) if tags else 0.0
        if tags:  # the tags on the right, the type in what is left (both elided if need be; the tooltip has all)
            p.drawText(line, Qt.AlignVCenter | Qt.AlignRight, fm.elidedText(tags, Qt.ElideRight, tag_w))
        p.drawText(line, Qt.AlignVCenter | Qt.AlignLeft, fm.elidedText(kind, Qt.ElideRight, line.width() - tag_w))
        for k, text in enumerate((size, shapes)):
            p.drawText(line.translated(0, (k + 1) * ROW_H), Qt.AlignVCenter | Qt.AlignLeft,
                       QFontMetricsF(TEXT_FONT).elidedText(text, Qt.ElideRight, line.width()))
        p.setPen(QColor(t.text))
        for values, is_input in ((self.ins, True), (self.outs, False)):
            for i, value in enumerate(values):
                y = r.top() + BODY_TOP + CARD_EXTRA + (i + 0.5) * ROW_H
                box = QRectF(r.x() + 12, y - ROW_H / 2, r.width() / 2 - 12, ROW_H) if is_input else \
                    QRectF(r.center().x(), y - ROW_H / 2, r.width() / 2 - 12, ROW_H)
                p.drawText(box, Qt.AlignVCenter | (Qt.AlignLeft if is_input else Qt.AlignRight),
                           elide(self.port_label(value, is_input), TEXT_FONT, box.width() - 2))
        p.setPen(QPen(QColor(t.node_body), 1.5))
        p.setBrush(QColor(t.port_in))
        for values, is_input in ((self.ins, True), (self.outs, False)):
            for i in range(len(values)):
                p.drawEllipse(self._port_point(i, is_input), PORT_R, PORT_R)
