"""Process trees from /proc (Linux): who is left of a run after a stop.

torchrun starts each worker in a session of its own, so a process group alone does
not find them; the launchers (remote/launch_local.py, app/run_controller.py) follow
descendants as well. No Qt here.
"""
from __future__ import annotations

import os


def _stats():
    """(pid, fields after "(comm)": state, ppid, pgrp, ...) of every process."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                yield int(entry.name), f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`."""
    return [pid for pid, rest in _stats() if len(rest) > 2 and int(rest[2]) == pgid and rest[0] != b"Z"]


def descendants(pid: int) -> set[int]:
    """Children, grandchildren... of pid (torchrun puts its workers in sessions of
    their own, so the process group alone does not find them)."""
    kids: dict[int, list[int]] = {}
    for child, rest in _stats():
        kids.setdefault(int(rest[1]), []).append(child)
    out, stack = set(), [pid]
    while stack:
        for c in kids.get(stack.pop(), []):
            if c not in out:
                out.add(c)
                stack.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False
