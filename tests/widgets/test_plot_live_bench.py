"""bench/plot_live.py, which measures the dashboard's updates, cannot rot: a tiny run
of three of its cases prints their rows, the load and the machine's yardstick."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_dashboard_bench_prints_its_table():
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    out = subprocess.run([sys.executable, "bench/plot_live.py", "--points", "20000", "--updates", "20",
                          "--cases", "single,overlay,live_overlay", "--poll", "20"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {ln[:44].strip(): ln[44:].split() for ln in out.stdout.splitlines() if re.search(r"\d+/\d+", ln)}
    assert set(rows) == {"1 series x 1 plot, 1,000 per update", "3 series x 5 plots (3 runs overlaid)",
                         "live at 20,000: 3 runs x 5 plots"}
    for cells in rows.values():  # plot mean, worst, under 30 ms; ingest mean, worst; both under 30, over; first;
        # the parse process's CPU per update
        assert len(cells) == 9 and all(float(cells[i]) >= 0 for i in (0, 1, 3, 4, 7, 8))
        assert cells[2] in ("yes", "no") and cells[5] in ("yes", "no")
    assert rows["3 series x 5 plots (3 runs overlaid)"][6].endswith("/19")
    assert rows["live at 20,000: 3 runs x 5 plots"][6].endswith("/99")
    speed = re.search(r"this machine's speed: ([\d.]+) ms", out.stdout)
    assert speed and float(speed.group(1)) > 0
