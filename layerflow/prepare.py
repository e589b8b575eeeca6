"""A run folder from a project and a placement: what `train` (the CLI), `Project.train`
(the API) and the GUI's Run button all go through, down to engine/runs/build.py `build_run` (the
one builder). Errors are LayerflowErrors that name the setting to change (placement.dp,
training.grad_accumulation, ...)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine import trust
from engine.project import Placement, Project
from engine.runs.build import RunError, build_run, derived_placement, replan_run
from engine.runtime.spec import RunSpec, SpecError


@dataclass
class Prepared:
    """A run folder ready to start, on `nproc` processes; `warnings` from the planner."""

    run_dir: Path
    nproc: int
    resume: bool = False
    warnings: list[str] = field(default_factory=list)


def checked_placement(placement: Placement, overrides: dict) -> Placement:
    """`placement` with these fields changed, checked as the file's are."""
    return derived_placement(placement, overrides)


def prepare_training(project: Project, *, nproc: int | None = None, steps: int | None = None,
                     seed: int | None = None, out: str | Path | None = None, accumulate: int | None = None,
                     restarts: int | None = None, placement: dict | None = None) -> Prepared:
    """A new run folder for `project` under its placement with `placement`'s fields
    changed. `nproc` alone (a 1-process placement) means data parallel over nproc. The run
    folder is `out`, else one under the project's runs/, which must stay inside its folder
    (a `runs` link out of it is refused: engine.runs.history.check_runs_inside)."""
    from engine.runs.history import check_runs_inside

    check_runs_inside(project.directory, out)
    built = build_run(project, out, nproc=nproc, steps=steps, seed=seed, accumulate=accumulate, restarts=restarts, placement=placement)
    return Prepared(built.run_dir, built.nproc, False, built.warnings)


def prepare_resume(run_dir: str | Path, *, nproc: int | None = None, steps: int | None = None,
                   placement: dict | None = None, trust_given: bool = False, trust_once: bool = False) -> Prepared:
    """An existing run folder, made ready to go on from its latest checkpoint: with more
    steps, or under another layout (its checkpoints load under any). The folder's code
    (Custom nodes of its run.json and project snapshot) must have the user's consent, and
    its latest checkpoint must hold tensors and plain values only, before anything runs
    (`trust_given`: --trust, remembered; `trust_once`: --trust-once, for this call only)."""
    from engine.runtime import dist_checkpoint
    from engine.runtime.folder import RunBusy, RunLock

    run_dir = Path(run_dir)
    for k, v in (("nproc", nproc), ("steps", steps)):
        if v is not None and (type(v) is not int or v < 1):
            raise RunError(f"{k} must be a whole number of at least 1, not {v!r}")
    if not (run_dir / "run.json").exists():
        raise RunError(f"resume {run_dir}: not a run folder (no run.json)")
    try:
        spec = RunSpec.load(run_dir)
    except SpecError as exc:
        raise RunError(f"resume: {exc}") from None
    consented = trust.check_run_folder(run_dir, given=trust_given, once=trust_once)
    try:
        dist_checkpoint.check_latest(run_dir)
    except dist_checkpoint.UnsafeCheckpoint as exc:
        raise RunError(str(exc)) from None
    if spec.weights:  # the run's initial weights, which the trainer loads before the checkpoint
        _check_run_weights(run_dir / spec.weights)
    try:  # a run (or its orphaned workers) still writing the folder: refuse before touching it
        RunLock(run_dir).acquire().release()
    except RunBusy as exc:
        raise RunError(str(exc)) from None
    if steps is not None:
        spec.total_steps = steps
        spec.save(run_dir)
    overrides = {k: v for k, v in (placement or {}).items() if v is not None}
    warnings: list[str] = []
    if overrides or nproc:
        with trust.allowing(consented):  # a new layout compiles the folder's project snapshot
            warnings = replan_run(run_dir, nproc, overrides)
    world = RunSpec.load(run_dir).world
    return Prepared(run_dir, nproc or world, True, warnings)


def _check_run_weights(path: Path) -> None:
    """A run folder's weights.pt read as the trainer reads it, before anything starts: a
    pickle there (a folder copied from elsewhere, or altered) is refused in one line."""
    from engine.files import os_error_text
    from engine.runtime.model import WeightsRefused, read_weights

    try:
        read_weights(path)
    except WeightsRefused as exc:
        raise RunError(f"resume: {exc}") from None
    except OSError as exc:
        raise RunError(f"resume: cannot read {path}: {os_error_text(exc)}") from None
