"""Parse metrics.jsonl in a process of its own, so the GUI thread does not.

The dashboard's live update must stay under 30 ms with the parse of its new lines
included, and parsing is most of that ingest: 3,000 lines of a 3-run overlay cost the
GUI thread 4.5 ms in orjson and 2 ms more to make columns of them, every poll. A
thread cannot take that off the GUI thread (orjson and np.fromiter hold the GIL); a
process can. `ParseWorker` starts `python -m engine.runs.parse_worker`, sends it each
poll's new lines (the bytes as read, one message) and hands back, in the order they
were sent, what engine/runs/tail.py's `parse_chunk` makes of them: a table of float64
columns (or, for small, mixed or odd batches, the records as dicts). The GUI's side
costs a pipe write and the unpickling of a few arrays.

Requests carry a tag the caller chooses (the dashboard: the run's own object, so the
results of a run removed or cleared meanwhile are dropped). Nothing is lost when the
process cannot start, dies or stops answering: what it had not answered is parsed
here, in order, and so is everything after (the same result, on the caller's
thread). The process ends when its stdin closes (the app gone, however it ended) or
is killed by `close()`. No Qt here.
"""
from __future__ import annotations

import collections
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

from engine.runs.tail import parse_chunk

CODE_ROOT = str(Path(__file__).resolve().parents[2])
log = logging.getLogger(__name__)


def _parse(data: bytes) -> tuple:
    """parse_chunk, never raising: a chunk it cannot read gives nothing (a line nested
    beyond Python's recursion limit, say) rather than stopping every later one."""
    try:
        return parse_chunk(data)
    except Exception:  # one bad chunk must not end the plotting of a run
        log.exception("a chunk of metrics lines could not be read")
        return None, []


class ParseWorker:
    """Chunks of metrics.jsonl parsed in a child process; results in submission order."""

    STUCK_S = 10.0  # an answer later than this (plus a second per 5 MB) means the process is stuck

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._send: Connection | None = None
        self._recv: Connection | None = None
        self._writer: threading.Thread | None = None
        # (tag, data, result, deadline) not taken yet, oldest first: result is None for
        # data sent to the process, or what was given already parsed (submit_parsed)
        self._sent: collections.deque = collections.deque()
        self._done: collections.deque = collections.deque()  # (tag, result) parsed here (no process)
        self._failed = False  # parse here from now on
        self._due = 0.0  # when the answer to the latest chunk sent is due at the latest
        self.error: str | None = None  # why the process is not used, if it is not

    @property
    def alive(self) -> bool:
        return self._proc is not None and not self._failed

    def _start(self) -> None:
        env = {**os.environ, "PYTHONPATH": CODE_ROOT + (os.pathsep + os.environ["PYTHONPATH"]
                                                       if os.environ.get("PYTHONPATH") else "")}
        try:  # a session of its own: Ctrl-C in the app's terminal is the app's to handle
            self._proc = subprocess.Popen([sys.executable, "-m", "engine.runs.parse_worker"], cwd=CODE_ROOT, env=env,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          start_new_session=True)
        except OSError as exc:
            self._give_up(f"could not start the parse process: {exc}")
            return
        # the pipes as multiprocessing Connections (length-prefixed pickles); they own the fds now
        self._send = Connection(os.dup(self._proc.stdin.fileno()), readable=False)
        self._recv = Connection(os.dup(self._proc.stdout.fileno()), writable=False)
        self._proc.stdin.close()
        self._proc.stdout.close()
        self._outbox = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write, args=(self._send, self._outbox), daemon=True,
                                        name="parse-worker-send")
        self._writer.start()

    @staticmethod
    def _write(conn: Connection, outbox: queue.SimpleQueue) -> None:
        """Sends the chunks: a write waits while the pipe is full (the process starting,
        or busy), and waits here, with the GIL released, never in the GUI thread."""
        try:
            while (data := outbox.get()) is not None:
                conn.send_bytes(data)
        except OSError:  # it died: ready() sees its output end and parses here
            pass
        finally:
            conn.close()  # its stdin ends: it exits

    def submit(self, tag, data: bytes) -> None:
        """Parse `data` (complete lines joined by newlines) in the process; its result
        comes out of `ready` after those of everything submitted before."""
        if not self._failed and self._proc is None:
            self._start()
        if self._failed:
            self._done.append((tag, _parse(data)))
            return
        # the answer is due once those before it are in, STUCK_S and a second per 5 MB later
        self._due = max(time.monotonic(), self._due) + self.STUCK_S + len(data) / 5e6
        self._sent.append((tag, data, None, self._due))
        self._outbox.put(data)

    def submit_parsed(self, tag, result: tuple) -> None:
        """A result made elsewhere, to come out of `ready` in its turn, after everything
        submitted before it (records that must not overtake lines still being parsed)."""
        if self._failed:
            self._done.append((tag, result))
        else:  # (while the process is used, every result passes through _sent, in order)
            self._sent.append((tag, None, result, 0.0))

    def pending(self) -> int:
        """Chunks submitted whose results have not been taken."""
        return len(self._sent) + len(self._done)

    def ready(self, timeout: float = 0.0, budget_s: float | None = None) -> list[tuple[object, tuple]]:
        """Results ready now (waiting up to `timeout` seconds for the first), oldest first:
        (tag, (table or None, records)); with `budget_s`, no more once that long was spent
        taking them (the rest stay in the pipe for the next call). A process that has not
        answered the oldest chunk in STUCK_S seconds is given up (see _give_up)."""
        out = []
        start = time.monotonic()
        deadline = start + timeout
        while self._sent and not self._failed:
            if out and budget_s is not None and time.monotonic() - start > budget_s:
                return out
            tag, _, result, stuck_at = self._sent[0]
            if result is None:
                try:
                    if not self._recv.poll(max(0.0, deadline - time.monotonic()) if not out else 0.0):
                        if time.monotonic() > stuck_at:
                            self._give_up(f"the parse process did not answer in {self.STUCK_S:g} s")
                        break
                    result = pickle.loads(self._recv.recv_bytes())
                except (OSError, EOFError, pickle.UnpicklingError) as exc:
                    self._give_up(f"the parse process ended: {exc!r}")
                    break
            self._sent.popleft()
            out.append((tag, result))
        while self._done:
            out.append(self._done.popleft())
        return out

    def wait(self, timeout: float = 30.0) -> list[tuple[object, tuple]]:
        """Every pending result (the process given up to `timeout` seconds in all)."""
        out, deadline = [], time.monotonic() + timeout
        while self.pending():
            left = deadline - time.monotonic()
            if left <= 0:
                self._give_up(f"the parse process did not answer in {timeout:g} s")
            out += self.ready(max(0.0, left))
        return out

    def _give_up(self, why: str) -> None:
        """Parse here from now on: first what the process had not answered, in order."""
        self.error, self._failed = why, True
        log.warning("%s; metrics are parsed in this process from now on", why)
        while self._sent:
            tag, data, result, _ = self._sent.popleft()
            self._done.append((tag, result if result is not None else _parse(data)))
        self.close()

    def close(self) -> None:
        """End the process at once: nothing it is doing is needed any more (what was not
        answered is lost, unless _give_up parsed it here first)."""
        self._failed = True
        if self._send is not None:
            self._outbox.put(None)  # the writer closes the pipe once it is out of a write
        if self._recv is not None:
            self._recv.close()
        proc, self._proc, self._send, self._recv = self._proc, None, None, None
        if proc is not None:
            proc.kill()
            proc.wait()
        if self._writer is not None:
            self._writer.join(timeout=2)  # a write to the killed process fails at once
            self._writer = None

    def __del__(self):
        if self._proc is not None:
            self.close()


def serve(inp: Connection, out: Connection) -> None:
    """The process: a thread reads requests as they come (so the GUI's writes never
    wait on a parse), this one parses them in order, and a third writes the answers.
    An answer larger than the pipe (10,000 records are 560 kB of columns; a pipe holds
    64 kB) is written only as the GUI reads it, at its next timer tick: parsing
    and answering in one thread parsed one chunk a tick (50 runs opened together took
    5 s to arrive, where their parse takes 1); with the writer apart, the parse runs
    ahead and a tick takes every answer ready."""
    requests: queue.Queue = queue.Queue()
    answers: queue.Queue = queue.Queue()

    def read():
        try:
            while True:
                requests.put(inp.recv_bytes())
        except (EOFError, OSError):
            requests.put(None)

    def write():
        try:
            while (blob := answers.get()) is not None:
                out.send_bytes(blob)
        except OSError:  # the app is gone
            pass

    threading.Thread(target=read, daemon=True).start()
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    while (msg := requests.get()) is not None:  # the bytes of one chunk
        answers.put(pickle.dumps(_parse(msg), protocol=pickle.HIGHEST_PROTOCOL))
        if not writer.is_alive():  # the app is gone
            return
    answers.put(None)
    writer.join()


if __name__ == "__main__":
    answers = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print must not land among the answers
    serve(Connection(sys.stdin.fileno(), writable=False), Connection(answers, readable=False))
