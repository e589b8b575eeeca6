"""GUI commands: bare `python main.py` (the editor with the last project or the
bundled example), `open PROJECT`, `screenshot PROJECT -o FILE.png`, which renders
the real main window offscreen and exits (how docs and checks see the app), and
`layout PROJECT`, the editor's auto-layout without a window.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
from pathlib import Path

from app.cli.cli_errors import CliError
from engine import trust


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("open", help="open a project in the editor")
    p.add_argument("project")
    p.set_defaults(func=cmd_open)

    p = sub.add_parser("layout", help="lay a project's diagram out (layered, blocks as units), in place or to -o")
    p.add_argument("project")
    p.add_argument("-o", "--output", help="write here instead of over PROJECT")
    p.add_argument("--direction", choices=("LR", "TB"),
                   help="data flows left to right (LR) or top down (TB); saved in the project (default: as it is)")
    p.set_defaults(func=cmd_layout)

    p = sub.add_parser("screenshot", help="render the main window with a project to a PNG, offscreen")
    p.add_argument("project")
    p.add_argument("-o", "--output", required=True, help="PNG file to write")
    p.add_argument("--theme", choices=("light", "dark"), default="light")
    p.add_argument("--size", default="1600x1000", help="window size WxH (default 1600x1000)")
    p.add_argument("--select", help="node to select (shown in the inspector)")
    p.add_argument("--zoom", type=float, help="zoom in percent (default: fit, but at least 60%% from the left)")
    p.add_argument("--run", help="a run folder to show in the run dashboard (needs the dashboard)")
    p.add_argument("--workspace", choices=("Design", "Place", "Train", "Compare"),
                   help="the workspace to show (default: Design; with --run, Train)")
    p.set_defaults(func=cmd_screenshot)


def _app(offscreen: bool = False):
    if offscreen or (sys.platform.startswith("linux") and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Layerflow")
    app.setOrganizationName("Layerflow")
    return app


def _start_path(path: str | None) -> str | None:
    """The file to open first: the given one, else the last one, else the example."""
    from app.main_window import EXAMPLE
    from app.settings import Settings

    if path:
        if not Path(path).exists():
            raise CliError(f"{path}: no such file")
        return path
    return next((c for c in (Settings().last_project(), str(EXAMPLE)) if c and Path(c).exists()), None)


def _run_window(project_path: str | None) -> int:
    app = _app()
    from app import gc_guard
    from app.window import MainWindow

    gc_guard.install(app)  # garbage collected from the event loop, at safe points

    path = _start_path(project_path)
    w = MainWindow()  # offers to recover a crashed session's work first
    w.show()
    # the bottom area opens on Problems (raised before the window was shown, the last dock
    # tabbed in, Changes, showed instead)
    w.problems_dock.raise_()
    if path and not w.is_dirty():
        # as File > Open does: a file that cannot be read is a message in the window, and a
        # project that names its own code asks before that code runs
        w.open_project(path)
    # What exists now (modules, classes, Qt wrappers: about 400,000 objects with torch)
    # lives as long as the app. Frozen, it is left out of the garbage collector's full
    # collections, each of which otherwise walks all of it and stalls the GUI: 270 ms
    # here with the example open (bench/plot_live.py freezes its setup the same way).
    # The price: a reference cycle among these objects is never freed (the example's
    # graph once another project is opened), a small leak against a stall per pass.
    gc.freeze()
    return app.exec()


def default(args) -> int:
    return _run_window(None)


def cmd_open(args) -> int:
    return _run_window(args.project)


def cmd_layout(args) -> int:
    """The editor's Auto-Layout, headless (pure Python: no Qt needed)."""
    from engine.diagram.layout import set_direction
    from engine.project import editing, load_project, save_project

    with editing(args.output or args.project):  # in place: a read-modify-write that takes turns with others
        project = load_project(args.project)
        set_direction(project.graph, args.direction or project.graph.direction)
        out = save_project(project, args.output or args.project)
    way = "top down" if project.graph.direction == "TB" else "left to right"
    print(f"laid out {len(project.graph.nodes)} nodes {way} -> {out}")
    return 0


def _frame(view, zoom: float | None) -> None:
    """Zoom in percent, or the editor's own first view (fit, but readable)."""
    view.frame_readable(zoom / 100.0 if zoom else None)


def cmd_screenshot(args) -> int:
    from engine.project import load_project

    try:
        w_px, h_px = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        raise CliError(f"--size must look like 1600x1000, not '{args.size}'") from None
    project = load_project(args.project)
    # The window is the editor, which runs what it shows (the user's own diagram): a project
    # file's code and outside files must have the user's consent first, as on every command.
    trust.require_consent(project, "a screenshot")
    if args.run:
        trust.check_run_folder(args.run, given=getattr(args, "consent_given", False),
                               once=getattr(args, "consent_once", False))
    # offscreen unless QT_QPA_PLATFORM says otherwise (xcb under Xvfb needs libxcb-cursor0)
    app = _app(offscreen=True)
    from app.settings import Settings

    # A throwaway config folder: no recovery prompt, the user's recent files and job
    # database untouched, nothing of theirs in the picture.
    saved_env = os.environ.get("LAYERFLOW_CONFIG_DIR")
    with tempfile.TemporaryDirectory(prefix="layerflow-shot-") as tmp:
        os.environ["LAYERFLOW_CONFIG_DIR"] = tmp
        try:
            return _shoot(app, project, args, w_px, h_px, Settings(Path(tmp)))
        finally:
            if saved_env is None:
                os.environ.pop("LAYERFLOW_CONFIG_DIR", None)
            else:
                os.environ["LAYERFLOW_CONFIG_DIR"] = saved_env


def _shoot(app, project, args, w_px: int, h_px: int, settings) -> int:
    from app.window import MainWindow

    w = MainWindow(project, settings=settings, recover=False)
    try:
        w.apply_theme(args.theme)
        w.resize(w_px, h_px)
        w.show()
        app.processEvents()
        w.default_dock_sizes()
        app.processEvents()
        w.controller.flush()
        if args.select:
            if args.select not in project.graph.nodes:
                raise CliError(f"--select: no node named '{args.select}' in {args.project}")
            w.scene.select_nodes([args.select])
        if args.run:
            try:
                w.open_run(args.run)
            except RuntimeError as exc:
                raise CliError(str(exc)) from None
        if getattr(args, "workspace", None):
            w.show_workspace(args.workspace)
            app.processEvents()
            w.default_dock_sizes()
        for _ in range(3):
            app.processEvents()
        _frame(w.view, args.zoom)
        w.view.minimap._render()
        app.processEvents()
        out = Path(args.output)
        from PySide6.QtCore import QBuffer, QIODevice

        from engine.files import atomic_write

        buf = QBuffer()
        buf.open(QIODevice.OpenModeFlag.WriteOnly)
        if not w.grab().save(buf, "PNG"):
            raise CliError(f"{out}: Qt could not encode the window as a PNG")
        atomic_write(out, bytes(buf.data()))  # (a full disk, a bad name: one line naming the file)
    finally:
        w.controller.stack.setClean()  # nothing to ask about on close
        w.close()
    print(f"wrote {out} ({w_px}x{h_px}, {args.theme})")
    return 0
