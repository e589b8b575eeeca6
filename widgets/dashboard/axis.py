"""The dashboard's axes and the caches that keep its repaints cheap.

`GridAxis` is pyqtgraph's AxisItem with opaque grid lines (Qt's raster engine
hands translucent ones to a thread pool), its drawing kept in a pixmap and its tick
layout shared by the axes that draw the same, a lean layout of the dashboard's own
axes (`_lean_specs`, equal to pyqtgraph's), tick values without numpy and large
numbers written short (200k, 1.2M). `cache_painting` paints the titles, labels and
legend entries of a plot once into pixmaps; `LegendSample` draws a legend entry in
its curve's own pen while an envelope (segments.py) draws the curve.
"""
from __future__ import annotations

import bisect
import math

import pyqtgraph as pg
from PySide6 import QtCore, QtGui, QtWidgets
from PySide6.QtCore import Qt


class GridAxis(pg.AxisItem):
    """An axis whose grid lines are opaque: pyqtgraph draws them in the tick colour at
    a low alpha, and Qt's raster engine hands every translucent line to its GUI
    thread pool, whose wake-ups cost more than all the rest of a repaint on a small
    machine. Here each grid pen gets the colour it had, blended over the plot's
    background beforehand; the axis is put behind the view box so that the curves
    cross the grid (a translucent grid tinted them slightly).

    The axes of one dashboard share their latest ticks (`shared`):
    the x axes of all plots are linked and the same size, so when the x range moves
    one of them lays out the ticks and labels and the others reuse them."""

    def __init__(self, orientation: str, background: QtGui.QColor, shared: dict):
        super().__init__(orientation)
        self._bg = QtGui.QColor(background)
        self._opaque: dict[int, QtGui.QPen] = {}
        self._shared = shared.setdefault("specs", {})  # key: generateDrawSpecs' result
        self._pixmaps = shared.setdefault("pixmaps", {})  # key: the axis drawn (see paint)
        self._text_sizes: dict[str, dict[str, tuple[float, float]]] = {}  # font key: label: (width, height)
        # painted once into a pixmap and blitted until its ticks change (see paint):
        # replaying the axis' QPicture cost 0.2 ms per axis and repaint, 12 axes here
        self._pixmap: tuple | None = None  # (pixmap, x, y) while self.picture is set
        # two levels of grid, not pyqtgraph's three: its third (a line every tenth of a
        # major step) doubled the cost of laying out an axis (1.4 ms to 0.75 ms), and
        # when the data of all five plots leaves their ranges in one update, those
        # layouts were the largest part of the slowest updates
        self.setStyle(maxTickLevel=1)

    def _key(self) -> tuple:
        """What the axis' ticks and labels depend on, for `shared`."""
        view = self.linkedView()
        # rounded: the plots' sizes, laid out in floats, differed in the 14th digit
        rect = view.mapRectToItem(self, view.boundingRect()).getRect() if view is not None else ()
        return (self.orientation, *self.range, self.logMode, *(round(v, 3) for v in (*self.size().toTuple(), *rect)))

    def paint(self, p, opt, widget):
        """The axis and its grid from a pixmap, drawn when its ticks change and shared
        by the axes that draw the same (the five x axes): a Qt item cache
        (DeviceCoordinateCache) is one pixmap per item, and when x moved all five were
        drawn again, 0.4 ms each. pyqtgraph sets `picture` to None whenever the axis
        must be drawn again."""
        t = p.worldTransform()
        if t.isScaling() or t.isRotating():  # an export, say: as pyqtgraph does
            return super().paint(p, opt, widget)
        rect = self.boundingRect()
        dpr = p.device().devicePixelRatioF() if p.device() is not None else 1.0
        left, top = rect.left() + t.dx(), rect.top() + t.dy()  # in device pixels
        x0, y0 = math.floor(left), math.floor(top)
        if self.picture is None or self._pixmap is None or self._pixmap[1:] != (x0 - t.dx(), y0 - t.dy()):
            key = (self._key(), round(left - x0, 3), round(top - y0, 3), math.ceil(rect.width() + left - x0),
                   math.ceil(rect.height() + top - y0), dpr, self.pen().color().rgba(), self.textPen().color().rgba(),
                   self.style["tickFont"].key() if self.style["tickFont"] is not None else None)
            pixmaps = self._pixmaps
            pm = pixmaps.get(key)
            if pm is None:
                pm = QtGui.QPixmap(round(key[3] * dpr), round(key[4] * dpr))
                pm.setDevicePixelRatio(dpr)
                pm.fill(Qt.transparent)
                painter = QtGui.QPainter(pm)
                try:
                    painter.translate(left - x0 - rect.left(), top - y0 - rect.top())
                    if self.style["tickFont"] is not None:
                        painter.setFont(self.style["tickFont"])
                    specs = self.generateDrawSpecs(painter)
                    if specs is not None:
                        self.drawPicture(painter, *specs)
                finally:
                    painter.end()
                if len(pixmaps) >= 16:  # the latest few
                    del pixmaps[next(iter(pixmaps))]
                pixmaps[key] = pm
            self.picture = True  # drawn: until pyqtgraph sets it to None
            self._pixmap = (pm, x0 - t.dx(), y0 - t.dy())
        pm, x, y = self._pixmap
        p.drawPixmap(QtCore.QPointF(x, y), pm)

    def generateDrawSpecs(self, p):
        key = self._key()
        if key in self._shared:
            return self._shared[key]
        specs = self._lean_specs(p) if self._lean() else None
        if specs is None:
            specs = super().generateDrawSpecs(p)
            if specs is not None:
                axis, ticks, texts = specs
                specs = axis, [(self._opaque_pen(pen), p1, p2) for pen, p1, p2 in ticks], texts
        if len(self._shared) >= 8:  # the latest few: one per plot row and orientation
            del self._shared[next(iter(self._shared))]
        self._shared[key] = specs
        return specs

    def _lean(self) -> bool:
        """Whether _lean_specs covers this axis: the dashboard's own (left or bottom,
        with a grid, automatic ticks and labels shown, the axis line not cut at ticks)."""
        st = self.style
        return (self.orientation in ("left", "bottom") and self.grid is not False and self.linkedView() is not None
                and self._tickLevels is None and st["showValues"] and st["tickAlpha"] is None
                and not any(st["stopAxisAtTick"]))

    def _lean_specs(self, p):
        """pyqtgraph's AxisItem.generateDrawSpecs for the axes the dashboard has (see
        _lean), with the same ticks, labels and places (tests/widgets compare them),
        laid out at a third of its cost: 1.1 ms an axis here, paid by every axis whose
        range moves, up to six in one update. Each label's size is measured once per
        font and kept; the axis' bounds are mapped once, not once per label; the grid
        pens are made opaque once per level. Returns None where pyqtgraph would."""
        st = self.style
        if st["tickFont"] is not None:
            p.setFont(st["tickFont"])
        bounds = self.mapRectFromParent(self.geometry())
        view = self.linkedView()
        tick_bounds = view.mapRectToItem(self, view.boundingRect())
        left = self.orientation == "left"
        if left:
            span = (bounds.topRight() + QtCore.QPointF(-1.0, -1.0), bounds.bottomRight() + QtCore.QPointF(-1.0, 1.0))
            tick_start, tick_stop, axis = tick_bounds.right(), bounds.right(), 0
        else:
            span = (bounds.topLeft() + QtCore.QPointF(-1.0, 1.0), bounds.topRight() + QtCore.QPointF(1.0, 1.0))
            tick_start, tick_stop, axis = tick_bounds.top(), bounds.top(), 1
        vt = self.deviceTransform_()
        if vt is None:
            return None
        d = vt.map(span[1]) - vt.map(span[0])
        length = math.hypot(d.x(), d.y())
        if length == 0:
            return None
        levels = self.tickValues(self.range[0], self.range[1], length)
        r0, r1 = self.range
        dif = r1 - r0
        if dif == 0:
            scale, offset = 1, 0
        elif axis == 0:
            scale = -bounds.height() / dif
            offset = r0 * scale - bounds.height()
        else:
            scale = bounds.width() / dif
            offset = r0 * scale
        x_min, x_max = sorted((r0 * scale - offset, r1 * scale - offset))
        positions, tick_specs = [], []
        base = self.tickPen()
        solid = base.brush().style() == Qt.BrushStyle.SolidPattern
        for i, (_, ticks) in enumerate(levels):
            alpha = 255 / (i + 1) * self.grid / 255.0 * min(max(0.05 * length / (len(ticks) + 1), 0.0), 1.0)
            pen = base
            if solid:
                pen = QtGui.QPen(base)
                c = QtGui.QColor(pen.color())
                c.setAlpha(int(alpha))
                pen.setColor(c)
            pen = self._opaque_pen(pen)
            at = []
            for v in ticks:
                x = v * scale - offset
                if x < x_min or x > x_max:
                    at.append(None)
                    continue
                at.append(x)
                if axis == 0:
                    tick_specs.append((pen, QtCore.QPointF(tick_start, x), QtCore.QPointF(tick_stop, x)))
                else:
                    tick_specs.append((pen, QtCore.QPointF(x, tick_start), QtCore.QPointF(x, tick_stop)))
            positions.append(at)
        axis_spec = (self.pen(), span[0], span[1])
        text_offset = st["tickTextOffset"][axis] + max(0, st["tickLength"])
        sizes = self._text_sizes.setdefault(p.font().key(), {})
        if len(sizes) > 4096:  # labels of many ranges: start again
            sizes.clear()
        br = self.boundingRect()
        text_specs, measured = [], []
        size2 = last_size2 = 0
        flags = (Qt.AlignRight | Qt.AlignVCenter if left else Qt.AlignHCenter | Qt.AlignTop) | Qt.TextDontClip
        for i in range(min(len(levels), st["maxTextLevel"] + 1)):
            spacing, values = levels[i]
            strings = self.tickStrings(values, self.autoSIPrefixScale * self.scale, spacing)
            if not strings:
                continue
            rects = []
            for j, s in enumerate(strings):
                if positions[i][j] is None:
                    rects.append(None)
                    continue
                wh = sizes.get(s)
                if wh is None:
                    r = p.boundingRect(QtCore.QRectF(0, 0, 100, 100), Qt.AlignCenter, s)
                    wh = sizes[s] = (r.width(), r.height() * 0.8)  # pyqtgraph's: its rects are a bit tall
                rects.append(wh)
                measured.append(wh)
            size = sum(wh[1 - axis] for wh in measured)  # along the axis
            size2 = max((wh[axis] for wh in measured), default=0)  # across it
            if i > 0 and any(len(text_specs) >= n and size / length >= limit for n, limit in st["textFillLimits"]):
                break  # crowded: no labels on this level
            last_size2 = size2
            for j, s in enumerate(strings):
                x, wh = positions[i][j], rects[j]
                if x is None:
                    continue
                w, h = wh
                if left:
                    rect = QtCore.QRectF(tick_stop - text_offset - w, x - h / 2, w, h)
                else:
                    rect = QtCore.QRectF(x - w / 2.0, tick_stop + text_offset, w, h)
                if br & rect != rect:
                    continue
                text_specs.append((rect, flags, s))
        self._updateMaxTextSize(last_size2)
        return axis_spec, tick_specs, text_specs

    def tickValues(self, minVal, maxVal, size):
        """pyqtgraph's tick values (linear axes), in plain Python: its numpy version
        (np.isclose of every tick against those of the levels above) was a third of
        laying out an axis. A tick within 1% of a step of one on a level above is
        left out, as there."""
        if self.logMode:
            return super().tickValues(minVal, maxVal, size)
        lo, hi = sorted((minVal, maxVal))
        lo, hi, scale = lo * self.scale, hi * self.scale, self.scale
        out, seen = [], []
        for spacing, offset in self.tickSpacing(lo, hi, size):
            start = math.ceil((lo - offset) / spacing) * spacing + offset
            tol = spacing / scale * 0.01
            values = [v for v in ((k * spacing + start) / scale for k in range(int((hi - start) / spacing) + 1))
                      if not _near(seen, v, tol)]
            seen = sorted(seen + values)
            out.append((spacing / scale, values))
        return out

    def tickStrings(self, values, scale, spacing):
        """Large numbers as 200k or 1.2M: pyqtgraph writes 200000 (its SI prefixes
        are off, see Dashboard._build_ui), and along an x axis of a million steps the labels
        ran into each other."""
        if self.logMode or not values or max(abs(v * scale) for v in values) < 1e4:
            return super().tickStrings(values, scale, spacing)
        return [_short(v * scale, spacing * scale) for v in values]

    def _opaque_pen(self, pen: QtGui.QPen) -> QtGui.QPen:
        c = pen.color()
        out = self._opaque.get(c.rgba())
        if out is None:
            a, bg = c.alphaF(), self._bg
            out = self._opaque[c.rgba()] = QtGui.QPen(pen)
            out.setColor(QtGui.QColor.fromRgbF(*(b + (f - b) * a for f, b in (
                (c.redF(), bg.redF()), (c.greenF(), bg.greenF()), (c.blueF(), bg.blueF())))))
        return out


def _near(ordered: list[float], v: float, tol: float) -> bool:
    """Whether a value of the sorted list `ordered` is within tol of v."""
    i = bisect.bisect_left(ordered, v)
    return (i < len(ordered) and ordered[i] - v <= tol) or (i > 0 and v - ordered[i - 1] <= tol)


def cache_painting(item: QtWidgets.QGraphicsItem) -> None:
    """Paint `item`, and the text and legend samples under it, once into a pixmap and
    blit that until they change (Qt repaints a cached item when it calls update(), as
    a text item does when its text changes). A cache mode holds for one item, not its
    children, and pyqtgraph's titles, axis labels and legend entries are
    QGraphicsTextItems under the item that lays them out: their text was laid out and
    drawn again on every repaint, 2 ms of the 9 ms that repainting six plots took.
    A pyqtgraph LabelItem (a title, a legend entry's text) only lays out the text
    item under it and draws nothing itself: it is marked as having no contents, so
    that a repaint neither asks it for its bounds (Python) nor blits an empty cached
    pixmap for it, 0.85 ms of a repaint of the five plots of three runs."""
    if type(item) is pg.LabelItem and type(item).paint is QtWidgets.QGraphicsWidget.paint:
        item.setFlag(QtWidgets.QGraphicsItem.ItemHasNoContents)
    else:
        item.setCacheMode(QtWidgets.QGraphicsItem.DeviceCoordinateCache)
    for child in item.childItems():
        if isinstance(child, (QtWidgets.QGraphicsTextItem, pg.ItemSample, pg.LabelItem)):
            cache_painting(child)


class LegendSample(pg.ItemSample):
    """A legend entry's sample line in its curve's own pen (`legend_pen`), also while
    the curve is empty and its envelope (a Segments, maybe of 1-pixel lines) draws."""

    def paint(self, p, *args):
        pen = getattr(self.item, "legend_pen", None)
        if pen is None or not self.item.isVisible() or self.item.opts.get("symbol") is not None:
            return super().paint(p, *args)
        p.setPen(pen)
        p.drawLine(0, 11, 20, 11)


def _short(v: float, spacing: float) -> str:
    """v with a k, M or G suffix and as many decimals as ticks `spacing` apart need."""
    unit, suffix = next(((u, x) for u, x in ((1e9, "G"), (1e6, "M"), (1e3, "k")) if abs(v) >= u), (1.0, ""))
    step, decimals = spacing / unit, 0  # the decimals a multiple of the spacing needs
    while decimals < 6 and abs(round(step, decimals) - step) > 1e-9 * step:
        decimals += 1
    text = f"{v / unit:.{decimals}f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + suffix


class SameRangeViewBox(pg.ViewBox):
    """A view box whose linked axis takes the linked view's range as it is. pyqtgraph lines
    linked views up on the screen when they overlap there (plots one over another in a
    column): a plot whose y axis is wider than its neighbour's then shows a shifted x range,
    and the last steps of a run fall off its right edge. Every plot here shows the whole
    range the first one follows."""

    def linkedViewChanged(self, view, axis):  # (pyqtgraph's API)
        if self.linksBlocked or view is None:
            return
        vr = view.viewRect()
        view.blockLink(True)
        try:
            if axis == pg.ViewBox.XAxis:
                self.enableAutoRange(pg.ViewBox.XAxis, False)
                self.setXRange(vr.left(), vr.right(), padding=0)
            else:
                self.enableAutoRange(pg.ViewBox.YAxis, False)
                self.setYRange(vr.top(), vr.bottom(), padding=0)
        finally:
            view.blockLink(False)
