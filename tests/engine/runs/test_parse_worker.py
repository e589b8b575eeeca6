"""engine/runs/parse_worker.py: metrics.jsonl parsed in a real child process, answered in
order, equal to parsing here; nothing lost when the process dies; it never outlives
the app."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from engine.runs.parse_worker import ParseWorker
from engine.runs.tail import parse_chunk

ROOT = Path(__file__).resolve().parents[3]


def chunk(start: int, n: int, nan_every: int = 0) -> bytes:
    recs = [{"step": s, "epoch": 0, "time": 100.0 + s / 8, "loss": 1.0 / s, "lr": 1e-3}
            for s in range(start, start + n)]
    if nan_every:
        for r in recs[::nan_every]:
            r["loss"] = math.nan  # Python's json writes NaN; orjson refuses it: read line by line
    return "\n".join(map(json.dumps, recs)).encode()


def same(a: tuple, b: tuple) -> bool:
    (ta, ra), (tb, rb) = a, b
    if (ta is None) != (tb is None) or json.dumps(ra) != json.dumps(rb):
        return False
    return ta is None or (ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k], equal_nan=True) for k in ta))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:  # (reaped meanwhile)
        return False


def test_chunks_come_back_in_order_as_parsed_here():
    chunks = [chunk(1 + 500 * i, 500, nan_every=7 if i == 3 else 0) for i in range(12)]
    chunks += [b'{"event": "start", "time": 1.0}\n{"step": 1, "loss": 0.5}', b"", b"not json\n{\"step\": 2}"]
    w = ParseWorker()
    try:
        for i, c in enumerate(chunks):
            w.submit(("run", i), c)
        got = w.wait(timeout=60)
        assert w.alive and w.error is None  # (answered by the process, not parsed here after a failure)
        assert [tag for tag, _ in got] == [("run", i) for i in range(len(chunks))]
        for (_, result), c in zip(got, chunks):
            assert same(result, parse_chunk(c))
        assert got[0][1][0]["step"].tolist() == list(range(1, 501)) and got[0][1][1] == []
        assert got[3][1][0] is not None and np.isnan(got[3][1][0]["loss"][::7]).all()  # NaN lines read one by one
        assert got[12][1] == (None, [{"event": "start", "time": 1.0}, {"step": 1, "loss": 0.5}])
        assert got[14][1] == (None, [{"step": 2}])
        assert w.pending() == 0 and w.ready() == []
    finally:
        w.close()


def test_a_worker_that_dies_loses_nothing():
    w = ParseWorker()
    chunks = [chunk(1 + 200 * i, 200) for i in range(6)]
    w.submit(0, chunks[0])
    first = w.wait(timeout=60)
    assert w.alive and [t for t, _ in first] == [0]
    pid = w._proc.pid
    os.kill(pid, signal.SIGKILL)
    for i in range(1, 4):  # sent to a process that is gone (or going)
        w.submit(i, chunks[i])
    got = w.wait(timeout=30)
    assert not w.alive and "ended" in w.error
    w.submit(4, chunks[4])  # parsed here from now on
    w.submit(5, chunks[5])
    got += w.ready()
    assert [t for t, _ in got] == [1, 2, 3, 4, 5]
    for (i, result) in got:
        assert same(result, parse_chunk(chunks[i]))


def test_results_given_already_parsed_keep_their_turn():
    """Records the caller has as dicts (a run's per-rank lines) must not overtake its
    lines still at the process, nor fall behind those sent after them; the same once
    the process is gone."""
    w = ParseWorker()
    try:
        w.submit(0, chunk(1, 300))
        w.submit_parsed(1, (None, [{"step": 300, "loss_rank1": 0.5}]))
        w.submit(2, chunk(301, 300))
        assert [t for t, _ in w.wait(timeout=60)] == [0, 1, 2] and w.alive
        w.submit(3, chunk(601, 300))
        os.kill(w._proc.pid, signal.SIGKILL)
        w.submit_parsed(4, (None, []))
        w.submit(5, chunk(901, 10))
        got = w.wait(timeout=30)
        assert [t for t, _ in got] == [3, 4, 5] and not w.alive
        assert same(got[0][1], parse_chunk(chunk(601, 300)))
    finally:
        w.close()


def test_a_process_that_stops_answering_is_given_up():
    w = ParseWorker()
    w.STUCK_S = 0.5
    try:
        w.submit(0, chunk(1, 50))
        w.wait(timeout=60)
        os.kill(w._proc.pid, signal.SIGSTOP)  # alive, but answers nothing
        w.submit(1, chunk(51, 50))
        deadline = time.monotonic() + 10
        got = []
        while not got and time.monotonic() < deadline:
            got = w.ready(0.1)
        assert [t for t, _ in got] == [1] and same(got[0][1], parse_chunk(chunk(51, 50)))
        assert "did not answer" in w.error
    finally:
        w.close()


def test_a_line_no_parser_can_read_costs_only_itself():
    """A line nested beyond Python's recursion limit (json raises RecursionError, not
    ValueError) is skipped like any unreadable line; the process goes on."""
    bad = b"[" * 100_000
    data = chunk(1, 3) + b"\n" + bad + b"\n" + chunk(4, 3)
    assert [r["step"] for r in parse_chunk(data)[1]] == [1, 2, 3, 4, 5, 6]
    w = ParseWorker()
    try:
        w.submit(0, data)
        w.submit(1, chunk(7, 100))
        got = w.wait(timeout=60)
        assert w.alive and [r["step"] for r in got[0][1][1]] == [1, 2, 3, 4, 5, 6]
        assert got[1][1][0]["step"].tolist() == list(range(7, 107))
    finally:
        w.close()


def test_close_ends_the_process():
    w = ParseWorker()
    w.submit(0, chunk(1, 100))
    w.wait(timeout=60)
    pid = w._proc.pid
    w.close()
    assert not alive(pid)
    w.submit(1, chunk(101, 100))  # still answers, parsed here
    assert [t for t, _ in w.ready()] == [1]


@pytest.mark.timeout(120)
def test_the_process_does_not_outlive_a_killed_app(tmp_path):
    """The app SIGKILLed (no close, no atexit): the parse process sees its stdin end and exits."""
    app = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from engine.runs.parse_worker import ParseWorker
        w = ParseWorker()
        w.submit(0, b'{"step": 1}')
        w.wait(timeout=60)
        print(w._proc.pid, flush=True)
        time.sleep(600)
    """)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(app.stdout.readline())
        assert alive(pid)
        app.kill()
        app.wait()
        deadline = time.monotonic() + 20
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid)
    finally:
        app.kill()
