"""The placement on the command line: the flags `train` and `plan` share (meaning the
same on both), checked and named as flags; the work is layerflow's (layerflow/prepare.py)."""
from __future__ import annotations

from app.cli.cli_errors import CliError
from engine.runtime.plan import SCHEDULES

PLACEMENT_FLAGS = ("dp", "tp", "pp", "schedule", "microbatches")


def add_placement_flags(p) -> None:
    """The placement overrides; `train` and `plan` take the same ones, meaning the same."""
    p.add_argument("--dp", type=int, help="data-parallel degree")
    p.add_argument("--tp", type=int, help="tensor-parallel degree")
    p.add_argument("--pp", type=int, help="pipeline-parallel degree (stages)")
    p.add_argument("--schedule", choices=list(SCHEDULES), help="pipeline schedule (interleavedzb: interleaved zero bubble; zbv, dualpipev: V-shaped, two stages per rank)")
    p.add_argument("--microbatches", type=int, help="micro-batches per step (pipelining; default: as the planner "
                                                     "picks, at least one per stage)")


def check_counts(args, *names: str) -> None:
    """Whole-number flags must be at least 1: the error names the flag."""
    for k in names:
        v = getattr(args, k, None)
        if v is not None and v < 1:
            raise CliError(f"--{k} must be at least 1, not {v}")


def placement_flags(project, args) -> dict:
    """The command line's placement overrides, checked against the project's placement as
    the file's fields are; the error names the flag."""
    from engine.runs.build import RunError
    from layerflow.prepare import checked_placement

    overrides = {k: getattr(args, k) for k in PLACEMENT_FLAGS if getattr(args, k, None) is not None}
    check_counts(args, "dp", "tp", "pp", "microbatches")
    try:
        checked_placement(project.placement, overrides)
    except RunError as exc:
        raise CliError(str(exc).replace("placement.", "--", 1)) from None
    return overrides
