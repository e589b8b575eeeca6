"""The Sweep dock and the Runs table dock.

Sweep: a sweep file (JSON, engine/runs/sweep.py) to load, edit and save; Start runs it as a
queue on this machine (engine.runs.sweep.SweepRunner, on a worker thread: it only starts
processes and reads files), Stop ends it as a user's Stop does; the queue shows each
run's point, state and progress, refreshed from the runner at 4 Hz.

Runs table: every run of the project's runs/ (engine.runs.history.runs_table) in a sortable,
filterable table (widgets/runs_table.py) beside a parallel-coordinates plot of the
settings against the chosen metric (widgets/parallel_coords.py), the best run
highlighted in both; selecting rows overlays their curves in the dashboard (its public
add/remove API: set_data, remove_run).
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QLabel, QPlainTextEdit, QProgressBar, QPushButton,
                               QSpinBox, QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from engine.errors import LayerflowError
from engine.runs.history import runs_dir as project_runs_dir, runs_table
from engine.runs.sweep import load_sweep
from remote.sweep_queue import SweepRunner
from widgets.parallel_coords import ParallelCoords
from widgets.runs_table import RunsTable

EXAMPLE_SWEEP = {
    "method": "grid",
    "parameters": {"training.optimizer.lr": [0.001, 0.003, 0.01], "placement.dp": [1]},
    "steps": 200,
    "stop": {"nan": True, "rules": [{"metric": "loss", "above": 2.2, "at_step": 100}]},
}


class SweepPanel(QWidget):
    """The sweep file's text, Load/Save, runs at once, Start/Stop, the queue."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.editor = QPlainTextEdit()
        self.editor.setPlainText(json.dumps(EXAMPLE_SWEEP, indent=1))
        self.load_button = QPushButton("Load…")
        self.save_button = QPushButton("Save…")
        self.parallel = QSpinBox(minimum=0, maximum=256, value=0, specialValueText="auto")
        self.parallel.setToolTip("Runs at once (auto: as this machine's cores allow)")
        self.start_button = QPushButton("Start")
        self.stop_button = QPushButton("Stop", enabled=False)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.progress = QProgressBar()
        self.queue = QTableWidget(0, 4)
        self.queue.setHorizontalHeaderLabels(["#", "settings", "state", "progress"])
        self.queue.verticalHeader().hide()
        self.queue.horizontalHeader().setStretchLastSection(True)
        self.queue.setEditTriggers(QTableWidget.NoEditTriggers)
        row = QHBoxLayout()
        for w in (self.load_button, self.save_button, QLabel("at once"), self.parallel, self.start_button, self.stop_button):
            row.addWidget(w)
        row.addStretch(1)
        split = QSplitter(Qt.Vertical)
        split.addWidget(self.editor)
        split.addWidget(self.queue)
        lay = QVBoxLayout(self)
        lay.addLayout(row)
        lay.addWidget(self.status)
        lay.addWidget(self.progress)
        lay.addWidget(split, 1)

    def show_queue(self, runs) -> None:
        self.queue.setRowCount(len(runs))
        for i, r in enumerate(runs):
            prog = f"{r.step}/{r.total_steps}" if r.total_steps else ""
            for c, text in enumerate((str(r.index + 1), r.label, r.shown_state, prog)):
                item = self.queue.item(i, c)
                if item is None:
                    self.queue.setItem(i, c, QTableWidgetItem(text))
                elif item.text() != text:
                    item.setText(text)
            tip = r.note or (str(r.run_dir) if r.run_dir else "")
            self.queue.item(i, 2).setToolTip(tip)
        done = sum(1 for r in runs if r.done)
        self.progress.setRange(0, max(1, len(runs)))
        self.progress.setValue(done)


class RunsCompare(QWidget):
    """The runs table beside the parallel-coordinates plot (the dock sits in the wide,
    short bottom area: stacked, each had a strip of it)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.table = RunsTable()
        self.plot = ParallelCoords()
        self.refresh_button = QPushButton("Refresh")
        split = QSplitter(Qt.Horizontal)
        split.addWidget(self.table)
        split.addWidget(self.plot)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        lay = QVBoxLayout(self)
        top = QHBoxLayout()
        top.addWidget(self.refresh_button)
        top.addStretch(1)
        lay.addLayout(top)
        lay.addWidget(split, 1)
        self.table.metric_changed.connect(lambda _m: self.redraw())
        self.table.filter_edit.textChanged.connect(lambda _t: self.redraw())
        self.plot.run_clicked.connect(lambda p: self.table.select_paths([p]))

    def set_rows(self, rows: list[dict]) -> None:
        self.table.set_rows(rows)
        self.redraw()

    def redraw(self) -> None:
        m = self.table.model
        settings = [c for c in m.columns if c not in ("run", "state", "step") and c not in _metric_cols()]
        self.plot.set_rows(self.table.visible_rows(), settings, self.table.metric)


def _metric_cols():
    from engine.runs.history import METRIC_COLUMNS, TEXT_COLUMNS

    return (*METRIC_COLUMNS, *TEXT_COLUMNS)  # (not settings: the parallel coordinates leave them out)


class SweepUI(QObject):
    finished = Signal(str)  # the sweep id, when its queue ends

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.panel = SweepPanel()
        self.compare = RunsCompare()
        self.dock = window.add_dock("Sweep", self.panel, Qt.RightDockWidgetArea)
        self.runs_table_dock = window.add_dock("Runs Table", self.compare, Qt.BottomDockWidgetArea)
        # a tab of the bottom area (Problems, Summary, Dashboard), not a second row beside it:
        # the area keeps one height, which the dashboard gives back when the user leaves it
        window.tabifyDockWidget(window.problems_dock, self.runs_table_dock)
        # read again whenever it comes into view (a workspace, the View menu, its tab): runs
        # made or ended meanwhile are in it without a Refresh
        self.runs_table_dock.visibilityChanged.connect(lambda shown: shown and self.refresh_runs())
        for d in (self.dock, self.runs_table_dock):
            d.hide()  # shown from Panels, Run ▸ Sweep… or when a sweep starts
        self.runner: SweepRunner | None = None
        self.thread: threading.Thread | None = None
        self.error: str | None = None
        self._last_done = -1
        self._overlaid: set[str] = set()
        self.timer = QTimer(self, interval=250, timeout=self._poll)
        p = self.panel
        p.load_button.clicked.connect(lambda: self.load())
        p.save_button.clicked.connect(lambda: self.save())
        p.start_button.clicked.connect(lambda: self.start())
        p.stop_button.clicked.connect(self.stop)
        self.compare.refresh_button.clicked.connect(self.refresh_runs)
        self.compare.table.selection_changed.connect(self.overlay)
        from PySide6.QtGui import QAction

        self.actions = [QAction("S&weep…", window, triggered=self.show, shortcut="Ctrl+Alt+S"),
                        QAction("Runs &Table", window, triggered=self.show_runs, shortcut="Ctrl+Alt+T")]  # Run menu (main_window._fill_run_menu)
        window.project_changed.connect(self._project_changed)

    # ----- the sweep file ---------------------------------------------------------------
    def show(self) -> None:
        self.dock.show()
        self.dock.raise_()

    RUNS_TABLE_SHARE = 0.45  # of the window's height, at least, when the table is shown

    def show_runs(self) -> None:
        """The Runs Table dock shown and raised, tall enough for its rows and the
        parallel-coordinates plot (the bottom area is a strip under the canvas otherwise:
        one row and a squashed plot)."""
        self.refresh_runs()
        self.runs_table_dock.show()
        self.runs_table_dock.raise_()
        want = int(self.window.height() * self.RUNS_TABLE_SHARE)
        if self.runs_table_dock.height() < want:
            self.window.resizeDocks([self.runs_table_dock], [want], Qt.Vertical)

    def load(self, path: str | None = None) -> bool:
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self.window, "Load sweep", str(self.window.project.directory),
                                                  "Sweep files (*.json)")
            if not path:
                return False
        try:
            sweep = load_sweep(path)
        except LayerflowError as exc:
            self._say(str(exc), error=True)
            return False
        self.panel.editor.setPlainText(json.dumps(sweep.to_json(), indent=1))
        self._say(f"Loaded {Path(path).name}")
        return True

    def save(self, path: str | None = None) -> bool:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self.window, "Save sweep", str(self.window.project.directory / "sweep.json"),
                                                  "Sweep files (*.json)")
            if not path:
                return False
        try:
            sweep = self.sweep_from_editor()
            from engine.project import atomic_write

            atomic_write(path, (json.dumps(sweep.to_json(), indent=1) + "\n").encode())
        except (LayerflowError, OSError) as exc:
            self._say(str(exc), error=True)
            return False
        self._say(f"Saved {Path(path).name}")
        return True

    def sweep_from_editor(self):
        try:
            data = json.loads(self.panel.editor.toPlainText())
        except ValueError as exc:
            from engine.runs.sweep import SweepError

            raise SweepError(f"sweep: not JSON (line {getattr(exc, 'lineno', '?')}: {getattr(exc, 'msg', exc)})") from None
        return load_sweep(data)

    # ----- running it ------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self, parallel: int | None = None) -> bool:
        """Check the sweep against the project and start its queue; False (and the reason
        shown) when it cannot."""
        if self.running:
            self._say("A sweep is going: stop it first", error=True)
            return False
        project = self.window.project
        if project.path is None:
            self._say("Save the project first: its runs go in the runs/ folder beside it", error=True)
            return False
        try:
            sweep = self.sweep_from_editor()
            n = parallel if parallel is not None else (self.panel.parallel.value() or None)
            self.runner = SweepRunner(project.copy(), sweep, parallel=n)
        except LayerflowError as exc:
            self._say(str(exc).splitlines()[0], error=True)
            return False
        self.error = None
        runner = self.runner

        def work():
            try:
                runner.run()
            except Exception as exc:  # noqa: BLE001 - shown in the panel, not lost in a thread
                self.error = f"{type(exc).__name__}: {exc}"

        self.thread = threading.Thread(target=work, name=f"sweep {runner.id}", daemon=True)
        self.thread.start()
        self.panel.start_button.setEnabled(False)
        self.panel.stop_button.setEnabled(True)
        self._last_done = -1
        self._say(f"Sweep {runner.id}: {len(runner.runs)} runs, {runner.parallel} at once")
        self.panel.show_queue(runner.runs)
        self.timer.start()
        self.show()
        return True

    def stop(self) -> None:
        if self.runner is not None and self.running:
            self.runner.stop()
            self._say("Stopping: each running run checkpoints and ends; queued ones are not started")

    def wait(self, timeout: float = 120.0) -> bool:
        """Block until the queue has ended (tests, shutdown); True when it has."""
        if self.thread is not None:
            self.thread.join(timeout)
        self._poll()
        return not self.running

    def shutdown(self) -> None:
        if self.running:
            self.runner.stop()
            self.wait(60)

    def _poll(self) -> None:
        r = self.runner
        if r is None:
            return
        with r.lock:
            self.panel.show_queue(r.runs)
            done = sum(1 for x in r.runs if x.done)
        if done != self._last_done:
            self._last_done = done
            self.refresh_runs()
        if not self.running:
            self.timer.stop()
            self.panel.start_button.setEnabled(True)
            self.panel.stop_button.setEnabled(False)
            states = [x.shown_state for x in r.runs]
            ok = sum(1 for x in r.runs if x.state == "succeeded")
            early = sum(1 for x in r.runs if x.state == "stopped")
            msg = f"Sweep {r.id} ended: {ok} of {len(states)} succeeded" + (f", {early} stopped early" if early else "")
            self._say(self.error or msg, error=bool(self.error))
            self.finished.emit(r.id)

    # ----- the runs table ----------------------------------------------------------------------
    def refresh_runs(self) -> None:
        project = self.window.project
        if project.path is None:
            self.compare.set_rows([])
            return
        self.compare.set_rows(runs_table(project_runs_dir(project.directory)))

    def _dashboard(self):
        ui = getattr(self.window, "run_ui", None)
        return ui.dashboard if ui is not None else None

    def overlay(self, paths: list[str]) -> None:
        """The selected runs' curves in the dashboard: added (their whole metrics.jsonl),
        and the ones this table added before and no longer selected removed."""
        dash = self._dashboard()
        if dash is None:
            return
        from engine.runs.tail import MetricsTail

        for key in self._overlaid - set(paths):
            dash.remove_run(key)
        for p in paths:
            if p not in dash.run_keys():
                data = MetricsTail(Path(p) / "metrics.jsonl").poll_data(max_bytes=None)
                dash.set_data(p, data, label=Path(p).name)
        self._overlaid = {p for p in paths}
        if paths:
            dash.auto_range()
            self.window.run_ui.show_dashboard()

    def _project_changed(self) -> None:
        if self.runs_table_dock.isVisible():
            self.refresh_runs()

    def _say(self, text: str, error: bool = False) -> None:
        self.panel.status.setText(text)
        self.panel.status.setStyleSheet("color: #c0392b" if error else "")


def install(window) -> SweepUI:
    """Run ▸ Sweep… (the Sweep dock) and Run ▸ Runs Table (app/main_window.py calls this)."""
    return SweepUI(window)
