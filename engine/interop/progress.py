"""Where a running import is: its phases, told to a callback the caller installs.

The importers call `phase("tracing", "torch.export")` at each step; outside
`reporting(callback)` that is a no-op. The callback runs on the importing thread and
may stop the import by raising (the GUI's Cancel raises Cancelled there), so an
import stops at its next phase rather than running on unseen.

    with reporting(lambda name, detail: print(name, detail)):
        import_module("pkg.mod:Net", {}, [[3, 32, 32]])
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable

# the phases, in the order an import goes through them (a progress bar's steps)
PHASES = ("loading", "tracing", "converting", "laying out", "checking", "writing")

_CALLBACK: contextvars.ContextVar[Callable[[str, str], None] | None] = contextvars.ContextVar(
    "import_progress", default=None)


class Cancelled(Exception):
    """Raised by a progress callback to stop the import it is told about."""

    stops_the_import = True  # (common.best_effort lets it through)


@contextlib.contextmanager
def reporting(callback: Callable[[str, str], None]):
    """Tell `callback(phase, detail)` each phase of the imports run inside (this thread)."""
    token = _CALLBACK.set(callback)
    try:
        yield
    finally:
        _CALLBACK.reset(token)


def phase(name: str, detail: str = "") -> None:
    """The import enters `name` (one of PHASES); `detail` says what it does there."""
    cb = _CALLBACK.get()
    if cb is not None:
        cb(name, detail)
