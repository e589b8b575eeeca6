"""data inspect, data pack, data use: data sets read in place, from the command line.

    layerflow data inspect photos/ --preview-dir previews/   samples, shapes, classes, samples/s
    layerflow data pack corpus.txt tokens/                   text -> train.bin, val.bin, meta.json
    layerflow data use model.lflow tokens/ --fit             training.dataset; the Input follows

The work is the Python API's (layerflow/data.py); errors are one line naming the file and
sample or row (lf.DataError, a LayerflowError app/cli/__init__.py prints).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from app.cli.cli_errors import CliError

KINDS = ("image_folder", "token_file", "parquet", "array", "shards")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="look at a data set, pack one, or point a project at one")
    data = p.add_subparsers(dest="data_command", metavar="ACTION")
    p.set_defaults(func=lambda args: _no_action(p))

    q = data.add_parser("inspect", help="samples per split, shapes and dtypes, classes (a histogram), examples, "
                                        "and the loader's samples/s")
    q.add_argument("path", help="an image folder, token files (.bin), .parquet/.arrow, .npz or .npy folder, "
                                ".tar shards")
    _add_settings(q)
    q.add_argument("--samples", type=int, default=4, metavar="N", help="examples to show (default 4)")
    q.add_argument("--preview-dir", metavar="DIR", help="write the example images there as PNGs (plain and "
                                                       "augmented)")
    q.add_argument("--seconds", type=float, default=1.5, help="how long to time the loader (default 1.5)")
    q.add_argument("--workers", type=int, default=0, help="loader workers to time (default 0)")
    q.add_argument("--batch-size", type=int, default=32, help="batch size to time (default 32)")
    q.add_argument("--strict", action="store_true", help="stop at the first unreadable sample (default: list it "
                                                         "and go on, as training does)")
    q.add_argument("--json", action="store_true", help="print the report as JSON")
    q.set_defaults(func=cmd_inspect)

    q = data.add_parser("pack", help="text -> token files, an image folder -> tar shards, .npz/.csv -> .npy")
    q.add_argument("source", nargs="+", metavar="SRC", help="text files (or a folder of .txt), an image folder, "
                                                            "an .npz or a .csv")
    q.add_argument("out", metavar="OUT", help="the folder to write")
    q.add_argument("--tokenizer", metavar="FILE", help="text: a tokenizer.json (default: byte-level, 256 ids)")
    q.add_argument("--val-fraction", type=float, default=0.1, help="text: the last fraction of the tokens kept "
                                                                   "for validation (default 0.1)")
    q.add_argument("--shard-size", "--shards", dest="shard_size", type=int, default=1000, metavar="N",
                   help="image folder: samples per tar shard (default 1000)")
    q.add_argument("--target", default="-1", help=".csv: the label column, by name or index (default: the last)")
    q.add_argument("--no-header", action="store_true", help=".csv: the first row is data, not column names")
    q.add_argument("--as", dest="as_kind", choices=("token_file", "shards", "array"),
                   help="what to make, where the names do not say")
    q.add_argument("--quiet", action="store_true", help="no progress on stderr")
    q.set_defaults(func=cmd_pack)

    q = data.add_parser("use", help="point a project at a data set (training.dataset) and say where the diagram "
                                    "disagrees with it")
    q.add_argument("project", help="the .lflow file (saved in place, atomically)")
    q.add_argument("path", help="the data set (relative to the current folder)")
    _add_settings(q)
    q.add_argument("--fit", action="store_true", help="set the Input node's shape and dtype to the data's")
    q.set_defaults(func=cmd_use)


def _no_action(p) -> int:
    p.print_help()
    return 2


def _add_settings(q) -> None:
    q.add_argument("--kind", choices=KINDS, help="the data set's kind (default: from its file names)")
    q.add_argument("--image-size", type=int, help="images: the square side the model sees (default 224)")
    q.add_argument("--seq-len", type=int, help="tokens, Parquet: tokens per sample")
    q.add_argument("--inputs", metavar="COL[,COL]", help="Parquet: the input columns (default: input_ids and "
                                                         "attention_mask, or every numeric column)")
    q.add_argument("--target", dest="target_column", metavar="COL", help="Parquet: the target column")
    q.add_argument("--task", choices=("classification", "regression", "language_model", "multi_label"))
    q.add_argument("--val-fraction", type=float, help="the validation share where the data has no split")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other training.dataset setting (a JSON value), e.g. --set flip=false; repeatable")


def _settings(args) -> dict:
    out = {"image_size": args.image_size, "seq_len": args.seq_len, "target": args.target_column,
           "task": args.task, "val_fraction": args.val_fraction,
           "inputs": [c.strip() for c in args.inputs.split(",") if c.strip()] if args.inputs else None}
    for item in args.set:
        key, eq, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key:
            raise CliError(f"--set {item!r}: write KEY=VALUE, e.g. --set flip=false")
        if key in ("kind", "path"):
            raise CliError(f"--set {key}=...: give the {'kind with --kind' if key == 'kind' else 'path as PATH'}")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text  # a bare word: a string
    return {k: v for k, v in out.items() if v is not None}


def cmd_inspect(args) -> int:
    import layerflow.data as lfd

    report = lfd.inspect(args.path, args.kind, samples=args.samples, seconds=args.seconds,
                         batch_size=args.batch_size, workers=args.workers, strict=args.strict,
                         preview_dir=args.preview_dir, **_settings(args))
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print(report)
    return 0


class _Progress:
    """Progress of a long pack on stderr: one line rewritten in a terminal, else a line
    each 10% at most once a second; silent for the first second (a quick pack says nothing)."""

    def __init__(self, what: str, unit: str, quiet: bool = False):
        self.what, self.unit, self.quiet = what, unit, quiet
        self.t0 = self.last = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.shown = -1
        self.any = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.quiet or now - self.t0 < 1.0 or (now - self.last < (0.2 if self.tty else 1.0) and done < total):
            return
        pct = int(100 * done / total) if total else 100
        if not self.tty and pct // 10 == self.shown // 10 and done < total:
            return
        self.last, self.shown, self.any = now, pct, True
        line = f"{self.what}: {pct}% ({_amount(done, self.unit)} of {_amount(total, self.unit)})"
        sys.stderr.write(("\r" + line) if self.tty else line + "\n")
        sys.stderr.flush()

    def end(self) -> None:
        if self.any and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _amount(n: int, unit: str) -> str:
    if unit == "bytes":
        for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if n >= scale:
                return f"{n / scale:.1f} {name}"
        return f"{n} bytes"
    return f"{n:,} {unit}"


def cmd_pack(args) -> int:
    import layerflow.data as lfd

    if args.shard_size < 1:
        raise CliError(f"--shard-size must be at least 1, not {args.shard_size}")
    if not 0 < args.val_fraction < 1:
        raise CliError(f"--val-fraction must be between 0 and 1, not {args.val_fraction}")
    target: str | int = args.target
    try:
        target = int(args.target)
    except ValueError:
        pass
    kind = args.as_kind or lfd.pack_kind(args.source)
    unit = "images" if kind == "shards" else "bytes"
    progress = _Progress(f"packing {args.source[0]}" + (f" and {len(args.source) - 1} more" if len(args.source) > 1
                                                         else ""), unit, args.quiet)
    try:
        packed = lfd.pack(args.source, args.out, tokenizer=args.tokenizer, shard_size=args.shard_size,
                          val_fraction=args.val_fraction, target=target, header=not args.no_header,
                          as_kind=args.as_kind, progress=progress)
    finally:
        progress.end()
    print(packed)
    print(f"use it: layerflow data use PROJECT {packed.path}")
    return 0


def cmd_use(args) -> int:
    from pathlib import Path

    from engine import trust
    from engine.project import editing, load_project, save_project
    from layerflow.data import use_data

    with editing(args.project):  # a read-modify-write: it takes turns with the other commands and the editor
        project = load_project(args.project)
        before = trust.needs_consent(project)
        trusted_before = trust.is_trusted(project.path, before)
        used = use_data(project, args.path, args.kind, fit=args.fit, **_settings(args))
        save_project(project, project.path)
    print(f"{args.project}: {used}")
    for line in used.mismatches:
        print(f"warning: {line}", file=sys.stderr)
    data = Path(used.dataset["path"])
    after = trust.needs_consent(project)
    if after != before and after and trusted_before:  # the data moved in or out of the project's folder;
        trust.trust(project.path, after)  # all else was consented to, and the user named this path just now
        if data.is_absolute():
            print(f"  {data} is outside the project's folder: recorded your consent to read it for this project")
    elif data.is_absolute() and not trust.is_trusted(project.path, after):
        print(f"note: {data} is outside the project's folder; `layerflow trust {args.project}` before training",
              file=sys.stderr)
    return 0
