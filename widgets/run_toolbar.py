"""Run toolbar: where to train (this machine with N processes; cluster profiles
later), Run, Stop, Resume, Logs. Fills a QToolBar the main window owns; emits the user's
requests and shows the running/idle state it is told. Its actions are QActions of the
toolbar (the window's Run menu shows the same ones: one enabled state, one shortcut)."""
from __future__ import annotations

import os

from PySide6 import QtCore, QtGui, QtWidgets
from PySide6.QtCore import Qt


class RunToolbar(QtCore.QObject):
    run_requested = QtCore.Signal(str, int)  # target ("local"), processes
    stop_requested = QtCore.Signal()
    resume_requested = QtCore.Signal(str, int)
    logs_requested = QtCore.Signal()
    processes_changed = QtCore.Signal(int)  # the user chose another process count (not set_processes)

    def __init__(self, toolbar: QtWidgets.QToolBar, max_procs: int | None = None):
        super().__init__(toolbar)
        self.toolbar = toolbar
        style = toolbar.style()
        self.target = QtWidgets.QComboBox()
        self.target.setToolTip("Where the run trains")
        self.target.addItem("This machine", "local")
        self.target.setSizeAdjustPolicy(QtWidgets.QComboBox.AdjustToContents)
        self.procs = QtWidgets.QSpinBox()
        self.procs.setRange(1, max_procs or max(8, os.cpu_count() or 1))
        self.procs.setValue(1)
        self.procs.setPrefix("× ")
        self.procs.setSuffix(" proc")
        self.procs.setToolTip("Training processes on this machine (dp × tp × pp of the placement)")
        self._setting = False
        self.procs.setKeyboardTracking(False)  # "12" typed is one choice (on Return or leaving the box), not 1 then 12
        self.procs.valueChanged.connect(lambda n: self._setting or self.processes_changed.emit(n))

        self.run_action = QtGui.QAction(style.standardIcon(QtWidgets.QStyle.SP_MediaPlay), "Run", toolbar)
        self.run_action.setToolTip("Train this project (F5)")
        self.run_action.setShortcut(QtGui.QKeySequence(Qt.Key_F5))
        self.run_action.triggered.connect(lambda: self.run_requested.emit(self.target.currentData(), self.procs.value()))
        self.stop_action = QtGui.QAction(style.standardIcon(QtWidgets.QStyle.SP_MediaStop), "Stop", toolbar)
        self.stop_action.setToolTip("Stop the run (it saves a checkpoint first) (Shift+F5)")
        self.stop_action.setShortcut(QtGui.QKeySequence("Shift+F5"))
        self.stop_action.triggered.connect(self.stop_requested.emit)
        self.resume_action = QtGui.QAction(style.standardIcon(QtWidgets.QStyle.SP_MediaSeekForward), "Resume", toolbar)
        self.resume_action.setToolTip("Continue the last stopped run from its latest checkpoint (Ctrl+F5)")
        self.resume_action.setShortcut(QtGui.QKeySequence("Ctrl+F5"))
        self.resume_action.triggered.connect(lambda: self.resume_requested.emit(self.target.currentData(), self.procs.value()))
        self.logs_action = QtGui.QAction(style.standardIcon(QtWidgets.QStyle.SP_FileDialogDetailedView), "Logs", toolbar)
        self.logs_action.setToolTip("Every rank's log of the selected (or the latest) run (Ctrl+Shift+J)")
        self.logs_action.setShortcut(QtGui.QKeySequence("Ctrl+Shift+J"))
        self.logs_action.triggered.connect(self.logs_requested.emit)

        toolbar.addWidget(self.target)
        toolbar.addWidget(self.procs)
        toolbar.addAction(self.run_action)
        toolbar.addAction(self.stop_action)
        toolbar.addAction(self.resume_action)
        # logs_action is the window's to place (after the actions other parts add: app/window.py)
        self.set_running(False)

    def set_running(self, running: bool, can_resume: bool = False) -> None:
        self._running = running
        self.run_action.setEnabled(not running and not getattr(self, "blocker", None))
        self.stop_action.setEnabled(running)
        self.resume_action.setEnabled(not running and can_resume)
        self.target.setEnabled(not running)
        self.procs.setEnabled(not running)

    def set_blocked(self, reason: str | None) -> None:
        """Run stays off while the diagram or its placement has an error; its tooltip says which."""
        self.blocker = reason
        self.run_action.setEnabled(not getattr(self, "_running", False) and not reason)
        self.run_action.setToolTip(f"Cannot run: {reason}" if reason else "Train this project (F5)")

    def set_processes(self, n: int) -> None:
        """Show the placement's process count (no processes_changed: it is not the user's choice)."""
        self._setting = True
        try:
            if n > self.procs.maximum():  # a placement of more processes than offered: shown as it is
                self.procs.setMaximum(n)
            self.procs.setValue(max(1, n))
        finally:
            self._setting = False
