"""app/gc_guard.py: with automatic collection off, garbage cycles are collected by the
event loop's timer, generation by generation as the thresholds say."""
from __future__ import annotations

import gc
import weakref

import pytest
from PySide6.QtCore import QObject

from app.gc_guard import SafeCollector

pytestmark = pytest.mark.gui


class Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it


def test_cycles_are_collected_from_the_event_loop_not_by_allocation(qtbot):
    owner = QObject()
    guard = SafeCollector(owner, interval_ms=20)
    try:
        assert not gc.isenabled()
        dead = Node()
        ref = weakref.ref(dead)
        del dead
        for _ in range(gc.get_threshold()[0] * 3):  # allocations alone collect nothing now
            Node()
        assert ref() is not None
        assert guard.timer.isActive() and guard.timer.interval() == 20
        guard.timer.timeout.emit()  # what the event loop runs every 20 ms
        assert ref() is None  # that collection freed it
        assert guard.check() == -1  # nothing due right after a collection
    finally:
        guard.stop()
    assert gc.isenabled()
    gc.disable()  # (the suite's own guard, tests/conftest.py, turns it back on after the test)


def test_the_oldest_generation_due_is_collected():
    owner = QObject()
    guard = SafeCollector(owner, interval_ms=10_000)
    try:
        guard.threshold = (-1, -1, -1)  # everything due: a full collection
        for _ in range(10):
            Node()
        assert guard.check() == 2
        guard.threshold = (10**9, 10, 10)
        assert guard.check() == -1
    finally:
        guard.stop()
    gc.disable()
