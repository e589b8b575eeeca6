"""A shared job board per cluster: everyone's jobs, read from the cluster itself.

A cluster profile may name a shared folder (`shared_dir`, e.g. /shared/layerflow) that
every user of the cluster can write through group permissions. A job launched to that
cluster registers itself there, in <shared_dir>/jobs/<job id>.json (owner = the remote
user, project, name, start, hosts and devices, state, last step), and node 0 keeps the
record current while the job runs (remote/jobctl.py `board`, from a session of its own).

`list_jobs` reads every record over one SSH command; `adopt` puts a teammate's job into
this machine's job database, marked with its owner, so it can be followed like one's own
(status, logs, metrics by byte offset, the dashboard) when the owner's files are readable.
Cancel is refused for it (remote/tracker.py): only the owner stops a job.
"""
from __future__ import annotations

import json
import time

from remote.cluster import Cluster
from remote.jobs import Job, JobDB, Node
from remote.ssh import Connection, SSHError, quote


def board_dir(cluster: Cluster) -> str | None:
    return f"{cluster.shared_dir.rstrip('/')}/jobs" if cluster.shared_dir else None


def whoami(conn: Connection) -> str:
    return conn.run("id -un").stdout.strip()


def record_of(job: Job, owner: str, project: str | None) -> dict:
    return {"id": job.id, "name": job.name, "owner": owner, "project": project, "cluster": job.cluster.get("name"),
            "created": job.created, "updated": time.time(), "state": job.state, "step": job.step,
            "total_steps": job.total_steps, "world_size": job.extra.get("world_size"),
            "nproc_per_node": job.extra.get("nproc_per_node"), "gpus": job.extra.get("gpus", 0),
            "hosts": [n.host for n in job.nodes], "nodes": [{"index": n.index, "host": n.host, "jobdir": n.jobdir}
                                                           for n in job.nodes]}


def prepare_record(conn: Connection, cluster: Cluster, job_id: str) -> str:
    """The record's path; its folder is made (setgid, group-writable) when missing."""
    d = conn.abspath(board_dir(cluster))
    res = conn.run(f"mkdir -p -m 2775 {quote(d)} && test -w {quote(d)}", check=False)
    if res.exit_status != 0:
        raise SSHError(conn.label, f"the cluster's shared_dir {cluster.shared_dir} has no writable jobs/ folder for "
                                   f"this user ({(res.stderr or res.stdout).strip() or 'permission denied'}); give "
                                   f"the users' group write permission on it, or unset shared_dir in the profile")
    return f"{d}/{job_id}.json"


def write_record(conn: Connection, path: str, record: dict) -> None:
    """Written whole or not at all (a teammate may be reading the folder), readable by all."""
    tmp = f"{path}.tmp"
    conn.write_bytes(tmp, json.dumps(record, sort_keys=True).encode(), 0o664)
    conn.run(f"mv -f {quote(tmp)} {quote(path)}")


def list_jobs(conn: Connection, cluster: Cluster) -> list[dict]:
    """Every record on the cluster's board (every user's), oldest first."""
    d = board_dir(cluster)
    if d is None:
        raise SSHError(conn.label, f"cluster {cluster.name!r} has no shared_dir: set one (cluster add ... "
                                   "--shared-dir /shared/layerflow) to see everyone's jobs")
    d = conn.abspath(d)
    res = conn.run(f"for f in {quote(d)}/*.json; do [ -f \"$f\" ] && cat \"$f\" && echo; done; true")
    out = []
    for line in res.stdout.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a record caught mid-replace is whole on the next read
        if isinstance(rec, dict) and isinstance(rec.get("id"), str):
            out.append(rec)
    return sorted(out, key=lambda r: r.get("created") or 0)


def _as_me(cluster: Cluster, label: str) -> str:
    """The owner's host label (alice@node1:2222) as this user's profile names that host."""
    where = label.rpartition("@")[2]
    for h in cluster.hosts:
        if h.label.rpartition("@")[2] == where:
            return h.label
    return label  # a node this profile does not list: following it says so


def adopt(db: JobDB, cluster: Cluster, rec: dict, me: str, conn: Connection | None = None) -> Job:
    """This machine's entry for a job on the board: one's own as it is; a teammate's, made
    from its record (owner kept, so cancel is refused), its run.json copied into the mirror
    so the dashboard reads it like a run of one's own."""
    try:
        known = db.get(rec["id"])
        if known.id == rec["id"]:
            return known
    except LookupError:
        pass
    nodes = [Node(int(n["index"]), _as_me(cluster, str(n["host"])), str(n["jobdir"])) for n in rec.get("nodes") or []]
    job = Job(id=rec["id"], name=rec.get("name") or rec["id"], cluster=cluster.model_dump(mode="json"),
              created=float(rec.get("created") or time.time()), state=str(rec.get("state") or "running"),
              nodes=nodes, total_steps=rec.get("total_steps"), step=rec.get("step"),
              extra={"owner": rec.get("owner"), "teammate": rec.get("owner") != me,
                     "world_size": rec.get("world_size"), "board": True})
    db.add(job)
    mirror = db.mirror_dir(job.id)
    mirror.mkdir(parents=True, exist_ok=True)
    if conn is not None and nodes:
        for name in ("run.json", "project.lflow"):
            try:
                text = conn.read_text(f"{nodes[0].jobdir}/run/{name}")
            except SSHError:
                text = None  # not readable for this user: status and metrics may still be
            if text is not None:
                (mirror / name).write_text(text)
    return job
