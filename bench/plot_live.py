"""How long one live dashboard update takes while its series grow to 1,000,000 points.

The dashboard (widgets/dashboard/) appends each poll's records and, 10 times a
second, pushes the changed series to their curves and repaints. Here every series
grows in 1,000 updates of 1,000 records each (a run writing 10,000 steps a second:
far above what a real run writes, about 4 lines a second at the default log
interval) and every update is timed in two parts: the plot update (flush = setData,
then a synchronous repaint of the plots) and the ingest of the new lines as the GUI
thread pays it: append_data (the lines kept, sent to the dashboard's parse process,
engine/runs/parse_worker.py), then, once parsed there, their columns taken into float64
buffers. The parse process's own CPU time is shown beside (it runs on another core).
Goal: plot update plus ingest under 30 ms, mean and worst ("both"). Cases:

  1 series x 1 plot      one run's loss; the loss plot repainted
  3 series x 5 plots     three runs overlaid, each writing loss, accuracy, lr,
                         throughput and peak memory: three curves on each of the
                         five plots, all five repainted (15 curves of 1M points)

plus one run's loss/lr/throughput with all five plots repainted, EMA smoothing, a
stress row (the overlay at 10,000 records per run per update: 30,000 JSON lines to
parse every 100 ms), a bare
pyqtgraph curve with its own clipToView + peak downsampling for comparison, and
two live cases: series opened at 1M points, then 100 polls of --poll records per run
(50: a run logging 500 steps a second), one run and the 3-run overlay.
The first update of a case (the curves created, the first paint) is shown on its
own and left out of mean and worst.
--before REV also measures the dashboard as it was at git revision REV, case
by case in turns with the current one, and prints both.

    QT_QPA_PLATFORM=offscreen python bench/plot_live.py [--points 1000000] [--updates 1000] [--before REV]
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyqtgraph as pg  # noqa: E402
from engine.runs.tail import parse_jsonl  # noqa: E402
from PySide6.QtCore import QEvent  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402


# --clock cpu (default): CPU time of the GUI thread, what an update costs on a core
# of its own; immune to other processes on a shared machine. --clock wall: elapsed.
now = time.thread_time


def records(start: int, n: int, rng, keys: str = "loss", offset: float = 0.0) -> list[bytes]:
    """n lines of metrics.jsonl as engine/runtime/loop.py writes them (json.dumps of a
    dict); keys: 'loss', 'three' (loss, lr, throughput) or 'five' (one series for each
    plot). The dashboard gets them as the app gives them: engine/runs/tail.py's parse_jsonl,
    timed as part of the ingest."""
    steps = np.arange(start + 1, start + n + 1)
    loss = offset + 2.0 * np.exp(-steps / 2e5) + 0.05 * rng.standard_normal(n)
    if keys == "loss":
        recs = ({"step": int(s), "time": round(float(s) * 1e-3, 4), "loss": float(v)} for s, v in zip(steps, loss))
    elif keys == "three":
        recs = ({"step": int(s), "epoch": 0, "time": round(float(s) * 1e-3, 4), "loss": float(v),
                 "lr": 1e-3 * (1 + float(v)), "samples_per_s": 5000.0 + float(v)} for s, v in zip(steps, loss))
    else:
        recs = ({"step": int(s), "epoch": 0, "time": round(float(s) * 1e-3, 4), "loss": float(v),
                 "acc": 1.0 - float(v) / 3, "lr": 1e-3 * (1 + float(v)), "samples_per_s": 5000.0 + 100 * float(v),
                 "peak_mem_mb": 800.0 + 10 * float(v)} for s, v in zip(steps, loss))
    return [json.dumps(r).encode() for r in recs]


def dashboard_at(rev: str):
    """The Dashboard class at git revision `rev`: of widgets/dashboard.py, one module
    until the package, or of the package widgets/dashboard/ (its modules import each
    other relatively, so it loads under a name of its own beside the current one)."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout

    folder = Path(tempfile.mkdtemp())
    files = git("ls-tree", "--name-only", rev, "widgets/dashboard/").split()
    if files:  # the package: its modules into a folder, loaded as the package dashboard_before
        path = folder / "dashboard_before"
        path.mkdir()
        for name in files:
            if name.endswith(".py"):
                (path / Path(name).name).write_text(git("show", f"{rev}:{name}"))
        spec = importlib.util.spec_from_file_location("dashboard_before", path / "__init__.py",
                                                      submodule_search_locations=[str(path)])
    else:
        path = folder / "dashboard_before.py"
        path.write_text(git("show", f"{rev}:widgets/dashboard.py"))
        spec = importlib.util.spec_from_file_location("dashboard_before", path)
    module = sys.modules["dashboard_before"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module.Dashboard


def shown(cls, keys: str, **kw):
    """A dashboard on screen whose updates are driven (and timed) here, and the plots to repaint."""
    d = cls(**kw)
    d._timer.stop()
    d.resize(1400, 800)
    d.show()
    QApplication.processEvents()
    gc.collect()
    gc.freeze()  # as app/cli/gui_cmds.py does once the window is up
    # the five metric plots (the sixth, per-rank step times, gets no record here), or the loss plot alone
    return d, [pw for pid, pw in d.plots.items() if pid == "loss" or (keys != "loss" and pid != "step_time")]


def gone(d) -> None:
    """Close and really delete a case's dashboard, and its buffers with it, before the
    next case (processEvents alone leaves deleteLater's event queued: the next case
    then ran beside a million points per series still held)."""
    if getattr(d, "_parser", None) is not None:
        d._parser.close()  # its parse process ends
    d.close()
    d.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.DeferredDelete)
    del d
    gc.unfreeze()  # it was frozen with the rest in shown(); frozen cycles are never freed
    gc.collect()


def worker_cpu(d) -> float:
    """CPU seconds the dashboard's parse process (engine/runs/parse_worker.py) has used so far."""
    proc = getattr(getattr(d, "_parser", None), "_proc", None)
    if proc is None:
        return 0.0
    try:
        with open(f"/proc/{proc.pid}/stat") as f:
            utime, stime = f.read().rsplit(") ", 1)[1].split()[11:13]
    except (OSError, ValueError):
        return 0.0
    return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


def timed_updates(d, paint, updates: int, batches_of) -> tuple[list, list]:
    """`updates` updates of `d`, each the batches (one per run, made untimed) of batches_of(i):
    (plot update times, ingest times). As the app does: each run's new lines go to
    append_data as one piece (what the tail reads), are parsed in the dashboard's parse
    process while the GUI thread is free (with the CPU clock, the wait for them is not
    counted; with the wall clock, 50 ms pass untimed, half the time between two timer
    ticks), then taken, plotted and painted. The ingest is what the GUI thread pays:
    the pipe write and the taking (unpickling, appending). A dashboard from before the
    parse process (--before) parses in the GUI thread: all of it is ingest."""
    plot, ingest = [], []
    worker = hasattr(d, "append_data")
    for i in range(updates):
        batches = batches_of(i)
        blobs = [b"\n".join(batch) for batch in batches]
        t0 = now()
        for r, (batch, blob) in enumerate(zip(batches, blobs)):
            if worker:
                d.append_data(f"run{r}", blob)
            else:
                d.append(f"run{r}", parse_jsonl(batch), batch)  # the lines are kept
        waited = 0.0
        if worker:
            if now is time.perf_counter:
                t1 = now()
                time.sleep(0.05)
                waited = now() - t1
                d._take_parsed()
            else:
                d.wait_parsed()
        t2 = now()
        (d._tick if hasattr(d, "NEW_CURVES_PER_TICK") else d.flush)()  # what the 10 Hz timer runs
        for pw in paint:
            pw.viewport().repaint()
        t3 = now()
        ingest.append(t2 - t0 - waited)
        plot.append(t3 - t2)
    return plot, ingest


def bench_dashboard(points: int, updates: int, smoothing: float = 0.0, keys: str = "loss",
                    runs: int = 1, dashboard=None) -> tuple[list, list, float]:
    """(plot update times, ingest times, the parse process's CPU seconds per update)."""
    from widgets.dashboard import Dashboard

    d, paint = shown(dashboard or Dashboard, keys, smoothing=smoothing)
    rng = np.random.default_rng(0)
    per = points // updates
    plot, ingest = timed_updates(d, paint, updates, lambda i: [records(i * per, per, rng, keys, offset=r / 2)
                                                                for r in range(runs)])
    assert all(len(d.series_data(f"run{r}", "loss")[0]) == points for r in range(runs))
    beside = worker_cpu(d) / updates
    gone(d)
    return plot, ingest, beside


def bench_live(points: int, updates: int, poll: int, keys: str = "loss", runs: int = 1) -> tuple[list, list, float]:
    """Series already at `points` (filled untimed, as when a long run is opened), then
    `updates` timed updates that each bring `poll` new records per run: a live run at
    1M points, logging poll * 10 records a second."""
    from widgets.dashboard import Dashboard

    d, paint = shown(Dashboard, keys)
    rng = np.random.default_rng(0)
    for at in range(0, points, 100_000):
        for r in range(runs):
            lines = records(at, min(100_000, points - at), rng, keys, offset=r / 2)
            d.append(f"run{r}", parse_jsonl(lines), lines)
    d.flush()
    for pw in paint:
        pw.viewport().repaint()
    plot, ingest = timed_updates(d, paint, updates, lambda i: [records(points + i * poll, poll, rng, keys,
                                                                        offset=r / 2) for r in range(runs)])
    beside = worker_cpu(d) / updates
    gone(d)
    return plot, ingest, beside


def bench_plain(points: int, updates: int) -> list[float]:
    """The same growth on one bare PlotWidget curve with pyqtgraph's own clipToView
    and peak downsampling (which re-reduces the whole series on every setData)."""
    pw = pg.PlotWidget()
    pw.resize(460, 380)
    pw.show()
    QApplication.processEvents()
    curve = pw.plot(pen=pg.mkPen("b", width=2))
    curve.setClipToView(True)
    curve.setDownsampling(auto=True, method="peak")
    rng = np.random.default_rng(0)
    x = np.arange(1, points + 1, dtype=np.float64)
    y = 2.0 * np.exp(-x / 2e5) + 0.05 * rng.standard_normal(points)
    per = points // updates
    times = []
    for i in range(1, updates + 1):
        t = now()
        curve.setData(x[: i * per], y[: i * per])
        pw.viewport().repaint()
        times.append(now() - t)
    pw.close()
    return times


def cells(times: list[float] | None) -> str:
    """Mean and worst of the updates after the first."""
    if not times:
        return f"{'':>7} {'':>7}"
    ms = [t * 1e3 for t in times[1:]]
    return f"{statistics.mean(ms):7.1f} {max(ms):7.1f}"


def ok(times: list[float], also: list[float] | None = None) -> str:
    """Under 30 ms, mean and worst (after the first update); with `also` (the ingest),
    update by update for the sum."""
    total = [a + b for a, b in zip(times, also)] if also else times
    return "yes" if statistics.mean(total[1:]) < 0.030 and max(total[1:]) < 0.030 else "no"


def over(times: list[float], also: list[float] | None = None) -> str:
    """How many updates after the first took 30 ms or more (with `also`: both parts)."""
    total = [a + b for a, b in zip(times, also)] if also else times
    return f"{sum(t >= 0.030 for t in total[1:])}/{len(total) - 1}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=1_000_000, help="points per series at the end")
    ap.add_argument("--updates", type=int, default=1000)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu: GUI-thread CPU time (default; fair on a busy machine); wall: elapsed time")
    ap.add_argument("--cases", default="all",
                    help="comma-separated subset of: single,ema,three,overlay,overlay_ema,stress,bare,live,live_overlay")
    ap.add_argument("--poll", type=int, default=50, help="records per run per update in the live cases")
    ap.add_argument("--before", metavar="REV", help="also measure the dashboard (widgets/dashboard) at this git revision")
    args = ap.parse_args()
    global now
    now = time.thread_time if args.clock == "cpu" else time.perf_counter
    QApplication.instance() or QApplication([])
    p, u = args.points, args.updates
    before = dashboard_at(args.before) if args.before else None
    every = {
        "single": (f"1 series x 1 plot, {p // u:,} per update", {}),
        "ema": ("  same, EMA smoothing 0.6", dict(smoothing=0.6)),
        "three": ("1 run: 3 series, 5 plots painted", dict(keys="three")),
        "overlay": ("3 series x 5 plots (3 runs overlaid)", dict(keys="five", runs=3)),
        "overlay_ema": ("  same, EMA smoothing 0.6", dict(smoothing=0.6, keys="five", runs=3)),
        "stress": (f"  same, {p // 100:,} per run per update (stress)", dict(keys="five", runs=3, updates=100)),
        "bare": ("bare pyqtgraph curve, peak downsampling", None),
        "live": (f"live at {args.points:,}: 1 run, {args.poll} records a poll", dict(keys="loss", runs=1)),
        "live_overlay": (f"live at {args.points:,}: 3 runs x 5 plots", dict(keys="five", runs=3)),
    }
    rows = []
    for case in (list(every) if args.cases == "all" else args.cases.split(",")):
        name, kw = every[case]
        if kw is None:
            rows.append((name, None, bench_plain(p, u), None, None))
            continue
        if case.startswith("live"):
            rows.append((name, None, *bench_live(p, 100, args.poll, **kw)))
            continue
        kw = dict(kw)
        n = kw.pop("updates", u)
        old = bench_dashboard(p, n, dashboard=before, **kw)[:2] if before else None
        rows.append((name, old, *bench_dashboard(p, n, **kw)))
    print(f"each series grows to {p:,} points in {u:,} updates ({p // u:,} new records per run each, "
          f"the stress row {p // 100:,}); ms per update after the first (the curves made, the first paint: "
          f"'first', plot and ingest), {args.clock} clock")
    sub = f"{'mean':>7} {'worst':>7}  {'<30 ms':>6}  "
    if before:  # the code at REV: its plot update and ingest, and how many updates took 30 ms or more
        print(f"{'':<44} {'before (' + args.before + '): plot, ingest':^43}  ", end="")
    else:
        print(f"{'':<44} ", end="")
    print(f"{'plot update':^25}{'ingest':^15}  {'both':^17}  {'first':>6}  {'parse':>7}")
    print(f"{'':<44} " + (f"{'mean':>7} {'worst':>7}  {'mean':>7} {'worst':>7} {'>=30 ms':>10}  " if before else "")
          + sub + f"{'mean':>7} {'worst':>7}  {'<30 ms':>6} {'>=30 ms':>10}  {'':>6}  {'process':>7}")
    for name, old, plot, ingest, beside in rows:
        was = f"{cells(old[0])}  {cells(old[1])} {over(*old):>10}  " if old else (" " * 46 if before else "")
        both = ok(plot, ingest) if ingest else ok(plot)
        first = (plot[0] + (ingest[0] if ingest else 0.0)) * 1e3
        print(f"{name:<44} {was}{cells(plot)}  {ok(plot):>6}  {cells(ingest)}  {both:>6} {over(plot, ingest):>10}"
              f"  {first:6.1f}  {'' if beside is None else format(beside * 1e3, '7.1f'):>7}")
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"this machine's speed: {reference():.2f} ms to parse 3,000 metrics lines (the overlay's per-update "
          f"parse, the median of 200); 'parse process': the CPU time per update of the dashboard's parse "
          f"process (engine/runs/parse_worker.py), on another core, beside the GUI thread's")


def reference() -> float:
    """A fixed piece of the ingest, timed on its own with the same clock: a yardstick
    for tables measured on other days (a shared VM's speed varies; the same code's
    ingest took 6.4 ms one day and 12.1 ms another)."""
    rng = np.random.default_rng(1)
    lines = [ln for r in range(3) for ln in records(0, 1000, rng, "five", offset=r / 2)]
    times = []
    for _ in range(200):
        t = now()
        parse_jsonl(lines)
        times.append(now() - t)
    return statistics.median(times) * 1e3


if __name__ == "__main__":
    main()
