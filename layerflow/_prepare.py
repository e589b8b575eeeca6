"""A run folder from a project and a placement: what `train` (the CLI), `Project.train`
(the API) and the GUI's Run button all go through. Errors are LayerflowErrors that name
the setting to change (placement.dp, training.grad_accumulation, ...)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from engine.errors import CheckFailed
from engine.project import Placement, Project, Training, atomic_write, load_project
from engine.run import RunError, prepare_run


@dataclass
class Prepared:
    """A run folder ready to start, on `nproc` processes; `warnings` from the planner."""

    run_dir: Path
    nproc: int
    resume: bool = False
    warnings: list[str] = field(default_factory=list)


def _positive(prefix: str = "", **values) -> None:
    for k, v in values.items():
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise RunError(f"{prefix}{k} must be a whole number of at least 1, not {v!r}")


def checked_placement(placement: Placement, overrides: dict) -> Placement:
    """`placement` with these fields changed, checked as the file's are."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    _positive("placement.", **{k: v for k, v in overrides.items() if k in ("dp", "tp", "pp", "microbatches")})
    try:
        return Placement.model_validate({**placement.model_dump(), **overrides})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = "placement." + str(err["loc"][0]) if err.get("loc") else "the placement"
        raise RunError(f"{where}: {err['msg'].removeprefix('Value error, ')}") from None


def plan_for_run(project: Project, nproc: int | None, overrides: dict) -> tuple[dict, list[str]]:
    """The runtime plan a run folder carries (run.json "plan"), and the planner's warnings;
    CheckFailed lists why the placement cannot run."""
    from engine.planner import grouped, make_plan

    plan = make_plan(project, nproc, placement=overrides)
    if plan.errors:
        raise CheckFailed("the placement cannot run", plan.errors)
    return plan.runtime_plan(), [w for w, _ in grouped(plan.warnings)]


def check_fits(project: Project) -> None:
    """One process: the planner's memory prediction against this machine, before anything
    is allocated (out_features 3e7 or a batch of 1e6 is refused with the numbers)."""
    from engine.compile import compile_graph
    from engine.planner import make_plan

    result = compile_graph(project.graph)
    if not result.ok:
        return  # prepare_run names the diagram's errors
    plan = make_plan(project, 1, compiled=result)
    too_big = [e for e in plan.errors if " needs " in e and " device has " in e]
    if too_big:
        raise RunError(too_big[0].replace("raise pp or tp, use data_parallel fsdp, or raise microbatches",
                                          "lower training.batch_size or the model's sizes, or train on several "
                                          "processes or a cluster (placement pp/tp, data_parallel fsdp)"))


def prepare_training(project: Project, *, nproc: int | None = None, steps: int | None = None,
                     seed: int | None = None, out: str | Path | None = None, accumulate: int | None = None,
                     placement: dict | None = None) -> Prepared:
    """A new run folder for `project` under its placement with `placement`'s fields
    changed. `nproc` alone (a 1-process placement) means data parallel over nproc."""
    overrides = {k: v for k, v in (placement or {}).items() if v is not None}
    _positive(nproc=nproc, steps=steps, accumulate=accumulate)
    if accumulate is not None:
        try:
            project.training = Training.model_validate({**project.training.model_dump(), "grad_accumulation": accumulate})
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise RunError(msg if "grad_accumulation" in msg else f"training.grad_accumulation {accumulate}: {msg}") from None
    checked_placement(project.placement, overrides)  # refuses a bad value before anything is written
    plan, warnings = None, []
    pl = project.placement.model_copy(update=overrides)
    if (nproc or 1) > 1 or pl.pp * pl.dp * pl.tp > 1:  # distributed: plan it (checks, stages, TP)
        if nproc and nproc > 1 and pl.pp * pl.dp * pl.tp == 1:
            overrides["dp"] = nproc  # nproc alone: data parallel over nproc processes
        plan, warnings = plan_for_run(project, nproc, overrides)
    else:
        check_fits(project)
    run_dir = prepare_run(project, out, steps=steps, seed=seed, placement=overrides, plan=plan)
    spec = json.loads((run_dir / "run.json").read_text())
    world = spec["placement"]["dp"] * spec["placement"]["tp"] * spec["placement"]["pp"]
    return Prepared(run_dir, world, False, warnings)


def prepare_resume(run_dir: str | Path, *, nproc: int | None = None, steps: int | None = None,
                   placement: dict | None = None) -> Prepared:
    """An existing run folder, made ready to go on from its latest checkpoint: with more
    steps, or under another layout (its checkpoints load under any)."""
    from engine.runtime.train import RunBusy, RunLock

    run_dir = Path(run_dir)
    _positive(nproc=nproc, steps=steps)
    if not (run_dir / "run.json").exists():
        raise RunError(f"resume {run_dir}: not a run folder (no run.json)")
    try:  # a run (or its orphaned workers) still writing the folder: refuse before touching it
        RunLock(run_dir).acquire().release()
    except RunBusy as exc:
        raise RunError(str(exc)) from None
    if steps is not None:
        _write_spec(run_dir, {**_spec(run_dir), "total_steps": steps})
    overrides = {k: v for k, v in (placement or {}).items() if v is not None}
    warnings: list[str] = []
    if overrides or nproc:
        warnings = replan_run(run_dir, nproc, overrides)
    pl = _spec(run_dir)["placement"]
    world = pl["dp"] * pl["tp"] * pl["pp"]
    if nproc and nproc != world and world > 1:
        raise RunError(f"nproc {nproc} but the placement needs dp*tp*pp = {pl['dp']}*{pl['tp']}*{pl['pp']} = "
                       f"{world} processes; change nproc or the degrees")
    return Prepared(run_dir, nproc or world, True, warnings)


def _spec(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def _write_spec(run_dir: Path, spec: dict) -> None:
    atomic_write(run_dir / "run.json", (json.dumps(spec, indent=1, sort_keys=True) + "\n").encode())


def replan_run(run_dir: str | Path, nproc: int | None, overrides: dict) -> list[str]:
    """Give a run folder a new placement and plan before resuming it: its DCP
    checkpoints load under any layout. The folder's project snapshot is planned."""
    run_dir = Path(run_dir)
    spec = _spec(run_dir)
    project = load_project(run_dir / "project.lflow")
    project.placement = project.placement.model_validate(spec["placement"])
    overrides = dict(overrides)
    if {"dp", "tp", "pp"} & set(overrides) or nproc:
        # a new layout: degrees not given start from 1, and dp takes what nproc leaves
        degrees = {k: overrides.get(k, 1) for k in ("pp", "tp")}
        rest = (nproc or 1) // (degrees["pp"] * degrees["tp"])
        degrees["dp"] = overrides.get("dp", max(1, rest) if nproc else spec["placement"]["dp"])
        overrides.update(degrees)
    pl = project.placement.model_copy(update=overrides)
    world = pl.pp * pl.dp * pl.tp
    plan, warnings = plan_for_run(project, nproc or world, overrides) if world > 1 else (None, [])
    if nproc and nproc != world:
        raise RunError(f"nproc {nproc} but the placement needs dp*tp*pp = {pl.dp}*{pl.tp}*{pl.pp} = {world} processes")
    spec["placement"], spec["plan"] = pl.model_dump(mode="json"), plan
    _write_spec(run_dir, spec)
    return warnings
