"""The one base of every error Layerflow reports to a user.

Each room keeps its own error types (ProjectError names a file and field, GraphError a
node and port, SSHError a host, ...); all of them are LayerflowErrors too, so the command
line prints any of them as one line, and a script (`import layerflow`) catches them with
one `except lf.LayerflowError`. Nothing but the standard library here: cheap anywhere.
"""
from __future__ import annotations


class LayerflowError(Exception):
    """A user's error or a refused request; the message names what is at fault and how to fix it."""


class CheckFailed(LayerflowError, ValueError):
    """A project that does not pass a check (the diagram, its data, its placement): `errors`
    lists every problem, `warnings` what is allowed but worth knowing; the message has both."""

    def __init__(self, what: str, errors: list[str], warnings: list[str] | None = None):
        self.what = what
        self.errors = [str(e) for e in errors]
        self.warnings = [str(w) for w in warnings or []]
        super().__init__(f"{what}: {len(self.errors)} error(s):\n" + "\n".join(f"  {e}" for e in self.errors))


class InteropError(LayerflowError, ValueError):
    """An export or import that cannot be done (engine/interop/), or a run's weights that
    cannot be read (engine/runs/weights.py); the message lists every reason."""
