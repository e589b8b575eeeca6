"""The local job database: every job ever deployed, so `jobs` after an app restart lists
them and the tracker reattaches to the running ones.

SQLite in the config dir (safe across the CLI and the GUI running at once). A job
keeps a snapshot of its cluster profile: editing or removing the profile later does
not strand a running job. Each job has a local mirror folder (config dir
/jobs/<id>/) where the tracker appends metrics.jsonl and logs; its byte sizes are
the offsets to resume from, so mirror and offsets cannot disagree.
"""
from __future__ import annotations

import json
import re
import secrets
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.errors import LayerflowError
from engine.runtime.records import ENDED_STATES
from engine.runtime.records import STATES as RUN_STATES
from remote.cluster import Cluster, config_dir

# the states of engine/runtime/records.py a job can have ("interrupted" is a local run's)
STATES = tuple(s for s in RUN_STATES if s != "interrupted")
# timeout: Slurm ended it at its time limit; lost is polled again; preempted (the run stopped
# at a preemption, checkpointed) and resuming (Slurm requeued it) are no end: the job goes on
TERMINAL = set(ENDED_STATES) - {"interrupted", "preempted"}


class JobError(LayerflowError, LookupError):
    pass


@dataclass
class Node:
    index: int
    host: str  # label, e.g. root@127.0.0.2:2222
    jobdir: str  # absolute path on that host


@dataclass
class Job:
    id: str
    name: str
    cluster: dict  # the profile as it was at deploy time
    created: float
    state: str = "pending"
    backend: str = "ssh"
    nodes: list[Node] = field(default_factory=list)
    token: str = ""
    total_steps: int | None = None
    step: int | None = None
    metrics_node: int | None = None  # the node whose run folder holds rank 0's metrics
    error: str | None = None
    updated: float = 0.0
    extra: dict = field(default_factory=dict)  # backend specifics (slurm job id, ...)

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    def cluster_profile(self) -> Cluster:
        return Cluster.model_validate(self.cluster)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Job":
        d = json.loads(text)
        d["nodes"] = [Node(**n) for n in d.get("nodes", [])]
        return cls(**d)


def new_job_id(name: str) -> str:
    """Readable and safe to type: a slug of the name, the time, and 4 random hex digits."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_")[:40] or "job"
    return f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


class JobDB:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else config_dir() / "jobs.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute("CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, created REAL, data TEXT NOT NULL)")

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def mirror_dir(self, job_id: str) -> Path:
        return self.path.parent / "jobs" / job_id

    def add(self, job: Job) -> Job:
        job.updated = time.time()
        with self._db() as db:
            db.execute("INSERT INTO jobs (id, created, data) VALUES (?, ?, ?)", (job.id, job.created, job.to_json()))
        return job

    def save(self, job: Job) -> Job:
        job.updated = time.time()
        with self._db() as db:
            cur = db.execute("UPDATE jobs SET data = ? WHERE id = ?", (job.to_json(), job.id))
            if cur.rowcount == 0:
                raise JobError(f"no job {job.id!r} in {self.path}")
        return job

    def get(self, job_id: str) -> Job:
        with self._db() as db:
            row = db.execute("SELECT data FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:  # a unique prefix is enough, like git
                rows = db.execute("SELECT data FROM jobs WHERE id LIKE ? ESCAPE '\\'",
                                  (job_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",)
                                  ).fetchall()
                if len(rows) == 1:
                    row = rows[0]
                elif rows:
                    raise JobError(f"{job_id!r} matches {len(rows)} jobs; give more of the id")
        if row is None:
            raise JobError(f"no job {job_id!r} (see `jobs` for the list)")
        return Job.from_json(row[0])

    def list(self) -> list[Job]:
        with self._db() as db:
            return [Job.from_json(r[0]) for r in db.execute("SELECT data FROM jobs ORDER BY created")]

    def add_with_mirror(self, job: Job, run_dir: Path) -> Path:
        """Add a job being launched, its local mirror starting as a copy of the run folder's
        inputs: the dashboard and the runs list read it like a local run while the tracker
        appends metrics and logs. Returns the mirror."""
        import shutil

        self.add(job)
        mirror = self.mirror_dir(job.id)
        mirror.mkdir(parents=True, exist_ok=True)
        for name in ("run.json", "project.lflow"):
            if (Path(run_dir) / name).is_file():
                shutil.copyfile(Path(run_dir) / name, mirror / name)
        return mirror

    def active(self) -> list[Job]:
        return [j for j in self.list() if not j.done]
