"""A run's model: weights (use a run's weights as the project's), predict (run it on inputs).

Export from a run is `export PROJECT --run RUN_DIR` (app/cli/interop_cmds.py) and fine-tuning
`train PROJECT --init-from RUN_DIR[:checkpoint]` (app/cli/core_cmds.py); all of them read the
run's weights through engine/runs/weights.py."""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from app.cli.cli_errors import CliError

CHECKPOINT_HELP = ("which weights of the run: final (model.pt), latest, best (by training.best_metric) or step_N; "
                   "default final, else latest")


def add_checkpoint_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", metavar="WHICH", help=CHECKPOINT_HELP)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("weights", help="a project's weights: `weights use PROJECT RUN_DIR` makes a run's its own")
    wsub = p.add_subparsers(dest="weights_command", metavar="ACTION", required=True)
    u = wsub.add_parser("use", help="copy a run's weights beside the project (NAME.weights.pt) and make the "
                                    "project name them: later runs start from them, exports carry them")
    u.add_argument("project")
    u.add_argument("run", metavar="RUN_DIR")
    add_checkpoint_flag(u)
    u.set_defaults(func=cmd_weights_use)
    s = wsub.add_parser("list", help="the checkpoints a run offers (final, latest, best, step_N)")
    s.add_argument("run", metavar="RUN_DIR")
    s.set_defaults(func=cmd_weights_list)

    p = sub.add_parser("predict", help="run a trained model (a run's weights) on inputs: .npy, .npz, an image or "
                                       "a folder of images")
    p.add_argument("project")
    p.add_argument("--run", metavar="RUN_DIR", help="the run whose weights to use (default: the project's own)")
    add_checkpoint_flag(p)
    p.add_argument("--input", "-i", required=True, metavar="FILE", help=".npy, .npz, an image file or a folder")
    p.add_argument("-o", "--output", metavar="OUT.npy", help="write the outputs (N x ...) as .npy")
    p.add_argument("--top", type=int, default=3, metavar="K", help="classifier: classes printed per input (3)")
    p.add_argument("--batch-size", type=int, default=256, help="samples per forward (256)")
    p.set_defaults(func=cmd_predict)


@contextlib.contextmanager
def _interop_errors():
    from engine.interop import InteropError

    try:
        yield
    except InteropError as exc:
        raise CliError(str(exc)) from None


def cmd_weights_use(args) -> int:
    from engine.runs.weights import use_run_weights

    with _interop_errors():
        wpath, name = use_run_weights(args.project, args.run, args.checkpoint)
    print(f"wrote {wpath} ({Path(args.run).name}, {name}); {Path(args.project).name} now names it as its weights")
    return 0


def cmd_weights_list(args) -> int:
    from engine.runs.weights import available_checkpoints, checkpoint_path

    with _interop_errors():
        have = available_checkpoints(args.run)
        for c in have:
            name, _ = checkpoint_path(args.run, c)
            print(c if name == c else f"{c} -> {name}")
    if not have:
        print(f"{Path(args.run).name}: no weights yet", file=sys.stderr)
        return 1
    return 0


def cmd_predict(args) -> int:
    import numpy as np

    from engine.runs.weights import (
        class_names,
        predict,
        read_inputs,
        top_classes,
    )
    from engine.project import atomic_write
    from layerflow import Project

    if args.batch_size < 1 or args.top < 1:
        raise CliError("--batch-size and --top must be at least 1")
    project = Project.load(args.project)
    core = project._runnable()
    with _interop_errors():
        inputs, labels = read_inputs(core, args.input)
        out = predict(core, inputs, args.run, args.checkpoint, batch_size=args.batch_size)
    if args.output:
        import io

        buf = io.BytesIO()
        np.save(buf, out, allow_pickle=False)
        atomic_write(Path(args.output), buf.getvalue())
        print(f"wrote {args.output} ({' x '.join(map(str, out.shape))})", file=sys.stderr)
    classifier = core.graph.nodes and _is_classifier(core)
    if classifier and out.ndim == 2:
        names = class_names(core, out.shape[1])
        for label, top in zip(labels, top_classes(out, args.top)):
            print(f"{label}: " + ", ".join(f"{names[j]} {p:.1%}" for j, p in top))
    elif not args.output:
        with np.printoptions(precision=4, suppress=True, linewidth=120, threshold=200):
            for label, row in zip(labels, out):
                print(f"{label}: {row}")
    return 0


def _is_classifier(project) -> bool:
    from engine.diagram.compile import compile_graph

    result = compile_graph(project.graph)
    return result.ok and result.loss() == "cross_entropy"


@contextlib.contextmanager
def init_from(project, source: str | None):
    """train --init-from RUN_DIR[:WHICH]: a copy of the project that starts from the run's
    weights (engine/runs/weights.py init_from); the project itself without it."""
    from engine.runs.weights import init_from as _init_from

    if not source:
        yield project
        return
    with _interop_errors():
        cm = _init_from(project, source)
        start = cm.__enter__()
    print(f"initial weights: {start.weights_origin}", file=sys.stderr)
    try:
        yield start
    except BaseException:
        if not cm.__exit__(*sys.exc_info()):
            raise
    else:
        cm.__exit__(None, None, None)
