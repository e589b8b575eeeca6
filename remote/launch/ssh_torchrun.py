"""Deploy over SSH: preflight, bundle, upload, then torchrun on every node, detached.

    deploy(cluster, run_dir) -> Job
      1. preflight every host (parallel, timeouts); any failure -> DeployError, nothing launched
      2. bundle the run folder + runtime (content hash, never the data); upload where that
         hash is missing; per node: extract into WORKDIR/jobs/<job id>/node<N>/
      3. per node: the data (remote/node_data.py): checked by fingerprint where it already is, or
         uploaded once into WORKDIR/data/<digest>/; any problem -> DeployError, nothing launched
         (node 0 first: nodes sharing a file system then find its copy); write token + nodeN.sh
      4. per node: `setsid nohup sh nodeN.sh </dev/null >nodeN.out 2>&1 &`
         the script records its pid (== its process group: setsid made it a leader),
         runs torchrun (c10d rendezvous on the first node, --max-restarts), and writes
         nodeN.exit with torchrun's exit code. Closing SSH does not touch it.

Every path and value that reaches a shell goes through shlex.quote; the job's
name is data, never code.
"""
from __future__ import annotations

import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from engine.errors import LayerflowError
from engine.runtime import ENTRY
from engine.runtime.spec import RunSpec, SpecError
from remote import board
from remote.bundle import Bundle, extract, make_bundle, upload
from remote.cluster import Cluster, config_dir
from remote.node_data import DataPlan, DataProblem, link_line, plan_data, stage_data
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
    """A run folder for a remote deploy (engine.runs.build.build_run), planned for the cluster's
    device (remote.preflight.device_spec of a preflight) when one is given: its predicted
    peak memory is checked against the GPUs' free memory at deploy."""
    from engine.errors import CheckFailed
    from engine.runs.build import RunError, build_run

    from engine.runs.history import RunsOutsideProject, check_runs_inside

    try:
        check_runs_inside(project.directory, out_dir)  # a `runs` link out of the project: refused, as for train
        return build_run(project, out_dir, steps=steps, placement=placement, device=device).run_dir
    except RunsOutsideProject as exc:
        raise DeployError(str(exc)) from None
    except CheckFailed as exc:
        raise DeployError("the placement cannot run:\n" + "\n".join(f"  {e}" for e in exc.errors)) from None
    except RunError as exc:
        raise DeployError(str(exc)) from None


def _endpoint(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"  # IPv6 needs brackets


LAST_CALL_S = 5  # the rendezvous waits this long for more nodes once it has the fewest it may start with


def node_bounds(cluster: Cluster, nnodes: int, nproc: int, group: int) -> tuple[int, int]:
    """(min, max) nodes of torchrun --nnodes MIN:MAX: the profile's, else the fewest nodes
    whose processes hold whole pp x tp groups (`group`), and every node deployed on."""
    fewest = next((n for n in range(1, nnodes + 1) if (n * nproc) % group == 0), nnodes)
    lo = cluster.min_nodes if cluster.min_nodes is not None else fewest
    hi = cluster.max_nodes if cluster.max_nodes is not None else nnodes
    return max(1, min(lo, nnodes)), max(min(lo, nnodes), min(hi, nnodes))


def _torchrun(job: Job, cluster: Cluster, i: int, nnodes: int, nproc: int) -> str:
    # One node needs no rendezvous port of the cluster's: torchrun --standalone picks a free one.
    lo, hi = job.extra.get("nodes_bounds") or (nnodes, nnodes)
    # node 0 hosts the rendezvous (on loopback or one host every agent would think it is the
    # host: the first to bind would win); a lost node's heartbeat stops after a few seconds
    conf = f"is_host={1 if i == 0 else 0},last_call_timeout={LAST_CALL_S},keep_alive_interval=1,keep_alive_max_attempt=5"
    rdzv = ["--standalone"] if nnodes == 1 else [
        f"--node-rank={i}", "--rdzv-backend=c10d", f"--rdzv-endpoint={_endpoint(rdzv_address(cluster), cluster.rdzv_port)}",
        f"--rdzv-id={job.token}", f"--rdzv-conf={conf}"]
    return " ".join(quote(a) for a in [
        cluster.python, "-m", "torch.distributed.run", f"--nnodes={lo}:{hi}" if lo != hi else f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}", *rdzv, f"--max-restarts={cluster.max_restarts or 0}", "--monitor-interval=1",
        "-m", ENTRY, "run"])


def _board_keeper(job: Job, cluster: Cluster, i: int) -> str:
    """Node 0 keeps the job's record on the shared job board current (remote/board.py), from
    a session of its own without the job's token: a cancel neither kills it nor counts it."""
    record = job.extra.get("board")
    if not record or i != 0:
        return ""
    cmd = " ".join(quote(a) for a in [cluster.python, "layerflow_jobctl.py", "board", ".", "0", record, "5"])
    return f"setsid nohup {cmd} </dev/null >board.out 2>&1 &\n"


def node_script(job: Job, cluster: Cluster, i: int, nnodes: int, nproc: int) -> str:
    env = {TOKEN_VAR: job.token, "PYTHONUNBUFFERED": "1", "LAYERFLOW_NODE": str(i),  # (ranks in node order: mesh.py)
           "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # (CUDA's numbers as nvidia-smi's, which preflight checked)
    if nnodes > 1:  # (the interface that reaches it is gloo's and NCCL's: mesh.set_socket_ifname)
        env["LAYERFLOW_RDZV_ENDPOINT"] = _endpoint(rdzv_address(cluster), cluster.rdzv_port)
    lo, hi = job.extra.get("nodes_bounds") or (nnodes, nnodes)
    if nnodes > 1 and lo != hi:
        # a node that joins a running job (tracker.py takes a returning node back) waits
        # forever for the round's MASTER_ADDR when the agents share the rendezvous store:
        # torch's c10d handler publishes it only in its first round. Unshared, every round's
        # rank 0 publishes it (and its workers host their own store, on a free port)
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.update(cluster.env)
    exports = "\n".join(f"export {k}={quote(v)}" for k, v in env.items())
    if nnodes * nproc == 1 and not cluster.max_restarts:
        # one process and no restarts: torchrun would only add an agent (and a second torch import)
        torchrun = " ".join(quote(a) for a in [cluster.python, "-m", ENTRY, "run"])
    else:
        torchrun = _torchrun(job, cluster, i, nnodes, nproc)
    return f"""#!/bin/sh
# Layerflow job {job.id}, node {i} of {nnodes}. Started by `setsid nohup`, stdin closed:
# this shell leads its own session, so its pid is the job's process group on this node.
echo $$ > node{i}.pid.tmp && mv node{i}.pid.tmp node{i}.pid
printf 'layerflow job %s (%s) node {i} of {nnodes}\\n' {quote(job.id)} {quote(job.name)}
{_board_keeper(job, cluster, i)}{link_line(job)}{exports}
{torchrun}
rc=$?
echo $rc > node{i}.exit.tmp && mv node{i}.exit.tmp node{i}.exit
exit $rc
"""


def deploy(cluster: Cluster, run_dir: str | Path, *, name: str | None = None, accept: Iterable[str] = (),
           db: JobDB | None = None, progress: Progress | None = None,
           on_preflight: Callable[[PreflightReport], None] | None = None, remote_data: str | None = None) -> Job:
    """Launch the prepared run folder on the cluster; returns the job (state running).

    remote_data: where the run's data set already is on every node (its path there): a
    data set read in place (run.json data.source) is checked there by fingerprint before
    anything starts; a generated set's data.npz is linked to it. Without it, the profile's
    data_paths may say where; else the data is uploaded once into the cluster's cache
    (remote/node_data.py). job.extra["sent"] says the bytes sent: {"bundle", "data"}."""
    run_dir = Path(run_dir)
    db = db or JobDB()
    accept = list(accept)
    if cluster.backend != "ssh":
        raise DeployError(f"cluster {cluster.name!r} uses backend {cluster.backend!r}; use remote.launch.deploy")
    spec = run_spec(run_dir)
    world = spec.world
    nnodes, nproc = layout(cluster, world)
    # the run's restart policy unless the profile sets its own
    restarts = cluster.max_restarts if cluster.max_restarts is not None else spec.training.restarts.max_restarts
    cluster_used = cluster.model_copy(update={"hosts": cluster.hosts[:nnodes], "max_restarts": restarts})
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

        try:
            dplan = plan_data(spec, run_dir, cluster, remote_data)
        except DataProblem as exc:
            raise DeployError(f"{exc}; nothing was launched") from None
        bundle = make_bundle(run_dir, config_dir() / "bundles", exclude=["data.npz"], replace=dplan.replace(run_dir))
        job = Job(id=new_job_id(name or run_dir.name), name=name or run_dir.name,
                  cluster=cluster_used.model_dump(mode="json"), created=time.time(), token=secrets.token_hex(12),
                  total_steps=spec.total_steps)
        job.extra = {"world_size": world, "nproc_per_node": nproc, "bundle": bundle.sha256,
                     "remote_data": remote_data if dplan.mode == "link" else None,
                     "gpus": sum(min(len(h.gpus), nproc) for h in report.hosts)}
        if nnodes > 1:  # torchrun --nnodes MIN:MAX: lost nodes shrink the data axis (engine/runtime/elastic.py)
            job.extra["nodes_bounds"] = list(node_bounds(cluster, nnodes, nproc, spec.plan.pp * spec.plan.tp))
        if dplan.mode == "cache" and dplan.npz:
            job.extra["data_link"] = dplan.path
        job.nodes, sent = stage_all(conns, cluster, job, bundle, dplan, progress)
        job.extra["sent"] = sent
        job.extra["data"] = dplan.record()
        owner = None
        if cluster.shared_dir:  # the shared job board: the record's place is in every node script
            owner = board.whoami(conns[0])
            job.extra["owner"] = owner
            job.extra["board"] = board.prepare_record(conns[0], cluster, job.id)

        db.add_with_mirror(job, run_dir)
        try:
            for n in job.nodes:
                c = conns[n.index]
                c.write_bytes(f"{n.jobdir}/token", job.token.encode(), 0o600)
                c.write_bytes(f"{n.jobdir}/node{n.index}.sh",
                              node_script(job, cluster_used, n.index, nnodes, nproc).encode(), 0o700)
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


def stage_all(conns: list[Connection], cluster: Cluster, job: Job, bundle: Bundle, dplan: DataPlan,
              progress: Progress | None = None) -> tuple[list[Node], dict]:
    """Per node: the bundle uploaded (where missing) and extracted into the job's folder, then
    the data made ready (remote/node_data.py). Node 0 goes first, the others after it in parallel:
    nodes that share a file system then find node 0's copies. Any failure removes the job's
    folders and raises DeployError (one line per node at fault); nothing was launched.
    Returns the nodes and the bytes sent, {"bundle": ..., "data": ...}."""
    sent = {"bundle": 0, "data": 0}
    staged: list[tuple[Connection, str]] = []
    lock = threading.Lock()

    def stage(i: int) -> Node:
        c = conns[i]
        workdir = c.abspath(cluster.workdir)
        # one folder per node: on a shared file system the nodes must not extract into,
        # or write their pid/exit files into, the same place
        jobdir = f"{workdir}/jobs/{job.id}/node{i}"
        tar, up = upload(c, bundle, f"{workdir}/bundles", (lambda d, t: progress(c.label, d, t)) if progress else None)
        staged.append((c, jobdir))
        extract(c, tar, jobdir)
        n = stage_data(c, dplan, cluster, jobdir, (lambda d, t: progress(f"{c.label} data", d, t)) if progress else None)
        with lock:
            sent["bundle"] += bundle.size if up else 0
            sent["data"] += n
        return Node(i, c.label, jobdir)

    def attempt(i: int):
        try:
            return stage(i)
        except (DataProblem, SSHError, OSError) as exc:
            return exc

    results = [attempt(0)]
    if not isinstance(results[0], Exception) and len(conns) > 1:
        with ThreadPoolExecutor(len(conns) - 1) as ex:
            results += list(ex.map(attempt, range(1, len(conns))))
    errors = [r for r in results if isinstance(r, Exception)]
    if not errors:
        return results, sent
    for c, jobdir in staged:  # nothing of a job that never started stays behind
        try:
            parent = jobdir.rsplit("/", 1)[0]
            c.run(f"rm -rf {quote(jobdir)}; rmdir {quote(parent)} {quote(parent.rsplit('/', 1)[0])} 2>/dev/null",
                  check=False, timeout=60)
        except SSHError:
            pass
    lines = [str(e) if isinstance(e, DataProblem) else f"upload failed: {e}" for e in errors]
    if len(lines) == 1:
        raise DeployError(f"{lines[0]}; nothing was launched") from None
    raise DeployError("nothing was launched:\n" + "\n".join(lines)) from None


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
