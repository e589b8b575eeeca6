"""Clusters dialog: add, edit, remove, import from ~/.ssh/config, and test the connection
(the preflight table). An unknown host key is shown with its fingerprint and pinned
only when the user says yes; a changed key is shown as an error, never accepted.

All work on the network runs in a worker thread (a future polled by a QTimer), so the
dialog never blocks. The logic is remote/ (cluster, preflight); this file is the form.
"""
from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout, QHBoxLayout,
                               QInputDialog, QLabel, QLineEdit, QListWidget, QMessageBox, QPlainTextEdit,
                               QPushButton, QSpinBox, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from remote.cluster import ClusterError, ClusterStore, hosts_from_ssh_config, parse_cluster

HOST_COLUMNS = ("address", "port", "user", "identity file")


def ask_trust_key(parent, host: str, key_type: str, fingerprint: str) -> bool:
    """The default question for an unknown host key (tests replace it)."""
    box = QMessageBox(QMessageBox.Warning, "Unknown host key",
                      f"{host} presents a host key that is not in known_hosts:\n\n"
                      f"    {key_type}  {fingerprint}\n\n"
                      "Compare it with the host's own fingerprint (ssh-keygen -lf "
                      "/etc/ssh/ssh_host_*_key.pub on the host). Trust this key and remember it?",
                      QMessageBox.Yes | QMessageBox.No, parent)
    box.setDefaultButton(QMessageBox.No)
    return box.exec() == QMessageBox.Yes


class ClusterDialog(QDialog):
    def __init__(self, parent=None, store: ClusterStore | None = None):
        super().__init__(parent)
        self.setWindowTitle("Clusters")
        self.resize(900, 600)
        self.store = store or ClusterStore()
        self.ask_trust = ask_trust_key  # (parent, host, key_type, fingerprint) -> bool
        self.accepted_keys: set[str] = set()
        self.last_report = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight")
        self._future: concurrent.futures.Future | None = None
        self._timer = QTimer(self, interval=100, timeout=self._poll)

        self.list = QListWidget()
        self.list.currentTextChanged.connect(self._load)
        new_btn, del_btn, imp_btn = QPushButton("New"), QPushButton("Remove"), QPushButton("Import ssh config…")
        new_btn.clicked.connect(self.new_cluster)
        del_btn.clicked.connect(self.remove_cluster)
        imp_btn.clicked.connect(self._import_clicked)
        left = QVBoxLayout()
        left.addWidget(self.list)
        for b in (new_btn, del_btn, imp_btn):
            left.addWidget(b)

        self.name = QLineEdit()
        self.hosts = QTableWidget(0, len(HOST_COLUMNS))
        self.hosts.setHorizontalHeaderLabels(HOST_COLUMNS)
        self.hosts.horizontalHeader().setStretchLastSection(True)
        add_host, del_host = QPushButton("+ host"), QPushButton("− host")
        add_host.clicked.connect(lambda: self.add_host_row())
        del_host.clicked.connect(lambda: self.hosts.removeRow(max(0, self.hosts.currentRow())))
        self.workdir, self.python = QLineEdit("~/layerflow"), QLineEdit("python3")
        self.env = QPlainTextEdit()
        self.env.setPlaceholderText("KEY=VALUE, one a line")
        self.env.setMaximumHeight(60)
        self.backend = QComboBox()
        self.backend.addItems(["ssh", "slurm"])
        self.nproc = QSpinBox(minimum=0, maximum=1024, specialValueText="auto")
        self.rdzv_port = QSpinBox(minimum=1, maximum=65535, value=29400)
        # elastic bounds and restarts (0 = "auto": the run's own restarts; the fewest nodes the
        # plan runs on; every node deployed on)
        self.restarts = QSpinBox(minimum=-1, maximum=100, value=-1, specialValueText="the run's")
        self.restarts.setToolTip("Restarts after a rank or node fails (torchrun --max-restarts); "
                                 "the run's: its own training.restarts")
        self.min_nodes = QSpinBox(minimum=0, maximum=4096, specialValueText="auto")
        self.min_nodes.setToolTip("A job goes on with at least this many of its nodes when others are lost: "
                                  "the data axis shrinks, the global batch is kept by accumulation. "
                                  "auto: the fewest its plan runs on; the node count: never shrink")
        self.max_nodes = QSpinBox(minimum=0, maximum=4096, specialValueText="auto")
        self.max_nodes.setToolTip("Nodes a shrunk job takes back when they return, at most. "
                                  "auto: those it was deployed on")
        self.known_hosts = QLineEdit()
        self.shared_dir = QLineEdit()
        self.shared_dir.setPlaceholderText("e.g. /shared/layerflow (optional)")
        self.shared_dir.setToolTip("A folder on the cluster every user can write (group permissions): jobs register "
                                   "there, and the Remote jobs panel's 'Everyone on' view lists every user's jobs")
        self.known_hosts.setPlaceholderText("default: Layerflow's own + ~/.ssh/known_hosts")
        self.data_paths = QPlainTextEdit()
        self.data_paths.setPlaceholderText("/data/here=/data/there, one a line (optional)")
        self.data_paths.setToolTip("Data sets already on the cluster: a run whose data lies under a folder here "
                                   "reads the same folder there (checked by fingerprint on every node) instead "
                                   "of uploading it")
        self.data_paths.setMaximumHeight(60)
        # Slurm only: the first host is the login node; sbatch asks for these
        self.partition, self.time_limit = QLineEdit(), QLineEdit()
        self.partition.setPlaceholderText("default partition")
        self.time_limit.setPlaceholderText("e.g. 02:00:00 (default: the partition's)")
        self.gpus = QSpinBox(minimum=0, maximum=64, specialValueText="none")
        self.backend.currentTextChanged.connect(self._backend_changed)
        form = QFormLayout()
        form.addRow("Name", self.name)
        hb = QHBoxLayout()
        hb.addWidget(add_host)
        hb.addWidget(del_host)
        hb.addStretch()
        self.hosts_label = QLabel("Hosts (first = rendezvous)")
        form.addRow(self.hosts_label, self.hosts)
        form.addRow("", _wrap(hb))
        form.addRow("Remote work folder", self.workdir)
        form.addRow("Python (with torch)", self.python)
        form.addRow("Environment", self.env)
        form.addRow("Backend", self.backend)
        form.addRow("Processes per node", self.nproc)
        form.addRow("Rendezvous port", self.rdzv_port)
        form.addRow("Restarts", self.restarts)
        bounds = QHBoxLayout()
        bounds.addWidget(QLabel("at least"))
        bounds.addWidget(self.min_nodes)
        bounds.addWidget(QLabel("at most"))
        bounds.addWidget(self.max_nodes)
        bounds.addStretch()
        form.addRow("Nodes (elastic)", _wrap(bounds))
        form.addRow("known_hosts", self.known_hosts)
        form.addRow("Shared job board folder", self.shared_dir)
        form.addRow("Data already there", self.data_paths)
        form.addRow("Slurm partition", self.partition)
        form.addRow("Slurm time limit", self.time_limit)
        form.addRow("Slurm GPUs per node", self.gpus)
        self._backend_changed(self.backend.currentText())

        self.error = QLabel()
        self.error.setStyleSheet("color: #c0392b")
        self.error.setWordWrap(True)
        self.report = QPlainTextEdit(readOnly=True)
        self.report.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        self.report.setPlaceholderText("Test connection: every host is checked in parallel.")
        self.save_btn, self.test_btn = QPushButton("Save"), QPushButton("Test connection")
        self.save_btn.clicked.connect(self.save)
        self.test_btn.clicked.connect(self.test_connection)
        close = QDialogButtonBox(QDialogButtonBox.Close)
        close.rejected.connect(self.reject)
        bottom = QHBoxLayout()
        bottom.addWidget(self.save_btn)
        bottom.addWidget(self.test_btn)
        bottom.addStretch()
        bottom.addWidget(close)

        right = QVBoxLayout()
        right.addLayout(form)
        right.addWidget(self.error)
        right.addWidget(self.report, 1)
        right.addLayout(bottom)
        top = QHBoxLayout(self)
        top.addLayout(left, 1)
        top.addLayout(right, 3)
        self.reload()

    # ----- list ------------------------------------------------------------------
    def reload(self, select: str | None = None) -> None:
        try:
            names = self.store.names()
        except ClusterError as exc:
            names = []
            self.error.setText(str(exc))
        self.list.blockSignals(True)
        self.list.clear()
        self.list.addItems(names)
        self.list.blockSignals(False)
        if names:
            target = select if select in names else names[0]
            self.list.setCurrentRow(names.index(target))
            self._load(target)
        else:
            self.new_cluster()

    def new_cluster(self) -> None:
        self.list.clearSelection()
        self.name.setText("")
        self.hosts.setRowCount(0)
        self.add_host_row()
        self.workdir.setText("~/layerflow")
        self.python.setText("python3")
        self.env.setPlainText("")
        self.backend.setCurrentText("ssh")
        self.nproc.setValue(0)
        self.rdzv_port.setValue(29400)
        self.restarts.setValue(-1)
        self.min_nodes.setValue(0)
        self.max_nodes.setValue(0)
        self.known_hosts.setText("")
        self.shared_dir.setText("")
        self.data_paths.setPlainText("")
        self._kept = {}
        self.partition.setText("")
        self.time_limit.setText("")
        self.gpus.setValue(0)
        self.report.clear()

    def _backend_changed(self, backend: str) -> None:
        for w in (self.partition, self.time_limit, self.gpus):
            w.setEnabled(backend == "slurm")
        self.hosts_label.setText("Login node (Slurm picks the nodes)" if backend == "slurm"
                                 else "Hosts (first = rendezvous)")

    def add_host_row(self, address="", port=22, user="", identity="") -> None:
        r = self.hosts.rowCount()
        self.hosts.insertRow(r)
        for c, v in enumerate((address, str(port), user or "", identity or "")):
            self.hosts.setItem(r, c, QTableWidgetItem(v))

    def _load(self, name: str) -> None:
        if not name:
            return
        try:
            c = self.store.get(name)
        except ClusterError as exc:
            self.error.setText(str(exc))
            return
        self.error.setText("")
        self.name.setText(c.name)
        self.hosts.setRowCount(0)
        self._jumps = {h.address: h.jump for h in c.hosts}
        for h in c.hosts:
            self.add_host_row(h.address, h.port, h.user, h.identity_file)
        self.workdir.setText(c.workdir)
        self.python.setText(c.python)
        self.env.setPlainText("\n".join(f"{k}={v}" for k, v in c.env.items()))
        self.backend.setCurrentText(c.backend)
        self.nproc.setValue(c.nproc_per_node or 0)
        self.rdzv_port.setValue(c.rdzv_port)
        self.restarts.setValue(-1 if c.max_restarts is None else c.max_restarts)
        self.min_nodes.setValue(c.min_nodes or 0)
        self.max_nodes.setValue(c.max_nodes or 0)
        self.known_hosts.setText(c.known_hosts or "")
        self.shared_dir.setText(c.shared_dir or "")
        self.data_paths.setPlainText("\n".join(f"{k}={v}" for k, v in c.data_paths.items()))
        # what the form has no field for (set by `cluster add` or by hand) is kept as it was
        self._kept = c.model_dump(include={"connect_timeout", "command_timeout", "preempt_grace_s"})
        self.partition.setText(c.partition or "")
        self.time_limit.setText(c.time_limit or "")
        self.gpus.setValue(c.gpus_per_node or 0)
        self.report.clear()

    # ----- form <-> profile ----------------------------------------------------------
    def cluster_from_form(self):
        """The profile in the form, validated (ClusterError names the bad field)."""
        hosts = []
        jumps = getattr(self, "_jumps", {})
        for r in range(self.hosts.rowCount()):
            cell = [(self.hosts.item(r, c).text().strip() if self.hosts.item(r, c) else "") for c in range(4)]
            if not cell[0]:
                continue
            try:
                port = int(cell[1] or 22)
            except ValueError:
                raise ClusterError(f"host {cell[0]}: port {cell[1]!r} is not a number") from None
            h = {"address": cell[0], "port": port, "user": cell[2] or None, "identity_file": cell[3] or None}
            if jumps.get(cell[0]) is not None:
                h["jump"] = jumps[cell[0]].model_dump()
            hosts.append({k: v for k, v in h.items() if v is not None})
        env = {}
        for ln in self.env.toPlainText().splitlines():
            if ln.strip():
                k, sep, v = ln.partition("=")
                if not sep:
                    raise ClusterError(f"environment line {ln!r}: expected KEY=VALUE")
                env[k.strip()] = v
        data_paths = {}
        for ln in self.data_paths.toPlainText().splitlines():
            if ln.strip():
                here, sep, there = ln.partition("=")
                if not sep:
                    raise ClusterError(f"data already there, line {ln!r}: expected FOLDER_HERE=FOLDER_THERE")
                data_paths[here.strip()] = there.strip()
        data = {**getattr(self, "_kept", {}), "data_paths": data_paths,
                "name": self.name.text().strip(), "hosts": hosts, "workdir": self.workdir.text().strip(),
                "python": self.python.text().strip(), "env": env, "backend": self.backend.currentText(),
                "nproc_per_node": self.nproc.value() or None, "rdzv_port": self.rdzv_port.value(),
                "max_restarts": None if self.restarts.value() < 0 else self.restarts.value(),
                "min_nodes": self.min_nodes.value() or None, "max_nodes": self.max_nodes.value() or None,
                "known_hosts": self.known_hosts.text().strip() or None,
                "shared_dir": self.shared_dir.text().strip() or None}
        if data["backend"] == "slurm":
            data.update(partition=self.partition.text().strip() or None,
                        time_limit=self.time_limit.text().strip() or None, gpus_per_node=self.gpus.value() or None)
        return parse_cluster({k: v for k, v in data.items() if v is not None}, "cluster")

    def save(self) -> bool:
        try:
            c = self.cluster_from_form()
            self.store.save(c)
        except ClusterError as exc:
            self.error.setText(str(exc))
            return False
        self.error.setText("")
        self.reload(c.name)
        return True

    def remove_cluster(self) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        try:
            self.store.remove(item.text())
        except ClusterError as exc:
            self.error.setText(str(exc))
        self.reload()

    def _import_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "ssh config", str(Path.home() / ".ssh" / "config"))
        if path:
            try:
                aliases = sorted(hosts_from_ssh_config(path))
            except ClusterError as exc:
                self.error.setText(str(exc))
                return
            alias, ok = QInputDialog.getItem(self, "Import", "Host:", aliases, 0, False)
            if ok:
                self.import_ssh_config(path, [alias])

    def import_ssh_config(self, path: str | os.PathLike, aliases: list[str]) -> None:
        """Put the given Host entries of an ssh config into the form (Save keeps them)."""
        try:
            found = hosts_from_ssh_config(path, aliases)
        except ClusterError as exc:
            self.error.setText(str(exc))
            return
        self.hosts.setRowCount(0)
        self._jumps = {}
        for a in aliases:
            h = found[a]
            self._jumps[h.address] = h.jump
            self.add_host_row(h.address, h.port, h.user, h.identity_file)
        if not self.name.text():
            self.name.setText(aliases[0])

    # ----- test connection (preflight in a worker thread) -----------------------------
    def test_connection(self) -> None:
        from remote.launch import check as preflight

        try:
            c = self.cluster_from_form()
        except ClusterError as exc:
            self.error.setText(str(exc))
            return
        self.error.setText("")
        self.report.setPlainText(f"checking {len(c.hosts)} host(s)…")
        self.test_btn.setEnabled(False)
        self._future = self._pool.submit(preflight, c, accept=set(self.accepted_keys))
        self._timer.start()

    @property
    def busy(self) -> bool:
        return self._future is not None

    def _poll(self) -> None:
        if self._future is None or not self._future.done():
            return
        fut, self._future = self._future, None
        self._timer.stop()
        self.test_btn.setEnabled(True)
        try:
            rep = fut.result()
        except Exception as exc:  # a bug must show up as text, not take the app down
            self.report.setPlainText(f"preflight failed: {type(exc).__name__}: {exc}")
            return
        self.last_report = rep
        self.report.setPlainText(rep.table() + ("\n\nall hosts ready" if rep.ok else
                                                "\n\n" + "\n".join(rep.failures)))
        unknown = [h for h in rep.hosts if h.unknown_key and h.unknown_key not in self.accepted_keys]
        if unknown:
            h = unknown[0]
            if self.ask_trust(self, h.host, h.unknown_key_type or "", h.unknown_key):
                self.accepted_keys.add(h.unknown_key)
                self.test_connection()  # again: the accepted key gets pinned on connect

    def done(self, r: int) -> None:
        self._timer.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)
        super().done(r)


def _wrap(layout) -> QWidget:
    w = QWidget()
    layout.setContentsMargins(0, 0, 0, 0)
    w.setLayout(layout)
    return w


__all__ = ["ClusterDialog", "ask_trust_key"]
