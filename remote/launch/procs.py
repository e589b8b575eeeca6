"""The processes of a local run, and the one way to stop them (psutil).

torchrun starts each worker in a session of its own, so a process group alone does
not find them; a run is therefore its launcher's process group *and* every
descendant seen since the start (`track`), each worker's own group included. Both
launchers, app/run_controller.py (the GUI) and remote/launch/local.py (the CLI's
`train --nproc N`), hold a run's processes as a `ProcessTree` and stop it one way:
the first signal to the launcher's group (its leader forwards it: the runtime
checkpoints and stops after the current step), then after a grace period SIGKILL
to the group, to every descendant and to every group they lead (`signal_tree`), so
no orphan survives; from a poll that never blocks (the GUI) or waiting (`stop_tree`).

A zombie counts as gone (it runs nothing; its parent reaps it), and nothing here
reaps a process: a launcher's exit code stays for its subprocess.Popen. `seen` maps
pid -> psutil.Process, whose create time guards against a pid reused since it was
seen. No Qt here; Linux and macOS.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Callable

import psutil

Seen = dict[int, psutil.Process]  # every process of a run seen so far


def _running(p: psutil.Process) -> bool:
    """Still the process that was seen (not a reused pid), and not a zombie."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def alive(pid: int) -> bool:
    """pid exists and is not a zombie."""
    p = process_of(pid)
    return p is not None and _running(p)


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (OSError, psutil.NoSuchProcess):
            continue
        except psutil.AccessDenied:
            out.append(p.pid)
    return sorted(out)


def process_of(pid: int) -> psutil.Process | None:
    """The process with this pid as it is now (a launcher keeps it: a pid reused later is not it)."""
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _proc(root: int | psutil.Process) -> psutil.Process | None:
    return root if isinstance(root, psutil.Process) else process_of(root)


def _children(root: int | psutil.Process) -> list[psutil.Process]:
    p = _proc(root)
    try:
        return p.children(recursive=True) if p is not None and p.is_running() else []
    except psutil.NoSuchProcess:
        return []


def descendants(pid: int) -> set[int]:
    """Children, grandchildren... of pid, zombies included (torchrun puts its workers
    in sessions of their own, so the process group alone does not find them)."""
    return {p.pid for p in _children(pid)}


def track(root: int | psutil.Process, seen: Seen) -> Seen:
    """Add root's current descendants to `seen` (pid -> psutil.Process); returns it.
    A root that is gone (or whose pid was reused) has none."""
    seen.update((p.pid, p) for p in _children(root))
    return seen


def leftovers(pgid: int | None, seen: Seen, root: int | psutil.Process | None = None) -> list[int]:
    """Processes of a run still alive: group `pgid`, the root, and every one seen."""
    left = set(group_pids(pgid)) if pgid is not None else set()
    r = _proc(root) if root is not None else None
    if r is not None and _running(r):
        left.add(r.pid)
    left |= {pid for pid, p in seen.items() if _running(p)}
    return sorted(left)


def _send(send, target: int, sig) -> None:
    try:
        send(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_tree(root: int | psutil.Process, pgid: int | None, sig, *, seen: Seen | None = None,
                group_only: bool = False) -> list[int]:
    """Send `sig` to a run. Always to process group `pgid` (killpg); unless `group_only`,
    also to the root, to each of its descendants and each process in `seen` (which the
    current descendants are added to), and to every group they lead. group_only is a
    polite request the group's leader passes on (SIGINT/SIGTERM); the whole tree is
    for SIGKILL. Never signals this process or its group. Returns the run's processes
    that were alive when signalled (root and group included)."""
    seen = {} if seen is None else seen
    me, my_group = os.getpid(), os.getpgrp()

    def to_group() -> None:
        if pgid is not None and pgid != my_group:
            _send(os.killpg, pgid, sig)

    if group_only:
        hit = leftovers(pgid, seen, root)
        to_group()
        return hit
    track(root, seen)  # before any signal: a dead parent's children are no longer its own
    targets = dict(seen)
    r = _proc(root)
    if r is not None:
        targets.setdefault(r.pid, r)
    hit = set(leftovers(pgid, seen, root))
    to_group()
    for pid, p in targets.items():
        if pid in (me, my_group):
            continue
        if _running(p):
            _send(os.killpg, pid, sig)  # a worker's own session: its helpers live there
            try:
                p.send_signal(sig)  # psutil checks the pid was not reused
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        elif not psutil.pid_exists(pid):
            # The leader is gone, its group may not be: the kernel keeps the number for
            # the group until the last member ends, so it cannot be someone else's.
            _send(os.killpg, pid, sig)
    return sorted(hit)


def wait_gone(pgid: int | None, seen: Seen, timeout: float, root: int | psutil.Process | None = None,
              interval: float = 0.1) -> list[int]:
    """Wait up to `timeout` s until nothing of the run is alive (zombies count as gone,
    none is reaped); new descendants of root are tracked meanwhile. Returns what is
    left."""
    end = time.monotonic() + timeout
    last_scan = 0.0
    while True:
        now = time.monotonic()
        if root is not None and now - last_scan >= 0.5:
            track(root, seen)
            last_scan = now
        left = leftovers(pgid, seen, root)
        if not left or now >= end:
            return left
        time.sleep(min(interval, max(0.0, end - now)))


def stop_tree(root: int | psutil.Process, pgid: int | None, grace_s: float, first_signal=signal.SIGTERM, *,
              seen: Seen | None = None, kill_wait_s: float = 5.0) -> list[int]:
    """Stop a run and wait: `first_signal` to group `pgid` (its leader passes it on),
    up to `grace_s` s for every process of the run to end, then SIGKILL to the whole
    tree (signal_tree) and up to `kill_wait_s` s more. `seen` (pid -> psutil.Process)
    is updated with every descendant found. Returns the pids still alive at the end
    (none, unless a process could not be killed)."""
    seen = {} if seen is None else seen
    track(root, seen)
    signal_tree(root, pgid, first_signal, seen=seen, group_only=True)
    left = wait_gone(pgid, seen, grace_s, root)
    if left:
        signal_tree(root, pgid, signal.SIGKILL, seen=seen)
        left = wait_gone(pgid, seen, kill_wait_s, root)
    return left


class ProcessTree:
    """A run's processes, and the one way both launchers stop them: a launcher
    (`proc`, leading a process group of its own: start_new_session) and every
    descendant seen since the start. The GUI's runs (app/run_controller.py) and the
    CLI's (remote/launch/local.py LocalJob) each hold one.

    `request_stop` asks (its `stop_signal` to the launcher's group; the runtime
    checkpoints and stops after the current step) and `poll` escalates to SIGKILL once
    the grace period is over, so a caller that must not block (the GUI's 5 Hz poll)
    never waits; `stop` does the same and waits. `poll` calls the run over only when
    the launcher has exited *and* none of its processes is left: a worker that outlives
    its launcher is asked to end (SIGTERM), then killed after `grace_s`."""

    SCAN_S = 1.0  # how often poll looks for new descendants while the launcher runs

    def __init__(self, proc, stop_signal=signal.SIGTERM, grace_s: float = 15.0):
        self.proc = proc
        self.stop_signal = stop_signal
        self.grace_s = grace_s
        self.root = process_of(proc.pid)  # not reaped yet: it is our child (a pid reused later is not it)
        self.seen: Seen = {}
        self.stop_requested = False
        self.kill_at: float | None = None  # monotonic time to escalate to SIGKILL
        # called before a stop is sent: LocalJob marks the run as cancelled by its user there
        # (engine/runtime/records.py CANCEL_FILE), so the run never reads the stop as a preemption
        self.before_stop: Callable[[], None] | None = None
        self._last_scan = 0.0
        self.scan()

    def _before_stop(self) -> None:
        if self.before_stop is not None and not self.stop_requested:
            try:
                self.before_stop()
            except Exception:  # noqa: BLE001 - marking the stop must never keep it from being sent
                pass

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session: the launcher leads its group

    def scan(self) -> None:
        if self.root is not None:
            track(self.root, self.seen)
        self._last_scan = time.monotonic()

    def leftovers(self) -> list[int]:
        """Processes of this run still alive: its group, and every descendant seen."""
        return leftovers(self.pgid, self.seen)

    def send(self, sig, *, group_only: bool = False) -> list[int]:
        """`sig` to the group (group_only) or to the whole tree (signal_tree)."""
        return signal_tree(self.root or self.pid, self.pgid, sig, seen=self.seen, group_only=group_only)

    def request_stop(self, grace_s: float | None = None) -> None:
        """Ask the run to stop (its stop_signal to the group); poll() SIGKILLs what is left
        after `grace_s` (default: the tree's)."""
        self._before_stop()
        self.stop_requested = True
        self.kill_at = time.monotonic() + (self.grace_s if grace_s is None else grace_s)
        self.scan()
        self.send(self.stop_signal, group_only=True)

    def kill(self) -> None:
        """SIGKILL to the launcher, its group, every descendant seen and every group they lead."""
        self.stop_requested = True
        self.send(signal.SIGKILL)

    def poll(self) -> int | None:
        """The launcher's exit code once nothing of the run is left; None before. Never blocks."""
        code = self.proc.poll()
        now = time.monotonic()
        if code is None and now - self._last_scan > self.SCAN_S:
            self.scan()
        if self.kill_at is not None and now > self.kill_at and self.leftovers():
            self.kill()
        if code is None:
            return None
        if self.leftovers():  # the launcher is gone but a worker is not: end it before calling the run over
            if self.kill_at is None:
                self.send(signal.SIGTERM)
                self.kill_at = now + self.grace_s
            return None
        return code

    def stop(self, grace_s: float | None = None) -> int:
        """request_stop, then wait: SIGKILL to the whole tree after the grace period
        (stop_tree). Returns the launcher's exit code."""
        self._before_stop()
        self.stop_requested = True
        grace = self.grace_s if grace_s is None else grace_s
        stop_tree(self.root or self.pid, self.pgid, grace, self.stop_signal, seen=self.seen)
        return self.proc.wait()


__all__ = ["ProcessTree", "alive", "descendants", "group_pids", "leftovers", "signal_tree", "stop_tree", "track", "wait_gone"]
