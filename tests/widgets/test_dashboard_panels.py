"""The runs panel and the run toolbar: what they show and the requests they emit."""
import time
from pathlib import Path

import pytest
from PySide6.QtWidgets import QToolBar

from engine.runs.history import RunSummary
from widgets.run_toolbar import RunToolbar
from widgets.runs_panel import RunsPanel, fmt_best, fmt_duration

pytestmark = pytest.mark.gui


def summaries():
    now = time.time()
    return [
        RunSummary(Path("/p/runs/a"), "a", "succeeded", step=200, total_steps=200, started=now - 300,
                   duration=125.0, best_val_acc=0.931, best_val_loss=0.2),
        RunSummary(Path("/p/runs/b"), "b", "cancelled", step=40, total_steps=200, started=now - 100, duration=9.6,
                   best_val_loss=0.51234),
        RunSummary(Path("/p/runs/c"), "c", "failed", step=3, total_steps=200, started=now - 50, duration=2,
                   error="RuntimeError: shapes"),
    ]


def test_runs_panel_rows_and_requests(qtbot):
    p = RunsPanel()
    qtbot.addWidget(p)
    assert p.empty_label.isVisibleTo(p) and not p.tree.isVisibleTo(p)
    p.set_runs(summaries())
    assert p.run_paths() == ["/p/runs/c", "/p/runs/b", "/p/runs/a"]  # newest first
    row = {p.tree.topLevelItem(i).text(0): [p.tree.topLevelItem(i).text(c) for c in range(5)] for i in range(3)}
    assert row["a"] == ["a", "succeeded", "2m 05s", "200/200", "acc 93.1%"]
    assert row["b"][2:] == ["10s", "40/200", "loss 0.5123"]
    assert "RuntimeError" in p.tree.topLevelItem(0).toolTip(1)
    assert not p.open_button.isEnabled() and not p.compare_button.isEnabled()

    p.select_runs(["/p/runs/b"])
    assert p.open_button.isEnabled() and p.resume_button.isEnabled() and p.delete_button.isEnabled()
    with qtbot.waitSignal(p.open_requested) as sig:
        p.open_button.click()
    assert sig.args == ["/p/runs/b"]
    with qtbot.waitSignal(p.delete_requested) as sig:
        p.delete_button.click()
    assert sig.args == ["/p/runs/b"]
    with qtbot.waitSignal(p.resume_requested) as sig:
        p.resume_button.click()
    p.select_runs(["/p/runs/a"])
    assert not p.resume_button.isEnabled()  # a finished run has nothing to resume

    p.select_runs(["/p/runs/a", "/p/runs/c"])
    assert p.compare_button.isEnabled() and not p.delete_button.isEnabled()
    with qtbot.waitSignal(p.compare_requested) as sig:
        p.compare_button.click()
    assert sorted(sig.args) == ["/p/runs/a", "/p/runs/c"]
    p.set_runs(summaries()[:2])  # a refresh keeps the selection of what is still there
    assert p.selected_runs() == ["/p/runs/a"]


def test_formatting():
    assert fmt_duration(None) == "" and fmt_duration(59.4) == "59s" and fmt_duration(3725) == "1h 02m"
    assert fmt_best(RunSummary(Path("x"), "x", "pending")) == ""


def test_run_toolbar(qtbot):
    bar = QToolBar()
    qtbot.addWidget(bar)
    t = RunToolbar(bar)
    assert [a.text() for a in bar.actions()][-3:] == ["Run", "Stop", "Resume"]
    assert t.run_action.isEnabled() and not t.stop_action.isEnabled() and not t.resume_action.isEnabled()
    t.procs.setValue(2)
    with qtbot.waitSignal(t.run_requested) as sig:
        t.run_action.trigger()
    assert sig.args == ["local", 2]
    t.set_running(True)
    assert not t.run_action.isEnabled() and t.stop_action.isEnabled() and not t.procs.isEnabled()
    with qtbot.waitSignal(t.stop_requested):
        t.stop_action.trigger()
    t.set_running(False, can_resume=True)
    assert t.resume_action.isEnabled()
