"""Read a growing line-oriented file (metrics.jsonl, rank logs) by byte offset.

The offset always sits just after the last *complete* line handed out, so a reader
that stops (app closed, SSH connection cut) and starts again from its saved offset
never loses nor repeats a line; a half-written last line is left for the next read.
remote/tracker.py uses `split_complete` on bytes read over SFTP; the dashboard uses
`FileTail` on local files. No Qt here.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO


def split_complete(data: bytes) -> tuple[list[bytes], int]:
    """Complete lines in `data` (without their newline) and how many bytes they span."""
    end = data.rfind(b"\n")
    if end < 0:
        return [], 0
    return data[:end].split(b"\n"), end + 1


def read_from(f: IO[bytes], offset: int, max_bytes: int = 16 << 20) -> tuple[list[bytes], int]:
    """Lines after `offset` in an open binary file; returns (lines, new offset)."""
    f.seek(offset)
    data = f.read(max_bytes)
    lines, used = split_complete(data)
    return lines, offset + used


class FileTail:
    """Polls a local file for new complete lines."""

    def __init__(self, path: str | os.PathLike, offset: int = 0):
        self.path = Path(path)
        self.offset = offset

    def poll(self) -> list[str]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:  # the file was replaced or truncated (a run restarted): start over
            self.offset = 0
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            lines, self.offset = read_from(f, self.offset)
        return [ln.decode("utf-8", errors="replace") for ln in lines]


def parse_jsonl(lines: list[str] | list[bytes]) -> list[dict]:
    """JSON objects from lines; blank and malformed lines are skipped."""
    out = []
    for ln in lines:
        ln = ln.strip()
        if not ln:
            continue
        try:
            obj = json.loads(ln)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


class MetricsTail(FileTail):
    """New metric records (dicts) of a run's metrics.jsonl."""

    def poll_records(self) -> list[dict]:
        return parse_jsonl(self.poll())


RANK_KEYS = ("step_ms", "samples_per_s", "loss")


class RankMetricsTail:
    """The per-rank records of a multi-process run (logs/rankN.metrics.jsonl, written
    by every rank) as dashboard records: {"step", "time", "step_ms_rank1": ...}. Files
    that appear later (ranks starting) are picked up on the next poll."""

    def __init__(self, run_dir: str | os.PathLike):
        self.logs = Path(run_dir) / "logs"
        self.tails: dict[Path, MetricsTail] = {}

    def poll_records(self) -> list[dict]:
        try:
            for p in sorted(self.logs.glob("rank*.metrics.jsonl")):
                self.tails.setdefault(p, MetricsTail(p))
        except OSError:
            return []
        out = []
        for tail in self.tails.values():
            for r in tail.poll_records():
                rank, step = r.get("rank"), r.get("step")
                if not isinstance(rank, int) or not isinstance(step, int):
                    continue
                rec = {"step": step, "time": r.get("time")}
                rec.update({f"{k}_rank{rank}": r[k] for k in RANK_KEYS if k in r})
                out.append(rec)
        return out


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All records of a metrics.jsonl (a finished or running run)."""
    return MetricsTail(path).poll_records()
