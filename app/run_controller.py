"""Start, watch and stop training runs from the GUI.

A run is what the CLI's `train` and the Python API's `Project.train` start: the run
folder prepared by layerflow/prepare.py (in a worker thread, so the window keeps
drawing while the data is made), then remote/launch/local.py `launch_local` (the
trainer itself for one process, torchrun for several), followed as a `LocalJob`.
Stop asks it to end after the current step (SIGTERM to its group: the trainer, or
torchrun, which passes it to its workers; each checkpoints and the run is marked
cancelled), then SIGKILLs, after a grace period, the group and every descendant seen:
the LocalJob's ProcessTree (remote/launch/procs.py), escalated from the poll so the GUI
thread never waits. One job model and one stop path for the GUI, the CLI and the API.
Nothing runs in the GUI thread but a 5 Hz poll: the preparation's future, the
processes' exit and the new lines of metrics.jsonl (engine/runs/tail.py, by byte offset),
handed to the dashboard as read: it parses them in a process of its own.
"""
from __future__ import annotations

import concurrent.futures
import math
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from engine.errors import LayerflowError
from engine.runs.history import failure_report
from engine.runtime.records import FINAL_STATES, RunStatus
from engine.runtime.spec import RunSpec, SpecError
from engine.runs.tail import MetricsTail, parse_jsonl
from remote.launch import procs
from remote.launch.local import LocalJob, launch_local
from remote.launch.procs import group_pids  # noqa: F401  (used by tests)
from widgets.runs_panel import fmt_duration


def placement_for_processes(placement, nproc: int):
    """The placement a run on `nproc` processes trains with, by the rule engine/runs/build.py's
    build_run applies to `nproc`: pipeline (pp) and tensor (tp) degrees kept, data
    parallel over the rest (dp = nproc / (pp x tp); a one-process placement becomes dp =
    nproc, as `train --nproc N` makes it). The window shows and plans this placement, so
    the toolbar's count, the Devices panel, the plan and the run agree. RunError (one
    line) when nproc is no multiple of pp x tp or the placement refuses the count."""
    from engine.runs.build import RunError, derived_placement

    if type(nproc) is not int or nproc < 1:
        raise RunError(f"processes must be a whole number of at least 1, not {nproc!r}")
    if nproc == placement.world:
        return placement
    pt = placement.pp * placement.tp
    if nproc % pt:
        raise RunError(f"{nproc} processes do not split into pipeline {placement.pp} × tensor {placement.tp} = {pt} "
                       f"per replica: choose a multiple of {pt}, or change pp or tp in the Devices panel")
    return derived_placement(placement, {"dp": nproc // pt})


def _fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "…"
    return fmt_duration(seconds)


def _step_record(lines) -> dict | None:
    """The first of `lines` that is a training step's record (an int step, a time, no event)."""
    for r in parse_jsonl(list(lines)):
        if isinstance(r.get("step"), int) and isinstance(r.get("time"), (int, float)) and "event" not in r:
            return r
    return None


@dataclass
class ActiveRun:
    """The run the GUI follows: its folder, its job (processes, how to stop them) once
    launched, and what the dashboard shows of it (metrics tail, step, ETA)."""
    run_dir: Path
    nproc: int = 1
    resume: bool = False
    job: LocalJob | None = None  # None while the folder is being prepared
    preparing: concurrent.futures.Future | None = None
    stop_early: bool = False  # Stop pressed before the processes started: they never do
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
    def command(self) -> list[str]:
        return list(self.job.proc.args) if self.job is not None else []

    @property
    def pgid(self) -> int | None:
        return self.job.tree.pgid if self.job is not None else None

    @property
    def seen(self) -> procs.Seen:
        return self.job.seen if self.job is not None else {}

    @property
    def stop_requested(self) -> bool:
        return self.stop_early or (self.job is not None and self.job.tree.stop_requested)


class RunController(QObject):
    """One training run at a time, launched and watched for the GUI."""

    started = Signal(str)  # run_dir
    lines = Signal(str, bytes)  # run_dir, new complete lines of metrics.jsonl joined by newlines (parsed by the dashboard)
    reset = Signal(str)  # run_dir: forget its records, they come again from the start
    progress = Signal(str, int, int, float)  # run_dir, step, total_steps (0: unknown), eta seconds (nan)
    finished = Signal(str, str)  # run_dir, state: succeeded | failed | cancelled
    failed = Signal(str, dict)  # run_dir, engine.runs.history.failure_report(...) (+ "message")

    POLL_MS = 200

    def __init__(self, parent=None, grace_s: float = 15.0):
        super().__init__(parent)
        self.grace_s = grace_s
        self.active: ActiveRun | None = None
        self.node_ids: tuple[str, ...] = ()  # for naming the failed node
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="prepare-run")
        self._timer = QTimer(self)
        self._timer.setInterval(self.POLL_MS)
        self._timer.timeout.connect(self.poll)

    # ----- starting ---------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.active is not None

    def start(self, project, *, nproc: int = 1, steps: int | None = None,
              runs_dir: str | Path | None = None, init_from: tuple[str, str | None] | None = None) -> Path:
        """Train `project` (an engine Project, saved or not: the run is what is on screen
        now) in a new run folder; returns the folder. The folder is prepared in the
        background; a project the preparation refuses ends as a failed run that names
        what is wrong, and leaves no folder. init_from=(run folder, checkpoint or None):
        fine-tuning, the run starts from that run's weights (engine/runs/weights.py)."""
        from engine.runs.build import new_run_dir
        from layerflow.prepare import prepare_training

        self._refuse_if_running()
        run_dir = new_run_dir(project, Path(runs_dir) if runs_dir else None)
        copy = project.copy()  # edits made while it is prepared are not this run's
        self.node_ids = tuple(project.graph.nodes)
        n = nproc if nproc > 1 else None

        def prepare():
            if init_from is None:
                return prepare_training(copy, nproc=n, steps=steps, out=run_dir)
            from engine.runs import weights as run_weights

            src, checkpoint = init_from
            with run_weights.init_from(copy, src, checkpoint) as begin:
                prep = prepare_training(begin, nproc=n, steps=steps, out=run_dir)
            run_weights.note_init(prep.run_dir, src, checkpoint)
            return prep

        return self._begin(run_dir, nproc, prepare)

    def resume(self, run_dir: str | Path, *, nproc: int = 1, node_ids=()) -> Path:
        """Continue a stopped run from its latest checkpoint."""
        from layerflow.prepare import prepare_resume

        self._refuse_if_running()
        run_dir = Path(run_dir)
        latest = run_dir / "checkpoints" / "latest"
        if not latest.is_file():
            raise ValueError(f"{run_dir.name}: no checkpoint to resume from (checkpoints/latest is missing)")
        self.node_ids = tuple(node_ids)
        return self._begin(run_dir, nproc, lambda: prepare_resume(run_dir, nproc=nproc if nproc > 1 else None),
                           resume=True)

    def _refuse_if_running(self) -> None:
        if self.active is not None:
            raise RuntimeError(f"a run is already going ({self.active.run_dir.name}); stop it first")

    def _begin(self, run_dir: Path, nproc: int, prepare, *, resume: bool = False) -> Path:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        return self._follow(ActiveRun(run_dir=run_dir, nproc=nproc, resume=resume,
                                      preparing=self._pool.submit(prepare)))

    def _follow(self, a: ActiveRun) -> Path:
        a.launched_at, a.tail, a.tail_ready = time.time(), MetricsTail(a.run_dir / "metrics.jsonl"), not a.resume
        self.active = a
        self._timer.start()
        self.started.emit(str(a.run_dir))
        return a.run_dir

    def _launch_prepared(self, a: ActiveRun) -> None:
        """The folder is ready: start its processes (or say why it could not be made)."""
        try:
            prep = a.preparing.result()
        except BaseException as exc:  # noqa: BLE001 - shown as the run's failure, never a crash of the GUI
            self._refused(a, exc)
            return
        if a.stop_early:
            self._finish(a, None)
            return
        if prep.warnings:
            with open(a.run_dir / "logs" / "launcher.log", "a") as log:
                log.writelines(f"warning: {w}\n" for w in prep.warnings)
        a.nproc = prep.nproc
        try:
            a.job = launch_local(prep.run_dir, prep.nproc, resume=prep.resume)
        except (OSError, ValueError) as exc:
            self._refused(a, exc)
            return
        a.job.tree.grace_s = self._grace(a)

    def launch(self, run_dir: Path, *, nproc: int = 1, resume: bool = False) -> Path:
        """Start and follow a run folder prepared elsewhere (what start and resume do once
        theirs is ready)."""
        self._refuse_if_running()
        a = ActiveRun(run_dir=Path(run_dir), nproc=nproc, resume=resume)
        a.job = launch_local(a.run_dir, nproc, resume=resume)
        a.job.tree.grace_s = self._grace(a)
        return self._follow(a)

    # ----- stopping ---------------------------------------------------------------
    def stop(self) -> None:
        """Ask the run to stop after its current step; SIGKILL after `grace_s`. Before its
        processes start (the folder still being prepared), they never do."""
        a = self.active
        if a is None:
            return
        if a.job is None:
            a.stop_early = True
        else:
            a.job.tree.request_stop(self._grace(a))

    def kill(self) -> None:
        """SIGKILL to the run's group, every descendant seen and every group they lead."""
        a = self.active
        if a is not None:
            if a.job is None:
                a.stop_early = True
            else:
                a.job.tree.kill()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the run and wait for its processes (the app is closing)."""
        a = self.active
        if a is None:
            return
        if a.job is None:
            a.stop_early = True
            concurrent.futures.wait([a.preparing], timeout=timeout_s)
            if a.preparing.done():
                self._launch_prepared(a)  # (stopped early: it finishes without starting anything)
            else:  # still writing the folder: it is removed once the worker is done with it
                if not a.resume:
                    run_dir = a.run_dir
                    a.preparing.add_done_callback(lambda _f: RunController._discard(run_dir))
                self._finish(a, None, discard=False)
            return
        a.job.tree.stop(self._grace(a, timeout_s))
        self.poll()

    def _grace(self, a: ActiveRun, base: float | None = None) -> float:
        """Several ranks stop at an agreed log step, then write their checkpoint together: twice the time."""
        return (self.grace_s if base is None else base) * (2 if a.nproc > 1 else 1)

    # ----- watching ---------------------------------------------------------------
    def poll(self) -> None:
        a = self.active
        if a is None:
            self._timer.stop()
            return
        if a.job is None:
            if a.preparing is not None and a.preparing.done():
                self._launch_prepared(a)
            return
        self._read_metrics(a)
        code = a.job.poll()  # None until the launcher and every process of the run are gone
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
        data = a.tail.poll_data()
        if a.total_steps is None and (a.run_dir / "run.json").is_file():
            try:
                a.total_steps = RunSpec.load(a.run_dir).total_steps
            except SpecError:
                pass
        if not data:
            return
        # progress from the run's first step record and this poll's last: a few lines
        # parsed here, the rest by the dashboard's parse process
        if a.rate_ref is None and (first := _step_record(data.split(b"\n", 64)[:64])) is not None:
            a.rate_ref = (float(first["time"]), first["step"])
        last = _step_record(reversed(data.rsplit(b"\n", 8)[-8:]))
        if last is not None:
            a.step = last["step"]
            a.rate_ref = a.rate_ref or (float(last["time"]), a.step)
            dt, ds = float(last["time"]) - a.rate_ref[0], a.step - a.rate_ref[1]
            if dt > 0 and ds > 0 and a.total_steps:
                a.eta = (a.total_steps - a.step) * dt / ds
        self.lines.emit(str(a.run_dir), data)
        self.progress.emit(str(a.run_dir), a.step, a.total_steps or 0, a.eta)

    def _finish(self, a: ActiveRun, code: int | None, *, discard: bool = True) -> None:
        """code: the launcher's exit code; None when nothing was started (stopped while
        the folder was prepared: a new run's folder is then removed, unless `discard` is
        false)."""
        self._timer.stop()
        self.active = None
        st = RunStatus.read(a.run_dir)
        state = st.state if st is not None else None
        if state not in FINAL_STATES:
            state = "cancelled" if a.stop_requested else ("succeeded" if code == 0 else "failed")
        if code is None and not a.resume and discard:
            self._discard(a.run_dir)  # prepared, never run: nothing to keep
        if state == "failed":
            report = failure_report(a.run_dir, self.node_ids)
            report["message"] = (st.error if st is not None else None) or \
                (a.job.describe_failure() if a.job is not None else f"the training process exited with code {code}")
            report["code"] = code
            self.failed.emit(str(a.run_dir), report)
        self.finished.emit(str(a.run_dir), state)

    def _refused(self, a: ActiveRun, exc: BaseException) -> None:
        """The preparation said no (a diagram that does not fit its data, a bad placement):
        a failed run whose message is the reason; the folder it began is removed."""
        self._timer.stop()
        self.active = None
        known = isinstance(exc, (LayerflowError, ValueError, OSError))
        message = str(exc) if known else f"{type(exc).__name__}: {exc}"
        named = [n for n in self.node_ids if f"node '{n}'" in message]
        report = {"rank": None, "node": named[0] if named else None, "log": None, "code": None, "message": message,
                  "traceback": None if known else "".join(traceback.format_exception(exc))}
        if not a.resume:
            self._discard(a.run_dir)
        self.failed.emit(str(a.run_dir), report)
        self.finished.emit(str(a.run_dir), "failed")

    @staticmethod
    def _discard(run_dir: Path) -> None:
        """Remove a folder this controller began that holds no run's results (nothing ran in it)."""
        if run_dir.is_dir() and not (run_dir / "status.json").exists() and not (run_dir / "metrics.jsonl").exists():
            shutil.rmtree(run_dir, ignore_errors=True)

    def eta_text(self) -> str:
        a = self.active
        return _fmt_eta(a.eta) if a else ""
