"""The sweep queue: runs of one sweep (engine/runs/sweep.py: the file, its points, their checks)
started on this machine (remote/launch/local.py) or deployed one job per run to a cluster
(remote/launch/__init__.py), watched through their metrics.jsonl, stopped early on a rule.

    runner = SweepRunner(project, sweep)      # checks every point (SweepError)
    runner.run(on_event=print)                # blocks; stop() from another thread ends it

No Qt here: the CLI, the API and the Sweep panel drive the same runner.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from engine.errors import LayerflowError
from engine.runs.sweep import (ACTIVE, TAG_FILE, SweepError, _fmt, _number, _table, check_sweep, default_parallel,
                          load_sweep, point_label)


# ----- the queue ---------------------------------------------------------------------------
@dataclass
class SweepRun:
    """One run of the queue, as the CLI and the Sweep panel show it."""
    index: int
    point: dict
    nproc: int
    state: str = "queued"  # queued | preparing | running | stopping | succeeded | failed | cancelled | stopped
    run_dir: Path | None = None
    step: int = 0
    total_steps: int | None = None
    note: str = ""  # "stopped early: <rule>", an error
    started: float | None = None
    ended: float | None = None
    last: dict = field(default_factory=dict)  # the last training record

    @property
    def label(self) -> str:
        return point_label(self.point)

    @property
    def done(self) -> bool:
        return self.state not in ("queued", *ACTIVE)

    @property
    def shown_state(self) -> str:
        return f"stopped early: {self.note}" if self.state == "stopped" else self.state

    def to_json(self) -> dict:
        return {"index": self.index, "point": self.point, "nproc": self.nproc, "state": self.state,
                "run_dir": str(self.run_dir) if self.run_dir else None, "step": self.step,
                "total_steps": self.total_steps, "note": self.note, "started": self.started, "ended": self.ended}


class _LocalHandle:
    """A run started on this machine (remote/launch/local.py LocalJob)."""

    def __init__(self, run_dir: Path, nproc: int):
        from remote.launch.local import launch_local

        self.run_dir = run_dir
        self.job = launch_local(run_dir, nproc)
        self.metrics = run_dir / "metrics.jsonl"

    def poll(self) -> bool:
        """True once the run and every process of it are gone."""
        return self.job.poll() is not None

    def request_stop(self, grace: float) -> None:
        self.job.tree.request_stop(grace)  # SIGTERM: checkpoint, end as cancelled; SIGKILL after grace

    def kill(self) -> None:
        self.job.kill()

    def state(self) -> tuple[str, int, str]:
        from engine.runtime.records import RunStatus

        st = RunStatus.read(self.run_dir)
        if st is None:
            return ("failed" if self.job.returncode else "pending"), 0, ""
        if st.state == "running" and self.job.returncode is not None:
            return ("failed" if self.job.returncode else "interrupted"), st.step, st.error or ""
        return st.state, st.step, st.error or ""


class _ClusterHandle:
    """A run deployed as one job on a cluster (remote/launch/__init__.py deploy; remote/tracker.py)."""

    def __init__(self, run_dir: Path, cluster: str, name: str):
        from remote.cluster import ClusterStore
        from remote.jobs import JobDB
        from remote.launch import deploy
        from remote.tracker import Tracker

        self.run_dir = run_dir
        job = deploy(ClusterStore().get(cluster), run_dir, name=name)
        self.db = JobDB()
        self.tracker = Tracker(job.id, db=self.db)
        self.job_id = job.id
        self.metrics = self.db.mirror_dir(job.id) / "metrics.jsonl"
        self.record = job

    def poll(self) -> bool:
        self.record = self.tracker.poll()
        self.sync()
        return self.record.done

    def sync(self) -> None:
        """The job's mirror (metrics, status, rank logs and system samples, as the tracker
        streams them) into the local run folder, so the runs table, `runs` and the dashboard
        read a cluster run as they read a local one: appended files grow by what is new,
        status.json is replaced when it changed."""
        from engine.files import atomic_write

        src = self.db.mirror_dir(self.job_id)
        for p in [src / "metrics.jsonl", src / "status.json", *sorted((src / "logs").glob("*"))]:
            if not p.is_file():
                continue
            dst = self.run_dir / p.relative_to(src)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if p.name == "status.json":
                data = p.read_bytes()
                if not dst.exists() or dst.read_bytes() != data:
                    atomic_write(dst, data)
                continue
            have = dst.stat().st_size if dst.exists() else 0
            if p.stat().st_size > have:
                with open(p, "rb") as f, open(dst, "ab") as out:
                    f.seek(have)
                    shutil.copyfileobj(f, out)

    def request_stop(self, grace: float) -> None:
        self.record = self.tracker.cancel(grace)
        self.sync()

    def kill(self) -> None:
        self.request_stop(0)

    def state(self) -> tuple[str, int, str]:
        r = self.record
        return r.state, int(r.step or 0), r.error or ""


EventFn = Callable[[str, SweepRun], None]  # ("started" | "progress" | "finished", run)


class SweepRunner:
    """The queue: `parallel` runs at once (local), or one cluster job per run (`cluster`).

        runner = SweepRunner(project, sweep)      # checks every point (SweepError)
        runner.run(on_event=print)                # blocks; stop() from another thread ends it

    Its state is runs/sweep-<id>.json, written at each change."""

    POLL_S = 0.5

    def __init__(self, project, sweep, *, parallel: int | None = None, cluster: str | None = None,
                 runs_dir: str | os.PathLike | None = None, sweep_id: str | None = None, grace_s: float = 30.0):
        from engine.runs.history import check_runs_inside, runs_dir as project_runs

        self.project = project
        self.sweep = load_sweep(sweep)
        for k, v in (("parallel", parallel),):
            if v is not None and (type(v) is not int or v < 1):
                raise SweepError(f"{k} must be a whole number of at least 1, not {v!r}")
        self.planned = check_sweep(project, self.sweep)
        self.cluster = cluster
        nprocs = [p.nproc for p in self.planned]
        if cluster:
            self.parallel = parallel or self.sweep.parallel or len(self.planned)
        else:
            self.parallel = parallel or self.sweep.parallel or default_parallel(nprocs)
        self.grace_s = grace_s
        self.runs_dir = Path(runs_dir) if runs_dir else project_runs(project.directory)
        if runs_dir is None:
            check_runs_inside(project.directory)
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.sweep.name) or "sweep"
        self.id = sweep_id or f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.runs = [SweepRun(p.index, p.point, p.nproc) for p in self.planned]
        self._handles: dict[int, Any] = {}
        self._tails: dict[int, Any] = {}
        self._reasons: dict[int, str] = {}
        self._stop = threading.Event()
        self.lock = threading.RLock()
        self.started: float | None = None
        self.ended: float | None = None

    @property
    def state_file(self) -> Path:
        return self.runs_dir / f"sweep-{self.id}.json"

    def queue_text(self) -> str:
        """The queue as a table (what `sweep --dry-run` prints)."""
        keys = list(self.sweep.parameters)
        rows = [["#", *keys, "procs", "state"]]
        for r in self.runs:
            rows.append([str(r.index + 1), *(_fmt(r.point.get(k)) for k in keys), str(r.nproc), r.shown_state])
        return _table(rows)

    # -- running ----------------------------------------------------------------------------
    def stop(self) -> None:
        """End the sweep: queued runs are not started, running ones stop as a user's Stop does."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, on_event: EventFn | None = None) -> list[SweepRun]:
        """Run the queue to its end (or until stop()); returns the runs."""
        self.started = time.time()
        self._save()
        try:
            while True:
                if not self.step(on_event):
                    break
                time.sleep(self.POLL_S)
        except BaseException:  # Ctrl-C, an error of ours: no run is left behind
            self._stop.set()
            for i, h in list(self._handles.items()):
                try:
                    h.request_stop(min(self.grace_s, 10.0))
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
            end = time.monotonic() + min(self.grace_s, 10.0) + 5
            while self._handles and time.monotonic() < end:
                for i, h in list(self._handles.items()):
                    if h.poll():
                        self._finish(i, h, on_event)
                time.sleep(0.2)
            for h in self._handles.values():
                h.kill()
            raise
        finally:
            self.ended = time.time()
            self._save()
        return self.runs

    def step(self, on_event: EventFn | None = None) -> bool:
        """One turn of the queue: poll the running runs, apply the stop rules, start what
        fits. False once nothing is left to do."""
        with self.lock:
            for i, h in list(self._handles.items()):
                self._watch(i, h, on_event)
            if self._stop.is_set():
                for r in self.runs:
                    if r.state == "queued":
                        r.state, r.note = "cancelled", "the sweep was stopped before it started"
                for i, h in self._handles.items():
                    if self.runs[i].state == "running":
                        self.runs[i].state = "stopping"
                        h.request_stop(self.grace_s)
            while not self._stop.is_set() and len(self._handles) < self.parallel:
                nxt = next((r for r in self.runs if r.state == "queued"), None)
                if nxt is None:
                    break
                self._start(nxt, on_event)
            return bool(self._handles) or any(r.state == "queued" for r in self.runs)

    def _start(self, r: SweepRun, on_event) -> None:
        from engine.runs.build import build_run

        r.state = "preparing"
        planned = self.planned[r.index]
        name = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.project.name) or "run"
        out = self.runs_dir / f"{name}-{self.id}-{r.index + 1:02d}"
        try:
            built = build_run(planned.project, out)
            r.run_dir, r.total_steps = built.run_dir, built.spec.total_steps
            tag = {"sweep": self.id, "index": r.index, "point": r.point, "sweep_file": self.sweep.to_json()}
            (built.run_dir / TAG_FILE).write_text(json.dumps(tag, indent=1))
            if self.cluster:
                h = _ClusterHandle(built.run_dir, self.cluster, f"{self.id}-{r.index + 1:02d}")
            else:
                h = _LocalHandle(built.run_dir, r.nproc)
        except (LayerflowError, OSError, ValueError) as exc:
            r.state, r.note, r.ended = "failed", str(exc).splitlines()[0], time.time()
            self._save()
            if on_event:
                on_event("finished", r)
            return
        from engine.runs.tail import MetricsTail

        self._handles[r.index] = h
        self._tails[r.index] = MetricsTail(h.metrics)
        r.state, r.started = "running", time.time()
        self._save()
        if on_event:
            on_event("started", r)

    def _watch(self, i: int, h, on_event) -> None:
        r = self.runs[i]
        ended = h.poll()
        progressed = False
        for rec in self._tails[i].poll_records():
            if "loss" in rec or "val_loss" in rec:
                r.last = {**r.last, **rec}
                if isinstance(rec.get("step"), int):
                    r.step, progressed = max(r.step, rec["step"]), True
            if i in self._reasons or r.state == "stopping":
                continue
            reason = self._broken(rec)
            if reason:
                self._reasons[i] = reason
                r.state = "stopping"
                h.request_stop(self.grace_s)
        if ended:
            self._finish(i, h, on_event)
        elif progressed and on_event:
            on_event("progress", r)

    def _broken(self, rec: dict) -> str | None:
        if self.sweep.nan:
            for k in ("loss", "val_loss"):
                v = _number(rec.get(k))
                if v is not None and not math.isfinite(v):
                    return f"{k} became {v} at step {rec.get('step')}"
        for rule in self.sweep.rules:
            why = rule.broken_by(rec)
            if why:
                return why
        return None

    def _finish(self, i: int, h, on_event) -> None:
        from engine.runtime.records import RunStatus

        r = self.runs[i]
        del self._handles[i]
        for rec in self._tails.pop(i).poll_records():
            if "loss" in rec and isinstance(rec.get("step"), int):
                r.last, r.step = {**r.last, **rec}, max(r.step, rec["step"])
        state, step, error = h.state()
        r.step = max(r.step, step)
        r.ended = time.time()
        reason = self._reasons.get(i)
        if reason is None and self.sweep.nan and state == "failed" and "loss became" in (error or ""):
            reason = error.split(":")[0]  # the run stopped itself on a NaN loss
        if reason and state == "succeeded":  # it ended before the stop reached it
            r.state, r.note = "succeeded", f"broke a stop rule at its end: {reason}"
        elif reason:
            r.state, r.note = "stopped", reason
            st = RunStatus.read(h.run_dir)
            if st is not None:  # the run's own record says why it ended early (runs table, GUI)
                st.extra["stopped_early"] = reason
                try:
                    st.write(h.run_dir)
                except OSError:
                    pass
        else:
            r.state = state if state in ("succeeded", "failed", "cancelled", "interrupted", "timeout", "lost") else "failed"
            if r.state != "succeeded":
                r.note = error.splitlines()[0] if error else ("stopped with the sweep" if self._stop.is_set() else "")
        self._save()
        if on_event:
            on_event("finished", r)

    # -- its record ------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"id": self.id, "project": str(self.project.path) if getattr(self.project, "path", None) else None,
                "cluster": self.cluster, "parallel": self.parallel, "started": self.started, "ended": self.ended,
                "sweep": self.sweep.to_json(), "runs": [r.to_json() for r in self.runs]}

    def _save(self) -> None:
        from engine.project import atomic_write

        try:
            self.runs_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(self.state_file, json.dumps(self.to_json(), indent=1).encode())
        except OSError:
            pass  # the queue goes on; its record is a convenience

    def progress_line(self, r: SweepRun) -> str:
        done = sum(1 for x in self.runs if x.done)
        loss = _number(r.last.get("loss"))
        extra = f"  loss {loss:.4f}" if loss is not None else ""
        return (f"[{done}/{len(self.runs)}] #{r.index + 1} {r.label}: {r.shown_state}"
                + (f" {r.step}/{r.total_steps}" if r.total_steps else "") + extra)


__all__ = ["SweepRun", "SweepRunner", "EventFn"]
