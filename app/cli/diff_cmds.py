"""diff, merge, resolve, git-setup: projects that travel between people (engine/diff.py).

    layerflow diff A.lflow B.lflow          what changed, by meaning
    layerflow diff P.lflow [--rev REV]      the working file against git's HEAD (or REV)
    layerflow merge BASE OURS THEIRS [-o OUT]   three-way merge; exit 1 if conflicts remain
    layerflow resolve P.lflow [N] --ours|--theirs   settle conflict N (or all)
    layerflow git-setup [DIR]               git diffs and merges .lflow files with these
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from app.cli.cli_errors import CliError
from engine.diff import at_revision, conflict_lines, diff_projects, merge_projects, resolve_conflict, show_value
from engine.project import ProjectError, editing, load_project, loads_project, save_project

ATTRIBUTES_LINE = "*.lflow diff=layerflow merge=layerflow"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="what changed between two projects (or a project and a git revision), by meaning")
    p.add_argument("project", help="the project (A: the older side when B is given)")
    p.add_argument("other", nargs="?", help="B, the newer side; omitted: the project against git's --rev of it")
    p.add_argument("--rev", default=None, help="git revision to compare the project with (default HEAD)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("merge", help="three-way merge of two edits of a project; exit 1 if conflicts are left "
                                     "(recorded in the file, which still opens)")
    p.add_argument("base", help="the common ancestor ('' or a missing file: none)")
    p.add_argument("ours")
    p.add_argument("theirs")
    p.add_argument("-o", "--out", help="where to write the result (default: OURS, as git's merge drivers do)")
    p.add_argument("--name", default=None, help="the file's name in messages (git passes its path)")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("resolve", help="list or settle a project's merge conflicts")
    p.add_argument("project")
    p.add_argument("item", nargs="?", type=int, help="conflict number (from the list); omitted: all")
    side = p.add_mutually_exclusive_group()
    side.add_argument("--ours", action="store_const", dest="side", const="ours", help="keep the value in the file")
    side.add_argument("--theirs", action="store_const", dest="side", const="theirs", help="take the other side's")
    p.set_defaults(func=cmd_resolve, side=None)

    p = sub.add_parser("git-setup", help="make git diff and merge .lflow files by meaning (this repository)")
    p.add_argument("repo", nargs="?", default=".", help="a folder inside the git repository (default: here)")
    p.set_defaults(func=cmd_git_setup)

    # git's external diff driver calls: path old-file old-hex old-mode new-file new-hex new-mode
    p = sub.add_parser("git-diff-driver")
    p.add_argument("args", nargs="*")
    p.set_defaults(func=cmd_git_diff_driver)


def _git(args: list[str], cwd: Path) -> str:
    from engine.diff import git

    return git(args, cwd)


def cmd_diff(args) -> int:
    if args.other and args.rev:
        raise CliError("give another project or --rev, not both")
    if args.other:  # `diff A B`: from A to B, as diff(1) reads
        old, new = load_project(args.project), load_project(args.other)
        old_label, new_label = args.project, args.other
    else:
        old, new = at_revision(Path(args.project), args.rev or "HEAD"), load_project(args.project)
        old_label, new_label = f"{args.project}@{args.rev or 'HEAD'}", args.project
    d = diff_projects(old, new)
    if args.json:
        print(json.dumps(d.to_json(), indent=2, default=str))
    else:
        print(f"--- {old_label}\n+++ {new_label}")
        print(d.text())
    return 0 if d.empty else 1


def _load_or_none(path: str):
    if not path or not os.path.exists(path) or os.path.getsize(path) == 0:
        return None  # git's %O of a file both sides added
    return load_project(path)


def cmd_merge(args) -> int:
    name = args.name or args.ours
    with editing(args.out or args.ours):  # ours is read and written over: others wait their turn
        base = _load_or_none(args.base)
        ours, theirs = load_project(args.ours), load_project(args.theirs)
        result = merge_projects(base, ours, theirs)
        merged = loads_project(json.dumps(result.project), name)
        save_project(merged, args.out or args.ours)
    if result.clean:
        print(f"{name}: merged cleanly")
        return 0
    print(f"{name}: merged with {len(result.conflicts)} conflict(s), recorded in the file (ours kept for now); "
          f"`layerflow resolve {name}` lists them", file=sys.stderr)
    for i, c in enumerate(result.conflicts, 1):
        print(f"  {i}. {c.what}: ours {show_value(c.ours)}, theirs {show_value(c.theirs)}", file=sys.stderr)
    return 1


def cmd_resolve(args) -> int:
    with editing(args.project):  # a read-modify-write: it takes turns with the other commands and the editor
        return _resolve(args, load_project(args.project))


def _resolve(args, project) -> int:
    if not project.conflicts:
        print(f"{args.project}: no merge conflicts")
        return 0
    if args.side is None:
        if args.item is not None:
            raise CliError("say which side to take: --ours or --theirs")
        print("\n".join(conflict_lines(project)))
        return 1
    items = [args.item] if args.item is not None else list(range(len(project.conflicts), 0, -1))
    for n in sorted(items, reverse=True):  # from the last: earlier numbers stay valid
        resolve_conflict(project, n - 1, args.side)
    save_project(project)
    left = len(project.conflicts)
    print(f"{args.project}: took {args.side} for {len(items)} conflict(s)" + (f"; {left} left" if left else ""))
    return 0


def _self_command() -> str:
    """How git runs this Layerflow: this interpreter on this checkout's main.py (or the app module)."""
    main = Path(__file__).resolve().parents[2] / "main.py"
    if main.is_file():
        return f"{shlex.quote(sys.executable)} {shlex.quote(str(main))}"
    return f"{shlex.quote(sys.executable)} -c 'import sys; from app.cli import main; sys.exit(main())'"


def cmd_git_setup(args) -> int:
    folder = Path(args.repo).resolve()
    top = Path(_git(["rev-parse", "--show-toplevel"], folder).strip())
    me = _self_command()
    _git(["config", "diff.layerflow.command", f"{me} git-diff-driver"], top)
    _git(["config", "merge.layerflow.name", "Layerflow three-way project merge"], top)
    _git(["config", "merge.layerflow.driver", f"{me} merge %O %A %B --name %P"], top)
    attrs = top / ".gitattributes"
    lines = attrs.read_text().splitlines() if attrs.exists() else []
    if ATTRIBUTES_LINE not in lines:
        attrs.write_text("\n".join([*lines, ATTRIBUTES_LINE]) + "\n")
        print(f"{attrs}: added `{ATTRIBUTES_LINE}` (commit it so teammates get it)")
    print(f"{top}: git now diffs and merges .lflow files with Layerflow (git config diff.layerflow.command, "
          "merge.layerflow.driver); each teammate runs `layerflow git-setup` once in their clone")
    return 0


def cmd_git_diff_driver(args) -> int:
    a = args.args
    if len(a) < 7:
        print("git-diff-driver: git passes path old-file old-hex old-mode new-file new-hex new-mode", file=sys.stderr)
        return 2
    path, old, new = a[0], a[1], a[4]

    def side(f, label):
        if f == "/dev/null":
            return None
        return loads_project(Path(f).read_bytes(), label)

    try:
        before, after = side(old, f"a/{path}"), side(new, f"b/{path}")
    except ProjectError as exc:
        print(f"{path}: {exc}")
        return 0
    print(f"layerflow diff a/{path} b/{path}")
    if before is None or after is None:
        print(f"{'new' if before is None else 'deleted'} project ({len((after or before).graph.nodes)} nodes)")
        return 0
    print(diff_projects(before, after).text())
    return 0  # git stops at the first external diff that fails
