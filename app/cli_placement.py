"""The placement on the command line: the flags `train` and `plan` share (meaning the
same on both), and the runtime plan a `train` gets from them, for a new run or for a
run folder resumed under another layout. Used by cli_core.py and cli_dist.py."""
from __future__ import annotations

import json
import sys

PLACEMENT_FLAGS = ("dp", "tp", "pp", "schedule", "microbatches")


def add_placement_flags(p) -> None:
    """The placement overrides; `train` and `plan` take the same ones, meaning the same."""
    p.add_argument("--dp", type=int, help="data-parallel degree")
    p.add_argument("--tp", type=int, help="tensor-parallel degree")
    p.add_argument("--pp", type=int, help="pipeline-parallel degree (stages)")
    p.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved1f1b"], help="pipeline schedule")
    p.add_argument("--microbatches", type=int, help="micro-batches per step (pipelining; default: as the planner "
                                                     "picks, at least one per stage)")


def with_placement_flags(project, args):
    """The project with the command line's placement overrides applied (checked as the file's are)."""
    from pydantic import ValidationError

    from app.cli import CliError
    from engine.project import Placement

    overrides = {k: getattr(args, k) for k in PLACEMENT_FLAGS if getattr(args, k, None) is not None}
    for k, v in overrides.items():
        if isinstance(v, int) and v < 1:
            raise CliError(f"--{k} must be at least 1, not {v}")
    if overrides:
        try:
            project.placement = Placement.model_validate({**project.placement.model_dump(), **overrides})
        except ValidationError as exc:
            err = exc.errors()[0]
            where = "--" + str(err["loc"][0]) if err.get("loc") else "the placement flags"
            raise CliError(f"{where}: {err['msg'].removeprefix('Value error, ')}") from None
    return project


def plan_for_run(project, nproc: int | None, overrides: dict):
    """The runtime plan for `train`: the project's placement with the command's
    overrides. Returns (plan dict for run.json, warnings); raises CliError listing
    the validation errors."""
    from app.cli import CliError
    from engine.planner import grouped, make_plan

    plan = make_plan(project, nproc, placement=overrides)
    if plan.errors:
        raise CliError("the placement cannot run:\n" + "\n".join(f"  {e}" for e in plan.errors))
    for w, _ in grouped(plan.warnings):
        print(f"warning: {w}", file=sys.stderr)
    return plan.runtime_plan()


def replan_run(run_dir, nproc: int | None, overrides: dict) -> None:
    """Give a run folder a new placement and plan before resuming it: its DCP
    checkpoints load under any layout. The folder's project snapshot is planned."""
    from pathlib import Path

    from app.cli import CliError
    from engine.project import atomic_write, load_project

    run_dir = Path(run_dir)
    spec = json.loads((run_dir / "run.json").read_text())
    project = load_project(run_dir / "project.lflow")
    project.placement = project.placement.model_validate(spec["placement"])
    overrides = dict(overrides)
    if {"dp", "tp", "pp"} & set(overrides) or nproc:
        # a new layout: degrees not given start from 1, and dp takes what --nproc leaves
        degrees = {k: overrides.get(k, 1) for k in ("pp", "tp")}
        rest = (nproc or 1) // (degrees["pp"] * degrees["tp"])
        degrees["dp"] = overrides.get("dp", max(1, rest) if nproc else spec["placement"]["dp"])
        overrides.update(degrees)
    pl = project.placement.model_copy(update=overrides)
    world = pl.pp * pl.dp * pl.tp
    if world > 1:
        plan = plan_for_run(project, nproc or world, overrides)
    else:
        plan = None
    if nproc and nproc != world:
        raise CliError(f"--nproc {nproc} but the placement needs dp*tp*pp = {pl.dp}*{pl.tp}*{pl.pp} = {world} processes")
    spec["placement"], spec["plan"] = pl.model_dump(mode="json"), plan
    atomic_write(run_dir / "run.json", (json.dumps(spec, indent=1, sort_keys=True) + "\n").encode())
