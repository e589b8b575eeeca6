"""How long one live dashboard update takes while a series grows to 1,000,000 points.

The dashboard (widgets/dashboard.py) appends each poll's records and, 10 times a
second, pushes the changed series to their curves and repaints. This grows a loss
series in 100 updates of 10,000 records each (a run writing 10,000 steps per 100 ms:
a worst case; real runs write a few) and times every update in two parts: the plot
update (flush = setData, then a synchronous repaint of the plot that holds the
series) and the ingest of the new records (append: parse dicts into float64
buffers). Goal: plot update mean and worst under 30 ms. Also timed: the same with
EMA smoothing, with three series growing at once (loss, lr, throughput: what a run
writes) and repainting all five plots, and a bare pyqtgraph curve with its own
clipToView + peak downsampling for comparison (the dashboard feeds pyqtgraph a
block min/max envelope it keeps up to date as points arrive instead).

    QT_QPA_PLATFORM=offscreen python bench/plot_live.py [--points 1000000] [--updates 100]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyqtgraph as pg  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402


# --clock cpu (default): CPU time of the GUI thread, what an update costs on a core
# of its own; immune to other processes on a shared machine. --clock wall: elapsed.
now = time.thread_time


def records(start: int, n: int, rng, full: bool = False) -> list[dict]:
    steps = np.arange(start + 1, start + n + 1)
    loss = 2.0 * np.exp(-steps / 2e5) + 0.05 * rng.standard_normal(n)
    if full:
        return [{"step": int(s), "epoch": 0, "time": float(s) * 1e-3, "loss": float(v), "lr": 1e-3 * (1 + float(v)),
                 "samples_per_s": 5000.0 + float(v)} for s, v in zip(steps, loss)]
    return [{"step": int(s), "time": float(s) * 1e-3, "loss": float(v)} for s, v in zip(steps, loss)]


def repaint(d, all_plots: bool) -> None:
    for pid, pw in d.plots.items():
        if all_plots or pid == "loss":
            pw.viewport().repaint()


def bench_dashboard(points: int, updates: int, smoothing: float = 0.0, full: bool = False) -> tuple[list, list]:
    from widgets.dashboard import Dashboard

    d = Dashboard(smoothing=smoothing)
    d._timer.stop()  # updates are driven (and timed) here
    d.resize(1400, 800)
    d.show()
    QApplication.processEvents()
    rng = np.random.default_rng(0)
    per = points // updates
    batches = [records(i * per, per, rng, full) for i in range(updates)]  # prepared outside the timing
    plot, ingest = [], []
    for batch in batches:
        t0 = now()
        d.append("run", batch)
        t1 = now()
        d.flush()
        repaint(d, all_plots=full)
        t2 = now()
        ingest.append(t1 - t0)
        plot.append(t2 - t1)
    assert len(d.series_data("run", "loss")[0]) == points
    d.close()
    return plot, ingest


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


def row(name: str, times: list[float]) -> str:
    ms = [t * 1e3 for t in times]
    last = ms[-max(1, len(ms) // 10):]
    return (f"{name:<40} {statistics.mean(ms):7.1f} {statistics.median(ms):7.1f} {max(ms):7.1f} {statistics.mean(last):8.1f}"
            f"  {'yes' if statistics.mean(ms) < 30 and max(ms) < 30 else 'no'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--updates", type=int, default=100)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu: GUI-thread CPU time (default; fair on a busy machine); wall: elapsed time")
    args = ap.parse_args()
    global now
    now = time.thread_time if args.clock == "cpu" else time.perf_counter
    QApplication.instance() or QApplication([])
    dash, ingest = bench_dashboard(args.points, args.updates)
    dash_s, ingest_s = bench_dashboard(args.points, args.updates, smoothing=0.6)
    full, ingest_f = bench_dashboard(args.points, args.updates, full=True)
    plain = bench_plain(args.points, args.updates)
    print(f"a series growing to {args.points:,} points in {args.updates} updates "
          f"({args.points // args.updates:,} new points each); ms per update, {args.clock} clock")
    print(f"{'':<40} {'mean':>7} {'median':>7} {'worst':>7} {'last10%':>8}  <30 ms")
    print(row("plot update (setData + paint)", dash))
    print(row("  same, EMA smoothing 0.6", dash_s))
    print(row("  3 series, all 5 plots painted", full))
    print(row("ingest 10k records (append)", ingest))
    print(row("  same, EMA smoothing 0.6", ingest_s))
    print(row("  3 series", ingest_f))
    print(row("bare curve, pyqtgraph peak downsampling", plain))
    print(f"ratio bare curve / dashboard plot update, last 10%: "
          f"{statistics.mean(plain[-len(plain) // 10:]) / statistics.mean(dash[-len(dash) // 10:]):.2f}")
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
