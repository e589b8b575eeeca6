"""`python main.py <command>` / `layerflow <command>`: every GUI action, headless.

Each area registers its subcommands from its own module (app/cli/*_cmds.py, a
`register(subparsers)` function), listed in COMMAND_MODULES. A command returns an
exit code; user errors raise CliError (app/cli/cli_errors.py, which the command modules
import at their top) or the engine's own error types, and are printed as one clear
message, never as a traceback. The command modules are imported here statically, so
import-linter sees the real graph; what is heavy (Qt, torch) they import inside the
functions that need it.
"""
from __future__ import annotations

import argparse
import os
import sys

from app.cli import (core_cmds, data_cmds, diff_cmds, dist_cmds, gui_cmds, interop_cmds, model_cmds, remote_cmds,
                     sweep_cmds, track_cmds)
from app.cli.cli_errors import CliError
from engine.errors import LayerflowError

COMMAND_MODULES = [
    core_cmds,  # validate, summary, train
    interop_cmds,  # export (--onnx/--script), import (.onnx, module:pkg.mod:Class)
    model_cmds,  # weights use/list (a run's weights as the project's), predict
    data_cmds,  # data inspect, data pack, data use
    remote_cmds,  # cluster, deploy, jobs, status, logs, cancel, fetch
    dist_cmds,  # plan (distributed placement, --auto)
    diff_cmds,  # diff, merge, resolve, git-setup
    sweep_cmds,  # sweep (many runs queued), runs (a table of runs)
    track_cmds,  # TensorBoard / MLflow copies of runs
    gui_cmds,  # (bare) editor, open, screenshot
]

__all__ = ["COMMAND_MODULES", "CliError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="layerflow",
        description="Layerflow: draw a network, place it on devices, train it here or on a cluster.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    p = sub.add_parser("trust", help="allow a project's (or a run folder's) own code (Custom layers' imports) "
                                     "to run; remembered in your config folder for this exact set of imports")
    p.add_argument("project", help="a .lflow file, or a run folder (its run.json and project.lflow)")
    p.set_defaults(func=cmd_trust)
    return parser


def _consent(project_path: str | None, given: bool, once: bool = False):
    """Allow the project's code paths if the user trusted them before (or does now, --trust;
    or for this command only, --trust-once: the app's own runs of a project it trusts)."""
    import contextlib

    from engine import trust
    from engine.project import load_project

    if not project_path or not isinstance(project_path, str) or not os.path.isfile(project_path):
        return contextlib.nullcontext()
    paths = trust.needs_consent(load_project(project_path))
    if once and paths:
        return trust.allowing(paths)
    if given and paths:
        trust.trust(project_path, paths)
    if paths and trust.is_trusted(project_path, paths):
        return trust.allowing(paths)
    return contextlib.nullcontext()


def cmd_trust(args) -> int:
    from engine import trust
    from engine.project import load_project

    if os.path.isdir(args.project) and os.path.isfile(os.path.join(args.project, "run.json")):
        return _trust_run_folder(args.project)
    paths = trust.needs_consent(load_project(args.project))
    if not paths:
        print(f"{args.project}: runs no code of its own (only torch layers and ATen operators) and reads no file "
              "outside its folder; nothing to trust")
        return 0
    trust.trust(args.project, paths)
    code, files = trust.split(paths)
    print(f"{args.project}: trusted")
    if code:
        print("  these imports may now run when it is compiled, trained or exported:")
        print("\n".join(f"    {p}" for p in code))
    if files:
        print("  these files outside its folder may now be read:")
        print("\n".join(f"    {p}" for p in files))
    return 0


def _trust_run_folder(run_dir: str) -> int:
    from engine import trust

    paths = trust.trust_run_folder(run_dir)
    if not paths:
        print(f"{run_dir}: its model runs no code of its own (only torch layers and ATen operators); nothing to trust")
        return 0
    print(f"{run_dir}: trusted")
    print("  these imports may now run when it is resumed:")
    print("\n".join(f"    {p}" for p in paths))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    consent = "--trust" in argv  # any command: run the project's own code (Custom layers), and remember it
    once = "--trust-once" in argv  # the same for this command only, remembered nowhere (the app's runs)
    argv = [a for a in argv if a not in ("--trust", "--trust-once")]
    if argv and argv[0].endswith(".lflow") and gui_cmds in COMMAND_MODULES:
        argv.insert(0, "open")  # `layerflow FILE.lflow` opens it, as a desktop file association does
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        if gui_cmds in COMMAND_MODULES:
            return gui_cmds.default(args)
        parser.print_help()
        return 0
    # what the user said, for a command that opens more than its project (train --resume RUN_DIR)
    args.consent_given, args.consent_once = consent, once
    try:
        with _consent(getattr(args, "project", None), consent, once):
            return int(args.func(args) or 0)
    except LayerflowError as exc:  # CliError, ProjectError, RunError, SSHError, ...: one line each
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `layerflow status JOB | head -1`: the reader left; not an error of ours
        try:
            sys.stdout = open(os.devnull, "w")  # nothing more reaches the closed pipe at exit
        except OSError:
            pass
        return 0
    except (OSError, RecursionError, UnicodeError, ValueError) as exc:
        line = _last_net(exc, args)
        if line is None:  # a ValueError of ours (a bug): its traceback is what a report needs
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2


def _last_net(exc: BaseException, args) -> str | None:
    """One line for what escaped a command without a message of its own: a file the
    system would not read or write (a full disk, a name too long, a symlink loop, a NUL
    byte in a path), text that is not Unicode, values nested past Python's recursion
    limit. Named by the path at fault, else by the command's file."""
    from engine.files import os_error_text

    where = next((str(v) for v in (getattr(args, k, None) for k in ("project", "source", "output", "path"))
                  if isinstance(v, str)), None) or args.command
    if isinstance(exc, OSError):
        files = [f for f in (exc.filename, exc.filename2) if f is not None]
        shown = " -> ".join(_short(os.fsdecode(f) if isinstance(f, bytes) else str(f)) for f in files)
        if shown:
            return f"{shown}: {os_error_text(exc)}"
        out = next((str(v) for v in (getattr(args, k, None) for k in ("out", "output")) if isinstance(v, str)), None)
        doing = f"writing {_short(out)}" if out else "on a file it read or wrote"
        return f"{_short(where)}: `{args.command}` stopped {doing}: {os_error_text(exc)}"
    if isinstance(exc, RecursionError):
        return (f"{where}: values nested too deeply to read (past Python's recursion limit); "
                "a project's params and metadata nest a few levels, not hundreds")
    if isinstance(exc, UnicodeEncodeError):
        bad, start = exc.object, exc.start
        what = f" {bad[start]!r} in {bad[max(0, start - 20):start + 20]!r}" if start < len(bad) else ""
        return (f"{where}: holds text that cannot be written as UTF-8{what} (a lone surrogate); "
                "replace that character in the project (its name, a description)")
    if isinstance(exc, UnicodeError):
        return f"{where}: holds bytes that are not UTF-8 text ({exc}); save it as UTF-8"
    if "null byte" in str(exc) or "null character" in str(exc):
        return f"{where}: a path in it holds a NUL byte (\\0), which no file name may hold; fix that path"
    return None


def _short(path: str, most: int = 160) -> str:
    """A path as a line can show it: a 4,000-byte one as its start and end."""
    return path if len(path) <= most else f"{path[:most // 2]}...{path[-most // 2:]}"
