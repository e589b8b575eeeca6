"""`python main.py <command>` / `layerflow <command>`: every GUI action, headless.

Each area registers its subcommands from its own module (app/cli_*.py, a
`register(subparsers)` function), listed in COMMAND_MODULES. A command returns an
exit code; user errors raise CliError (or the engine's own error types) and are
printed as one clear message, never as a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = [
    "app.cli_core",  # validate, summary, train
    "app.cli_interop",  # export (--onnx/--script), import (.onnx, module:pkg.mod:Class)
    "app.cli_remote",  # cluster, deploy, jobs, status, logs, cancel, fetch
    "app.cli_dist",  # plan (distributed placement, --auto)
    "app.cli_gui",  # (bare) editor, open, screenshot
]


class CliError(Exception):
    """A user error: printed as `error: <message>`, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="layerflow",
        description="Layerflow: draw a network, place it on devices, train it here or on a cluster.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from engine.project import ProjectError

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        if "app.cli_gui" in COMMAND_MODULES:
            return importlib.import_module("app.cli_gui").default(args)
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (CliError, ProjectError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
