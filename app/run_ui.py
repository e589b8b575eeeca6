"""Run and watch, installed into the main window: the run toolbar, the Dashboard and
Runs docks, a progress bar with ETA in the status bar, end/failure notifications.

app/window.py (the composition root) calls `install(window)` while the window is
built. The window's own API is all it uses:
add_dock, run_toolbar, project, project_changed, run_openers, ask, is_dirty,
select_and_show.
"""
from __future__ import annotations

import concurrent.futures
import math
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox, QProgressBar, QSystemTrayIcon, QVBoxLayout, QWidget

from app.run_controller import RunController, _fmt_eta
from engine.runs.history import confusion_matrix, delete_run, list_runs, peak_memory_per_rank, runs_dir, summarize_run
from engine.runtime.records import RESUMABLE_STATES, RunStatus
from engine.runtime.sysmetrics import SystemTail
from engine.runs.tail import MetricsTail, RankMetricsTail, parse_jsonl
from widgets.dashboard import Dashboard
from widgets.run_toolbar import RunToolbar
from widgets.runs_panel import RunsPanel

RESUMABLE = RESUMABLE_STATES


class RunUI(QObject):
    """Everything about runs in one window."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.controller = RunController(self)
        self._dashboard: Dashboard | None = None  # built when first needed (see dashboard)
        self._dash_holder = QWidget()
        QVBoxLayout(self._dash_holder).setContentsMargins(0, 0, 0, 0)
        self.runs_panel = RunsPanel()
        self.toolbar = RunToolbar(window.run_toolbar)
        self.notifications: list[str] = []  # every end/failure message, newest last
        self.failure_box: QMessageBox | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="confusion")
        self._confusion_job: tuple[str, concurrent.futures.Future] | None = None
        self._confusion_timer = QTimer(self, interval=100, timeout=self._poll_confusion)
        # Opened runs that are still being written (a remote job's mirror, a run of
        # another window or of the CLI) are followed by byte offset, like the live run.
        self._followed: dict[str, MetricsTail] = {}
        self._rank_tails: dict[str, RankMetricsTail] = {}  # per-rank numbers of the runs shown
        self._system_tails: dict[str, SystemTail] = {}  # each rank's CPU and memory samples (the System tab)
        self.mlflow = None  # engine.runs.tracking.MlflowFollower of the live run, when a tracking URI is set
        self.mlflow_error: str | None = None
        self._mlflow_last = None  # the follower of the last run, finishing its last copy
        self._bottom_h: int | None = None  # the bottom area's height before the Dashboard took it
        self._watched_bars: list = []
        self.log_viewers: list = []
        self._follow_timer = QTimer(self, interval=500, timeout=self._poll_followed)

        self.dashboard_dock = window.add_dock("Dashboard", self._dash_holder, Qt.BottomDockWidgetArea)
        self.dashboard_dock.visibilityChanged.connect(lambda shown: shown and self.dashboard)
        self.runs_dock = window.add_dock("Runs", self.runs_panel, Qt.RightDockWidgetArea)
        # The dashboard shares the bottom with Problems/Summary, the runs list the
        # right side with Inspector/Devices; both come to the front when a run does.
        for neighbour, dock in (("problems_dock", self.dashboard_dock), ("inspector_dock", self.runs_dock)):
            other = getattr(window, neighbour, None)
            if other is not None:
                window.tabifyDockWidget(other, dock)
                other.raise_()

        self.progress = QProgressBar()
        self.progress.setMaximumWidth(260)
        self.progress.setTextVisible(True)
        self.progress.setVisible(False)
        window.statusBar().addPermanentWidget(self.progress)

        c = self.controller
        c.started.connect(self._on_started)
        c.lines.connect(self._on_lines)
        c.reset.connect(lambda run_dir: self.dashboard.set_records(run_dir, [], label=Path(run_dir).name))
        c.progress.connect(self._on_progress)
        c.finished.connect(self._on_finished)
        c.failed.connect(self._on_failed)
        self.toolbar.run_requested.connect(self.run)
        self.toolbar.stop_requested.connect(self.stop)
        self.toolbar.resume_requested.connect(lambda _t, n: self.resume(None, n))
        p = self.runs_panel
        p.open_requested.connect(self.open_run)
        p.compare_requested.connect(self.compare)
        p.delete_requested.connect(self.delete)
        p.resume_requested.connect(lambda path: self.resume(path, self.toolbar.procs.value()))
        p.refresh_requested.connect(self.refresh)
        p.logs_requested.connect(self.show_logs)
        # a run's model: app/interop_ui.py does the work (the same engine calls as export --run,
        # weights use, train --init-from)
        p.export_onnx_requested.connect(lambda path: self._model("export_onnx_to", path))
        p.export_script_requested.connect(lambda path: self._model("export_script_to", path))
        p.use_weights_requested.connect(lambda path: self._model("use_run_weights", path))
        p.fine_tune_requested.connect(lambda path: self._model("fine_tune", path))
        window.project_changed.connect(self._on_project_changed)
        editor = getattr(window, "controller", None)
        if editor is not None:  # Run follows the problems, the process count the placement
            editor.compiled.connect(lambda _r: self.toolbar.set_blocked(editor.run_blocker()))
            editor.placement_changed.connect(self._follow_placement)
            self.toolbar.set_blocked(editor.run_blocker())  # the project's first check ran before this
        window.run_openers.append(self._open_for_window)
        window.installEventFilter(self)
        app = QApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)
        self._on_project_changed()

    def _model(self, action: str, run_dir: str):
        ui = getattr(self.window, "interop_ui", None)
        if ui is None:
            self._message("Export and weights need the File menu's interop actions, which this window lacks")
            return None
        if action in ("export_onnx_to", "export_script_to"):
            return getattr(ui, action)(None, run_dir)
        result = getattr(ui, action)(run_dir)
        if action == "use_run_weights":
            self.refresh()
        return result

    @property
    def dashboard(self) -> Dashboard:
        """The plots; six pyqtgraph views cost a few hundred ms, so a window that
        never shows them (most editor sessions, every editor test) never builds them."""
        if self._dashboard is None:
            self._dashboard = Dashboard(smoothing=0.6)
            self._dash_holder.layout().addWidget(self._dashboard)
        return self._dashboard

    # ----- project and history ----------------------------------------------------
    @property
    def runs_dir(self) -> Path:
        return runs_dir(self.window.project.directory)

    def refresh(self) -> None:
        # projects in one folder share runs/: each lists its own (a run records its project's name)
        runs = [r for r in list_runs(self.runs_dir) if r.name == self.window.project.name]
        self.runs_panel.set_runs(runs)
        can_resume = any(r.state in RESUMABLE and (r.path / "checkpoints" / "latest").is_file() for r in runs)
        self.toolbar.set_running(self.controller.running, can_resume)

    def _on_project_changed(self) -> None:
        if not self.controller.running and self._dashboard is not None:
            self._dashboard.clear()
        self._follow_placement()
        self.refresh()

    def _follow_placement(self) -> None:
        pl = self.window.project.placement
        self.toolbar.set_processes(pl.dp * pl.tp * pl.pp)

    # ----- running ----------------------------------------------------------------
    def run(self, target: str = "local", nproc: int = 1, steps: int | None = None) -> Path | None:
        if self.controller.running:
            return None
        if target != "local":
            self._message(f"Target {target!r} is not available yet; training on this machine needs target 'local'")
            return None
        editor = getattr(self.window, "controller", None)
        if editor is not None:
            editor.flush()
            blocker = editor.run_blocker()
            if blocker:
                self._message(f"Cannot run: {blocker}")
                return None
        try:
            run_dir = self.controller.start(self.window.project, nproc=nproc, steps=steps)
        except (OSError, RuntimeError, ValueError) as exc:
            self._message(f"Cannot start the run: {exc}")
            return None
        return run_dir

    def resume(self, run_dir=None, nproc: int = 1) -> Path | None:
        if self.controller.running:
            return None
        if run_dir is None:
            sel = self.runs_panel.selected_runs()
            candidates = [Path(p) for p in sel] or [r.path for r in list_runs(self.runs_dir)]
            run_dir = next((p for p in candidates if summarize_run(p).state in RESUMABLE
                            and (p / "checkpoints" / "latest").is_file()), None)
            if run_dir is None:
                self._message("No stopped run with a checkpoint to resume")
                return None
        try:
            return self.controller.resume(run_dir, nproc=nproc, node_ids=self.window.project.graph.nodes)
        except (OSError, RuntimeError, ValueError) as exc:
            self._message(f"Cannot resume: {exc}")
            return None

    def stop(self) -> None:
        if self.controller.running:
            self._message(f"Stopping {self.controller.active.run_dir.name}…")
            self.controller.stop()

    def shutdown(self) -> None:
        self._follow_timer.stop()
        if self.mlflow is not None:
            self.mlflow.stop(timeout=5.0)
            self.mlflow = None
        self.controller.shutdown()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def eventFilter(self, obj, event) -> bool:
        if obj is self.window and event.type() == QEvent.Close:
            # closeEvent may still refuse (unsaved changes): decide once it has run.
            QTimer.singleShot(0, self._after_close)
        return False

    def _after_close(self) -> None:
        if not self.window.isVisible():
            self.shutdown()

    def _on_started(self, run_dir: str) -> None:
        self.dashboard.clear()
        self.dashboard.add_run(run_dir, Path(run_dir).name)
        self._rank_tails = {run_dir: RankMetricsTail(run_dir)}
        self._system_tails = {run_dir: SystemTail(run_dir)}
        self._start_mlflow(run_dir)
        self.toolbar.set_running(True)
        self.progress.setRange(0, 0)  # busy until the first step arrives
        self.progress.setFormat("starting…")
        self.progress.setVisible(True)
        self.show_dashboard()
        self._message(f"Training {self.window.project.name}: {Path(run_dir).name}")

    def _on_lines(self, run_dir: str, data: bytes) -> None:
        first = not self.dashboard.has_records(run_dir)
        self.dashboard.append_data(run_dir, data)
        self._append_side(run_dir)
        if first:
            self.refresh()  # the folder became a run: list it

    def _on_progress(self, run_dir: str, step: int, total: int, eta: float) -> None:
        if total:
            self.progress.setRange(0, total)
            self.progress.setValue(min(step, total))
            self.progress.setFormat(f"step {step}/{total} · ETA {_fmt_eta(eta)}" if math.isfinite(eta)
                                    else f"step {step}/{total}")

    def _start_mlflow(self, run_dir: str) -> None:
        """The live run copied to MLflow as it trains, when a tracking URI is set
        ($MLFLOW_TRACKING_URI, or the user setting `layerflow track uri` saves); a
        store that cannot be used is said in the status bar, and the run goes on."""
        self._stop_mlflow()
        from engine.runs.tracking import MlflowFollower, TrackingError, resolve_uri

        uri = resolve_uri()
        if uri is None:
            try:
                from app.settings import Settings

                uri = Settings().mlflow_uri()
            except Exception:  # noqa: BLE001 - no settings file: no MLflow
                uri = None
        if not uri:
            return
        try:
            self.mlflow = MlflowFollower(run_dir, uri).start()
        except TrackingError as exc:
            self.mlflow_error = str(exc)
            self._message(f"Not logged to MLflow: {exc}", 20000)

    def _stop_mlflow(self) -> None:
        if self.mlflow is not None:
            follower, self.mlflow = self.mlflow, None
            self._pool.submit(follower.stop)  # its last copy, off the GUI thread
            self._mlflow_last = follower

    def _on_finished(self, run_dir: str, state: str) -> None:
        self.progress.setVisible(False)
        self._stop_mlflow()
        if run_dir in self.dashboard.run_keys():
            self._append_side(run_dir)  # the ranks' last lines, flushed as they ended
        self.refresh()
        name = Path(run_dir).name
        s = summarize_run(run_dir) if Path(run_dir).exists() else None
        best = ""
        if s is not None and s.best_metric:
            k, v = s.best_metric
            best = f", best {'val acc ' + format(v, '.1%') if k == 'val_acc' else 'val loss ' + format(v, '.4g')}"
        steps = f" after {s.step} steps" if s is not None else ""
        msg = f"Run {name} {state}{steps}{best}"
        self.notify(msg, failed=(state == "failed"))
        if Path(run_dir).exists() and run_dir in self.dashboard.run_keys():
            self._show_rank_peaks(run_dir)
        if state == "succeeded":
            self._load_confusion(run_dir)

    def _on_failed(self, run_dir: str, report: dict) -> None:
        node = report.get("node")
        rank = report.get("rank")
        where = (f" in node '{node}'" if node else "") + (f" on rank {rank}" if rank is not None else "")
        text = f"Run {Path(run_dir).name} failed{where}:\n{report.get('message') or ''}"
        box = QMessageBox(QMessageBox.Critical, "Run failed", text, QMessageBox.Close, self.window)
        if report.get("traceback"):
            box.setDetailedText(report["traceback"])
        if node:
            show = box.addButton(f"Show '{node}'", QMessageBox.ActionRole)
            show.clicked.connect(lambda: self._select_node(node))
        box.setWindowModality(Qt.NonModal)
        self.failure_box = box
        self.failure_report = report
        box.open()

    def _select_node(self, node: str) -> None:
        fn = getattr(self.window, "select_and_show", None)
        if fn is not None:
            fn(node)

    def notify(self, msg: str, failed: bool = False) -> None:
        """Status bar, the system tray where there is one, and the task bar."""
        self.notifications.append(msg)
        self._message(msg, 30000)
        if QSystemTrayIcon.isSystemTrayAvailable() and QSystemTrayIcon.supportsMessages():
            tray = getattr(self, "_tray", None)
            if tray is None:
                tray = self._tray = QSystemTrayIcon(self.window.windowIcon(), self)
                tray.show()
            tray.showMessage("Layerflow", msg, QSystemTrayIcon.Critical if failed else QSystemTrayIcon.Information, 8000)
        QApplication.alert(self.window)

    def _message(self, msg: str, ms: int = 10000) -> None:
        self.window.statusBar().showMessage(msg, ms)

    # ----- history: open, compare, delete ------------------------------------------
    def show_dashboard(self) -> None:
        """The plots, tall enough to read; the bottom area gets its old height back when the
        user turns to another of its tabs (Problems, Summary), so the canvas is not left small."""
        ws = getattr(self.window, "workspaces", None)
        if ws is not None and ws.current not in ("Train", "Compare"):
            ws.show("Train")  # the task's workspace, as a debugger's start shows its mode
        bar = self._bottom_tabs()
        if bar is not None and bar.tabText(bar.currentIndex()) != "Dashboard":
            self._bottom_h = self.dashboard_dock.height() if self.dashboard_dock.isVisible() else None
        self.dashboard_dock.show()
        self.dashboard_dock.raise_()
        h = self.window.height()
        self.window.resizeDocks([self.dashboard_dock], [max(360, int(h * 0.58))], Qt.Vertical)

    def _bottom_tabs(self):
        """The tab bar of the bottom dock area that holds the Dashboard (Qt makes it when
        docks are tabified), watched so that leaving the Dashboard gives the height back."""
        from PySide6.QtWidgets import QTabBar

        for bar in self.window.findChildren(QTabBar):
            if "Dashboard" in [bar.tabText(i) for i in range(bar.count())]:
                if bar not in self._watched_bars:
                    self._watched_bars.append(bar)
                    bar.currentChanged.connect(lambda i, bar=bar: self._bottom_tab_changed(bar, i))
                return bar
        return None

    def _bottom_tab_changed(self, bar, index: int) -> None:
        problems = getattr(self.window, "problems_dock", None)  # tabified with the rest: one height for all
        if bar.tabText(index) == "Dashboard" or not self._bottom_h or problems is None:
            return
        h, self._bottom_h = self._bottom_h, None
        self.window.resizeDocks([problems], [h], Qt.Vertical)

    def _live(self) -> str | None:
        a = self.controller.active
        return str(a.run_dir) if a else None

    def _show_runs(self, paths: list) -> None:
        live = self._live()
        for key in self.dashboard.run_keys():
            if key != live:
                self.dashboard.remove_run(key)
        self._followed.clear()
        self._rank_tails = {k: t for k, t in self._rank_tails.items() if k == live}
        self._system_tails = {k: t for k, t in self._system_tails.items() if k == live}
        for p in paths:
            p = str(Path(p))
            if p == live:
                continue
            tail = MetricsTail(Path(p) / "metrics.jsonl")
            data = tail.poll_data(max_bytes=None)  # all of it, parsed in the dashboard's parse process
            self._rank_tails[p] = RankMetricsTail(p)
            self._system_tails[p] = SystemTail(p)
            self.dashboard.set_data(p, data, label=Path(p).name)
            self._append_side(p)
            self._show_rank_peaks(p)
            if not self._has_ended(p, data):
                self._followed[p] = tail
        if self._followed:
            self._follow_timer.start()
        else:
            self._follow_timer.stop()
        self.dashboard.set_confusion(None)
        self.dashboard.auto_range()
        self.show_dashboard()

    @staticmethod
    def _has_ended(run_dir: str, data: bytes) -> bool:
        """The run's end event among the last lines of `data`, or its status final."""
        # (a preempted attempt's end is not the run's: under Slurm it is requeued and goes on)
        if any(r.get("event") == "end" and r.get("state") != "preempted" for r in parse_jsonl(data.rsplit(b"\n", 4)[-4:])):
            return True
        st = RunStatus.read(run_dir)  # the state the run (or a remote job's tracker) wrote; its pid may be on another host
        return st is None or (st.done and st.state != "preempted") or st.state == "lost"

    def _poll_followed(self) -> None:
        for key, tail in list(self._followed.items()):
            if key not in self.dashboard.run_keys():
                del self._followed[key]
                continue
            data = tail.poll_data()
            if data:
                self.dashboard.append_data(key, data)
                self._append_side(key)
            elif self._has_ended(key, b""):  # nothing new and the run is over
                del self._followed[key]
        if not self._followed:
            self._follow_timer.stop()

    def show_logs(self, run_dir) -> "LogViewer":
        """Every rank's log of a run, in a window that follows them while it runs."""
        from app.log_viewer import LogViewer

        viewer = LogViewer(run_dir, self.window)
        viewer.show()
        self.log_viewers = [v for v in self.log_viewers if v.isVisible()] + [viewer]  # kept while open
        return viewer

    def _rank_records(self, run_dir: str) -> list[dict]:
        """New per-rank step time, throughput and loss of a multi-process run shown here."""
        tail = self._rank_tails.get(run_dir)
        return tail.poll_records() if tail is not None else []

    def _append_side(self, run_dir: str) -> None:
        """The per-rank records of a run shown here, and every rank's new system samples
        (the dashboard's System tab: plotted, not among the run's metrics records)."""
        ranks = self._rank_records(run_dir)
        if ranks:
            self.dashboard.append(run_dir, ranks)
        tail = self._system_tails.get(run_dir)
        samples = tail.poll_records() if tail is not None else []
        if samples:
            self.dashboard.append(run_dir, samples, keep=False)

    def _show_rank_peaks(self, run_dir: str) -> None:
        peaks = peak_memory_per_rank(run_dir)
        if peaks and len(peaks) > 1:
            self.dashboard.set_peak_memory(run_dir, peaks)

    def open_run(self, run_dir) -> None:
        run_dir = Path(run_dir)
        if not (run_dir / "metrics.jsonl").exists() and not (run_dir / "run.json").exists():
            raise RuntimeError(f"{run_dir}: not a run folder (no run.json or metrics.jsonl)")
        self._show_runs([run_dir])
        self.runs_panel.select_runs([str(run_dir)])
        self._load_confusion(str(run_dir))

    def _open_for_window(self, _window, run_dir) -> None:
        """window.open_run (the screenshot command): the plots and, when there is
        one, the confusion matrix, before returning."""
        self.open_run(run_dir)
        self.runs_dock.raise_()
        self.wait_confusion(10.0)
        self.dashboard.wait_parsed()
        self.dashboard.flush()

    def compare(self, a, b) -> None:
        self._show_runs([a, b])

    def delete(self, run_dir) -> bool:
        run_dir = Path(run_dir)
        if self._live() == str(run_dir):
            self._message("The run is going: stop it before deleting it")
            return False
        B = QMessageBox.StandardButton
        answer = self.window.ask("warning", "Delete run",
                                 f"Delete the run {run_dir.name} and all its files (checkpoints, model, logs)?\n"
                                 f"{run_dir}", B.Yes | B.Cancel, B.Cancel)
        if answer != B.Yes:
            return False
        try:
            delete_run(run_dir, within=self.runs_dir)
        except (OSError, ValueError) as exc:
            self._message(f"Cannot delete: {exc}")
            return False
        if self._dashboard is not None:
            self._dashboard.remove_run(str(run_dir))
        self.refresh()
        self._message(f"Deleted {run_dir.name}")
        return True

    # ----- confusion matrix (computed off the GUI thread) ---------------------------
    def _load_confusion(self, run_dir: str) -> None:
        s = summarize_run(run_dir)
        if s.state != "succeeded" or s.task not in (None, "classification"):
            return
        self._confusion_job = (run_dir, self._pool.submit(confusion_matrix, run_dir))
        self._confusion_timer.start()

    def _poll_confusion(self) -> None:
        if self._confusion_job is None:
            self._confusion_timer.stop()
            return
        run_dir, fut = self._confusion_job
        if not fut.done():
            return
        self._confusion_timer.stop()
        self._confusion_job = None
        try:
            result = fut.result()
        except Exception as exc:  # noqa: BLE001 - a broken model file must not break the window
            self._message(f"No confusion matrix for {Path(run_dir).name}: {exc}")
            return
        if result and run_dir in self.dashboard.run_keys():
            self.dashboard.set_confusion(result["matrix"], result["labels"],
                                         "Confusion matrix (validation)")

    def wait_confusion(self, timeout_s: float = 30.0) -> None:
        """Tests and screenshots: block until the pending confusion matrix is shown."""
        if self._confusion_job is not None:
            concurrent.futures.wait([self._confusion_job[1]], timeout=timeout_s)
            self._poll_confusion()


def install(window) -> RunUI:
    """The Run toolbar, dashboard and run history of `window` (app/window.py calls this)."""
    return RunUI(window)
