"""The dashboard fits the window (issue 42, item 5): at 1440x900, docked as the app
docks it, every plot's title fits its plot, legends sit outside the data area (and can
be hidden), the confusion matrix shows every column (10 and 100 classes) with labels
that do not run together, and in a comparison the runs have short unique labels with
the full name on hover."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from PySide6.QtWidgets import QApplication

pytestmark = pytest.mark.gui


def write_run(folder, n=40, loss0=2.0):
    folder.mkdir(parents=True)
    with open(folder / "metrics.jsonl", "w") as f:
        for s in range(1, n + 1):
            f.write(json.dumps({"step": s, "time": 10 + 0.25 * s, "loss": loss0 * math.exp(-s / 15), "lr": 1e-3,
                                "samples_per_s": 500.0 + s, "peak_mem_mb": 100.0 + s / 10, "step_ms": 3.0}) + "\n")
            if s % 10 == 0:
                f.write(json.dumps({"step": s, "time": 10 + 0.25 * s, "val_loss": loss0 * math.exp(-s / 18),
                                    "val_acc": s / n, "val_top5": min(1.0, 2 * s / n)}) + "\n")
        f.write(json.dumps({"event": "end", "state": "succeeded", "step": n, "time": 30.0}) + "\n")
    return folder


@pytest.fixture
def window(qtbot, asked):
    from pathlib import Path

    from app.window import MainWindow
    from engine.project import load_project

    w = MainWindow(load_project(Path(__file__).resolve().parents[2] / "resources/examples/cnn_digits.lflow"),
                   recover=False)
    qtbot.addWidget(w)
    w.resize(1440, 900)  # the default size
    w.show()
    qtbot.waitExposed(w)
    w.default_dock_sizes()
    QApplication.processEvents()
    return w


def settle(dash):
    dash.wait_parsed()
    dash.flush()
    for _ in range(5):
        QApplication.processEvents()


def check_fits(dash):
    """Every plot: inside the visible width of the dashboard, its title no wider than the
    plot, its legend (when shown) under the data area, not over it."""
    view = dash.plots_scroll.viewport()
    for pid, pw in [*dash.plots.items(), ("confusion", dash.confusion)]:
        assert pw.isVisible(), pid
        left = pw.mapTo(view, pw.rect().topLeft()).x()
        assert left >= 0 and left + pw.width() <= view.width() + 1, f"{pid} runs off the dashboard's right edge"
        pi = pw.getPlotItem()
        tw = pi.titleLabel.item.boundingRect().width()
        assert tw <= pi.titleLabel.geometry().width() + 1 and tw <= pw.width(), \
            f"{pid}: title '{pi.titleLabel.item.toPlainText()}' ({tw:.0f}px) is wider than its plot"
        shown = pi.titleLabel.item.toPlainText()
        assert shown == pi.full_title or pi.titleLabel.toolTip() == pi.full_title  # shortened: full on hover
        if pid == "confusion":
            continue
        if pi.legend is not None and pi.legend.isVisible() and pi.legend.items:
            data = pi.vb.sceneBoundingRect()
            legend = pi.legend.sceneBoundingRect()
            assert not legend.intersects(data), f"{pid}: the legend covers the curves"
            assert legend.top() >= data.bottom()
            assert legend.bottom() <= pi.sceneBoundingRect().bottom() + 1
            assert data.height() >= 40, f"{pid}: the legend left the curves {data.height():.0f}px"
            for _, label in pi.legend.items:  # every entry inside the plot's width
                assert label.sceneBoundingRect().right() <= pi.sceneBoundingRect().right() + 1


def test_one_run_at_the_default_size(window, tmp_path):
    run = write_run(tmp_path / "runs" / "cnn_digits-20261206-031500")
    window.open_run(run)
    dash = window.run_ui.dashboard
    settle(dash)
    assert window.run_ui.dashboard_dock.isVisible()
    assert dash.columns() >= 2  # the plots reflowed to the dock's width, not clipped at 4
    check_fits(dash)
    loss = dash.plots["loss"].getPlotItem()
    assert [lb.text for _, lb in loss.legend.items] == ["train", "val"]
    # the legends can be hidden: more room for the curves
    h = loss.vb.height()
    dash.legend_check.setChecked(False)
    QApplication.processEvents()
    assert not loss.legend.isVisible() and loss.vb.height() > h
    dash.legend_check.setChecked(True)
    QApplication.processEvents()
    assert loss.legend.isVisible()


@pytest.mark.parametrize("n", [10, 100])
def test_the_confusion_matrix_shows_every_column(window, tmp_path, n):
    window.open_run(write_run(tmp_path / "runs" / "r-1"))
    dash = window.run_ui.dashboard
    settle(dash)
    rng = np.random.default_rng(0)
    m = rng.integers(0, 20, (n, n)) + np.eye(n, dtype=int) * 50
    dash.set_confusion(m, [f"c{i}" for i in range(n)])
    QApplication.processEvents()
    cm = dash.confusion
    dash.plots_scroll.ensureWidgetVisible(cm)
    QApplication.processEvents()
    check_fits(dash)
    vb = cm.getPlotItem().vb
    (x0, x1), (y0, y1) = vb.viewRange()
    assert x0 <= -0.5 and x1 >= n - 0.5 and y0 <= -0.5 and y1 >= n - 0.5  # every column and row in view
    image = cm.image.mapRectToScene(cm.image.boundingRect())
    assert vb.sceneBoundingRect().adjusted(-1, -1, 1, 1).contains(image)
    # the class labels do not run together: one every `step` classes, that far apart on screen
    cw, _ = cm.cell_size()
    assert cw > 0
    ticks = cm.getPlotItem().getAxis("bottom")._tickLevels[0]
    fm = cm.fontMetrics()
    widest = max(fm.horizontalAdvance(label) for _, label in ticks)
    step = ticks[1][0] - ticks[0][0] if len(ticks) > 1 else n
    assert step * cw >= widest, f"{n} classes: labels {widest}px wide every {step * cw:.1f}px"
    assert len(ticks) >= 2
    # numbers in the cells only where they fit
    if cm._texts:
        fits = cw >= max(fm.horizontalAdvance(t.toPlainText()) for t in cm._texts)
        assert all(t.isVisible() == fits for t in cm._texts) or fits


def test_compare_gives_short_unique_labels_and_legends_beside_the_plots(window, tmp_path):
    a = write_run(tmp_path / "runs" / "cnn_digits-20261206-031500")
    b = write_run(tmp_path / "runs" / "cnn_digits-20261206-031513", n=30, loss0=3.0)
    window.run_ui.compare(str(a), str(b))
    dash = window.run_ui.dashboard
    settle(dash)
    assert [dash.run_list.item(i).text() for i in range(2)] == ["031500", "031513"]
    assert dash.run_list.item(0).toolTip().startswith("cnn_digits-20261206-031500")  # the full name on hover
    assert dash.side.isVisible()
    loss = dash.plots["loss"].getPlotItem()
    names = [lb.full for _, lb in loss.legend.items]
    assert sorted(names) == ["031500: train", "031500: val", "031513: train", "031513: val"]
    tips = [lb.toolTip() for _, lb in loss.legend.items]
    assert all(t.startswith("cnn_digits-20261206-0315") for t in tips)
    check_fits(dash)
    from widgets.dashboard.fit import LINE_H, max_lines

    for pw in dash.plots.values():  # legends of two lines, more in a tall plot (whole names, issue 60)
        pi = pw.getPlotItem()
        if pi.legend.items:
            assert pi.layout.rowMaximumHeight(4) <= max_lines(pi) * LINE_H + 2 and max_lines(pi) <= 4
    text = dash.show_crosshair(10)
    assert "031500:" in text and "031513:" in text


def test_short_labels():
    from widgets.dashboard.series import short_labels

    assert short_labels(["cnn-20261206-031500", "cnn-20261206-031513"]) == ["031500", "031513"]
    assert short_labels(["run-013", "run-014"]) == ["013", "014"]
    assert short_labels(["exp-lr0.1-013", "exp-lr0.2-013"]) == ["lr0.1-013", "lr0.2-013"]
    assert short_labels(["a", "a"]) == ["a", "a #2"]
    assert short_labels(["x-1", "y-x-1"]) == ["x-1", "y-x-1"]
