"""Deploy over SSH: preflight, bundle, upload, then torchrun on every node, detached.

    deploy(cluster, run_dir) -> Job
      1. preflight every host (parallel, timeouts); any failure -> DeployError, nothing launched
      2. bundle the run folder + runtime (content hash); upload where that hash is missing
      3. per node: extract into WORKDIR/jobs/<job id>/node<N>/, write token + nodeN.sh
      4. per node: `setsid nohup sh nodeN.sh </dev/null >nodeN.out 2>&1 &`
         the script records its pid (== its process group: setsid made it a leader),
         runs torchrun (c10d rendezvous on the first node, --max-restarts), and writes
         nodeN.exit with torchrun's exit code. Closing SSH does not touch it.

Every path and value that reaches a shell goes through shlex.quote; the job's
name is data, never code.
"""
from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from engine.errors import LayerflowError
from engine.runtime.spec import RunSpec, SpecError
from remote import board
from remote.bundle import Bundle, extract, make_bundle, upload
from remote.cluster import Cluster, config_dir
from remote.jobctl import TOKEN_VAR
from remote.jobs import Job, JobDB, Node, new_job_id
from remote.preflight import PreflightReport, check_devices, preflight, rdzv_address
from remote.ssh import Connection, SSHError, quote

Progress = Callable[[str, int, int], None]  # (host, bytes done, bytes total)


class DeployError(LayerflowError, RuntimeError):
    def __init__(self, message: str, report: PreflightReport | None = None):
        super().__init__(message)
        self.report = report


def run_spec(run_dir: Path) -> RunSpec:
    """The run folder's typed spec; DeployError names the field at fault."""
    try:
        return RunSpec.load(run_dir)
    except SpecError as exc:
        raise DeployError(str(exc)) from None


def world_size(run_dir: Path) -> int:
    return run_spec(Path(run_dir)).world


def layout(cluster: Cluster, world: int) -> tuple[int, int]:
    """(nodes, processes per node) for a plan of `world` processes on this cluster."""
    n = len(cluster.hosts)
    if cluster.nproc_per_node:
        nodes = world // cluster.nproc_per_node
        if nodes * cluster.nproc_per_node != world or not 1 <= nodes <= n:
            raise DeployError(f"the plan needs {world} processes; with nproc_per_node={cluster.nproc_per_node} "
                              f"that is not a whole number of this cluster's {n} node(s); change placement "
                              f"(pp x dp x tp) or nproc_per_node")
        return nodes, cluster.nproc_per_node
    if world < n:
        return world, 1  # a small plan uses the first `world` hosts
    if world % n:
        raise DeployError(f"the plan needs {world} processes, which does not split evenly over {n} nodes; "
                          f"set the cluster's nproc_per_node or change placement (pp x dp x tp)")
    return n, world // n


def prepare(project, out_dir: str | Path | None = None, *, steps: int | None = None,
            placement: dict | None = None, device=None) -> Path:
    """A run folder for a remote deploy (engine.run.build_run), planned for the cluster's
    device (remote.preflight.device_spec of a preflight) when one is given: its predicted
    peak memory is checked against the GPUs' free memory at deploy."""
    from engine.errors import CheckFailed
    from engine.run import RunError, build_run

    try:
        return build_run(project, out_dir, steps=steps, placement=placement, device=device).run_dir
    except CheckFailed as exc:
        raise DeployError("the placement cannot run:\n" + "\n".join(f"  {e}" for e in exc.errors)) from None
    except RunError as exc:
        raise DeployError(str(exc)) from None


def _endpoint(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"  # IPv6 needs brackets


def _torchrun(job: Job, cluster: Cluster, i: int, nnodes: int, nproc: int) -> str:
    # One node needs no rendezvous port of the cluster's: torchrun --standalone picks a free one.
    rdzv = ["--standalone"] if nnodes == 1 else [
        f"--node-rank={i}", "--rdzv-backend=c10d", f"--rdzv-endpoint={_endpoint(rdzv_address(cluster), cluster.rdzv_port)}",
        f"--rdzv-id={job.token}"]
    return " ".join(quote(a) for a in [
        cluster.python, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", *rdzv,
        f"--max-restarts={cluster.max_restarts}", "--monitor-interval=1",
        "-m", "engine.runtime.train", "run"])


def _link_data(job: Job) -> str:
    """A data set already on the cluster: the run folder's data.npz points at it."""
    path = job.extra.get("remote_data")
    return f"ln -sfn {quote(path)} run/data.npz\n" if path else ""


def _board_keeper(job: Job, cluster: Cluster, i: int) -> str:
    """Node 0 keeps the job's record on the shared job board current (remote/board.py), from
    a session of its own without the job's token: a cancel neither kills it nor counts it."""
    record = job.extra.get("board")
    if not record or i != 0:
        return ""
    cmd = " ".join(quote(a) for a in [cluster.python, "layerflow_jobctl.py", "board", ".", "0", record, "5"])
    return f"setsid nohup {cmd} </dev/null >board.out 2>&1 &\n"


def node_script(job: Job, cluster: Cluster, i: int, nnodes: int, nproc: int) -> str:
    env = {TOKEN_VAR: job.token, "PYTHONUNBUFFERED": "1", **cluster.env}
    exports = "\n".join(f"export {k}={quote(v)}" for k, v in env.items())
    if nnodes * nproc == 1 and cluster.max_restarts == 0:
        # one process and no restarts: torchrun would only add an agent (and a second torch import)
        torchrun = " ".join(quote(a) for a in [cluster.python, "-m", "engine.runtime.train", "run"])
    else:
        torchrun = _torchrun(job, cluster, i, nnodes, nproc)
    return f"""#!/bin/sh
# Layerflow job {job.id}, node {i} of {nnodes}. Started by `setsid nohup`, stdin closed:
# this shell leads its own session, so its pid is the job's process group on this node.
echo $$ > node{i}.pid.tmp && mv node{i}.pid.tmp node{i}.pid
printf 'layerflow job %s (%s) node {i} of {nnodes}\\n' {quote(job.id)} {quote(job.name)}
{_board_keeper(job, cluster, i)}{_link_data(job)}{exports}
{torchrun}
rc=$?
echo $rc > node{i}.exit.tmp && mv node{i}.exit.tmp node{i}.exit
exit $rc
"""


def deploy(cluster: Cluster, run_dir: str | Path, *, name: str | None = None, accept: Iterable[str] = (),
           db: JobDB | None = None, progress: Progress | None = None,
           on_preflight: Callable[[PreflightReport], None] | None = None, remote_data: str | None = None) -> Job:
    """Launch the prepared run folder on the cluster; returns the job (state running).

    remote_data: a data set (.npz with x_train, y_train, x_val, y_val) already on every
    node at this path; the bundle then leaves data.npz out and the nodes link to it."""
    run_dir = Path(run_dir)
    db = db or JobDB()
    accept = list(accept)
    if cluster.backend != "ssh":
        raise DeployError(f"cluster {cluster.name!r} uses backend {cluster.backend!r}; use remote.launch.deploy")
    spec = run_spec(run_dir)
    world = spec.world
    nnodes, nproc = layout(cluster, world)
    cluster_used = cluster.model_copy(update={"hosts": cluster.hosts[:nnodes]})
    conns = [Connection.to(cluster, h, accept) for h in cluster_used.hosts]
    try:
        # the rendezvous port is checked only where one is used: several nodes
        report = preflight(cluster_used, accept=accept, connections=conns, rendezvous=nnodes > 1)
        if on_preflight:
            on_preflight(report)
        if not report.ok:
            raise DeployError("preflight failed, nothing was launched:\n" + "\n".join(report.failures), report)
        errs = check_devices(report, world, nproc, spec.predicted.peak_bytes)
        if errs:
            raise DeployError("the plan does not fit the cluster, nothing was launched:\n" + "\n".join(errs), report)

        if remote_data:
            missing = []
            for c in conns:
                if c.run(f"test -r {quote(remote_data)}", check=False).exit_status != 0:
                    missing.append(c.label)
            if missing:
                raise DeployError(f"remote data {remote_data} is not readable on {', '.join(missing)}; "
                                  "nothing was launched")
        bundle = make_bundle(run_dir, config_dir() / "bundles", exclude=["data.npz"] if remote_data else ())
        job = Job(id=new_job_id(name or run_dir.name), name=name or run_dir.name,
                  cluster=cluster_used.model_dump(mode="json"), created=time.time(), token=secrets.token_hex(12),
                  total_steps=spec.total_steps)
        job.extra = {"world_size": world, "nproc_per_node": nproc, "bundle": bundle.sha256,
                     "remote_data": remote_data,
                     "gpus": sum(min(len(h.gpus), nproc) for h in report.hosts)}
        owner = None
        if cluster.shared_dir:  # the shared job board: the record's place is in every node script
            owner = board.whoami(conns[0])
            job.extra["owner"] = owner
            job.extra["board"] = board.prepare_record(conns[0], cluster, job.id)

        def stage(i: int) -> Node:
            c = conns[i]
            workdir = c.abspath(cluster.workdir)
            # one folder per node: on a shared file system the nodes must not extract into,
            # or write their pid/exit files into, the same place
            jobdir = f"{workdir}/jobs/{job.id}/node{i}"
            tar, _ = upload(c, bundle, f"{workdir}/bundles",
                            (lambda d, t: progress(c.label, d, t)) if progress else None)
            extract(c, tar, jobdir)
            c.write_bytes(f"{jobdir}/token", job.token.encode(), 0o600)
            c.write_bytes(f"{jobdir}/node{i}.sh", node_script(job, cluster_used, i, nnodes, nproc).encode(), 0o700)
            return Node(i, c.label, jobdir)

        db.add_with_mirror(job, run_dir)
        try:
            with ThreadPoolExecutor(len(conns)) as ex:
                job.nodes = list(ex.map(stage, range(nnodes)))
        except (SSHError, OSError) as exc:
            job.state, job.error = "failed", f"upload failed, nothing was launched: {exc}"
            db.save(job)
            raise DeployError(job.error) from None
        project = None
        if owner is not None:
            project = spec.name
            board.write_record(conns[0], job.extra["board"], board.record_of(job, owner, project))
        # All nodes staged: only now start anything.
        started = []
        try:
            for n in job.nodes:
                conns[n.index].run(f"cd {quote(n.jobdir)} && (setsid nohup sh node{n.index}.sh "
                                   f"</dev/null >node{n.index}.out 2>&1 &)")
                started.append(n)
        except SSHError as exc:
            for n in started:  # a half-launched job would wait on its rendezvous: end it
                try:
                    conns[n.index].run(" ".join(quote(a) for a in [cluster.python, f"{n.jobdir}/layerflow_jobctl.py",
                                                                   "cancel", n.jobdir, str(n.index), "10"]),
                                       timeout=60)
                except SSHError:
                    pass
            job.state, job.error = "failed", f"launch failed on {exc.host}: {exc.reason}"
            db.save(job)
            if owner is not None:  # the board must not show a job that never started as pending
                try:
                    board.write_record(conns[0], job.extra["board"], {**board.record_of(job, owner, project),
                                                                      "error": job.error})
                except SSHError:
                    pass
            raise DeployError(job.error) from None
        job.state = "running"
        db.save(job)
        return job
    finally:
        for c in conns:
            c.close()


def upload_bundle(cluster: Cluster, bundle: Bundle, accept: Iterable[str] = (),
                  progress: Progress | None = None) -> list[bool]:
    """Upload a bundle to every host (used by bench/deploy.py); returns uploaded? per host."""
    def one(h):
        with Connection.to(cluster, h, accept) as c:
            _, sent = upload(c, bundle, f"{c.abspath(cluster.workdir)}/bundles",
                             (lambda d, t: progress(c.label, d, t)) if progress else None)
            return sent
    with ThreadPoolExecutor(len(cluster.hosts)) as ex:
        return list(ex.map(one, cluster.hosts))
