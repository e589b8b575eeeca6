"""cluster add|list|check|remove|import-ssh-config, deploy, jobs, status, logs, cancel, fetch.

The GUI calls the same functions (remote.*); this file only parses flags and prints.
An unknown host key stops with its fingerprint; run again with
`--accept-host-key SHA256:...` once you have checked it (ssh-keygen -lf on the host).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

from app.cli.cli_errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="SSH cluster profiles: add, list, check, remove, import-ssh-config")
    csub = p.add_subparsers(dest="cluster_cmd", metavar="ACTION", required=True)

    a = csub.add_parser("add", help="add (or replace) a cluster profile")
    a.add_argument("name")
    a.add_argument("--host", action="append", required=True, metavar="[USER@]ADDR[:PORT]",
                   help="a node; repeat for each, the first runs the rendezvous")
    a.add_argument("--identity", help="private key file (default: the ssh-agent and default keys)")
    a.add_argument("--jump", metavar="[USER@]ADDR[:PORT]", help="reach every node through this host (ProxyJump)")
    _profile_flags(a)
    a.set_defaults(func=cmd_cluster_add)

    a = csub.add_parser("import-ssh-config", help="make a profile from Host entries of ~/.ssh/config")
    a.add_argument("name")
    a.add_argument("aliases", nargs="+", metavar="HOST", help="Host aliases, first = rendezvous node")
    a.add_argument("--config", help="ssh config file (default ~/.ssh/config)")
    _profile_flags(a)
    a.set_defaults(func=cmd_cluster_import)

    a = csub.add_parser("list", help="list cluster profiles")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_cluster_list)

    a = csub.add_parser("check", help="preflight every node: reachable, python/torch, GPUs, disk, rendezvous")
    a.add_argument("name")
    a.add_argument("--accept-host-key", action="append", default=[], metavar="FINGERPRINT")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_cluster_check)

    a = csub.add_parser("remove", help="delete a cluster profile")
    a.add_argument("name")
    a.set_defaults(func=cmd_cluster_remove)

    p = sub.add_parser("deploy", help="run a project on a cluster; prints the job id")
    p.add_argument("project")
    p.add_argument("--cluster", required=True)
    p.add_argument("--steps", type=int)
    p.add_argument("--name", help="job name (default: the run folder's name)")
    p.add_argument("--out", help="local run folder to prepare (default: <project>/runs/<name>-<time>)")
    p.add_argument("--accept-host-key", action="append", default=[], metavar="FINGERPRINT")
    p.add_argument("--remote-data", metavar="PATH", help="the data set is already at PATH on every node (a folder, "
                   "a file): read it there, checked against the local copy's fingerprint, instead of uploading it")
    p.add_argument("--min-nodes", type=int, metavar="N", help="this job goes on with at least N of its nodes when "
                   "others are lost (default: the profile's, else the fewest its plan runs on)")
    p.add_argument("--max-nodes", type=int, metavar="N", help="nodes this job takes back when they return, at most "
                   "(default: the profile's, else those it was deployed on)")
    p.add_argument("--max-restarts", type=int, metavar="N", help="restarts after a rank or node fails (default: the "
                   "profile's, else the run's training.restarts)")
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser("jobs", help="list remote jobs (refreshes the ones still running); --all: everyone's")
    p.add_argument("--no-refresh", action="store_true", help="show the database only; contact no host")
    p.add_argument("--cluster", metavar="NAME", help="only this cluster's jobs")
    p.add_argument("--all", action="store_true", help="with --cluster: every user's jobs, read from the cluster's "
                   "shared job board (its shared_dir); teammates' jobs can then be followed with status/logs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("status", help="state, step and error of a job")
    p.add_argument("job")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("logs", help="a job's logs (rank 0's by default)")
    p.add_argument("job")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument("--log", default="rank0.log", help="which log: rank<N>.log or node<N>.out (default rank0.log)")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("cancel", help="stop a job on every node and check nothing is left")
    p.add_argument("job")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("fetch", help="download checkpoints, final model, metrics and logs")
    p.add_argument("job")
    p.add_argument("-o", "--out", help="folder (default ./<job id>)")
    p.set_defaults(func=cmd_fetch)


def _profile_flags(a: argparse.ArgumentParser) -> None:
    a.add_argument("--workdir", default="~/layerflow", help="remote folder for bundles and jobs")
    a.add_argument("--python", default="python3", help="interpreter with torch on every node")
    a.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    a.add_argument("--backend", choices=["ssh", "slurm"], default="ssh")
    a.add_argument("--nproc-per-node", type=int)
    a.add_argument("--rdzv-port", type=int, default=29400)
    a.add_argument("--max-restarts", type=int, help="restarts after a rank or node fails (default: the run's "
                   "training.restarts)")
    a.add_argument("--min-nodes", type=int, metavar="N", help="a job goes on with at least N of its nodes when "
                   "others are lost (default: the fewest its plan runs on; the node count: never shrink)")
    a.add_argument("--max-nodes", type=int, metavar="N", help="nodes a shrunk job takes back, at most "
                   "(default: those it was deployed on)")
    a.add_argument("--known-hosts", help="known_hosts file (default: Layerflow's own + ~/.ssh/known_hosts)")
    a.add_argument("--data-path", action="append", default=[], metavar="HERE=THERE",
                   help="data sets under the folder HERE are already at THERE on every node: runs read them there "
                        "(checked by fingerprint) instead of uploading them; repeat for several folders")
    a.add_argument("--shared-dir", metavar="PATH", help="a folder on the cluster every user can write (group "
                   "permissions): jobs register there, and `jobs --cluster NAME --all` lists everyone's")
    s = a.add_argument_group("Slurm (--backend slurm: the first --host is the login node)")
    s.add_argument("--partition", help="partition to submit to (default: the cluster's default partition)")
    s.add_argument("--time-limit", metavar="TIME", help="sbatch --time, e.g. 02:00:00 (default: the partition's)")
    s.add_argument("--gpus-per-node", type=int, metavar="N", help="GPUs asked per node (sbatch --gpus-per-node)")
    s.add_argument("--preempt-grace", type=int, metavar="SECONDS", dest="preempt_grace_s",
                   help="warning before a preemption or the time limit (sbatch --signal=B:USR1@SECONDS): the run "
                        "checkpoints and stops within it, and the job is requeued to go on; 0: none (default 60)")


def _profile(args, hosts: list[dict]):
    from remote.cluster import parse_cluster

    env = {}
    for kv in args.env:
        k, sep, v = kv.partition("=")
        if not sep:
            raise CliError(f"--env {kv!r}: expected KEY=VALUE")
        env[k] = v
    data_paths = {}
    for kv in getattr(args, "data_path", []):
        here, sep, there = kv.partition("=")
        if not sep or not here or not there:
            raise CliError(f"--data-path {kv!r}: expected FOLDER_HERE=FOLDER_THERE, e.g. /data/imagenet=/scratch/imagenet")
        data_paths[os.path.abspath(os.path.expanduser(here))] = there
    data = {"data_paths": data_paths, "name": args.name, "hosts": hosts, "workdir": args.workdir, "python": args.python, "env": env,
            "backend": args.backend, "nproc_per_node": args.nproc_per_node, "rdzv_port": args.rdzv_port,
            "max_restarts": args.max_restarts, "min_nodes": args.min_nodes, "max_nodes": args.max_nodes,
            "known_hosts": args.known_hosts, "shared_dir": args.shared_dir,
            "partition": args.partition, "time_limit": args.time_limit, "gpus_per_node": args.gpus_per_node,
            "preempt_grace_s": getattr(args, "preempt_grace_s", None)}
    return parse_cluster({k: v for k, v in data.items() if v is not None}, f"cluster {args.name!r}")


def _errors():
    """Remote errors become one-line CLI errors."""
    from remote.cluster import ClusterError
    from remote.jobs import JobError
    from remote.launch.ssh_torchrun import DeployError
    from remote.ssh import SSHError
    from remote.tracker import CancelError
    return ClusterError, JobError, DeployError, SSHError, CancelError


def _guard(fn):
    def wrapped(args):
        try:
            return fn(args)
        except _errors() as exc:
            raise CliError(str(exc)) from None
    return wrapped


@_guard
def cmd_cluster_add(args) -> int:
    from remote.cluster import ClusterStore, parse_host

    jump = parse_host(args.jump).model_dump() if args.jump else None
    hosts = []
    for spec in args.host:
        h = parse_host(spec, identity_file=args.identity).model_dump(exclude_none=True)
        if jump:
            h["jump"] = jump
        hosts.append(h)
    c = _profile(args, hosts)
    ClusterStore().save(c)
    what = (f"Slurm login node {c.hosts[0].label}" if c.backend == "slurm" else f"{len(c.hosts)} node(s)")
    print(f"cluster {c.name}: {what} saved; check them with `cluster check {c.name}`")
    return 0


@_guard
def cmd_cluster_import(args) -> int:
    from remote.cluster import ClusterError, ClusterStore, hosts_from_ssh_config

    found = hosts_from_ssh_config(args.config, args.aliases)
    missing = [a for a in args.aliases if a not in found]
    if missing:
        raise ClusterError(f"no Host {', '.join(missing)} in the ssh config")
    c = _profile(args, [found[a].model_dump(exclude_none=True) for a in args.aliases])
    ClusterStore().save(c)
    print(f"cluster {c.name}: imported {', '.join(h.label for h in c.hosts)}")
    return 0


@_guard
def cmd_cluster_list(args) -> int:
    from remote.cluster import ClusterStore

    clusters = ClusterStore().all()
    if args.json:
        print(json.dumps([c.model_dump(mode="json") for c in clusters], indent=1))
        return 0
    if not clusters:
        print("no clusters; add one with `cluster add NAME --host user@addr`")
    for c in clusters:
        print(f"{c.name:<20} {c.backend:<5} {', '.join(h.label for h in c.hosts)}  workdir={c.workdir}")
    return 0


@_guard
def cmd_cluster_check(args) -> int:
    from remote.cluster import ClusterStore
    from remote.launch import check as preflight

    rep = preflight(ClusterStore().get(args.name), accept=args.accept_host_key)
    print(json.dumps(rep.to_dict(), indent=1) if args.json else rep.table())
    if not rep.ok:
        for f in rep.failures:
            print(f"error: {f}", file=sys.stderr)
        return 1
    return 0


@_guard
def cmd_cluster_remove(args) -> int:
    from remote.cluster import ClusterStore

    ClusterStore().remove(args.name)
    print(f"cluster {args.name} removed")
    return 0


class _Bar:
    """A one-line upload progress per host on stderr."""

    def __init__(self):
        self.last = 0.0
        self.lock = threading.Lock()

    def __call__(self, host: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < 0.2:
            return
        with self.lock:
            self.last = now
            pct = 100.0 * done / max(total, 1)
            print(f"\rupload {host}: {done / 1e6:8.1f} / {total / 1e6:.1f} MB ({pct:5.1f}%)", end="",
                  file=sys.stderr, flush=True)
            if done >= total:
                print(file=sys.stderr)


@_guard
def cmd_deploy(args) -> int:
    from layerflow import Project

    def show(rep):
        print(rep.table(), file=sys.stderr)

    job = Project.load(args.project).deploy(
        args.cluster, steps=args.steps, name=args.name, out=args.out, accept_host_key=args.accept_host_key,
        remote_data=args.remote_data, progress=_Bar(), on_preflight=show,
        min_nodes=args.min_nodes, max_nodes=args.max_nodes, max_restarts=args.max_restarts,
        on_prepared=lambda run_dir: print(f"run folder: {run_dir}", file=sys.stderr))
    print(job.id)
    from remote.node_data import sent_line
    from remote.jobs import JobDB

    print(sent_line(JobDB().get(job.id)), file=sys.stderr)
    return 0


def _tracker(job_id: str, **kw):
    from remote.tracker import Tracker

    return Tracker(job_id, **kw)


def _steps(job) -> str:
    return f"{job.step or 0}/{job.total_steps or '?'}"


@_guard
def cmd_jobs(args) -> int:
    from remote.jobs import JobDB
    from remote.launch.slurm import state_text

    if args.all:
        if not args.cluster:
            raise CliError("--all needs --cluster NAME: the board is the cluster's own")
        return _board(args)
    db = JobDB()
    if not args.no_refresh:
        for job in db.active():  # reattach: one poll refreshes state and mirrors new output
            with _tracker(job.id, db=db) as tr:
                tr.poll()
    jobs = [j for j in db.list() if not args.cluster or j.cluster.get("name") == args.cluster]
    if args.json:
        print(json.dumps([json.loads(j.to_json()) for j in jobs], indent=1))
        return 0
    if not jobs:
        print("no jobs yet; start one with `deploy PROJECT --cluster NAME`")
    for j in jobs:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(j.created))
        print(f"{j.id:<44} {state_text(j):<10} {_steps(j):>12}  {j.cluster.get('name', '?'):<16} {when}")
    return 0


def _board(args) -> int:
    """Everyone's jobs on the cluster, from its shared job board (remote/board.py)."""
    from layerflow import cluster_jobs
    from remote.cluster import ClusterStore
    from remote.jobs import JobDB

    cluster = ClusterStore().get(args.cluster)
    records = cluster_jobs(cluster.name)
    mine = {j.id for j in JobDB().list() if not j.extra.get("teammate")}
    if args.json:
        print(json.dumps(records, indent=1))
        return 0
    if not records:
        print(f"no jobs on {cluster.name}'s board ({cluster.shared_dir}/jobs)")
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.get("created") or 0))
        devices = f"{r.get('world_size') or '?'} proc" + (f", {r['gpus']} GPU" if r.get("gpus") else "")
        steps = f"{r.get('step') or 0}/{r.get('total_steps') or '?'}"
        you = " (you)" if r["id"] in mine else ""
        print(f"{r['id']:<44} {str(r.get('owner')) + you:<16} {r.get('state', '?'):<10} {steps:>12}  "
              f"{devices:<16} {', '.join(r.get('hosts') or [])}  {when}")
    return 0


@_guard
def cmd_status(args) -> int:
    with _tracker(args.job) as tr:
        job = tr.poll() if not tr.job.done else tr.job
        unreachable = [f"{job.nodes[i].host}: {v.error}" for i, v in tr.nodes.items() if not v.reachable]
    if args.json:
        print(job.to_json())
        return 0
    print(f"{job.id}: {job.state}, step {_steps(job)}")
    print(f"  name: {job.name}\n  cluster: {job.cluster.get('name')}")
    if job.extra.get("owner"):
        print(f"  owner: {job.extra['owner']}" + (" (a teammate's job: read only)" if job.extra.get("teammate") else ""))
    if job.backend == "slurm":
        from remote.launch.slurm import describe

        sl = job.extra.get("slurm") or {}
        print(f"  slurm: job {job.extra.get('slurm_id')} {describe(sl)}" + (f" on {sl['nodes']}" if sl.get("nodes") and
              sl.get("nodes") != "(null)" else "") + f", partition {job.extra.get('partition')}")
        print(f"  login node: {job.nodes[0].host}:{job.nodes[0].jobdir}")
    for n in job.nodes if job.backend != "slurm" else []:
        print(f"  node {n.index}: {n.host}:{n.jobdir}")
    if job.error:
        print(f"  error: {job.error}")
    for u in unreachable if not job.done else []:
        print(f"  unreachable: {u}")
    return 0


@_guard
def cmd_logs(args) -> int:
    from remote.jobs import JobDB

    db = JobDB()
    path = db.mirror_dir(db.get(args.job).id) / "logs" / Path(args.log).name
    printed = 0

    def show() -> None:
        nonlocal printed
        if path.exists():
            with open(path, "rb") as f:
                f.seek(printed)
                data = f.read()
            printed += len(data)
            sys.stdout.write(data.decode("utf-8", "replace"))
            sys.stdout.flush()

    with _tracker(args.job, db=db) as tr:
        job = tr.poll() if not tr.job.done else tr.job
        show()
        while args.follow and not job.done and job.state != "lost":
            time.sleep(1.0)
            job = tr.poll()
            show()
    if args.follow and job.state == "lost":
        print(f"job {job.id} is lost: {job.error}", file=sys.stderr)
        return 1
    if not path.exists():
        print(f"(no {path.name} yet; logs: {', '.join(p.name for p in path.parent.glob('*')) or 'none'})",
              file=sys.stderr)
    return 0


@_guard
def cmd_cancel(args) -> int:
    from layerflow import Job

    with Job(args.job) as job:
        st = job.cancel()
        print(f"{job.id}: {st.state}; no process of it is left on {len(job.record.nodes)} node(s)")
    return 0


@_guard
def cmd_fetch(args) -> int:
    from layerflow import Job

    with Job(args.job) as job:
        out = job.fetch(args.out)
    print(f"{sum(1 for p in out.rglob('*') if p.is_file())} file(s) into {out}")
    return 0
