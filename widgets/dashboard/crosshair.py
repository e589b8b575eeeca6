"""The dashboard's crosshair: a dotted line at the mouse's x on every plot, and the bar's
readout of each visible run's values at the nearest point (and, on a restart's marker,
what happened there). A part of Dashboard
(widget.py), which it is mixed into.
"""
from __future__ import annotations

import html
import math

import numpy as np


class Crosshair:
    """Dashboard's crosshair and readout (a mixin)."""

    def _mouse_moved(self, plot_id: str, pos) -> None:
        vb = self._pw(plot_id).getPlotItem().vb
        if not vb.sceneBoundingRect().contains(pos):
            return
        self.show_crosshair(vb.mapSceneToView(pos).x())

    def show_crosshair(self, x: float) -> str:
        """Put the crosshair at x on every plot; the readout lists each visible run's
        values at the nearest point, after what happened there when x is on a marker of
        its recovery (a restart: its step, the time lost, the world after, why). Returns
        the readout as plain text."""
        for line in self._vlines.values():
            line.setPos(x)
            line.setVisible(True)
        unit = "step" if self._x_mode == "step" else "t"
        parts_html, parts_text = [], []
        for run, m in self._markers_near(x):  # a restart's line under the crosshair: what happened there, first
            parts_text.append(f"{run.short}: {m.short}" if len(self._runs) > 1 else m.short)
            parts_html.append(f"<span style='color:{run.color}'>┆</span> <b>{html.escape(parts_text[-1])}</b>")
        for run in self._runs.values():
            if not run.visible:
                continue
            vals = []
            for skey in run.series:
                xs, ys = self.series_data(run.key, skey)
                if len(xs) == 0:
                    continue
                i = int(np.clip(np.searchsorted(xs, x), 0, len(xs) - 1))
                if i > 0 and abs(xs[i - 1] - x) <= abs(xs[i] - x):
                    i -= 1
                vals.append(f"{skey} {_fmt(ys[i])}")
            if vals:
                parts_text.append(f"{run.short}: " + ", ".join(vals))
                parts_html.append(f"<span style='color:{run.color}'>■</span> <b>{run.short}</b>: " + ", ".join(vals))
        xs = f"{x:.0f}" if self._x_mode == "step" else f"{x:.1f}s"
        self.readout.setText(f"{unit} {xs} &nbsp; " + " &nbsp;│&nbsp; ".join(parts_html))
        return f"{unit} {xs}  " + " | ".join(parts_text)


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    a = abs(v)
    if a != 0 and (a < 1e-3 or a >= 1e5):
        return f"{v:.3g}"
    return f"{v:.4g}"
