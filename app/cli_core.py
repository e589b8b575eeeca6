"""validate, summary, train."""
from __future__ import annotations

import argparse
import json
import sys

from app.cli_placement import PLACEMENT_FLAGS, add_placement_flags
from engine.compile import compile_graph
from engine.project import load_project
from engine.units import human


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check a project: exit 0 if valid, else list every error")
    p.add_argument("project")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("summary", help="table of nodes, output shapes, parameters and FLOPs")
    p.add_argument("project")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_summary)

    p = sub.add_parser("train", help="train a project (this machine; --nproc N for several processes)")
    p.add_argument("project")
    p.add_argument("--steps", type=int, help="optimizer steps (overrides the project's steps/epochs)")
    p.add_argument("--out", help="run folder (default: <project folder>/runs/<name>-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    p.add_argument("--seed", type=int, help="random seed (overrides the project's)")
    p.add_argument("--accumulate", type=int, metavar="N",
                   help="one process: cut each batch into N micro-batches, one optimizer step "
                        "(sets training.grad_accumulation)")
    p.add_argument("--nproc", type=int, help="processes on this machine (default: dp*tp*pp of the placement)")
    add_placement_flags(p)
    p.set_defaults(func=cmd_train)


def cmd_validate(args) -> int:
    project = load_project(args.project)
    if project.conflicts:
        from app.cli_diff import conflict_lines

        for line in conflict_lines(project):
            print(f"error: merge conflict {line}", file=sys.stderr)
        print(f"{args.project}: {len(project.conflicts)} merge conflict(s) left: settle them in the editor or with "
              f"`layerflow resolve {args.project} N --ours|--theirs`", file=sys.stderr)
        return 1
    result = compile_graph(project.graph)
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if result.errors:
        for e in result.errors:
            print(f"error: {e}", file=sys.stderr)
        print(f"{args.project}: {len(result.errors)} error(s)", file=sys.stderr)
        return 1
    pl = project.placement
    world = pl.pp * pl.dp * pl.tp
    # the placement must be runnable too (memory included): the planner's own checks
    from engine.planner import grouped, make_plan

    plan = make_plan(project, world, compiled=result)
    for w, _ in grouped(plan.warnings):
        print(f"warning: {w}", file=sys.stderr)
    if plan.errors:
        for e in plan.errors:
            print(f"error: {e}", file=sys.stderr)
        print(f"{args.project}: the diagram compiles but cannot run as placed: {len(plan.errors)} error(s)",
              file=sys.stderr)
        return 1
    print(f"{args.project}: valid ({len(project.graph.nodes)} nodes, {result.total_params:,} parameters"
          + (f", {world} processes" if world > 1 else "") + ")")
    return 0


def _check_fits(project) -> None:
    """One process: the planner's memory prediction against this machine, before anything
    is allocated (out_features 3e7 or a batch of 1e6 is refused with the numbers)."""
    from app.cli import CliError
    from engine.compile import compile_graph
    from engine.planner import make_plan

    result = compile_graph(project.graph)
    if not result.ok:
        return  # prepare_run names the diagram's errors
    plan = make_plan(project, 1, compiled=result)
    too_big = [e for e in plan.errors if " needs " in e and " device has " in e]
    if too_big:
        raise CliError(too_big[0].replace("raise pp or tp, use data_parallel fsdp, or raise microbatches",
                                          "lower training.batch_size or the model's sizes, or train on several "
                                          "processes or a cluster (placement pp/tp, data_parallel fsdp)"))


def cmd_summary(args) -> int:
    project = load_project(args.project)
    result = compile_graph(project.graph)
    rows = result.summary_rows()
    if args.json:
        print(json.dumps({
            "nodes": rows,
            "total_params": result.total_params,
            "total_flops": result.total_flops,
            "errors": [e.message for e in result.errors],
            "warnings": [w.message for w in result.warnings],
        }, indent=2))
        return 1 if result.errors else 0
    headers = ("node", "type", "output shape", "params", "FLOPs/sample")
    table = [(r["node"], r["type"], r["output_shape"], f"{r['params']:,}", human(r["flops"])) for r in rows]
    table.append(("total", "", "", f"{result.total_params:,}", human(result.total_flops)))
    widths = [max(len(str(x[i])) for x in [headers, *table]) for i in range(len(headers))]
    def line(cells):
        return "  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for i, r in enumerate(table):
        if i == len(table) - 1:
            print("  ".join("-" * w for w in widths))
        print(line(r))
    for e in result.errors:
        print(f"error: {e}", file=sys.stderr)
    return 1 if result.errors else 0




def cmd_train(args) -> int:
    from pathlib import Path

    from pydantic import ValidationError

    from app.cli import CliError
    from engine.project import Placement, Training
    from engine.run import RunError, prepare_run

    project = load_project(args.project)
    overrides = {k: getattr(args, k) for k in PLACEMENT_FLAGS if getattr(args, k) is not None}
    for k in ("dp", "tp", "pp", "microbatches", "nproc", "steps", "accumulate"):
        v = getattr(args, k)
        if v is not None and v < 1:
            raise CliError(f"--{k} must be at least 1, not {v}")
    if args.accumulate is not None:
        if args.resume:
            raise CliError("--accumulate sets up a new run; a resumed run keeps its training.grad_accumulation")
        try:
            project.training = Training.model_validate({**project.training.model_dump(),
                                                        "grad_accumulation": args.accumulate})
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise CliError(f"--accumulate {args.accumulate}: {msg}") from None
    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "run.json").exists():
            raise CliError(f"--resume {run_dir}: not a run folder (no run.json)")
        from engine.runtime.train import RunBusy, RunLock

        try:  # a run (or its orphaned workers) still writing the folder: refuse before touching it
            RunLock(run_dir).acquire().release()
        except RunBusy as exc:
            raise CliError(str(exc)) from None
        if args.steps is not None:
            _extend_run(run_dir, args.steps)
        if overrides or args.nproc:  # resume under another layout (checkpoints are layout-free)
            from app.cli_placement import replan_run

            replan_run(run_dir, args.nproc, overrides)
    else:
        try:
            plan = None
            pl = project.placement.model_copy(update=overrides)
            if (args.nproc or 1) > 1 or pl.pp * pl.dp * pl.tp > 1:  # distributed: plan it (checks, stages, TP)
                from app.cli_placement import plan_for_run

                if args.nproc and args.nproc > 1 and pl.pp * pl.dp * pl.tp == 1:
                    overrides["dp"] = args.nproc  # `--nproc N` alone: data parallel over N processes
                plan = plan_for_run(project, args.nproc, overrides)
            else:
                _check_fits(project)
            run_dir = prepare_run(project, args.out, steps=args.steps, seed=args.seed, placement=overrides, plan=plan)
        except RunError as exc:
            raise CliError(str(exc)) from None
    spec = json.loads((run_dir / "run.json").read_text())
    placement = Placement.model_validate(spec["placement"])
    world = placement.dp * placement.tp * placement.pp
    nproc = args.nproc or world
    if nproc != world and world > 1:
        raise CliError(f"--nproc {nproc} but the placement needs dp*tp*pp = {placement.dp}*{placement.tp}*"
                       f"{placement.pp} = {world} processes; change --nproc or the degrees")
    print(f"run folder: {run_dir}", file=sys.stderr)
    if nproc > 1:
        return _train_multi(run_dir, nproc, resume=bool(args.resume))
    return _train_single(run_dir, resume=bool(args.resume))


def _extend_run(run_dir, steps: int) -> None:
    from engine.project import atomic_write

    path = run_dir / "run.json"
    spec = json.loads(path.read_text())
    spec["total_steps"] = steps
    atomic_write(path, (json.dumps(spec, indent=1, sort_keys=True) + "\n").encode())


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
        from app.cli import CliError

        raise CliError(f"training failed: {exc} (log: {run_dir / 'logs' / 'rank0.log'})") from None
    finally:
        if bar is not None:
            bar.close()
    print(f"{status['state']}: {status['step']}/{status['total_steps']} steps; run folder {run_dir}")
    return 0 if status["state"] in ("succeeded", "cancelled") else 1


def _train_multi(run_dir, nproc: int, resume: bool) -> int:
    from app.cli import CliError

    try:
        from remote.launch_local import launch_local  # the distributed runtime's local launcher
    except ImportError:
        raise CliError(f"training on {nproc} processes needs the distributed runtime, which this build lacks") from None
    job = launch_local(run_dir, nproc, resume=resume)
    return job.wait_with_progress()
