"""Python's garbage collector run at safe points of the GUI's event loop, not wherever an
allocation happens to trigger it.

With automatic collection, a collection may start inside any call that allocates,
including one Qt makes back into Python while it holds a lock of its own. PySide then
deletes the C++ objects of collected wrappers in the middle of that call: seen here as
a deadlock (a QObject::disconnect holding Qt's signal mutex called into Python, the
collection that started there deleted a dead window's QMenu, whose QAction destructor
waited for the same mutex) and as a segfault (a collection on the GUI thread while a
worker thread ran torch.export). So the GUI process turns automatic collection off and
a timer collects instead, generation by generation as the thresholds say, from the
event loop itself (the recipe calibre and other PyQt applications use).

    install(app)     # once, with the QApplication (app/cli/gui_cmds.py)

The test suite does the same per test (tests/conftest.py): no automatic collection
during a test, a full one after its widgets are gone.
"""
from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

INTERVAL_MS = 500  # as often as the thresholds are looked at: garbage waits at most this long


class SafeCollector(QObject):
    """Collects from a timer of the event loop, each generation when its count passes
    the threshold automatic collection would have used."""

    def __init__(self, parent: QObject | None = None, interval_ms: int = INTERVAL_MS):
        super().__init__(parent)
        self.threshold = gc.get_threshold()
        gc.disable()
        self.timer = QTimer(self)
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self.check)
        self.timer.start()

    def check(self) -> int:
        """One look at the counts; collects the oldest generation due. Returns the
        generation collected, or -1."""
        c0, c1, c2 = gc.get_count()
        t0, t1, t2 = self.threshold
        if c0 <= t0:
            return -1
        gen = 2 if c2 > t2 and c1 > t1 else 1 if c1 > t1 else 0
        gc.collect(gen)
        return gen

    def stop(self) -> None:
        """Automatic collection back on (the timer stopped)."""
        self.timer.stop()
        gc.enable()


def install(app: QObject) -> SafeCollector:
    """Collection at safe points for this process, for as long as `app` lives."""
    return SafeCollector(app)
