"""Formats other tools read: a run's metrics as TensorBoard event files, MLflow runs.

    track mlflow RUN_DIR... [--uri URI] [--experiment NAME] [--follow]
        copy runs (settings, metrics, system metrics, end state) to an MLflow tracking
        store; again later, only what is new (engine/runs/tracking.py); --follow: until they end
    track tensorboard RUN_DIR...
        write the TensorBoard event files of runs that have none (runs made before, or
        where tensorboard was not installed); runs write their own as they train
    track uri [URI | --clear]
        the MLflow tracking URI used when neither --uri nor $MLFLOW_TRACKING_URI says one
        (a user setting; the GUI logs its runs there too)
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from app.cli.cli_errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("track", help="copy runs to MLflow, or write their TensorBoard files")
    tsub = p.add_subparsers(dest="track_command", metavar="{mlflow,tensorboard,uri}")
    tsub.required = True

    m = tsub.add_parser("mlflow", help="log runs (settings, metrics, system metrics) to an MLflow tracking store")
    m.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    m.add_argument("--uri", help="tracking URI: http://host:5000 or sqlite:///path.db "
                                 "(default: $MLFLOW_TRACKING_URI, else `track uri`'s setting)")
    m.add_argument("--experiment", help="MLflow experiment (default: the project's name)")
    m.add_argument("--follow", action="store_true", help="keep copying running runs until they end")
    m.add_argument("--interval", type=float, default=5.0, help="seconds between copies with --follow")
    m.set_defaults(func=cmd_mlflow)

    t = tsub.add_parser("tensorboard", help="write TensorBoard event files of finished runs that have none")
    t.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    t.set_defaults(func=cmd_tensorboard)

    u = tsub.add_parser("uri", help="show or set the MLflow tracking URI runs are logged to")
    u.add_argument("uri", nargs="?")
    u.add_argument("--clear", action="store_true", help="log runs to MLflow no more (unless --uri or the variable says)")
    u.set_defaults(func=cmd_uri)


def saved_uri() -> str | None:
    from engine.runs.tracking import saved_uri

    return saved_uri()


def mlflow_uri(explicit: str | None = None) -> str | None:
    """--uri, else $MLFLOW_TRACKING_URI, else the user setting; None: no MLflow."""
    from engine.runs.tracking import resolve_uri

    return resolve_uri(explicit) or saved_uri()


def start_mlflow(run_dir, explicit: str | None = None, interval: float = 5.0):
    """`train`'s hook (--mlflow URI): the run folder copied to MLflow as it trains, when a
    tracking URI is set (--mlflow, $MLFLOW_TRACKING_URI, or the saved one); a started
    engine.runs.tracking.MlflowFollower (stop() it when training ends: its last copy), or None.
    A URI that cannot be used is one CliError line, before any training starts."""
    import sys

    from engine.runs.tracking import MlflowFollower, TrackingError

    uri = mlflow_uri(explicit)
    if not uri:
        return None
    try:
        follower = MlflowFollower(run_dir, uri, interval=interval).start()
    except TrackingError as exc:
        raise CliError(str(exc)) from None
    print(f"MLflow: logging to {uri}", file=sys.stderr)
    return follower


def cmd_mlflow(args) -> int:
    from engine.runtime.records import RunStatus
    from engine.runs.tracking import MlflowSync

    uri = mlflow_uri(args.uri)
    if not uri:
        raise CliError("no MLflow tracking URI: give --uri (http://host:5000 or sqlite:///path.db), "
                       "set MLFLOW_TRACKING_URI, or save one with `layerflow track uri URI`")
    syncs = []
    for d in args.run_dirs:
        d = Path(d)
        if not (d / "metrics.jsonl").exists() and not (d / "run.json").exists():
            raise CliError(f"{d}: not a run folder (no run.json or metrics.jsonl)")
        syncs.append(MlflowSync(d, uri, args.experiment))
    left = list(syncs)
    while left:
        for s in list(left):
            n = s.sync()
            st = RunStatus.read(s.run_dir)
            done = s.ended or not args.follow or (st is not None and st.done)
            if done:
                left.remove(s)
                exp = s.client.get_experiment(s.state()["experiment_id"]).name
                print(f"{s.run_dir.name}: MLflow run {s.run_id} in experiment {exp!r} at {uri} "
                      f"({n} new values{'' if s.ended else ', the run has not ended'})")
        if left:
            time.sleep(max(args.interval, 0.1))
    return 0


def cmd_tensorboard(args) -> int:
    import json

    from engine.runtime.tensorboard import TensorBoardLog
    from engine.runs.tail import read_metrics

    for d in args.run_dirs:
        d = Path(d)
        if not (d / "metrics.jsonl").exists():
            raise CliError(f"{d}: not a run folder (no metrics.jsonl)")
        if list(d.glob("events.out.tfevents.*")):
            print(f"{d.name}: has TensorBoard files already")
            continue
        try:
            run_json = json.loads((d / "run.json").read_text())
        except (OSError, ValueError):
            run_json = {}
        missing = []
        tb = TensorBoardLog.open(d, run_json, log=missing.append)
        if tb is None:
            raise CliError(missing[0] if missing else "TensorBoard files are turned off (LAYERFLOW_TENSORBOARD=0)")
        recs = read_metrics(d / "metrics.jsonl")
        for r in recs:
            tb.write(r)
        tb.close()
        print(f"{d.name}: {len(recs)} records written as TensorBoard scalars (tensorboard --logdir {d.parent})")
    return 0


def cmd_uri(args) -> int:
    from engine.runs.tracking import save_uri, saved_uri

    if args.clear:
        save_uri(None)
        print("MLflow: off (no saved tracking URI)")
    elif args.uri:
        save_uri(args.uri)
        print(f"MLflow tracking URI: {args.uri}")
    else:
        print(saved_uri() or "(none)")
    return 0
