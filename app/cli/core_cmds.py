"""validate, summary, train."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.cli.cli_errors import CliError
from app.cli.placement_flags import add_placement_flags, check_counts, placement_flags
from engine.project import load_project
from layerflow import Project


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check a project: exit 0 if valid, else list every error")
    p.add_argument("project")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("summary", help="table of nodes, output shapes, parameters and FLOPs")
    p.add_argument("project")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_summary)

    p = sub.add_parser("train", help="train a project (this machine; --nproc N for several processes)")
    p.add_argument("project", nargs="?", help="the .lflow file (with --resume: optional, the run folder has its own)")
    p.add_argument("--steps", type=int, help="optimizer steps (overrides the project's steps/epochs)")
    p.add_argument("--out", help="run folder (default: <project folder>/runs/<name>-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    p.add_argument("--seed", type=int, help="random seed (overrides the project's)")
    p.add_argument("--accumulate", type=int, metavar="N",
                   help="one process: cut each batch into N micro-batches, one optimizer step "
                        "(sets training.grad_accumulation)")
    p.add_argument("--nproc", type=int, help="processes on this machine (default: dp*tp*pp of the placement)")
    p.add_argument("--restarts", type=int, metavar="N", help="several processes: start again by itself from the "
                   "latest checkpoint after a rank fails or hangs, at most N times (training.restarts; default 3; 0: never)")
    p.add_argument("--init-from", metavar="RUN_DIR[:WHICH]", help="fine-tune: start from this run's weights "
                   "(WHICH: final, latest, best or step_N; default final, else latest)")
    p.add_argument("--mlflow", metavar="URI", help="also log the run to this MLflow tracking URI as it trains "
                   "(a server or sqlite:///path.db; default $MLFLOW_TRACKING_URI, or `layerflow track uri`)")
    add_placement_flags(p)
    p.set_defaults(func=cmd_train)


def cmd_validate(args) -> int:
    from engine.errors import CheckFailed

    from engine.data.describe import check_synthetic

    project = Project.load(args.project)
    check_synthetic(project.training.dataset)  # sizes whose arrays would not fit: named before train tries
    try:
        warnings = project.validate()
    except CheckFailed as exc:
        for w in exc.warnings:
            print(f"warning: {w}", file=sys.stderr)
        for e in exc.errors:
            print(f"error: {e}", file=sys.stderr)
        print(f"{exc.what}: {len(exc.errors)} error(s)", file=sys.stderr)
        return 1
    for w in warnings:  # (the settings' own, an absurd weight decay among them, included)
        print(f"warning: {w}", file=sys.stderr)
    pl = project.placement
    world = pl.pp * pl.dp * pl.tp
    print(f"{args.project}: valid ({len(project.nodes)} nodes, {project.summary().total_params:,} parameters"
          + (f", {world} processes" if world > 1 else "") + ")")
    return 0


def cmd_summary(args) -> int:
    summary = Project.load(args.project).summary()
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        print(summary)
    for e in summary.errors if not args.json else ():
        print(f"error: {e}", file=sys.stderr)
    return 1 if summary.errors else 0


def cmd_train(args) -> int:
    from app.cli.model_cmds import init_from
    from layerflow.prepare import prepare_resume, prepare_training

    check_counts(args, "nproc", "steps", "accumulate")
    if getattr(args, "mlflow", None):  # a URI that cannot be used: one line before a run folder is made
        from engine.runs.tracking import TrackingError, check_uri

        try:
            check_uri(args.mlflow)
        except TrackingError as exc:
            raise CliError(str(exc)) from None
    if not args.resume and not args.project:
        raise CliError("train: give a project (.lflow), or --resume RUN_DIR")
    if args.resume:
        if args.init_from:
            raise CliError("--init-from starts a new run; a resumed run goes on from its own checkpoint")
        if args.accumulate is not None:
            raise CliError("--accumulate sets up a new run; a resumed run keeps its training.grad_accumulation")
        if args.restarts is not None:
            raise CliError("--restarts sets up a new run; a resumed run keeps its training.restarts")
        snapshot = Path(args.resume) / "project.lflow"
        if not snapshot.exists() and not args.project:
            raise CliError(f"--resume {args.resume}: no project.lflow in it; give the project too")
        project = load_project(snapshot if snapshot.exists() else args.project)
        # a run folder comes from a cluster or a colleague: its code runs only with consent, as a
        # project's, and its checkpoint is read only if it holds tensors (prepare_resume's gate)
        prep = prepare_resume(args.resume, nproc=args.nproc, steps=args.steps, placement=placement_flags(project, args),
                              trust_given=getattr(args, "consent_given", False),
                              trust_once=getattr(args, "consent_once", False))
    else:
        project = load_project(args.project)  # (a `runs` link out of its folder: refused in prepare_training)
        with init_from(project, args.init_from) as start:  # --init-from: the run's weights start this one
            prep = prepare_training(start, nproc=args.nproc, steps=args.steps, seed=args.seed, out=args.out,
                                    accumulate=args.accumulate, restarts=args.restarts,
                                    placement=placement_flags(project, args))
    for w in prep.warnings + [w for w in project.training.warnings() if w not in prep.warnings]:
        print(f"warning: {w}", file=sys.stderr)
    print(f"run folder: {prep.run_dir}", file=sys.stderr)
    from app.cli.track_cmds import start_mlflow

    follower = start_mlflow(prep.run_dir, getattr(args, "mlflow", None))  # None: no tracking URI set
    try:
        if prep.nproc > 1:
            return _train_multi(prep.run_dir, prep.nproc, resume=prep.resume)
        return _train_single(prep.run_dir, resume=prep.resume)
    finally:
        if follower is not None:
            follower.stop()  # its last copy: the final metrics and the run's end state


def _train_single(run_dir, resume: bool) -> int:
    from tqdm import tqdm

    from engine.runtime.train import run

    bar = None

    def progress(step: int, total: int, rec: dict) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, initial=step - 1, unit="step", file=sys.stderr, dynamic_ncols=True)
        bar.update(step - bar.n)
        bar.set_postfix(loss=f"{rec['loss']:.4f}", refresh=False)
        if "val_loss" in rec:
            extra = f" val_acc {rec['val_acc']:.4f}" if "val_acc" in rec else ""
            bar.write(f"step {step}/{total}  loss {rec['loss']:.4f}  val_loss {rec['val_loss']:.4f}{extra}", file=sys.stderr)

    try:
        status = run(run_dir, resume=resume, progress=progress)
    except (ValueError, OSError, FloatingPointError) as exc:  # OSError: a missing file, a full disk
        raise CliError(f"training failed: {exc} (log: {run_dir / 'logs' / 'rank0.log'})") from None
    finally:
        if bar is not None:
            bar.close()
    print(f"{status.state}: {status.step}/{status.total_steps} steps; run folder {run_dir}")
    return 0 if status.ok else 1


def _train_multi(run_dir, nproc: int, resume: bool) -> int:
    try:
        from remote.launch.local import (
            launch_local,  # the distributed runtime's local launcher
        )
    except ImportError:
        raise CliError(f"training on {nproc} processes needs the distributed runtime, which this build lacks") from None
    job = launch_local(run_dir, nproc, resume=resume)
    return job.wait_with_progress()
