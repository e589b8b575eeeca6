"""The parallel-coordinates plot reads with one run and with fifty (issue 60): a setting
that never varies is no axis, every axis is named (the first too), names and values are
shortened to the room between two axes so none runs into the next, and values sit on a
band of the background beside their axis."""
from __future__ import annotations

import pytest
from PySide6.QtGui import QFont, QFontMetricsF
from PySide6.QtWidgets import QApplication

from widgets.parallel_coords import ParallelCoords

pytestmark = pytest.mark.gui
SETTINGS = ["training.optimizer.lr", "training.batch_size", "training.schedule.name", "placement.microbatches",
            "placement.precision"]


def rows(n):
    return [{"path": f"/runs/r{i}", "run": f"mlp_digits-20261206-{i:06d}", "final_loss": 1.0 / (i + 1),
             "settings": {"lr": 0.0036 * (1 + i % 7), "batch_size": 32 * (1 + i % 3),
                          "name": ["cosine", "linear", "constant"][i % 3], "microbatches": 4,
                          "precision": "fp32"}} for i in range(n)]


@pytest.fixture
def plot(qtbot):
    p = ParallelCoords()
    qtbot.addWidget(p)
    p.resize(420, 300)
    p.show()
    qtbot.waitExposed(p)
    return p


def check_names(p):
    QApplication.processEvents()
    ax = p.plotItem.getAxis("bottom")
    fm = QFontMetricsF(ax.style.get("tickFont") or QFont())
    room = p.column_px()
    assert len(p.names) == len(p.columns) and all(p.names), p.names  # every axis named, the first too
    vb = p.plotItem.vb
    for i, name in enumerate(p.names):
        w = fm.horizontalAdvance(name)
        assert w <= room, f"'{name}' ({w:.0f}px) wider than the {room:.0f}px between axes"
        x = vb.mapViewToScene(pg_point(i, 0)).x()
        assert x - w / 2 >= vb.sceneBoundingRect().left() - 1 and x + w / 2 <= vb.sceneBoundingRect().right() + 1, name
    for x, t in p.value_labels:  # a value stays in its own column
        r = t.mapRectToScene(t.boundingRect())
        next_axis = vb.mapViewToScene(pg_point(x + 1, 0)).x()
        assert r.right() <= next_axis + 1, f"value '{t.toPlainText()}' reaches the next axis"
        assert t.fill.color().alpha() > 0


def pg_point(x, y):
    from PySide6.QtCore import QPointF

    return QPointF(x, y)


def test_fifty_runs_drop_the_constant_axes_and_fit_their_names(plot):
    plot.set_rows(rows(50), SETTINGS, "final_loss")
    assert plot.columns == ["training.optimizer.lr", "training.batch_size", "training.schedule.name", "final_loss"]
    assert "placement.precision" not in plot.columns  # fp32 in every run: no axis
    assert plot.names[0] == "lr" and len(plot.lines) == 50
    check_names(plot)
    assert "training.optimizer.lr" in plot.toolTip()  # the full names


def test_one_run_keeps_its_settings_and_still_fits(plot):
    plot.resize(300, 260)
    plot.set_rows(rows(1), SETTINGS, "final_loss")
    assert plot.columns == [*SETTINGS, "final_loss"] and len(plot.lines) == 1
    check_names(plot)
