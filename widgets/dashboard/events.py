"""What a run's recovery did, as the dashboard marks it on the loss plot: its restarts
(engine/runtime/recovery.py's restart_record: {"step", "event": "restart", "attempt",
"reason", "failed_at_step", "world", "down_s"[, "layout", "accumulation"]}), a
preemption ({"event": "preempted", "step"}) and a checkpoint that failed
({"event": "checkpoint_failed", "checkpoint", "error"}). `marker_of` gives a record's
short label (the one drawn beside the line, "restart 2") and its text (the tooltip and
the crosshair's readout: why, the time lost, the world after). Plain Python: no Qt.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

MARKED = frozenset(("restart", "preempted", "checkpoint_failed"))


@dataclass
class Marker:
    kind: str  # restart | preempted | checkpoint_failed
    step: float
    time: float  # seconds since the run's first record (the x of the wall-time axis)
    label: str  # drawn beside the line
    text: str  # the tooltip: why, what it cost, what came after (lines)
    short: str = ""  # one line of it, for the crosshair's readout


WRAP = 90  # a tooltip line (an error's text can be a paragraph)
SHORT_WHY = 70  # the readout's cut of it


def _num(v) -> float | None:
    return float(v) if type(v) in (int, float) and math.isfinite(v) else None


def _seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _layout(rec: dict) -> str | None:
    from engine.runs.history import layout_text  # (plain Python too; only when a marker comes)

    return layout_text(rec.get("layout")) if isinstance(rec.get("layout"), dict) else None


def _why(text: str) -> list[str]:
    """An error's text in tooltip lines: wrapped, at most 4 of them."""
    return textwrap.wrap(" ".join(str(text).split()), WRAP, max_lines=4, placeholder=" …") or [""]


def _cut(text, n: int = SHORT_WHY) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 1].rstrip() + "…"


def marker_of(rec: dict) -> tuple[str, str, str] | None:
    """(label, text, short) of a recovery record, or None for any other record."""
    kind = rec.get("event")
    if kind not in MARKED:
        return None
    step = rec.get("step")
    if kind == "restart":
        n = rec.get("attempt")
        label = f"restart {n}" if type(n) is int else "restart"
        lines = [f"{label}: resumed at step {step}"
                 + (f" (failed at step {rec['failed_at_step']})" if type(rec.get("failed_at_step")) is int else "")]
        short = [f"{label} at step {step}"]
        if rec.get("reason"):
            why = _why(rec["reason"])
            lines += [f"why: {why[0]}", *(f"     {w}" for w in why[1:])]
        down = _num(rec.get("down_s"))
        if down is not None:
            lines.append(f"time lost: down {_seconds(down)} (from the failure to this start)")
            short.append(f"down {_seconds(down)}")
        world = rec.get("world")
        if type(world) is int:
            after = f"then on {world} process{'es' if world != 1 else ''}"
            layout = _layout(rec)
            if layout:
                after += f" ({layout})"
            short.append(after)
            acc = rec.get("accumulation")
            if type(acc) is int and acc > 1:
                after += f", {acc} micro-batches a step to keep the batch"
            lines.append(after)
        if rec.get("reason"):
            short.append(f"why: {_cut(rec['reason'])}")
        return label, "\n".join(lines), ", ".join(short)
    if kind == "preempted":
        why = rec.get("reason") or rec.get("signal")
        text = f"preempted at step {step}" + (f": {_cut(why, WRAP)}" if why else "")
        return "preempted", text + "\nthe run goes on from its latest checkpoint when it is started again", text
    name = rec.get("checkpoint") or f"step_{step}"
    text = f"checkpoint {name} failed"
    why = _why(rec["error"]) if rec.get("error") else []
    return ("checkpoint failed", "\n".join([text + (f": {why[0]}" if why else ""), *why[1:],
                                            "the checkpoint before it stays the latest"]),
            text + (f": {_cut(rec['error'])}" if rec.get("error") else ""))
