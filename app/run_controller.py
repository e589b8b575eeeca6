"""Start, watch and stop training runs from the GUI.

A run is the CLI's own `python main.py train PROJECT --out RUN_DIR [--nproc N]`
(or `--resume RUN_DIR`) in a child process that leads its own process group
(start_new_session). Stop asks it to end after the current step (SIGTERM to the
group for one process: the trainer checkpoints and marks the run cancelled; SIGINT
to the CLI for several, whose launcher stops torchrun and its workers), then
SIGKILLs, after a grace period, the group and every descendant it has seen: the
run's processes are a remote/procs.py ProcessTree, the CLI launcher's own stop path
(LocalJob holds one too), escalated from the poll so the GUI thread never waits. Nothing runs in the GUI thread
but a 5 Hz poll: the process's exit code and the new lines of metrics.jsonl
(engine/tail.py, by byte offset).
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from engine.runs import failure_report, is_run_dir
from engine.runtime.records import FINAL_STATES, RunStatus
from engine.tail import MetricsTail
from remote import procs
from remote.procs import group_pids  # noqa: F401  (used by tests)
from widgets.runs_panel import fmt_duration

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "main.py"


def _fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "…"
    return fmt_duration(seconds)


@dataclass
class ActiveRun:
    """The run the GUI follows: its folder, its processes (`tree`) and what the
    dashboard shows of it (metrics tail, step, ETA)."""
    run_dir: Path
    tree: procs.ProcessTree
    command: list[str]
    nproc: int = 1
    resume: bool = False
    snapshot: Path | None = None  # temporary project file, removed at the end
    tail: MetricsTail | None = None
    total_steps: int | None = None
    started: float = field(default_factory=time.monotonic)
    rate_ref: tuple[float, int] | None = None  # (metrics time, step) of the first record seen
    step: int = 0
    eta: float = math.nan
    launched_at: float = 0.0  # wall clock
    # A resumed run first cuts metrics.jsonl back to its checkpoint; until then the
    # file still holds lines that will disappear, so reading waits (see _read_metrics).
    tail_ready: bool = True

    @property
    def proc(self) -> subprocess.Popen:
        return self.tree.proc

    @property
    def pgid(self) -> int:
        return self.tree.pgid

    @property
    def seen(self) -> procs.Seen:
        return self.tree.seen

    @property
    def stop_requested(self) -> bool:
        return self.tree.stop_requested


def stop_signal(nproc: int):
    """SIGINT to the CLI of several processes (its launcher stops torchrun), SIGTERM
    to one (the trainer checkpoints, then exits)."""
    return signal.SIGINT if nproc > 1 else signal.SIGTERM


class RunController(QObject):
    """One training run at a time, launched and watched for the GUI."""

    started = Signal(str)  # run_dir
    records = Signal(str, list)  # run_dir, new metrics records
    reset = Signal(str)  # run_dir: forget its records, they come again from the start
    progress = Signal(str, int, int, float)  # run_dir, step, total_steps (0: unknown), eta seconds (nan)
    finished = Signal(str, str)  # run_dir, state: succeeded | failed | cancelled
    failed = Signal(str, dict)  # run_dir, engine.runs.failure_report(...) (+ "message")

    POLL_MS = 200

    def __init__(self, parent=None, python: str = sys.executable, grace_s: float = 15.0):
        super().__init__(parent)
        self.python = python
        self.grace_s = grace_s
        self.active: ActiveRun | None = None
        self.node_ids: tuple[str, ...] = ()  # for naming the failed node
        self._timer = QTimer(self)
        self._timer.setInterval(self.POLL_MS)
        self._timer.timeout.connect(self.poll)

    # ----- starting ---------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.active is not None

    def start(self, project, *, nproc: int = 1, steps: int | None = None, runs_dir: str | Path | None = None,
              unsaved: bool = False) -> Path:
        """Train `project` (an engine Project) in a new run folder; returns the folder.
        A project with unsaved changes (`unsaved`, or never saved) is run as it is on
        screen: a snapshot is written beside it (so relative data paths resolve) and
        removed when the run ends."""
        from engine.project import load_project, save_project
        from engine.run import new_run_dir

        self._refuse_if_running()
        run_dir = new_run_dir(project, Path(runs_dir) if runs_dir else None)
        snapshot = None
        if unsaved or project.path is None or not Path(project.path).exists():
            snapshot = project.directory / f".{run_dir.name}.lflow"
            copy = project.copy()
            save_project(copy, snapshot)
            project_file = snapshot
        else:
            project_file = Path(project.path)
        cmd = [self.python, str(MAIN), "train", str(project_file), "--out", str(run_dir)]
        cmd += self._consent(load_project(project_file))  # the file the CLI reads: its paths, resolved as it will
        if nproc > 1:
            cmd += ["--nproc", str(nproc)]
        if steps:
            cmd += ["--steps", str(steps)]
        self.node_ids = tuple(project.graph.nodes)
        return self.launch(run_dir, cmd, snapshot=snapshot, nproc=nproc)

    def resume(self, run_dir: str | Path, *, nproc: int = 1, node_ids=()) -> Path:
        """Continue a stopped run from its latest checkpoint."""
        self._refuse_if_running()
        run_dir = Path(run_dir)
        latest = run_dir / "checkpoints" / "latest"
        if not latest.is_file():
            raise ValueError(f"{run_dir.name}: no checkpoint to resume from (checkpoints/latest is missing)")
        from engine.project import load_project

        cmd = [self.python, str(MAIN), "train", str(run_dir / "project.lflow"), "--resume", str(run_dir)]
        try:
            cmd += self._consent(load_project(run_dir / "project.lflow"))
        except Exception:  # noqa: BLE001  (an unreadable copy: the CLI names what is wrong with it)
            pass
        if nproc > 1:
            cmd += ["--nproc", str(nproc)]
        self.node_ids = tuple(node_ids)
        return self.launch(run_dir, cmd, resume=True, nproc=nproc)

    @staticmethod
    def _consent(project) -> list[str]:
        """The run is the CLI in another process, on a snapshot or a run folder's copy: it may
        run what this process may (the user's own edits, a project they trusted), no more."""
        from engine import trust

        return ["--trust-once"] if trust.needs_consent(project) and trust.consented(project) else []

    def _refuse_if_running(self) -> None:
        if self.active is not None:
            raise RuntimeError(f"a run is already going ({self.active.run_dir.name}); stop it first")

    def launch(self, run_dir: Path, cmd: list[str], *, snapshot: Path | None = None, resume: bool = False,
               nproc: int = 1) -> Path:
        logs = run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(logs / "launcher.log", "ab") as out:
            out.write(f"$ {' '.join(cmd)}\n".encode())
            out.flush()
            proc = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        tail = MetricsTail(run_dir / "metrics.jsonl")
        tree = procs.ProcessTree(proc, stop_signal(nproc), self.grace_s)
        self.active = ActiveRun(run_dir=run_dir, tree=tree, command=cmd, nproc=nproc, resume=resume,
                                snapshot=snapshot, tail=tail, launched_at=time.time(), tail_ready=not resume)
        self._timer.start()
        self.started.emit(str(run_dir))
        return run_dir

    # ----- stopping ---------------------------------------------------------------
    def stop(self) -> None:
        """Ask the run to stop after its current step; SIGKILL after `grace_s`.
        One process: SIGTERM to the group (the trainer checkpoints, then exits).
        Several: SIGINT to the CLI, whose launcher then stops torchrun and every
        worker (they live in sessions of their own) and kills them after its grace."""
        a = self.active
        if a is not None:  # (the CLI of several processes needs its own grace for torchrun's)
            a.tree.request_stop(self.grace_s * (2 if a.nproc > 1 else 1))

    def kill(self) -> None:
        """SIGKILL to the group, the CLI, every descendant seen and every group they lead."""
        if self.active is not None:
            self.active.tree.kill()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the run and wait for its processes (the app is closing)."""
        a = self.active
        if a is None:
            return
        a.tree.stop(timeout_s * (2 if a.nproc > 1 else 1))
        self.poll()

    # ----- watching ---------------------------------------------------------------
    def poll(self) -> None:
        a = self.active
        if a is None:
            self._timer.stop()
            return
        self._read_metrics(a)
        code = a.tree.poll()  # None until the CLI and every process of the run are gone
        if code is None:
            return
        self._read_metrics(a)
        self._finish(a, code)

    def _read_metrics(self, a: ActiveRun) -> None:
        if not a.tail_ready:
            # The runtime writes status.json (state running, a new start time) right
            # after truncating metrics.jsonl: from then on the file only grows.
            st = RunStatus.read(a.run_dir)
            if not (st is not None and st.state == "running" and st.started is not None
                    and st.started >= a.launched_at - 1.0):
                return
            a.tail_ready = True
            a.tail = MetricsTail(a.run_dir / "metrics.jsonl")
            self.reset.emit(str(a.run_dir))
        recs = a.tail.poll_records()
        if a.total_steps is None and (a.run_dir / "run.json").is_file():
            try:
                a.total_steps = int(json.loads((a.run_dir / "run.json").read_text())["total_steps"])
            except (OSError, ValueError, KeyError, TypeError):
                pass
        if not recs:
            return
        for r in recs:
            if isinstance(r.get("step"), int) and isinstance(r.get("time"), (int, float)) and "event" not in r:
                a.step = r["step"]
                if a.rate_ref is None:
                    a.rate_ref = (float(r["time"]), a.step)
                else:
                    dt, ds = float(r["time"]) - a.rate_ref[0], a.step - a.rate_ref[1]
                    if dt > 0 and ds > 0 and a.total_steps:
                        a.eta = (a.total_steps - a.step) * dt / ds
        self.records.emit(str(a.run_dir), recs)
        self.progress.emit(str(a.run_dir), a.step, a.total_steps or 0, a.eta)

    def _finish(self, a: ActiveRun, code: int) -> None:
        self._timer.stop()
        self.active = None
        if a.snapshot is not None:
            try:
                a.snapshot.unlink()
            except OSError:
                pass
        st = RunStatus.read(a.run_dir)
        state = st.state if st is not None else None
        if state not in FINAL_STATES:
            state = "cancelled" if a.stop_requested else ("succeeded" if code == 0 else "failed")
        if state == "failed":
            report = failure_report(a.run_dir, self.node_ids)
            report["message"] = self._last_error_line(a.run_dir) or f"the training process exited with code {code}"
            report["code"] = code
            if not is_run_dir(a.run_dir):
                # The CLI refused before the folder became a run (e.g. the data does not
                # fit the diagram): keep nothing but tell the user why.
                report.setdefault("traceback", None)
                report["traceback"] = report["traceback"] or self._launcher_text(a.run_dir)
                self._remove_empty(a.run_dir)
            self.failed.emit(str(a.run_dir), report)
        self.finished.emit(str(a.run_dir), state)

    @staticmethod
    def _launcher_text(run_dir: Path) -> str:
        try:
            return (run_dir / "logs" / "launcher.log").read_text(errors="replace")
        except OSError:
            return ""

    def _last_error_line(self, run_dir: Path) -> str | None:
        """The CLI's `error: ...` message (it may go on over several lines)."""
        lines = self._launcher_text(run_dir).splitlines()
        for i in range(len(lines) - 1, -1, -1):
            if lines[i].startswith("error:"):
                rest = [ln for ln in lines[i + 1:] if ln.startswith((" ", "\t"))]
                return "\n".join([lines[i][len("error:"):].strip(), *rest])
        return None

    @staticmethod
    def _remove_empty(run_dir: Path) -> None:
        import shutil

        if run_dir.is_dir() and not is_run_dir(run_dir) and {p.name for p in run_dir.iterdir()} <= {"logs"}:
            shutil.rmtree(run_dir, ignore_errors=True)

    def eta_text(self) -> str:
        a = self.active
        return _fmt_eta(a.eta) if a else ""
