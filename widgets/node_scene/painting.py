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
READABLE_LOD = 0.6  # below this zoom a name drawn at its own size is too small to read


@functools.lru_cache(maxsize=64)
def _far_font(points: float) -> tuple[QFont, QFontMetricsF]:
    font = QFont(TITLE_FONT)
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


DIFF_COLORS = {"added": QColor("#2e9e44"), "changed": QColor("#e0a000"), "removed": QColor("#d04040")}
