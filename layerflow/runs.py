"""A run on this machine (`Run`) and a job on a cluster (`Job`): what `Project.train` and
`Project.deploy` return. Both read the run-folder contract (engine/runs/build.py): status.json
for the state (engine/runtime/records.py `RunStatus`, what both `status()` return),
metrics.jsonl for the records, followed by byte offset (engine/runs/tail.py), so nothing is
missed or repeated while a run goes on."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from engine.errors import LayerflowError
from engine.runs.history import is_run_dir
from engine.runtime.records import RunStatus
from engine.runs.tail import MetricsTail, read_metrics


class RunFailed(LayerflowError, RuntimeError):
    """A run that ended in failure; the message says which rank failed first, at which
    step, and what it died of. `status` is the run's last status."""

    def __init__(self, message: str, status: RunStatus):
        super().__init__(message)
        self.status = status


def _read_status(run_dir: Path) -> RunStatus:
    return RunStatus.read(run_dir) or RunStatus("pending")


class Run:
    """A training run on this machine: its folder, and while it goes, its processes.

        run = project.train(nproc=2)
        for rec in run.metrics(follow=True):   # each record as it is written
            print(rec["step"], rec.get("loss"))
        run.wait()                             # Status; RunFailed if it failed

    `Run(folder)` opens a finished (or another process's) run to read it."""

    def __init__(self, run_dir: str | Path, job=None):
        self.dir = Path(run_dir).resolve()
        if job is None and not is_run_dir(self.dir):
            raise LayerflowError(f"{self.dir} is not a run folder (no run.json)")
        self._job = job  # remote.launch.local.LocalJob while this process runs it

    def __repr__(self) -> str:
        return f"Run({str(self.dir)!r}, {self.status().state})"

    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def running(self) -> bool:
        if self._job is not None:
            return self._job.poll() is None
        st = self.status()
        if st.done or st.state == "pending":
            return False
        from engine.runtime.records import pid_alive

        return bool(pid_alive(st.pid))

    def status(self) -> RunStatus:
        return _read_status(self.dir)

    def metrics(self, follow: bool = False, poll_s: float = 0.5, timeout: float | None = None) -> Iterator[dict]:
        """The run's records (training steps, evaluations, the final {"event": "end"}), in
        order. With follow=True, new ones as they are written, until the run ends."""
        tail = MetricsTail(self.dir / "metrics.jsonl")
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            alive = follow and self.running  # read before draining: a record written at the end is not lost
            yield from tail.poll_records()
            if not alive:
                return
            if end is not None and time.monotonic() > end:
                raise TimeoutError(f"run {self.name} still going after {timeout} s")
            time.sleep(poll_s)

    def logs(self, name: str = "rank0.log") -> str:
        """A log of the run so far: rank<N>.log, or launcher.log (torchrun's, or the trainer's
        own output); what Job.logs gives for a cluster job."""
        path = self.dir / "logs" / Path(name).name
        return path.read_text(errors="replace") if path.exists() else ""

    def losses(self) -> list[tuple[int, float]]:
        """(step, training loss) of every logged step so far."""
        return [(r["step"], r["loss"]) for r in read_metrics(self.dir / "metrics.jsonl") if "loss" in r]

    def wait(self, timeout: float | None = None) -> RunStatus:
        """Block until the run ends; its status, or RunFailed naming why it failed."""
        if self._job is not None:
            self._job.wait(timeout)
        else:
            end = None if timeout is None else time.monotonic() + timeout
            while self.running:
                if end is not None and time.monotonic() > end:
                    raise TimeoutError(f"run {self.name} still going after {timeout} s")
                time.sleep(0.5)
        st = self.status()
        if st.state == "failed" or (self._job is not None and self._job.returncode not in (0, None) and not st.ok):
            detail = self._job.describe_failure() if self._job is not None else (st.error or "see its logs")
            raise RunFailed(f"run {self.name} failed: {detail}", st)
        return st

    def cancel(self, grace: float = 30.0) -> RunStatus:
        """Stop after the current step (the run checkpoints and is marked cancelled);
        whatever is still alive after `grace` seconds is killed."""
        if self._job is None:
            raise LayerflowError(f"run {self.name} was not started by this process: stop it where it runs")
        self._job.terminate(grace)
        return self.status()

    def resume(self, *, steps: int | None = None, nproc: int | None = None, **placement) -> Run:
        """Go on from the latest checkpoint (to `steps` in all, or under another layout)."""
        from layerflow.prepare import prepare_resume

        if self.running:
            raise LayerflowError(f"run {self.name} is still going")
        prep = prepare_resume(self.dir, nproc=nproc, steps=steps, placement=placement)
        return start(prep)


def start(prep) -> Run:
    """Start a prepared run folder on this machine (one process, or torchrun for several)."""
    from remote.launch.local import launch_local

    return Run(prep.run_dir, launch_local(prep.run_dir, prep.nproc, resume=prep.resume))


class Job:
    """A job on a cluster (`Project.deploy`, or `Job(job_id)` for one started before):
    its state from the nodes, its metrics and logs mirrored to this machine by byte
    offset, surviving a dropped connection (a later call reconnects)."""

    def __init__(self, job_id: str, db=None):
        from remote.jobs import JobDB

        self._db = db or JobDB()
        self.id = self._db.get(job_id).id  # JobError names an unknown job
        self._tracker = None

    def __repr__(self) -> str:
        return f"Job({self.id!r}, {self.record.state})"

    def __enter__(self) -> Job:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._tracker is not None:
            self._tracker.close()
            self._tracker = None

    def _tr(self):
        from remote.tracker import Tracker

        if self._tracker is None:
            self._tracker = Tracker(self.id, db=self._db)
        return self._tracker

    @property
    def record(self):
        """The job database's record (remote.jobs.Job): cluster, nodes, state, step."""
        return self._db.get(self.id)

    @property
    def mirror(self) -> Path:
        """This machine's copy of the job's run folder (metrics.jsonl, logs/)."""
        return self._db.mirror_dir(self.id)

    def status(self) -> RunStatus:
        """Ask the nodes (and mirror what is new); a finished job is not asked again."""
        job = self.record
        if not job.done:
            job = self._tr().poll()
        return _job_status(job)

    def metrics(self, follow: bool = False, poll_s: float = 1.0, timeout: float | None = None) -> Iterator[dict]:
        """Records of the job's metrics.jsonl, as mirrored; with follow=True, new ones as
        they arrive, until the job ends."""
        tail = MetricsTail(self.mirror / "metrics.jsonl")
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.status()
            yield from tail.poll_records()
            if not follow or self.record.done:  # (the job's end: a preempted one is requeued and goes on)
                return
            if end is not None and time.monotonic() > end:
                raise TimeoutError(f"job {self.id} still going after {timeout} s")
            time.sleep(poll_s)

    def wait(self, timeout: float | None = None, poll_s: float = 1.0) -> RunStatus:
        for _ in self.metrics(follow=True, poll_s=poll_s, timeout=timeout):
            pass
        st = self.status()
        if not st.ok:
            raise RunFailed(f"job {self.id} {st.state}: {st.error or 'see its logs (job.logs())'}", st)
        return st

    def logs(self, name: str = "rank0.log") -> str:
        """A log as mirrored so far: rank<N>.log or node<N>.out."""
        self.status()
        path = self.mirror / "logs" / Path(name).name
        return path.read_text(errors="replace") if path.exists() else ""

    def cancel(self, grace: float = 15.0) -> RunStatus:
        """Stop the job on every node and check that none of its processes is left."""
        return _job_status(self._tr().cancel(grace))

    def fetch(self, out: str | Path | None = None) -> Path:
        """Download checkpoints, the final model, metrics and logs into `out` (./<job id>)."""
        out = Path(out or self.id)
        self._tr().fetch(out)
        return out


def _job_status(job) -> RunStatus:
    """A job database record (remote.jobs.Job) as a run's status."""
    return RunStatus(job.state, int(job.step or 0), job.total_steps, error=job.error or None)


def cluster_jobs(cluster: str) -> list[dict]:
    """Every user's jobs on a cluster, read from its shared job board (the profile's
    shared_dir): one record each (owner, state, step, hosts, ...). Teammates' jobs join
    this machine's job list, so `Job(record["id"])` follows them (read only)."""
    from remote import board
    from remote.cluster import ClusterStore
    from remote.jobs import JobDB
    from remote.ssh import Connection

    profile, db = ClusterStore().get(cluster), JobDB()
    with Connection.to(profile, profile.hosts[0]) as conn:
        me = board.whoami(conn)
        records = board.list_jobs(conn, profile)
        for rec in records:
            board.adopt(db, profile, rec, me, conn)
    return records
