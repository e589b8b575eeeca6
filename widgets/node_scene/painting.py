"""What the items paint with: the shared fonts, the empty brush and pen, the
colours of a comparison (added, changed, removed), and names drawn at a fixed size
on the screen so that they stay readable when zoomed far out.

A leaf of the package: Qt only, imported by the items.
"""
from __future__ import annotations

import atexit
import functools

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QPainter, QPen

TITLE_FONT = QFont()
TITLE_FONT.setPointSizeF(9.5)
TITLE_FONT.setBold(True)
TEXT_FONT = QFont()
TEXT_FONT.setPointSizeF(8.5)
SMALL_FONT = QFont()
SMALL_FONT.setPointSizeF(7.5)
NO_BRUSH = QBrush()
NO_PEN = QPen(Qt.NoPen)


LABEL_PX = 11.0  # names far out: this many pixels high on the screen, whatever the zoom
MIN_LABEL_PX = 8.0  # a name that does not fit is drawn smaller, down to this, before it is cut
MIN_PREFIX = 4  # a cut name keeps at least this many of its first characters, else none is drawn
READABLE_LOD = 0.6  # below this zoom a name drawn at its own size is too small to read
FAR_SPREAD = 0.3  # a far name may reach this share of its card's width past each side


@functools.lru_cache(maxsize=64)
def _far_font(points: float) -> tuple[QFont, QFontMetricsF]:
    font = QFont(TITLE_FONT)
    font.setPointSizeF(points)
    return font, QFontMetricsF(font)


# Qt objects must not outlive the application: drop the cached fonts first at exit
atexit.register(_far_font.cache_clear)


@functools.lru_cache(maxsize=4096)
def fit_name(text: str, room_px: float) -> tuple[str, float] | None:
    """A name for `room_px` screen pixels: (what to draw, its pixel height). The whole name
    at LABEL_PX, else smaller down to MIN_LABEL_PX, else its start and "…" (at least
    MIN_PREFIX characters of it, never a stub like "a…l"), else None: no room for a name
    worth reading (the tooltip has it)."""
    px = LABEL_PX
    while px >= MIN_LABEL_PX:
        fm = _far_font(round(px * 0.75, 2))[1]  # (points at 96 dpi)
        if fm.horizontalAdvance(text) <= room_px:
            return text, px
        px -= 1.0
    fm = _far_font(round(MIN_LABEL_PX * 0.75, 2))[1]
    cut = fm.elidedText(text, Qt.ElideRight, room_px)
    if not cut.endswith("…") or len(cut) - 1 < min(MIN_PREFIX, len(text)):
        return None
    return cut, MIN_LABEL_PX


def draw_far_label(p: QPainter, rect: QRectF, text: str, color: QColor, lod: float, left: bool = False,
                   mark: str = "", bg: QColor | None = None) -> str | None:
    """A name that stays readable when zoomed far out: drawn at a fixed screen size
    over its card (centred, up to FAR_SPREAD of the card's width past each side; `left`:
    along the top of a frame, within its width), smaller or cut after a few characters
    where there is no room (fit_name), or not at all; `mark` (an arrow) goes before it
    and is not part of the name. A name wider than its card gets a band of the card's
    colour `bg` behind the part past its sides (light text on the canvas is unreadable).
    Returns what it drew."""
    if rect.width() * lod < 16:  # the card is a few pixels (the minimap): no room for a name
        return None
    width = rect.width() * (1.0 if left else 1 + 2 * FAR_SPREAD)
    mark_px = _far_font(round(MIN_LABEL_PX * 0.75, 2))[1].horizontalAdvance(mark) if mark else 0.0
    fitted = fit_name(text, width * lod - mark_px)
    if fitted is None:
        return None
    label, px = fitted
    label = mark + label
    font, fm = _far_font(round(max(0.5, px / max(lod, 1e-3) * 0.75), 1))
    if left:
        p.setFont(font)
        p.setPen(color)
        p.drawText(QRectF(rect.left(), rect.top(), width, fm.height()), Qt.AlignLeft | Qt.AlignVCenter, label)
        return label
    top = min(rect.center().y() - fm.height() / 2, rect.bottom() - fm.height()) if rect.height() >= fm.height() \
        else rect.top()
    box = QRectF(rect.center().x() - width / 2, top, width, fm.height())
    text_w = fm.horizontalAdvance(label) + 4 / max(lod, 1e-3)
    if bg is not None and text_w > rect.width():
        p.fillRect(QRectF(rect.center().x() - text_w / 2, top, text_w, fm.height()), bg)
    p.setFont(font)
    p.setPen(color)
    p.drawText(box, Qt.AlignCenter, label)
    return label


def elide(text: str, font: QFont, width: float) -> str:
    """`text` cut at its end with "…" to `width` (never in the middle: the start of a name
    is what tells it from its neighbours), or "" where not even MIN_PREFIX characters fit."""
    cut = QFontMetricsF(font).elidedText(text, Qt.ElideRight, width)
    if cut != text and len(cut) - 1 < min(MIN_PREFIX, len(text)):
        return ""
    return cut


DIFF_COLORS = {"added": QColor("#2e9e44"), "changed": QColor("#e0a000"), "removed": QColor("#d04040")}
