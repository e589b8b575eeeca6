"""The runs panel: every run of the project with its status, duration, steps and
best validation number. It shows engine.runs.history.RunSummary rows and emits what the
user asks for (open, compare, delete, resume, and what to do with a run's model:
export it as ONNX or a script, use its weights, fine-tune from it); app/run_ui.py
and app/interop_ui.py do the work."""
from __future__ import annotations

import time
from pathlib import Path

from PySide6 import QtCore, QtGui, QtWidgets
from PySide6.QtCore import Qt

from engine.runtime.records import RESUMABLE_STATES

STATE_COLORS = {"running": "#1f77b4", "succeeded": "#2ca02c", "failed": "#d62728",
                "cancelled": "#ff7f0e", "interrupted": "#9467bd", "pending": "#7f7f7f", "preempted": "#bcbd22",
                "resuming": "#17becf"}
COLUMNS = ("Run", "Status", "Time", "Steps", "Best val")


def fmt_duration(seconds) -> str:
    if seconds is None:
        return ""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


def fmt_best(summary) -> str:
    best = summary.best_metric
    if best is None:
        return ""
    name, v = best
    return f"acc {v:.1%}" if name == "val_acc" else f"loss {v:.4g}"


class _Item(QtWidgets.QTreeWidgetItem):
    """Sorts by the raw value (seconds, steps) rather than the displayed text."""

    def __lt__(self, other):
        col = self.treeWidget().sortColumn() if self.treeWidget() else 0
        a, b = self.data(col, Qt.UserRole + 1), other.data(col, Qt.UserRole + 1)
        if a is not None and b is not None:
            return a < b
        return self.text(col) < other.text(col)


class RunsPanel(QtWidgets.QWidget):
    open_requested = QtCore.Signal(str)  # run folder
    compare_requested = QtCore.Signal(str, str)
    delete_requested = QtCore.Signal(str)
    resume_requested = QtCore.Signal(str)
    logs_requested = QtCore.Signal(str)  # run folder: show its ranks' logs
    refresh_requested = QtCore.Signal()
    # a run's model (run folder): its weights exported, made the project's, or fine-tuned from
    export_onnx_requested = QtCore.Signal(str)
    export_script_requested = QtCore.Signal(str)
    use_weights_requested = QtCore.Signal(str)
    fine_tune_requested = QtCore.Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.tree = QtWidgets.QTreeWidget()
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(COLUMNS)
        self.tree.setRootIsDecorated(False)
        self.tree.setAlternatingRowColors(True)
        self.tree.setUniformRowHeights(True)
        self.tree.setSortingEnabled(True)
        self.tree.sortByColumn(0, Qt.DescendingOrder)  # column 0 sorts by start time: newest first
        self.tree.setSelectionMode(QtWidgets.QAbstractItemView.ExtendedSelection)
        self.tree.itemDoubleClicked.connect(lambda item, _c: self.open_requested.emit(item.data(0, Qt.UserRole)))
        self.tree.itemSelectionChanged.connect(self._update_buttons)
        header = self.tree.header()
        header.setStretchLastSection(False)
        self.tree.setTextElideMode(Qt.ElideMiddle)  # run names are long; the end is the time
        header.setSectionResizeMode(0, QtWidgets.QHeaderView.Interactive)
        header.resizeSection(0, 112)
        for i in range(1, len(COLUMNS)):
            header.setSectionResizeMode(i, QtWidgets.QHeaderView.ResizeToContents)

        self.open_button = QtWidgets.QPushButton("Open")
        self.open_button.setToolTip("Show the selected run's plots")
        self.open_button.clicked.connect(self._open)
        self.compare_button = QtWidgets.QPushButton("Compare")
        self.compare_button.setToolTip("Overlay the two selected runs")
        self.compare_button.clicked.connect(self._compare)
        self.resume_button = QtWidgets.QPushButton("Resume")
        self.resume_button.setToolTip("Continue the selected run from its latest checkpoint")
        self.resume_button.clicked.connect(lambda: self._emit_one(self.resume_requested))
        self.logs_button = QtWidgets.QPushButton("Logs…")
        self.logs_button.setToolTip("Every rank's log of the selected run (followed while it runs)")
        self.logs_button.clicked.connect(lambda: self._emit_one(self.logs_requested))
        self.delete_button = QtWidgets.QPushButton("Delete…")
        self.delete_button.setToolTip("Delete the selected run's folder (asks first)")
        self.delete_button.clicked.connect(lambda: self._emit_one(self.delete_requested))
        # the run's model: one menu button (the row of buttons fits a narrow dock), the same
        # actions in the list's context menu
        self.model_menu = QtWidgets.QMenu(self)
        self.model_actions: dict[str, QtGui.QAction] = {}
        for key, text, tip, signal in (
                ("export_onnx", "Export ONNX…", "Write the run's trained model as ONNX", self.export_onnx_requested),
                ("export_script", "Export script…", "Write a PyTorch script that starts from the run's weights",
                 self.export_script_requested),
                ("use_weights", "Use these weights", ("Make the run's weights the project's (a weights file beside "
                                                      "it): later runs and exports start from them"),
                 self.use_weights_requested),
                ("fine_tune", "Fine-tune from here", "Start a new run of the project from the run's weights",
                 self.fine_tune_requested)):
            act = self.model_menu.addAction(text)
            act.setToolTip(tip)
            act.setStatusTip(tip)
            act.triggered.connect(lambda _=False, sig=signal: self._emit_one(sig))
            self.model_actions[key] = act
        self.model_menu.setToolTipsVisible(True)
        self.model_button = QtWidgets.QToolButton()
        self.model_button.setText("Model")
        self.model_button.setToolTip("The selected run's trained model: export it, use its weights, fine-tune")
        self.model_button.setPopupMode(QtWidgets.QToolButton.InstantPopup)
        self.model_button.setMenu(self.model_menu)
        self.tree.setContextMenuPolicy(Qt.CustomContextMenu)
        self.tree.customContextMenuRequested.connect(self._context_menu)
        self.refresh_button = QtWidgets.QToolButton()
        self.refresh_button.setText("↻")
        self.refresh_button.setToolTip("Read the runs folder again")
        self.refresh_button.clicked.connect(self.refresh_requested.emit)
        self.empty_label = QtWidgets.QLabel("No runs yet: press Run to train this project.")
        self.empty_label.setAlignment(Qt.AlignCenter)
        self.empty_label.setStyleSheet("color: palette(mid);")

        # two rows: in one the seven buttons made the dock (and the window) at least 533 px wide,
        # past a workspace's side panel (app/workspaces.py: 330) and a 1440 px window's width
        buttons = QtWidgets.QGridLayout()
        buttons.setContentsMargins(0, 0, 0, 0)
        for i, b in enumerate((self.open_button, self.compare_button, self.resume_button)):
            buttons.addWidget(b, 0, i)
        for i, b in enumerate((self.logs_button, self.model_button, self.delete_button)):
            buttons.addWidget(b, 1, i)
        buttons.addWidget(self.refresh_button, 1, 3)
        buttons.setColumnStretch(4, 1)
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.addWidget(self.tree, 1)
        lay.addWidget(self.empty_label)
        lay.addLayout(buttons)
        self._summaries = {}
        self.set_runs([])

    # ----- content ----------------------------------------------------------------
    def set_runs(self, summaries) -> None:
        """Show these runs (engine.runs.history.RunSummary), keeping the selection."""
        selected = set(self.selected_runs())
        self._summaries = {str(s.path): s for s in summaries}
        self.tree.setSortingEnabled(False)
        self.tree.clear()
        for s in summaries:
            item = _Item()
            item.setText(0, s.path.name)
            item.setData(0, Qt.UserRole, str(s.path))
            item.setText(1, s.state)
            item.setForeground(1, QtGui.QBrush(QtGui.QColor(STATE_COLORS.get(s.state, "#7f7f7f"))))
            if s.error:
                item.setToolTip(1, s.error)
            item.setText(2, fmt_duration(s.duration))
            item.setData(2, Qt.UserRole + 1, s.duration or 0.0)
            item.setText(3, f"{s.step}/{s.total_steps}" if s.total_steps else str(s.step))
            item.setData(3, Qt.UserRole + 1, s.step)
            item.setTextAlignment(3, Qt.AlignRight | Qt.AlignVCenter)
            item.setText(4, fmt_best(s))
            best = s.best_metric
            item.setData(4, Qt.UserRole + 1, (best[1] if best[0] == "val_acc" else -best[1]) if best else float("-inf"))
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.started)) if s.started else "?"
            item.setToolTip(0, f"{s.path}\nstarted {started}" + (f"\n{s.error}" if s.error else ""))
            item.setData(0, Qt.UserRole + 1, s.started or 0.0)  # sorts by start time
            self.tree.addTopLevelItem(item)
            if str(s.path) in selected:
                item.setSelected(True)
        self.tree.setSortingEnabled(True)

        self.tree.setVisible(bool(summaries))
        self.empty_label.setVisible(not summaries)
        self._update_buttons()

    def run_paths(self) -> list[str]:
        return [self.tree.topLevelItem(i).data(0, Qt.UserRole) for i in range(self.tree.topLevelItemCount())]

    def summary(self, path: str):
        return self._summaries.get(str(path))

    def selected_runs(self) -> list[str]:
        return [it.data(0, Qt.UserRole) for it in self.tree.selectedItems()]

    def select_runs(self, paths) -> None:
        want = {str(p) for p in paths}
        for i in range(self.tree.topLevelItemCount()):
            item = self.tree.topLevelItem(i)
            item.setSelected(item.data(0, Qt.UserRole) in want)

    # ----- actions ----------------------------------------------------------------
    def _update_buttons(self) -> None:
        sel = self.selected_runs()
        self.open_button.setEnabled(len(sel) >= 1)
        self.compare_button.setEnabled(len(sel) == 2)
        self.delete_button.setEnabled(len(sel) == 1)
        self.logs_button.setEnabled(len(sel) == 1)
        s = self._summaries.get(sel[0]) if len(sel) == 1 else None
        self.resume_button.setEnabled(bool(s and s.state in RESUMABLE_STATES))
        weights = len(sel) == 1 and has_weights(sel[0])
        for act in self.model_actions.values():
            act.setEnabled(weights)
        self.model_button.setEnabled(weights)
        self.model_button.setToolTip(
            "The selected run's trained model: export it, use its weights, fine-tune" if weights else
            "Select one run that has weights (a checkpoint or its final model.pt)")

    def _context_menu(self, pos) -> None:
        item = self.tree.itemAt(pos)
        if item is None:
            return
        if not item.isSelected():
            self.tree.clearSelection()
            item.setSelected(True)
        self.model_menu.popup(self.tree.viewport().mapToGlobal(pos))

    def _open(self) -> None:
        for path in self.selected_runs()[:1]:
            self.open_requested.emit(path)

    def _compare(self) -> None:
        sel = self.selected_runs()
        if len(sel) == 2:
            self.compare_requested.emit(sel[0], sel[1])

    def _emit_one(self, signal) -> None:
        sel = self.selected_runs()
        if len(sel) == 1:
            signal.emit(sel[0])


def has_weights(run_dir) -> bool:
    """The run has weights to offer: its final model.pt or a whole checkpoint."""
    p = Path(run_dir)
    return (p / "model.pt").is_file() or (p / "checkpoints" / "latest").is_file()
