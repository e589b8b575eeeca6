"""The Sweep dock and the Runs Table dock, driven in the real window: a sweep typed in the
editor runs as a real queue of two training processes, its queue shows each run's end,
the runs table lists both with their settings and metrics, the best run is marked in the
table and the parallel-coordinates plot, and selecting rows overlays their curves in the
dashboard; a sweep that is not JSON, or names a setting the project lacks, is one line in
the panel and starts nothing."""
import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.settings import Settings
from app.window import MainWindow
from engine.project import load_project, save_project

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "resources" / "examples"
pytestmark = [pytest.mark.gui, pytest.mark.slow, pytest.mark.xdist_group("run_ui")]


@pytest.fixture
def win(qtbot, tmp_path):
    p = load_project(EX / "mlp_digits.lflow")
    path = tmp_path / "proj" / "mlp.lflow"
    path.parent.mkdir()
    save_project(p, path)
    w = MainWindow(load_project(path), settings=Settings(tmp_path / "home"), recover=False)
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    yield w
    w.sweep_ui.shutdown()
    w.run_ui.shutdown()


def test_a_sweep_runs_from_the_panel_and_its_runs_fill_the_table(win, qtbot):
    ui = win.sweep_ui
    sweep_action = next(a for a in win.run_menu.actions() if a.text() == "S&weep…")
    sweep_action.trigger()
    assert ui.dock.isVisible()
    ui.panel.editor.setPlainText(json.dumps({"method": "grid", "steps": 8,
                                             "parameters": {"training.optimizer.lr": [0.001, 0.05]}}))
    ui.panel.parallel.setValue(2)
    qtbot.mouseClick(ui.panel.start_button, Qt.LeftButton)
    assert ui.running and not ui.panel.start_button.isEnabled() and ui.panel.stop_button.isEnabled()
    qtbot.waitUntil(lambda: not ui.running and not ui.timer.isActive(), timeout=240_000)
    q = ui.panel.queue
    assert q.rowCount() == 2
    assert [q.item(i, 2).text() for i in range(2)] == ["succeeded", "succeeded"]
    assert [q.item(i, 3).text() for i in range(2)] == ["8/8", "8/8"]
    assert "ended: 2 of 2 succeeded" in ui.panel.status.text()
    assert ui.panel.progress.value() == 2 and ui.panel.start_button.isEnabled()

    # the runs table: both runs, the swept setting as a column, the best by final loss marked in both views
    next(a for a in win.run_menu.actions() if a.text() == "Runs &Table").trigger()
    assert ui.runs_table_dock.isVisible()
    table = ui.compare.table
    rows = table.visible_rows()
    assert len(rows) == 2 and sorted(r["settings"]["lr"] for r in rows) == [0.001, 0.05]
    assert all(r["state"] == "succeeded" and r["final_loss"] is not None for r in rows)
    table.set_metric("final_loss")
    best = min(rows, key=lambda r: r["final_loss"])
    assert table.best_path() == best["path"] and ui.compare.plot.best_path == best["path"]
    assert set(ui.compare.plot.lines) == {r["path"] for r in rows}
    # selecting both rows overlays both runs' curves in the dashboard
    table.select_paths([r["path"] for r in rows])
    dash = win.run_ui.dashboard
    qtbot.waitUntil(lambda: {r["path"] for r in rows} <= set(dash.run_keys()), timeout=10_000)
    assert win.run_ui.dashboard_dock.isVisible()
    table.select_paths([best["path"]])  # one row: the other's curves leave
    qtbot.waitUntil(lambda: set(dash.run_keys()) & {r["path"] for r in rows} == {best["path"]}, timeout=10_000)


def test_a_bad_sweep_is_one_line_and_starts_nothing(win):
    ui = win.sweep_ui
    ui.panel.editor.setPlainText('{"parameters": {"training.optimizer.lr": [0.1,]}}')
    assert ui.start() is False and ui.thread is None
    assert ui.panel.status.text().startswith("sweep: not JSON (line 1")
    ui.panel.editor.setPlainText(json.dumps({"parameters": {"training.no_such_setting": [1, 2]}}))
    assert ui.start() is False and ui.thread is None
    text = ui.panel.status.text()
    assert "training.no_such_setting" in text and "\n" not in text
    runs = win.project.directory / "runs"
    assert not runs.exists() or not any(runs.iterdir())
