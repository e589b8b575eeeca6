"""Track a remote job: state, metrics and logs streamed back, through faults.

One `poll()` asks every node for its status (one command each, with a timeout:
our own liveness check, since paramiko's keepalive never declares a dead peer),
then reads metrics.jsonl, the logs and each rank's system samples (logs/rankR.system.jsonl)
from their byte offsets over SFTP and appends the complete lines to the job's local
mirror (JobDB.mirror_dir), which the dashboard reads like a local run folder. The mirror's size
*is* the offset, so after a cut link, a crashed app or a restart the next read
starts exactly after the last line kept: nothing lost, nothing repeated. Several
trackers of one job (the GUI, and `status` in a terminal) share the mirror under a
file lock; each hands out the mirror's new lines to its own callbacks.

States: pending (launched, no pid yet), running, succeeded, failed, cancelled, lost
(a node unreachable for longer than `lost_after` seconds, or its processes gone
without an exit code, e.g. a reboot). `follow()` polls until the job ends and
reconnects with exponential backoff. `cancel()` TERMs the job's processes on every
node, waits, KILLs, and checks that nothing is left. `fetch()` downloads results.
"""
from __future__ import annotations

import json
import math
import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from filelock import FileLock

from engine.errors import LayerflowError
from engine.project import atomic_write
from engine.runtime.records import RESIZE_FILE
from engine.runs.tail import parse_jsonl, read_from, split_complete
from remote.node_data import restore_run_json
from remote.jobs import TERMINAL, Job, JobDB
from remote.ssh import Connection, SSHError, quote

MetricsFn = Callable[[list[dict]], None]
LogFn = Callable[[str, list[str]], None]  # (log name, new lines)
SystemFn = Callable[[str, list[dict]], None]  # (file name, new samples of its rank)
SYSTEM_SUFFIX = ".system.jsonl"  # logs/rankR.system.jsonl: a rank's CPU/memory samples (engine/runtime/sysmetrics.py)
REJOIN_MAX = 3  # a lost node is started again at most this often (a host that keeps failing stays out)
SYSTEM_LIST_S = 5.0  # how often a node's logs/ is listed for them (when its jobctl does not report their sizes)


class CancelError(LayerflowError, RuntimeError):
    pass


@dataclass
class NodeView:
    reachable: bool = False
    since_unreachable: float | None = None
    info: dict = field(default_factory=dict)
    error: str | None = None


def _truncate_partial(path: Path) -> int:
    """Cut a half-written last line (a crash mid-append) so size == the true offset."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        f.seek(max(0, size - (1 << 20)))
        tail = f.read()
        end = tail.rfind(b"\n")
        keep = size - len(tail) + end + 1 if end >= 0 else (0 if size <= (1 << 20) else size)
        if keep != size:
            f.truncate(keep)
    return keep


def _last_line(path: Path, size: int) -> bytes:
    """The last whole line of the first `size` bytes of `path` (b'' when there is none)."""
    if size <= 0:
        return b""
    with open(path, "rb") as f:
        f.seek(max(0, size - (64 << 10)))
        tail = f.read(size - max(0, size - (64 << 10)))
    cut = tail.rfind(b"\n", 0, len(tail) - 1)
    return tail[cut + 1:] if cut >= 0 or size <= (64 << 10) else b""


class Tracker:
    """Follows one job. Not thread-safe: drive it from one (worker) thread."""

    def __init__(self, job_id: str, db: JobDB | None = None, *, accept: Iterable[str] = (),
                 on_metrics: MetricsFn | None = None, on_log: LogFn | None = None,
                 on_state: Callable[[Job], None] | None = None, lost_after: float = 120.0,
                 status_timeout: float = 20.0, replay: bool = False, on_system: SystemFn | None = None):
        self.db = db or JobDB()
        self.job = self.db.get(job_id)
        self.cluster = self.job.cluster_profile()
        self.accept = list(accept)
        self.on_metrics, self.on_log, self.on_state = on_metrics, on_log, on_state
        self.on_system = on_system
        self._system_listed: dict[int, float] = {}  # node -> when its system files were last listed
        self.lost_after, self.status_timeout = lost_after, status_timeout
        self.mirror = self.db.mirror_dir(self.job.id)
        self.mirror.mkdir(parents=True, exist_ok=True)
        self.nodes = {n.index: NodeView() for n in self.job.nodes}
        self._rejoining: dict[int, float] = {}  # nodes started again, until their script says its pid
        self._conns: dict[int, Connection] = {}
        with self._mirror_lock():
            for p in [self.mirror / "metrics.jsonl", *self.mirror.glob("logs/*")]:
                _truncate_partial(p)
            # what is in the mirror already was handed out before (replay=True: hand it out again)
            self._seen_cuts = {k: v[0] for k, v in self._cuts().items()}
            self._delivered = {} if replay else {
                p.name: p.stat().st_size for p in [self.mirror / "metrics.jsonl", *self.mirror.glob("logs/*")]
                if p.exists()}

    def _mirror_lock(self) -> FileLock:
        """An exclusive lock on the job's mirror (filelock, a new one each time: across
        processes and threads)."""
        return FileLock(self.mirror / ".lock")

    # ----- connections -------------------------------------------------------
    def conn(self, i: int) -> Connection:
        if i not in self._conns:
            host = next((h for h in self.cluster.hosts if h.label == self.job.nodes[i].host), None)
            if host is None:
                raise SSHError(self.job.nodes[i].host, f"this host of job {self.job.id} is not in cluster "
                                                       f"{self.cluster.name!r}'s profile; add it to follow the job")
            self._conns[i] = Connection.to(self.cluster, host, self.accept)
        return self._conns[i]

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ctl(self, i: int, command: str, *extra: str, timeout: float | None = None, node_arg: bool = True) -> dict:
        """Run layerflow_jobctl.py on node i; its last stdout line is JSON."""
        node = self.job.nodes[i]
        cmd = " ".join(quote(a) for a in [self.cluster.python, f"{node.jobdir}/layerflow_jobctl.py", command,
                                          node.jobdir, *([str(i)] if node_arg else []), *extra])
        res = self.conn(i).run(cmd, timeout=timeout or self.status_timeout)
        return json.loads(res.stdout.strip().splitlines()[-1])

    # ----- one round -----------------------------------------------------------
    def poll(self) -> Job:
        """Refresh state, metrics and logs once. Never raises for a host problem."""
        now = time.time()
        for n in self.job.nodes:
            view = self.nodes[n.index]
            try:
                if self.job.backend == "slurm":  # one login node: Slurm's state and the file sizes
                    view.info = self._ctl(n.index, "slurm", self.job.extra["slurm_id"], node_arg=False)
                else:
                    view.info = self._ctl(n.index, "status")
                view.reachable, view.since_unreachable, view.error = True, None, None
            except (SSHError, ValueError, IndexError) as exc:
                view.reachable, view.error = False, str(exc)
                view.since_unreachable = view.since_unreachable or now
        # Read output *after* the status: if a node reported its exit code, everything
        # the run wrote is already on disk and this read gets all of it.
        with self._mirror_lock():
            for n in self.job.nodes:
                if self.nodes[n.index].reachable:
                    try:
                        self._stream(n.index)
                    except SSHError as exc:
                        v = self.nodes[n.index]
                        v.reachable, v.error, v.since_unreachable = False, str(exc), v.since_unreachable or now
        self._deliver()
        if self.job.backend == "slurm":
            self._update_slurm_state(now)
        else:
            self._update_state(now)
        return self.job

    def _update_slurm_state(self, now: float) -> None:
        """Slurm knows the state of its jobs (jobctl asked it on the login node)."""
        from remote.launch.slurm import describe, preemption, slurm_state

        job, old = self.job, (self.job.state, self.job.error, self.job.extra.get("slurm"))
        view = self.nodes[0]
        if job.done:
            pass
        elif not view.reachable:
            if view.since_unreachable and now - view.since_unreachable > self.lost_after:
                job.state = "lost"
                job.error = (f"login node {job.nodes[0].host} unreachable for more than {self.lost_after:g} s: "
                             f"{view.error}; the job may still run under Slurm (the next poll asks again)")
        else:
            info = view.info.get("slurm") or {}
            state = slurm_state(info.get("state") or "")
            job.extra["slurm"] = {k: info.get(k) for k in ("state", "reason", "nodes", "exit", "source", "restarts")}
            run = view.info.get("status") or {}
            if state is None:
                job.state = "lost"
                job.error = (f"Slurm no longer knows job {job.extra['slurm_id']} (no accounting store) and it left "
                             f"no exit code: {info.get('error') or 'no record'}")
            else:
                job.state, job.error = state, None
                seen = preemption(state, info, run, job.extra.get("preempted"), view.info.get("checkpoint"), now)
                if seen is not None:  # preempted, resuming, or a preemption Slurm did not requeue
                    job.state, job.error, job.extra["preempted"] = seen
                elif state == "pending":
                    reason = info.get("reason")
                    job.error = f"waiting in the queue: {reason}" if reason and reason != "None" else None
                elif state == "succeeded" and run.get("state") == "cancelled":
                    job.state = "cancelled"
                elif state == "failed":
                    job.error = f"Slurm: {describe(info)}, exit code {info.get('exit')}" + (
                        f": {run['error']}" if run.get("error") else self._error_hint())
                elif state == "timeout":
                    ckpt = view.info.get("checkpoint")
                    job.error = (f"Slurm stopped the job at its time limit ({info.get('time_limit') or job.cluster.get('time_limit')})"
                                 + (f"; latest checkpoint: {ckpt}" if ckpt else "")
                                 + "; `fetch` it and `train --resume` the folder to go on")
                elif state == "lost":
                    job.error = f"Slurm: {describe(info)} on {info.get('nodes')}"
        self.db.save(job)
        if (job.state, job.error, job.extra.get("slurm")) != old and self.on_state:
            self.on_state(job)

    def _system_sizes(self, i: int) -> dict[str, int]:
        """The sizes of node i's system-metrics files (run/logs/rankR.system.jsonl), listed
        over SFTP every SYSTEM_LIST_S seconds; {} between listings (a stale size must never
        read as a file that shrank). A jobctl that reports them itself spares the listing."""
        now = time.monotonic()
        if now - self._system_listed.get(i, -math.inf) < SYSTEM_LIST_S:
            return {}
        self._system_listed[i] = now
        try:
            entries = self.conn(i).listdir(f"{self.job.nodes[i].jobdir}/run/logs")
        except (OSError, SSHError):  # no logs/ yet
            return {}
        return {f"run/logs/{e.filename}": int(e.st_size) for e in entries
                if e.filename.endswith(SYSTEM_SUFFIX) and e.st_size is not None}

    def _stream(self, i: int) -> None:
        sizes = dict(self.nodes[i].info.get("sizes", {}))
        if not any(rel.endswith(SYSTEM_SUFFIX) for rel in sizes):
            sizes.update(self._system_sizes(i))
        if self.job.metrics_node is None and "run/metrics.jsonl" in sizes:
            self.job.metrics_node = i
            self.db.save(self.job)
        status = self.nodes[i].info.get("status")
        if i == self.job.metrics_node and isinstance(status, dict):
            # mirrored without the pid: that process lives on the node, not here
            text = json.dumps({k: v for k, v in status.items() if k != "pid"}, sort_keys=True)
            path = self.mirror / "status.json"
            if not path.exists() or path.read_text() != text:
                atomic_write(path, text.encode())
        for rel, size in sizes.items():
            if rel == "run/metrics.jsonl":
                if i != self.job.metrics_node:
                    continue
                local = self.mirror / "metrics.jsonl"
            else:
                local = self.mirror / "logs" / (Path(rel).name if rel.startswith("run/logs/") else rel)
            # The mirror's size is the offset, read under the lock: another tracker of the
            # same job (the GUI and a `status` in a terminal) may append meanwhile.
            offset = local.stat().st_size if local.exists() else 0
            if size < offset:  # rewritten on the node (torchrun restarted the run): find where
                offset = self._resync(i, rel, local, size)
            # a resume cuts metrics.jsonl back to its checkpoint and writes on at once, so the
            # file may be longer again by the next poll: the first read takes our last line
            # too, which the node's file must still hold where we have it
            check = _last_line(local, offset)
            while size > offset:
                data = self.conn(i).read_range(f"{self.job.nodes[i].jobdir}/{rel}", offset - len(check))
                if check:
                    if data[:len(check)] != check:  # rewritten past our copy: keep what is common, read on from there
                        offset, check = self._resync(i, rel, local, size), b""
                        continue
                    data, check = data[len(check):], b""
                _, used = split_complete(data)
                if not used:
                    break  # only a half-written line so far
                local.parent.mkdir(parents=True, exist_ok=True)
                with open(local, "ab") as f:
                    f.write(data[:used])
                    f.flush()
                    os.fsync(f.fileno())
                offset += used

    def _resync(self, i: int, rel: str, local: Path, size: int) -> int:
        """The remote file is shorter than our copy: keep the common prefix (whole lines),
        cut the rest, and note the cut so every tracker of the job re-delivers from there."""
        remote = b""
        while len(remote) < size:
            chunk = self.conn(i).read_range(f"{self.job.nodes[i].jobdir}/{rel}", len(remote))
            if not chunk:
                break
            remote += chunk
        mine = local.read_bytes()
        n = 0
        limit = min(len(mine), len(remote))
        while n < limit and mine[n] == remote[n]:
            n += 1
        keep = mine.rfind(b"\n", 0, n) + 1 if n < len(mine) else n
        with open(local, "r+b") as f:
            f.truncate(keep)
        cuts = self._cuts()
        gen = cuts.get(local.name, [0, 0])[0] + 1
        cuts[local.name] = [gen, keep]
        atomic_write(self.mirror / ".cuts.json", json.dumps(cuts).encode())
        return keep

    def _cuts(self) -> dict:
        try:
            return json.loads((self.mirror / ".cuts.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def _deliver(self) -> None:
        """Hand out the mirror's lines this tracker has not handed out yet (whoever wrote them)."""
        files = [self.mirror / "metrics.jsonl", *sorted((self.mirror / "logs").glob("*"))]
        cuts = self._cuts()
        for path in files:
            start = self._delivered.get(path.name, 0)
            gen, keep = cuts.get(path.name, [0, 0])
            if gen != self._seen_cuts.get(path.name, 0):  # the file was cut since we last read it
                self._seen_cuts[path.name] = gen
                start = self._delivered[path.name] = min(start, keep)
            try:
                if path.stat().st_size <= start:
                    continue
            except FileNotFoundError:
                continue
            with open(path, "rb") as f:
                lines, self._delivered[path.name] = read_from(f, start)
            if path.name == "metrics.jsonl":
                recs = parse_jsonl(lines)
                steps = [r["step"] for r in recs if isinstance(r.get("step"), int)]
                if steps:
                    self.job.step = max([self.job.step or 0, *steps])
                if self.on_metrics and recs:
                    self.on_metrics(recs)
            elif path.name.endswith(SYSTEM_SUFFIX):
                if self.on_system and lines:
                    self.on_system(path.name, parse_jsonl(lines))
            elif self.on_log and lines:
                self.on_log(path.name, [ln.decode("utf-8", "replace") for ln in lines])

    def _update_state(self, now: float) -> None:
        job, old = self.job, (self.job.state, self.job.error)
        infos = {i: v.info for i, v in self.nodes.items() if v.reachable}
        unreachable = [i for i, v in self.nodes.items() if not v.reachable]
        bounds = job.extra.get("nodes_bounds")  # an elastic job goes on without a lost node (torchrun --nnodes MIN:MAX)
        if bounds and bounds[0] >= bounds[1]:
            bounds = None  # (it needs every node: one lost, or failed, ends it)
        gone = [i for i in unreachable if now - self.nodes[i].since_unreachable > self.lost_after]
        if bounds:  # a lost node (never node 0, which hosts the rendezvous) is no longer the job's, until it rejoins;
            # nor is one whose torchrun failed: node 0's goes on without it (or fails, and says so)
            self._mark_lost([i for i in gone if i] + [i for i, inf in infos.items() if i and inf.get("exit") not in (None, 0)])
            out = self._lost()
            infos = {i: inf for i, inf in infos.items() if i not in out}
            unreachable, gone = [i for i in unreachable if i not in out], [i for i in gone if i not in out]
        failed_here = {i: inf.get("exit") for i, inf in infos.items() if inf.get("exit") not in (None, 0)}
        if job.state in TERMINAL:
            pass
        elif unreachable and failed_here:
            # what the reachable nodes know: a node whose torchrun failed ended the job, whatever
            # the others (unreachable) do
            job.state = "failed"
            job.error = ("; ".join(f"{job.nodes[i].host}: torchrun exited with {e}" for i, e in failed_here.items())
                         + "; unreachable: " + ", ".join(job.nodes[i].host for i in unreachable) + self._error_hint())
            self._kill_rest()
        elif unreachable:  # (not for long yet: the next polls say; an elastic job's lost nodes are out)
            if gone:
                job.state = "lost"
                job.error = "; ".join(f"{job.nodes[i].host} unreachable for more than {self.lost_after:g} s: "
                                      f"{self.nodes[i].error}" for i in gone)
        else:  # (an elastic job: the nodes left, with node 0, which hosts the rendezvous, say where it stands)
            if bounds:  # a node whose processes vanished is one the job went on without
                vanished = [i for i, inf in infos.items() if i and inf.get("pid") and not inf["alive"]
                            and inf.get("exit") is None]
                self._mark_lost(vanished)
                infos = {i: inf for i, inf in infos.items() if i not in vanished}
            exits = {i: inf.get("exit") for i, inf in infos.items()}
            run_state = (infos.get(job.metrics_node, {}).get("status") or {}).get("state") \
                if job.metrics_node is not None else None
            if any(inf.get("cancelled") for inf in infos.values()) and not any(inf["alive"] for inf in infos.values()):
                job.state = "cancelled"
            elif all(e is not None for e in exits.values()):
                if all(e == 0 for e in exits.values()):
                    job.state = "cancelled" if run_state == "cancelled" else "succeeded"
                else:
                    job.state = "failed"
                    job.error = "; ".join(f"{job.nodes[i].host}: torchrun exited with {e}"
                                          for i, e in exits.items() if e) + self._error_hint()
            elif any(e not in (None, 0) for e in exits.values()):
                # one node failed: the others would wait on a rendezvous that never completes
                job.state = "failed"
                job.error = "; ".join(f"{job.nodes[i].host}: torchrun exited with {e}"
                                      for i, e in exits.items() if e not in (None, 0)) + self._error_hint()
                self._kill_rest()
            elif any(inf.get("pid") and not inf["alive"] and inf.get("exit") is None for inf in infos.values()):
                job.state, job.error = "lost", "a node's processes vanished without an exit code (host rebooted?)"
            elif all(inf.get("pid") or i in self._rejoining for i, inf in infos.items()):
                job.state, job.error = "running", None
                if bounds and len(infos) < bounds[0]:
                    job.error = (f"waiting for nodes: {len(infos)} of the {bounds[0]} it needs at least are left "
                                 f"(lost: {', '.join(job.extra.get('lost_nodes', []))})")
                elif bounds and self._may_grow(infos.get(0)):
                    self._rejoin(now, bounds)
            else:
                job.state = "pending"
        self.db.save(job)  # also records step and metrics_node
        if (job.state, job.error) != old and self.on_state:
            self.on_state(job)

    # ----- elastic jobs: nodes lost, and taken back ----------------------------
    def _lost(self) -> set[int]:
        lost = set(self.job.extra.get("lost_nodes", []))
        return {n.index for n in self.job.nodes if n.host in lost}

    def _mark_lost(self, nodes: Iterable[int]) -> None:
        hosts = {self.job.nodes[i].host for i in nodes}
        if hosts:
            self.job.extra["lost_nodes"] = sorted({*self.job.extra.get("lost_nodes", []), *hosts})
            for i in nodes:
                self._rejoining.pop(i, None)

    def _may_grow(self, home: dict | None) -> bool:
        """Node 0's run is training, with steps left to train (a node taken in at the end
        would find no rendezvous)."""
        st = (home or {}).get("status") or {}
        total = st.get("total_steps") or self.job.total_steps
        return bool(home and home.get("alive") and st.get("state") == "running"
                    and (total is None or (st.get("step") or 0) < total))

    def _rejoin(self, now: float, bounds: list[int]) -> None:
        """A lost node of a running elastic job that can be reached again is started again,
        while the job has fewer nodes than its maximum (each host at most REJOIN_MAX times):
        rank 0's run folder is told first (records.RESIZE_FILE), so that the stop torchrun's
        agents make to take the node in reads as the cluster's (a checkpoint, the attempt
        ended preempted), then the node's script runs again and joins the rendezvous. The
        next attempt lays the plan out on the larger world (engine/runtime/elastic.py)."""
        job = self.job
        for i in sorted(self._lost()):
            active = len(job.nodes) - len(self._lost())
            host = job.nodes[i].host
            done = [r for r in job.extra.get("rejoined", []) if r.get("host") == host]
            if active >= bounds[1] or not self.nodes[i].reachable or len(done) >= REJOIN_MAX:
                continue
            note = json.dumps({"host": host, "at": round(now, 3)}).encode()
            try:
                self.conn(0).write_bytes(f"{job.nodes[0].jobdir}/run/{RESIZE_FILE}", note, 0o644)
                res = self._ctl(i, "rejoin", timeout=60)
            except (SSHError, OSError, ValueError, IndexError) as exc:
                self.nodes[i].error = f"could not start it again: {exc}"
                continue
            if not res.get("started"):
                continue
            job.extra["lost_nodes"] = [h for h in job.extra.get("lost_nodes", []) if h != host]
            job.extra.setdefault("rejoined", []).append({"host": host, "at": round(now, 3), "step": job.step})
            self._rejoining[i] = now

    def _error_hint(self) -> str:
        log = self.mirror / "logs" / "rank0.log"
        if log.exists():
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            if tail:
                return " | rank0.log: " + " / ".join(tail)
        return ""

    def _kill_rest(self) -> None:
        if self.job.extra.get("teammate"):
            return  # a teammate's job: its owner's tracker (or its rendezvous timeout) ends it
        for n in self.job.nodes:
            inf = self.nodes[n.index].info
            if inf.get("alive"):
                try:
                    self._ctl(n.index, "cancel", "10", timeout=40)
                except (SSHError, ValueError, IndexError):
                    pass

    # ----- loops and actions -----------------------------------------------------
    def follow(self, stop: threading.Event | None = None, interval: float = 1.0,
               backoff_max: float = 10.0) -> Job:
        """Poll until the job ends (or `stop` is set); back off while a node is unreachable."""
        stop = stop or threading.Event()
        delay = interval
        while not stop.is_set():
            job = self.poll()
            if job.done:
                return job
            if all(v.reachable for v in self.nodes.values()):
                delay = interval
            else:
                delay = min(backoff_max, max(delay * 2, 0.5))  # reconnect with backoff
            stop.wait(delay)
        return self.job

    def cancel(self, grace: float = 15.0) -> Job:
        """TERM every node's job processes, wait `grace` s, KILL what is left, verify none remain."""
        if self.job.extra.get("teammate"):
            raise CancelError(f"job {self.job.id} belongs to {self.job.extra.get('owner')} on cluster "
                              f"{self.job.cluster.get('name')}: only its owner can cancel it")
        if self.job.backend == "slurm":
            return self._cancel_slurm(grace)

        def one(n):
            return self._ctl(n.index, "cancel", f"{grace:g}", timeout=grace + 30)

        errors, left = [], []
        with ThreadPoolExecutor(len(self.job.nodes)) as ex:
            futs = {n.index: ex.submit(one, n) for n in self.job.nodes}
        for i, f in futs.items():
            try:
                r = f.result()
                if r["left"]:
                    left.append(f"{self.job.nodes[i].host}: pids {r['left']} survived SIGKILL")
            except (SSHError, ValueError, IndexError) as exc:
                errors.append(f"{self.job.nodes[i].host}: {exc}")
        # Close the channels the cancel used before the final poll (they were in other threads).
        self.close()
        self.poll()
        if errors or left:
            raise CancelError("cancel incomplete: " + "; ".join(errors + left))
        if self.job.state not in TERMINAL:  # (a job that finished before the TERM keeps its state)
            self.job.state = "cancelled"
        self.db.save(self.job)
        return self.job

    def _cancel_slurm(self, grace: float) -> Job:
        """scancel on the login node; Slurm TERMs every step (the run checkpoints), KILLs
        after its KillWait; jobctl waits until the job has ended and no step is left."""
        wait = grace + 60.0  # Slurm's own KillWait (30 s by default) comes on top of ours
        r = self._ctl(0, "slurm-cancel", self.job.extra["slurm_id"], f"{wait:g}", timeout=wait + 30, node_arg=False)
        if r.get("scancel"):
            raise CancelError(f"scancel {self.job.extra['slurm_id']} failed: {r.get('error')}")
        self.poll()
        if r.get("left"):
            raise CancelError(f"cancel incomplete: Slurm still runs {', '.join(r['left'])} of job "
                              f"{self.job.extra['slurm_id']}")
        if self.job.state not in TERMINAL:
            self.job.state = "cancelled"
        self.db.save(self.job)
        return self.job

    def fetch(self, out_dir: str | Path, progress: Callable[[str, int, int], None] | None = None) -> list[Path]:
        """Download checkpoints, model.pt, metrics, status and logs into out_dir."""
        out_dir = Path(out_dir)
        got: list[Path] = []
        order = sorted(self.job.nodes, key=lambda n: n.index != self.job.metrics_node)  # rank 0's node first
        for n in order:
            c = self.conn(n.index)
            run = f"{n.jobdir}/run"
            # the outputs, and the inputs that make the folder one `train --resume` accepts
            wanted = (["metrics.jsonl", "status.json", "model.pt", "run.json", "project.lflow"]
                      + ([] if self.job.extra.get("remote_data") else ["data.npz"])  # (a big set stays there)
                      if n.index == order[0].index else [])
            for name in wanted:
                if c.stat_size(f"{run}/{name}") is not None:
                    got.append(self._get(c, f"{run}/{name}", out_dir / name, progress))
                    if name == "run.json":  # the data set's path here, not the cluster's
                        restore_run_json(out_dir / name, self.job)
            for sub in ("checkpoints", "logs"):
                got += self._get_tree(c, f"{run}/{sub}", out_dir / sub, progress)
            # the node scripts' output (nodeN.out) and, under Slurm, the batch script's (slurm-ID.out)
            for e in c.listdir(n.jobdir):
                if e.filename.endswith(".out") and (e.filename.startswith(("node", "slurm-"))):
                    got.append(self._get(c, f"{n.jobdir}/{e.filename}", out_dir / "logs" / e.filename, progress))
        return got

    @staticmethod
    def _get(c: Connection, remote: str, local: Path, progress) -> Path:
        """Download into a temporary name beside `local`, then rename: a fetch that stops
        (a full disk here, a lost link) leaves no half file. A local write that fails is
        one line naming `local` (WriteError: 'No space left on device (the disk is full;
        ...)'), not an SSH error of the remote file's."""
        from engine.files import WriteError

        failed: list[OSError] = []

        class Sink:  # paramiko's getfo writes here: a failure is ours, not the link's
            def __init__(self, f):
                self.f = f

            def write(self, data):
                try:
                    return self.f.write(data)
                except OSError as exc:
                    failed.append(exc)
                    raise

        tmp = local.with_name(f".{local.name}.part-{os.getpid()}")
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                c._sftp_call(f"download {remote}", lambda s: s.getfo(
                    remote, Sink(f), callback=(lambda d, t: progress(remote, d, t)) if progress else None))
            os.replace(tmp, local)
        except SSHError:
            if failed:
                raise WriteError(local, failed[0]) from None
            raise
        except FileNotFoundError:
            raise
        except OSError as exc:  # creating the folder or the file, or the last flush at close
            raise WriteError(local, exc) from None
        finally:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
        return local

    def _get_tree(self, c: Connection, remote: str, local: Path, progress) -> list[Path]:
        try:
            entries = c.listdir(remote)
        except FileNotFoundError:
            return []
        out = []
        for e in entries:
            if stat.S_ISDIR(e.st_mode or 0):
                out += self._get_tree(c, f"{remote}/{e.filename}", local / e.filename, progress)
            elif not (local / e.filename).exists():  # shards of other ranks merge; rank 0's node went first
                out.append(self._get(c, f"{remote}/{e.filename}", local / e.filename, progress))
        return out


def mirror_metrics(db: JobDB, job_id: str) -> Path:
    """The local metrics.jsonl of a job (what the dashboard tails like a local run's)."""
    return db.mirror_dir(job_id) / "metrics.jsonl"


class Follower:
    """Follow a job on a background thread (the GUI's way: never block the event loop).

    Callbacks run on that thread; a Qt caller forwards them with a queued signal.
    stop() returns promptly (the loop waits on an Event) and closes the connections.
    """

    def __init__(self, job_id: str, db: JobDB | None = None, *, interval: float = 1.0, **callbacks):
        self.job_id, self.db, self.interval, self.callbacks = job_id, db, interval, callbacks
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.job: Job | None = None
        self.thread = threading.Thread(target=self._run, name=f"follow-{job_id}", daemon=True)

    def start(self) -> "Follower":
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            with Tracker(self.job_id, self.db, **self.callbacks) as tr:
                self.job = tr.follow(self.stop_event, interval=self.interval)
        except BaseException as exc:  # reported to the caller, never lost in a thread
            self.error = exc

    def stop(self, timeout: float = 30.0) -> None:
        self.stop_event.set()
        self.thread.join(timeout)
