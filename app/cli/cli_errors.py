"""The command line's own error type, in a module of its own.

app/cli/__init__.py imports the command modules (app/cli/*_cmds.py) and every command module raises
CliError: kept here, a leaf that imports only engine.errors, the imports go one way
(app.cli -> app.cli.core_cmds -> app.cli.cli_errors) and import-linter sees no cycle.
"""
from __future__ import annotations

from engine.errors import LayerflowError


class CliError(LayerflowError):
    """A user error of the command line itself (a bad flag); printed, like every
    LayerflowError, as `error: <message>`, exit code 2."""
