"""Sizes of a node card and where things sit on it: the port rows, the port dots,
the grid, the zoom below which cards drop their detail, and the curve an edge takes.

A leaf of the package: Qt geometry only, imported by the items and the scene.
engine/diagram/layout.py mirrors NODE_W and node_height() to lay diagrams out without Qt.
"""
from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF
from PySide6.QtGui import QPainterPath

NODE_W = 152.0
HEADER_H = 26.0
BODY_TOP = 48.0  # first port row starts here (header + type line)
ROW_H = 18.0
PORT_R = 5.0
GRID = 20.0
LOD_DETAIL = 0.35  # below this zoom nodes are plain cards and ports are hidden


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
