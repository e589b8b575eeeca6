"""A run's logs, one file at a time: every rank's log, the launcher's, a rank's error;
it follows a file that is still growing (a live run), as `tail -f` does."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtGui import QFontDatabase, QTextCursor
from PySide6.QtWidgets import QCheckBox, QComboBox, QDialog, QHBoxLayout, QLabel, QPlainTextEdit, QVBoxLayout

from engine.runs.tail import FileTail

MAX_LINES = 20_000  # what the view keeps of a long log (the file keeps everything)


def log_files(run_dir: str | Path) -> list[Path]:
    """rank0.log, rank1.log, ..., then launcher.log and any rankN.error, as they exist."""
    logs = Path(run_dir) / "logs"
    try:
        files = [p for p in logs.iterdir() if p.is_file() and p.suffix in (".log", ".error")]
    except OSError:
        return []

    def order(p: Path):
        digits = "".join(c for c in p.stem if c.isdigit())
        return (0 if p.stem.startswith("rank") else 1, int(digits) if digits else 0, p.name)

    return sorted(files, key=order)


class LogViewer(QDialog):
    def __init__(self, run_dir: str | Path, parent=None):
        super().__init__(parent)
        self.run_dir = Path(run_dir)
        self.setWindowTitle(f"Logs: {self.run_dir.name}")
        self.resize(900, 560)
        self.files = QComboBox()
        self.files.setObjectName("log_file")
        self.follow = QCheckBox("Follow")
        self.follow.setChecked(True)
        self.follow.setToolTip("Keep showing the end of the file as it grows")
        self.text = QPlainTextEdit(readOnly=True)
        self.text.setObjectName("log_text")
        self.text.setLineWrapMode(QPlainTextEdit.NoWrap)
        self.text.setMaximumBlockCount(MAX_LINES)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        top = QHBoxLayout()
        top.addWidget(QLabel("File"))
        top.addWidget(self.files, 1)
        top.addWidget(self.follow)
        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(self.text, 1)
        self._tail: FileTail | None = None
        self.files.currentIndexChanged.connect(lambda _i: self._show(self.files.currentData()))
        self._fill()
        self._timer = QTimer(self, interval=500, timeout=self.poll)  # runs only while the window is shown

    def showEvent(self, e) -> None:  # noqa: N802
        self._timer.start()
        super().showEvent(e)

    def hideEvent(self, e) -> None:  # noqa: N802
        self._timer.stop()  # a closed viewer reads nothing more
        super().hideEvent(e)

    def _fill(self) -> None:
        current = self.files.currentData()
        found = log_files(self.run_dir)
        if [self.files.itemData(i) for i in range(self.files.count())] == found:
            return
        self.files.blockSignals(True)
        self.files.clear()
        for p in found:
            self.files.addItem(p.name, p)
        self.files.blockSignals(False)
        if not found:
            self.text.setPlainText(f"{self.run_dir / 'logs'}: no log yet")
            return
        index = self.files.findData(current) if current in found else 0
        self.files.setCurrentIndex(max(0, index))
        if current not in found:
            self._show(self.files.currentData())

    def _show(self, path: Path | None) -> None:
        self.text.clear()
        self._tail = FileTail(path) if path else None
        self.poll()

    def show_file(self, name: str) -> None:
        """Show logs/NAME (rank1.log, launcher.log, ...)."""
        self._fill()
        i = self.files.findText(name)
        if i < 0:
            raise ValueError(f"{self.run_dir.name} has no log {name!r} (it has: "
                             f"{', '.join(self.files.itemText(k) for k in range(self.files.count())) or 'none'})")
        self.files.setCurrentIndex(i)

    def poll(self) -> None:
        self._fill()  # ranks that started since
        if self._tail is None:
            return
        lines = self._tail.poll()
        if not lines:
            return
        bar = self.text.verticalScrollBar()
        self.text.appendPlainText("\n".join(lines))
        if self.follow.isChecked():
            self.text.moveCursor(QTextCursor.End)
            bar.setValue(bar.maximum())
