"""Keep PySide6 6.12 from killing `None`, `True` and `False` on Python 3.11.

Measured here (PySide6 6.12.0, CPython 3.11.7): every call of a C++ method that
returns void (QPainter.setPen, QPointF.setX, QObject.setObjectName ...) returns
None without taking a reference, i.e. it assumes Python >= 3.12 where None is
immortal (PEP 683). On 3.11 each call drains one reference from None, and after a
few thousand calls (painting a few hundred nodes) the interpreter aborts with
"Fatal Python error: none_dealloc". We give None the same effectively infinite
reference count that 3.12 gives it. Likewise SignalInstance.emit() returns True
without taking a reference (measured: one reference per emit; pyqtgraph emits on
every view change), which ends in "bool_dealloc", so True and False get the same.
Import this module before painting anything; on 3.12+ it does nothing.
"""
from __future__ import annotations

import ctypes
import sys

_IMMORTAL = 1 << 60  # far more than any process can drain; far below overflow (2**63)


def make_none_immortal() -> None:
    """None, True and False (the singletons PySide6 returns without a reference)."""
    if (sys.version_info >= (3, 12) or hasattr(sys, "gettotalrefcount")  # 3.12+, or a debug build's layout
            or sys.implementation.name != "cpython"):
        return
    for obj in (None, True, False):
        refcnt = ctypes.c_ssize_t.from_address(id(obj))  # ob_refcnt is PyObject's first field
        if refcnt.value < _IMMORTAL // 2:
            refcnt.value += _IMMORTAL


make_none_immortal()
