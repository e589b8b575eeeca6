"""Reusable Qt views. Importing any of them first keeps PySide6 6.12 on Python 3.11
from draining None's reference count (see widgets/qt_fix.py)."""
import widgets.qt_fix  # noqa: F401
