"""sweep, runs: many runs of one project, queued and compared (engine/runs/sweep.py)."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from app.cli.cli_errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a project over a grid (or random sample) of settings, as a queue")
    p.add_argument("project", help="the .lflow file")
    p.add_argument("sweep", help="the sweep file (JSON): method, parameters, budget, stop rules, parallel")
    p.add_argument("--parallel", type=int, metavar="K", help="runs at once (default: as the cores allow)")
    p.add_argument("--cluster", metavar="NAME", help="one job per run on this cluster profile (layerflow cluster add)")
    p.add_argument("--dry-run", action="store_true", help="check every point and print the queue; run nothing")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("runs", help="a table of runs: settings, final and best metrics, throughput, memory")
    p.add_argument("target", metavar="PROJECT_OR_RUNS_DIR", help="a project (.lflow) or a folder of runs")
    p.add_argument("--sort", metavar="METRIC", help="sort by a column, best first (best_val_acc, final_loss, lr, ...)")
    p.add_argument("--filter", action="append", default=[], metavar="EXPR",
                   help="KEY=VALUE, KEY<X, KEY>X or KEY~TEXT (repeatable), e.g. --filter dp=2 --filter 'lr<0.01'")
    p.add_argument("--sweep", metavar="ID", help="only the runs of this sweep")
    p.add_argument("--mtbf-hours", type=float, metavar="H", help="hours between failures of one device, for the "
                   "suggested checkpoint interval (default: the setting device_mtbf_h, else Llama 3's ~50,700)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_runs)


def cmd_sweep(args) -> int:
    from engine.project import load_project
    from engine.runs.sweep import load_sweep
    from remote.sweep_queue import SweepRunner

    project = load_project(args.project)
    sweep = load_sweep(args.sweep)  # SweepError names the key
    runner = SweepRunner(project, sweep, parallel=args.parallel, cluster=args.cluster)  # every point checked
    where = f"cluster {args.cluster}, one job per run" if args.cluster else f"this machine, {runner.parallel} at once"
    print(f"sweep {runner.id}: {len(runner.runs)} runs ({sweep.method}) on {where}")
    print(runner.queue_text())
    for p in runner.planned:
        for w in p.warnings:
            print(f"warning: point {p.index + 1}: {w}", file=sys.stderr)
    if args.dry_run:
        print("dry run: nothing started")
        return 0
    print(f"runs folder: {runner.runs_dir}  (record: {runner.state_file.name})", file=sys.stderr)

    def show(event: str, run) -> None:
        if event == "progress":
            return
        print(runner.progress_line(run), flush=True)

    try:
        runs = runner.run(on_event=show)
    except KeyboardInterrupt:
        print("interrupted: every run of the sweep stopped", file=sys.stderr)
        return 130
    print()
    print(_final_table(runs))
    ok = all(r.state in ("succeeded", "stopped", "cancelled") for r in runs)
    return 0 if ok else 1


def _final_table(runs) -> str:
    from engine.runs.history import run_row

    keys = list(runs[0].point) if runs else []
    rows = [["#", *(k.rsplit(".", 1)[-1] for k in keys), "state", "step", "final_loss", "best_val_acc", "run"]]
    for r in runs:
        row = run_row(r.run_dir) if r.run_dir and Path(r.run_dir).is_dir() else {}
        rows.append([str(r.index + 1), *(_fmt(r.point.get(k)) for k in keys), r.shown_state + (f" ({r.note})" if r.note and r.state == "failed" else ""),
                     f"{r.step}/{r.total_steps or '?'}", _fmt(row.get("final_loss")), _fmt(row.get("best_val_acc")),
                     Path(r.run_dir).name if r.run_dir else ""])
    return _table(rows)


def cmd_runs(args) -> int:
    from engine.runs.history import METRIC_COLUMNS, filter_rows, runs_dir, runs_table, sort_rows

    target = Path(args.target)
    if target.suffix == ".lflow" or target.is_file():
        if not target.is_file():
            raise CliError(f"{target}: no such project")
        directory = runs_dir(target.parent)
    else:
        if not target.is_dir():
            raise CliError(f"{target}: no such folder")
        from engine.runs.history import is_run_dir

        has_runs = any(is_run_dir(c) for c in target.iterdir())
        directory = target / "runs" if not has_runs and (target / "runs").is_dir() else target
    rows = runs_table(directory, sweep=args.sweep)
    try:
        rows = filter_rows(rows, args.filter)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.sort:
        if rows and all(_value(r, args.sort) is None for r in rows):
            known = sorted({*METRIC_COLUMNS, *(k for r in rows for k in r["settings"])})
            raise CliError(f"--sort {args.sort}: no run has it; columns: {', '.join(known)}")
        rows = sort_rows(rows, args.sort)
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    if not rows:
        print(f"no runs in {directory}" + (" match" if args.filter or args.sweep else ""))
        return 0
    settings = [k for k in rows[0]["settings"] if any(r["settings"].get(k) not in (None, "") for r in rows)
                and len({json.dumps(r["settings"].get(k), default=str) for r in rows}) > 1] or ["lr", "dp"]
    system = [c for c in ("cpu_pct_mean", "rss_mb_peak", "gpu_util_pct_mean") if any(r.get(c) is not None for r in rows)]
    # a run that restarted: how often, the time it was down, the layout of each attempt ("dp2 → dp1")
    recovery = ["restarts", "down_s", "layouts"] if any(r.get("restarts") for r in rows) else []
    saves = ["checkpoint_s"] if any(r.get("checkpoint_s") is not None for r in rows) else []
    cols = ["run", "state", *settings, "final_loss", "best_val_loss", "best_val_acc", "samples_per_s",
            "peak_mem_mb", "predicted_step_s", "measured_step_s", *system, *recovery, *saves]
    table = [cols] + [[_fmt(_value(r, c)) for c in cols] for r in rows]
    print(_table(table))
    if saves:
        print(_interval_line(rows, args.mtbf_hours))
    return 0


def _interval_line(rows: list[dict], mtbf_hours: float | None) -> str:
    """The Young/Daly checkpoint interval from the newest listed run that measured its saves."""
    from engine.runs.checkpoint_interval import suggest_for_run

    if mtbf_hours is not None and not (math.isfinite(mtbf_hours) and mtbf_hours > 0):
        raise CliError(f"--mtbf-hours {mtbf_hours}: give the hours between failures of one device, a positive number")
    for r in sorted((r for r in rows if r.get("checkpoint_s") is not None), key=lambda r: r.get("started") or 0,
                    reverse=True):
        s = suggest_for_run(r["path"], mtbf_hours)
        if s is not None:
            now = f" (it ran with {s.current:,})" if s.current else ""
            return f"checkpoint_interval, from {r['run']}{now}: {s.line}"
    return "checkpoint_interval: no listed run measured its step time and its saves"


def _value(row: dict, key: str):
    from engine.runs.history import row_value

    return row_value(row, key)


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.4g}"
    return str(v)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
