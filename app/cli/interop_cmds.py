"""export (ONNX, PyTorch script) and import (ONNX file, nn.Module by import path)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.cli.cli_errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write the project's model as ONNX and/or a standalone PyTorch training script")
    p.add_argument("project")
    p.add_argument("--onnx", metavar="FILE", help="ONNX file to write (dynamic batch dimension)")
    p.add_argument("--script", metavar="FILE", help="standalone training script to write (torch only)")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default 20)")
    p.add_argument("--run", metavar="RUN_DIR", help="carry this run's trained weights (default: the project's own "
                                                    "weights file, else its initial weights)")
    p.add_argument("--checkpoint", metavar="WHICH", help="with --run: final (model.pt), latest, best or step_N; "
                                                         "default final, else latest")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("import", help="make a project from MODEL.onnx or module:pkg.mod:Class, with its weights")
    p.add_argument("source", help="an .onnx file, or module:package.module:Class")
    p.add_argument("-o", "--output", required=True, metavar="PROJECT", help="project file to write (.lflow)")
    p.add_argument("--kwargs", default="{}", help="module import: constructor keyword arguments as JSON")
    p.add_argument("--input-shape", action="append", default=[], metavar="3,32,32",
                   help="module import: shape of one input without the batch (repeat for several inputs)")
    p.add_argument("--input-dtype", action="append", default=[], choices=("float32", "int64"),
                   help="module import: dtype of each input (default float32)")
    p.add_argument("--direction", choices=("LR", "TB"),
                   help="lay the diagram out left to right (LR) or top down (TB); default: as the file has it, else LR")
    p.add_argument("--force", action="store_true", help="overwrite an existing project file")
    p.set_defaults(func=cmd_import)


def cmd_export(args) -> int:
    from engine.runs.weights import checkpoint_path
    from layerflow import Project

    if not args.onnx and not args.script:
        raise CliError("say what to write: --onnx FILE and/or --script FILE")
    if args.checkpoint and not args.run:
        raise CliError("--checkpoint names one of a run's checkpoints: give the run too (--run RUN_DIR)")
    project = Project.load(args.project)
    what = ""
    if args.run:
        name, _ = checkpoint_path(args.run, args.checkpoint)
        what = f" (weights of {Path(args.run).name}, {name})"
    if args.onnx:
        print(f"wrote {project.export_onnx(args.onnx, opset=args.opset, run=args.run, checkpoint=args.checkpoint)}{what}")
    if args.script:
        print(f"wrote {project.export_script(args.script, run=args.run, checkpoint=args.checkpoint)}{what}")
    return 0


def _shape(text: str) -> list[int]:
    try:
        dims = [int(s) for s in text.replace("x", ",").split(",") if s.strip()]
    except ValueError:
        raise CliError(f"--input-shape '{text}' must be sizes separated by commas, e.g. 3,32,32") from None
    if not dims or any(d <= 0 for d in dims):
        raise CliError(f"--input-shape '{text}' must list positive sizes")
    return dims


def cmd_import(args) -> int:
    from engine.interop import InteropError, import_module, import_onnx, save_imported

    out = Path(args.output)
    if out.exists() and not args.force:
        raise CliError(f"{out} exists; pass --force to overwrite it")
    try:
        if args.source.startswith("module:"):
            try:
                kwargs = json.loads(args.kwargs)
            except json.JSONDecodeError as exc:
                raise CliError(f"--kwargs is not valid JSON: {exc.msg} at column {exc.colno}") from None
            if not isinstance(kwargs, dict):
                raise CliError("--kwargs must be a JSON object, e.g. '{\"width\": 64}'")
            imported = import_module(args.source[len("module:"):], kwargs, [_shape(s) for s in args.input_shape],
                                     args.input_dtype or None, name=out.stem)
        else:
            imported = import_onnx(args.source, name=out.stem)
        if args.direction and args.direction != imported.project.graph.direction:
            from engine.diagram.layout import set_direction

            set_direction(imported.project.graph, args.direction)
        path = save_imported(imported, out)
    except InteropError as exc:
        raise CliError(str(exc)) from None
    for note in imported.notes:
        print(f"note: {note}", file=sys.stderr)
    n = len(imported.project.graph.nodes)
    short = "; not all of the source's: see the note on what is left out" if imported.project.left_out else ""
    print(f"wrote {path} ({n} nodes, {imported.n_params:,} parameters{short}) and {imported.project.weights}")
    return 0
