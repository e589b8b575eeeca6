"""The plan's predicted step time, corrected by what this machine really did.

The cost model (engine/planning/cost.py) prices a step from measured device rates, but a
machine that is doing something else, or a model that runs below the rates the
calibration kernels reach, makes every prediction off by a factor. A run writes its
own achieved step time (its records' `samples_per_s`, which exclude evaluations and
checkpoints); its run.json keeps what the plan predicted for it. The ratio of the two,
taken from the first steps after warm-up of the newest run of the same project and
layout, corrects the prediction of the next plan: shown by `plan`, in the editor's
plan view, and kept in the plan document (`calibration`, `predicted.calibrated_step_s`).
"""
from __future__ import annotations

import os
import statistics
from pathlib import Path

from engine.runtime.loop import (
    WARMUP_LOGS as WARMUP_STEPS,  # (its first steps are not the machine's pace)
)
from engine.runtime.spec import RunSpec, SpecError

FIRST_RECORDS = 20  # "the run's own first steps": this many records after the warm-up


def layout_key(doc: dict) -> tuple:
    """What makes two plans the same layout for timing purposes."""
    pp, dp, tp = int(doc.get("pp", 1)), int(doc.get("dp", 1)), int(doc.get("tp", 1))
    return (pp, dp, tp, doc.get("schedule") if pp > 1 else None, doc.get("microbatches") if pp > 1 else None,
            doc.get("data_parallel") if dp > 1 else None, doc.get("mixed_precision") if doc.get("mixed_precision") not in
            (None, "none") else None)


def measured_step_s(run_dir: str | Path) -> float | None:
    """The median step time of a run's first records after the warm-up, from its
    metrics (batch / samples_per_s); None when it has not got that far."""
    from engine.runs.tail import read_metrics

    run_dir = Path(run_dir)
    if run_dir in _MEASURED:
        return _MEASURED[run_dir]
    facts = _run_facts(run_dir)
    batch = (facts or {}).get("training", {}).get("batch_size")
    try:
        records = read_metrics(run_dir / "metrics.jsonl")
    except OSError:
        return None
    if not isinstance(batch, int):
        return None
    steps = [batch / r["samples_per_s"] for r in records
             if isinstance(r.get("samples_per_s"), (int, float)) and r["samples_per_s"] > 0
             and isinstance(r.get("step"), int) and r["step"] > WARMUP_STEPS][:FIRST_RECORDS]
    if len(steps) < 2:
        return None
    value = statistics.median(steps)
    if len(steps) >= FIRST_RECORDS or any(r.get("event") == "end" for r in records[-1:]):
        _MEASURED[run_dir] = value  # all its first records are in (or it has ended): it will not change
    return value


def find(project, doc: dict, runs_dir: str | Path | None = None) -> dict | None:
    """The calibration for a plan document of `project`: from the newest run (under
    its runs folder) of the same project name, layout, process count, batch size and
    device kind that recorded its predicted step time and got past its first steps."""
    from engine.runs.build import default_runs_dir

    want = layout_key(doc)
    device = (doc.get("device") or {}).get("name")
    for path in _runs_newest_first(Path(runs_dir or default_runs_dir(project))):
        spec = _run_facts(path)
        if spec is None:
            continue
        pred = spec.get("predicted_step_s")
        if not isinstance(pred, (int, float)) or pred <= 0 or spec.get("name") != project.name:
            continue
        plan = spec.get("plan") or {"pp": 1, "dp": 1, "tp": 1}
        if layout_key(plan) != want or spec.get("predicted_device") != device or \
                int(spec.get("training", {}).get("batch_size", -1)) != project.training.batch_size or \
                int(spec.get("nproc", 1)) != int(doc.get("world", 1)):
            continue
        measured = measured_step_s(path)
        if measured is None:
            continue
        return {"run": path.name, "measured_step_s": measured, "predicted_step_s": float(pred),
                "ratio": measured / float(pred)}
    return None


_FACTS: dict[Path, dict | None] = {}  # run.json's few fields this reads (a run's run.json never changes)
_MEASURED: dict[Path, float] = {}  # (filled by measured_step_s once a run has all its first records)


def _runs_newest_first(d: Path) -> list[Path]:
    try:
        runs = [(e.stat().st_mtime, Path(e.path)) for e in os.scandir(d) if e.is_dir()]
    except OSError:
        return []
    return [p for _, p in sorted(runs, reverse=True) if (p / "run.json").is_file()]


def _run_facts(path: Path) -> dict | None:
    if path not in _FACTS:
        try:
            spec = RunSpec.load(path)
        except SpecError:
            return None  # (not kept: a run folder being written)
        pr = spec.predicted
        _FACTS[path] = {"name": spec.name, "plan": spec.plan.to_json(), "predicted_step_s": pr.step_s,
                        "predicted_device": pr.device, "nproc": pr.nproc,
                        "training": {"batch_size": spec.training.batch_size}}
    return _FACTS[path]


def apply(plan, project, runs_dir: str | Path | None = None) -> dict | None:
    """Correct a plan's predicted step time by the calibration `find` gives (in place)."""
    if plan.predicted is None:
        return None
    r = plan.run  # (what find reads of it: not the whole document, which lists every rank)
    cal = find(project, {"pp": r.pp, "dp": r.dp, "tp": r.tp, "schedule": r.schedule, "microbatches": r.microbatches,
                         "data_parallel": r.data_parallel, "mixed_precision": r.mixed_precision,
                         "device": {"name": plan.device.name}, "world": plan.world}, runs_dir)
    if cal is not None:
        plan.calibration = cal
        plan.predicted.calibrated_step_s = plan.predicted.step_s * cal["ratio"]
    return cal


__all__ = ["apply", "find", "layout_key", "measured_step_s"]
