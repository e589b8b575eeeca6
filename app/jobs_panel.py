"""Remote jobs in the GUI: a panel listing every job of the job database, a controller
that deploys, follows, cancels and fetches in worker threads, and `install(window)`,
which adds a "Remote jobs" dock and "Clusters…" / "Deploy…" actions to the run toolbar.

Following a job = remote.tracker.Follower on a thread; its callbacks are turned into
queued Qt signals, so the widgets change only on the GUI thread. A job's metrics are
mirrored into JobDB().mirror_dir(job_id)/metrics.jsonl, which the dashboard tails like
a local run's (`open_requested` carries that folder).
"""
from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QDockWidget, QFileDialog, QHBoxLayout, QInputDialog,
                               QMessageBox, QPlainTextEdit, QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout,
                               QWidget)

from remote.jobs import JobDB
from remote.launch.slurm import state_text
from remote.tracker import Follower, Tracker

COLUMNS = ("job", "name", "cluster", "state", "step", "started", "owner")
MINE = "My jobs"


class JobsController(QObject):
    """Owns the job database handle, the followers and a small thread pool."""

    jobs_changed = Signal()
    job_state = Signal(str, str)  # job id, state
    metrics = Signal(str, list)  # job id, new records
    log_lines = Signal(str, str, list)  # job id, log name, lines
    message = Signal(str)  # one line for the status bar
    failed = Signal(str, str)  # title, text
    host_key_question = Signal(str, str, str)  # host, key type, fingerprint (deploy stopped on it)
    board_loaded = Signal(str, list)  # cluster name, every user's job records (remote/board.py)

    def __init__(self, parent=None, db: JobDB | None = None):
        super().__init__(parent)
        self.db = db or JobDB()
        self.followers: dict[str, Follower] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="remote")
        self._pending: list[tuple[concurrent.futures.Future, object]] = []
        self._timer = QTimer(self, interval=150, timeout=self._poll_futures)
        self._timer.start()

    # ----- background work -----------------------------------------------------------
    def _submit(self, fn, on_done, *args, **kw) -> concurrent.futures.Future:
        fut = self._pool.submit(fn, *args, **kw)
        self._pending.append((fut, on_done))
        return fut

    def _poll_futures(self) -> None:
        for item in [p for p in self._pending if p[0].done()]:
            self._pending.remove(item)
            fut, on_done = item
            exc = fut.exception()
            if exc is not None:
                self._report(exc)
            elif on_done:
                on_done(fut.result())

    def _report(self, exc: BaseException) -> None:
        from remote.ssh import UnknownHostKey

        if isinstance(exc, UnknownHostKey):
            self.host_key_question.emit(exc.host, exc.key_type, exc.fingerprint)
            return
        report = getattr(exc, "report", None)
        if report is not None:
            for h in report.hosts:
                if h.unknown_key:
                    self.host_key_question.emit(h.host, h.unknown_key_type or "", h.unknown_key)
                    return
        self.failed.emit("Remote job", str(exc))

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    # ----- actions ---------------------------------------------------------------------
    def deploy(self, project, cluster_name: str, *, steps: int | None = None, accept=()) -> None:
        """Prepare the run folder, preflight, upload and launch, off the GUI thread."""
        from remote.cluster import ClusterStore
        from remote.launch import deploy
        from remote.launch.ssh_torchrun import prepare

        project = project.copy()  # a snapshot taken here: the user may keep editing meanwhile

        def work():
            cluster = ClusterStore().get(cluster_name)
            run_dir = prepare(project, steps=steps)
            last = [0.0]

            def progress(host, done, total):
                if time.monotonic() - last[0] > 0.5 or done == total:
                    last[0] = time.monotonic()
                    self.message.emit(f"upload to {host}: {100 * done / max(total, 1):.0f}%")
            return deploy(cluster, run_dir, accept=accept, db=self.db, progress=progress)

        def done(job):
            self.message.emit(f"deployed {job.id} on {cluster_name}")
            self.jobs_changed.emit()
            self.follow(job.id)

        self.message.emit(f"deploying to {cluster_name}…")
        self._submit(work, done)

    def follow(self, job_id: str) -> None:
        if job_id in self.followers and self.followers[job_id].thread.is_alive():
            return
        f = Follower(job_id, self.db, interval=1.0,
                     on_metrics=lambda recs: self.metrics.emit(job_id, recs),
                     on_log=lambda name, lines: self.log_lines.emit(job_id, name, lines),
                     on_state=lambda job: self.job_state.emit(job.id, job.state))
        self.followers[job_id] = f.start()

    def reattach(self) -> None:
        """After a restart: follow every job the database says is not finished."""
        for job in self.db.active():
            self.follow(job.id)
        self.jobs_changed.emit()

    def load_board(self, cluster_name: str) -> None:
        """Everyone's jobs on the cluster, read from its shared job board; teammates' jobs
        join the database (marked with their owner) so they can be opened and followed."""
        from layerflow import cluster_jobs

        self._submit(cluster_jobs, lambda records: self.board_loaded.emit(cluster_name, records), cluster_name)

    def cancel(self, job_id: str) -> None:
        def work():
            with Tracker(job_id, self.db) as tr:
                return tr.cancel()
        self._submit(work, lambda job: (self.message.emit(f"{job.id}: {job.state}"), self.jobs_changed.emit()))

    def fetch(self, job_id: str, out_dir: str) -> None:
        def work():
            with Tracker(job_id, self.db) as tr:
                return tr.fetch(out_dir)
        self._submit(work, lambda files: self.message.emit(f"{len(files)} file(s) into {out_dir}"))

    def shutdown(self) -> None:
        for f in self.followers.values():
            f.stop_event.set()
        for f in self.followers.values():
            f.stop(timeout=5)
        self._timer.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)


class JobsPanel(QWidget):
    """The jobs table with Logs / Cancel / Fetch / Open buttons and a log view."""

    open_requested = Signal(str)  # the job's local mirror folder (metrics.jsonl, logs/)

    def __init__(self, controller: JobsController, parent=None):
        super().__init__(parent)
        self.controller = controller
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.itemSelectionChanged.connect(self._show_logs)
        self.table.doubleClicked.connect(lambda _i: self._open())
        self.log = QPlainTextEdit(readOnly=True)
        self.log.setMaximumBlockCount(5000)
        self.buttons = {}
        self.view = QComboBox()  # My jobs, or Everyone on <cluster> (clusters with a shared_dir)
        self.view.setToolTip("My jobs: this machine's job database; Everyone on a cluster: every user's jobs, "
                             "read from the cluster's shared job board")
        self.view.activated.connect(lambda _i: self._view_changed())
        self.board: dict[str, dict] = {}  # job id -> record, in the Everyone view
        row = QHBoxLayout()
        row.addWidget(self.view)
        for name, slot in (("Refresh", self._reload), ("Open", self._open), ("Cancel", self._cancel),
                           ("Fetch…", self._fetch)):
            b = QPushButton(name)
            b.clicked.connect(slot)
            row.addWidget(b)
            self.buttons[name] = b
        row.addStretch()
        lay = QVBoxLayout(self)
        lay.addWidget(self.table, 2)
        lay.addLayout(row)
        lay.addWidget(self.log, 1)
        controller.jobs_changed.connect(self.refresh)
        controller.job_state.connect(lambda _id, _s: self.refresh())
        controller.log_lines.connect(self._append_log)
        controller.metrics.connect(self._on_metrics)
        controller.board_loaded.connect(self._on_board)
        self.fill_views()
        self.refresh()

    # ----- My jobs / Everyone on a cluster ------------------------------------------------
    def fill_views(self) -> None:
        from remote.cluster import ClusterError, ClusterStore

        try:
            shared = [c.name for c in ClusterStore().all() if c.shared_dir]
        except ClusterError:
            shared = []
        current = self.view.currentText()
        self.view.clear()
        self.view.addItems([MINE, *(f"Everyone on {n}" for n in shared)])
        if self.view.findText(current) >= 0:
            self.view.setCurrentText(current)

    def everyone_on(self) -> str | None:
        text = self.view.currentText()
        return text.removeprefix("Everyone on ") if text != MINE and text else None

    def show_everyone(self, cluster_name: str) -> None:
        self.fill_views()
        self.view.setCurrentText(f"Everyone on {cluster_name}")
        self._view_changed()

    def _view_changed(self) -> None:
        self.board = {}
        self._reload()

    def _reload(self) -> None:
        if self.everyone_on():
            self.controller.load_board(self.everyone_on())
        self.refresh()

    def _on_board(self, cluster_name: str, records: list) -> None:
        if cluster_name == self.everyone_on():
            self.board = {r["id"]: r for r in records}
            self.refresh()

    def refresh(self) -> None:
        selected = self.selected_job()
        jobs = list(reversed(self.controller.db.list()))
        if self.everyone_on():
            jobs = [j for j in jobs if j.id in self.board]
        self.table.setRowCount(len(jobs))
        for r, j in enumerate(jobs):
            rec = self.board.get(j.id, {})
            state, step = (j.state, j.step) if not j.extra.get("teammate") or not rec else (rec.get("state"), rec.get("step"))
            if not j.extra.get("teammate"):
                state = state_text(j)  # a Slurm job: with its Slurm id and queue reason
            cells = (j.id, j.name, j.cluster.get("name", "?"), str(state), f"{step or 0}/{j.total_steps or '?'}",
                     time.strftime("%Y-%m-%d %H:%M", time.localtime(j.created)),
                     str(j.extra.get("owner") or rec.get("owner") or "you"))
            for c, v in enumerate(cells):
                item = QTableWidgetItem(v)
                item.setData(Qt.UserRole, j.id)
                item.setToolTip(v)  # the whole text where a column cuts it
                self.table.setItem(r, c, item)
            if j.id == selected:
                self.table.selectRow(r)
        # a state reads whole ("pending, Slurm 12 (Resources)"); the first column keeps its width
        self.table.resizeColumnToContents(COLUMNS.index("state"))
        self._update_buttons()

    def job_ids(self) -> list[str]:
        return [self.table.item(r, 0).text() for r in range(self.table.rowCount())]

    def selected_job(self) -> str | None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        return self.table.item(rows[0].row(), 0).text() if rows else None

    def select_job(self, job_id: str) -> None:
        for r in range(self.table.rowCount()):
            if self.table.item(r, 0).text() == job_id:
                self.table.selectRow(r)

    def _update_buttons(self) -> None:
        jid = self.selected_job()
        state, teammate = None, None
        if jid:
            try:
                job = self.controller.db.get(jid)
                state, teammate = job.state, job.extra.get("teammate") and job.extra.get("owner")
            except LookupError:
                state = None
        cancel = self.buttons["Cancel"]
        cancel.setEnabled(state in ("pending", "running", "lost", "preempted", "resuming") and not teammate)
        cancel.setToolTip(f"a job of {teammate}'s: only its owner can cancel it" if teammate else "")
        for k in ("Open", "Fetch…"):
            self.buttons[k].setEnabled(jid is not None)

    def _show_logs(self) -> None:
        self._update_buttons()
        jid = self.selected_job()
        self.log.clear()
        if jid:
            p = self.controller.db.mirror_dir(jid) / "logs" / "rank0.log"
            if p.exists():
                self.log.setPlainText(p.read_text(errors="replace"))

    def _append_log(self, job_id: str, name: str, lines: list) -> None:
        if job_id == self.selected_job() and name == "rank0.log":
            for ln in lines:
                self.log.appendPlainText(ln)

    def _on_metrics(self, job_id: str, recs: list) -> None:
        steps = [r.get("step") for r in recs if isinstance(r.get("step"), int)]
        if not steps:
            return
        for r in range(self.table.rowCount()):
            if self.table.item(r, 0).text() == job_id:
                total = self.table.item(r, 4).text().split("/")[-1]
                self.table.item(r, 4).setText(f"{max(steps)}/{total}")

    def _open(self) -> None:
        jid = self.selected_job()
        if jid:
            job = self.controller.db.get(jid)
            if job.extra.get("teammate") and not job.done:
                self.controller.follow(jid)  # read only: its metrics mirrored by byte offset like one's own
            self.open_requested.emit(str(self.controller.db.mirror_dir(jid)))

    def _cancel(self) -> None:
        jid = self.selected_job()
        if jid:
            self.controller.cancel(jid)

    def _fetch(self) -> None:
        jid = self.selected_job()
        if jid:
            out = QFileDialog.getExistingDirectory(self, "Fetch results into")
            if out:
                self.controller.fetch(jid, str(Path(out) / jid))


# ----- main window extension ----------------------------------------------------------
def install(window) -> tuple[JobsController, JobsPanel, QDockWidget]:
    """Add the Remote jobs dock and the Clusters…/Deploy… actions; reattach to running jobs.
    Returns (the controller, its panel, the dock); app/window.py calls this."""
    controller = JobsController(window)
    panel = JobsPanel(controller)
    dock = window.add_dock("Remote jobs", panel, Qt.RightDockWidgetArea)
    last_deploy: list[str] = []  # the cluster of the last Deploy (asked again after a new host key)

    def clusters():
        from app.cluster_dialog import ClusterDialog
        ClusterDialog(window).exec()
        panel.fill_views()  # a cluster with a shared_dir offers "Everyone on" it

    def deploy(accept=()):
        from remote.cluster import ClusterError, ClusterStore
        try:
            names = ClusterStore().names()
        except ClusterError as exc:
            QMessageBox.warning(window, "Deploy", str(exc))
            return
        if not names:
            QMessageBox.information(window, "Deploy", "No cluster yet: add one in Clusters…")
            return
        preferred = getattr(window.project, "cluster", None)
        name, ok = QInputDialog.getItem(window, "Deploy", "Cluster:", names,
                                        names.index(preferred) if preferred in names else 0, False)
        if ok:
            dock.raise_()
            controller.deploy(window.project, name, accept=accept)
            last_deploy[:] = [name]

    def on_host_key(host, key_type, fp):
        from app.cluster_dialog import ask_trust_key
        if ask_trust_key(window, host, key_type, fp) and last_deploy:
            controller.deploy(window.project, last_deploy[0], accept=[fp])

    def open_job(mirror: str) -> None:
        # the job's mirror reads like a local run folder: plotted (and tailed) by the dashboard
        if window.run_openers:
            window.open_run(mirror)

    panel.open_requested.connect(open_job)
    window.run_toolbar.addAction("Clusters…", clusters)
    window.run_toolbar.addAction("Deploy…", deploy)
    window.run_toolbar.setVisible(True)
    controller.message.connect(lambda text: window.statusBar().showMessage(text, 8000))
    controller.failed.connect(lambda title, text: QMessageBox.warning(window, title, text))
    controller.host_key_question.connect(on_host_key)
    window.destroyed.connect(lambda *_: controller.shutdown())
    controller.reattach()
    return controller, panel, dock
