"""The dashboard with 50 runs of 10,000 steps overlaid: opening them, and live updates.

    QT_QPA_PLATFORM=offscreen python bench/dashboard_many_runs.py [--runs 50] [--steps 10000] [--live 4]

What the runs table does when a user selects rows (app/sweep_ui.py SweepUI.overlay): each
run's whole metrics.jsonl read (engine/runs/tail.py MetricsTail.poll_data) and handed to the
dashboard (Dashboard.set_data: parsed in its parse process), then plotted by the
dashboard's own 10 Hz timer. The run folders are written first, as the runtime writes
metrics.jsonl: every step's loss, lr, throughput and peak memory, a validation record
every 500 steps.

Timed on the wall clock, as the user waits, with the timer's ticks driven here:
  open      from the first set_data until every run's curves exist and are painted,
            ticking at the timer's pace (10 a second): when the last curve is on
            screen, each tick's time (mean, worst), and the GUI thread's busy total
  live      then `--live` of the runs (a sweep's runs in flight) each get 20 new lines
            per update, 100 updates: ingest + tick + the changed plots' repaint, mean and worst
  fit       Fit (auto_range) over all runs, then a repaint
Not a test: numbers depend on this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def write_runs(folder: Path, runs: int, steps: int) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for r in range(runs):
        d = folder / f"run{r:02d}"
        d.mkdir()
        s = np.arange(1, steps + 1)
        loss = (0.3 + r / runs) * np.exp(-s / (steps / 3)) + 0.2 + 0.03 * rng.standard_normal(steps)
        with open(d / "metrics.jsonl", "w") as f:
            for i, step in enumerate(s):
                rec = {"step": int(step), "epoch": int(step) // 1000, "time": round(step * 0.01, 3),
                       "loss": float(loss[i]), "lr": 1e-3 * (1 + r), "samples_per_s": 5000.0 + float(rng.normal(0, 50)),
                       "peak_mem_mb": 300.0 + r}
                f.write(json.dumps(rec) + "\n")
                if step % 500 == 0:
                    f.write(json.dumps({"step": int(step), "val_loss": float(loss[i]) + 0.05,
                                        "val_acc": float(1 - loss[i] / 2)}) + "\n")
        paths.append(d)
    return paths


def live_lines(start: int, n: int, r: int) -> bytes:
    recs = [{"step": start + i, "epoch": 0, "time": round((start + i) * 0.01, 3), "loss": 0.2 + r * 1e-3,
             "lr": 1e-3, "samples_per_s": 5000.0, "peak_mem_mb": 300.0} for i in range(1, n + 1)]
    return "\n".join(json.dumps(x) for x in recs).encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--live", type=int, default=4)
    args = ap.parse_args()

    from PySide6.QtWidgets import QApplication

    from engine.runs.tail import MetricsTail
    from widgets.dashboard import Dashboard

    app = QApplication.instance() or QApplication([])
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        paths = write_runs(Path(tmp), args.runs, args.steps)
        size = sum((p / "metrics.jsonl").stat().st_size for p in paths)
        print(f"{args.runs} runs of {args.steps:,} steps: {size / 1e6:.0f} MB of metrics.jsonl "
              f"(written in {time.perf_counter() - t:.1f} s)")
        d = Dashboard()
        d._timer.stop()  # its ticks are driven (and timed) here
        d.resize(1400, 800)
        d.show()
        app.processEvents()
        plots = list(d.plots.values())

        def tick() -> float:
            """What the timer runs, and the repaint of the plots whose curves changed (Qt
            repaints a view whose items changed; the others keep what they showed)."""
            t0 = time.perf_counter()
            changed = {s.spec.plot for run in d._runs.values() for s in run.series.values() if s.dirty}
            d._tick()
            for pid, pw in d.plots.items():
                if pid in changed:
                    pw.viewport().repaint()
            return time.perf_counter() - t0

        def pending() -> bool:
            return any(run.in_flight for run in d._runs.values()) or any(
                s.dirty for run in d._runs.values() for s in run.series.values())

        # ----- open: what SweepUI.overlay does for the selected rows --------------------------
        t0 = time.perf_counter()
        for p in paths:
            d.set_data(str(p), MetricsTail(p / "metrics.jsonl").poll_data(max_bytes=None), label=p.name)
        handed = time.perf_counter() - t0
        d.auto_range()
        ticks = []
        due = time.perf_counter()
        parsed_at: dict[str, float] = {}  # when each run's lines were back from the parse process
        while pending() and len(ticks) < 10_000:  # ticks at the timer's pace, 10 a second
            time.sleep(max(0.0, due - time.perf_counter()))
            ticks.append(tick())
            due += d.UPDATE_MS / 1000
            for key, run in d._runs.items():
                if not run.in_flight and key not in parsed_at:
                    parsed_at[key] = time.perf_counter()
        opened = time.perf_counter() - t0
        parsed = max(parsed_at.values()) - t0 if parsed_at else float("nan")
        curves = sum(1 for run in d._runs.values() for s in run.series.values() if s.curve is not None)
        print(f"\nopen: {args.runs} runs, {curves} curves")
        print(f"  read and handed to the parse process  {handed * 1e3:8.0f} ms")
        print(f"  last run parsed (parse process) after {parsed * 1e3:8.0f} ms")
        print(f"  all shown after                       {opened * 1e3:8.0f} ms  ({len(ticks)} ticks of the 10 Hz timer)")
        print(f"  tick time mean / worst                {statistics.mean(ticks) * 1e3:8.1f} / "
              f"{max(ticks) * 1e3:.1f} ms")
        print(f"  GUI thread busy in ticks              {sum(ticks) * 1e3:8.0f} ms")

        # ----- live: `--live` runs in flight get new lines --------------------------------------
        live = [str(p) for p in paths[:args.live]]
        upd = []
        for i in range(100):
            t1 = time.perf_counter()
            for r, key in enumerate(live):
                d.append_data(key, live_lines(args.steps + i * 20, 20, r))
            d.wait_parsed()
            upd.append(time.perf_counter() - t1 + tick())
        print(f"\nlive: {args.live} runs appending 20 lines each per update, with {args.runs} shown")
        upd.sort()
        print(f"  update (ingest + tick + repaint) mean / median / 95th / worst  {statistics.mean(upd) * 1e3:.1f} / "
              f"{upd[len(upd) // 2] * 1e3:.1f} / {upd[94] * 1e3:.1f} / {upd[-1] * 1e3:.1f} ms")

        t2 = time.perf_counter()
        d.auto_range()
        for pw in plots:
            pw.viewport().repaint()
        fits = [time.perf_counter() - t2]
        while pending():
            fits.append(tick())
        print(f"\nfit: auto_range and repaint over {args.runs} runs  {sum(fits) * 1e3:.1f} ms")
        if getattr(d, "_parser", None) is not None:
            d._parser.close()
        d.close()


if __name__ == "__main__":
    main()
