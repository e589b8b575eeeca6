"""Deploy through Slurm: preflight on the login node, one upload, `sbatch`, `srun torchrun`.

    deploy(cluster, run_dir) -> Job   (backend "slurm", state pending)
      1. preflight the login node (the profile's first host): reachable, the profile's
         python has torch, sbatch/sinfo/scontrol/scancel on PATH, free disk under
         WORKDIR; then Slurm itself (`scontrol show partition`, `sinfo -N`): the
         partition exists and is up, enough nodes are up, the GPUs asked per node are
         there (gres), the time limit fits the partition's MaxTime
      2. bundle (content hash) uploaded once to WORKDIR/bundles, extracted into
         WORKDIR/jobs/<job id>/ (WORKDIR must be on the file system the nodes share)
      3. `sbatch --parsable job.sbatch`: the batch script finds the first node of the
         allocation and its address (NodeAddr), and `srun` runs node.sh once per node;
         node.sh starts torchrun (c10d rendezvous hosted by node 0 of the allocation)
         and writes its output to node<N>.out. The Slurm job id is recorded.

Preemption: the job is submitted with `--requeue` and, unless the profile's
preempt_grace_s is 0, `--signal=B:USR1@GRACE`. Slurm's warning (GRACE s before a
preemption, with PreemptParameters=send_user_signal, or before the time limit) reaches the
batch script, which passes USR1 to the workers (`scancel --signal=USR1`, the steps only;
node.sh makes torchrun ignore it); the run checkpoints and ends as preempted, and the
batch script requeues the job when that checkpoint is new. Slurm's own SIGTERM at a
preemption or `scontrol requeue` reads as a preemption too (no cancel request:
engine/runtime/loop.py StopSignal). When Slurm starts the requeued job again
(SLURM_RESTART_COUNT > 0), node.sh runs `train --resume` from the run's latest checkpoint;
the run folder keeps one lineage (attempts.jsonl). Meanwhile the job shows as preempted,
then resuming; neither is an end.

Tracking asks `layerflow_jobctl.py slurm` on the login node (one SSH command a round):
Slurm's state and reason (scontrol while Slurm remembers the job, then sacct when
accounting is on, then the batch script's own exit file), and the sizes of the files
the tracker mirrors by byte offset. Cancel is `scancel`, then a wait until Slurm says
the job ended and no step of it is left. Paths go on sbatch's command line or into
the scripts shell-quoted, never into #SBATCH lines, which Slurm parses itself.
"""
from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from engine.runtime import ENTRY
from engine.runtime.records import CANCEL_FILE
from remote.bundle import extract, make_bundle, upload
from remote.cluster import Cluster, config_dir
from remote.node_data import DataProblem, link_line, plan_data, stage_data
from remote.jobctl import TOKEN_VAR
from remote.jobctl import (
    kv_pairs as parse_kv,  # `scontrol show ... -o` lines (one parser, node and host)
)
from remote.jobs import Job, JobDB, Node, new_job_id
from remote.launch.ssh_torchrun import DeployError, Progress, run_spec
from remote.preflight import PreflightReport, probe_host, sections
from remote.ssh import Connection, SSHError, quote

# Slurm job states (scontrol/sacct/squeue) -> Layerflow job states
SLURM_STATES = {
    "PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "resuming", "REQUEUE_HOLD": "resuming",
    "REQUEUE_FED": "resuming", "RESV_DEL_HOLD": "pending", "SPECIAL_EXIT": "failed",
    "RUNNING": "running", "COMPLETING": "running", "SUSPENDED": "running", "STAGE_OUT": "running",
    "RESIZING": "running", "SIGNALING": "running", "STOPPED": "running",
    "COMPLETED": "succeeded", "CANCELLED": "cancelled", "TIMEOUT": "timeout",
    "FAILED": "failed", "OUT_OF_MEMORY": "failed", "DEADLINE": "failed",
    "PREEMPTED": "preempted", "BOOT_FAIL": "failed", "NODE_FAIL": "lost", "REVOKED": "cancelled",
}
TOOLS = ("sbatch", "sinfo", "scontrol", "scancel", "squeue")
# node states (sinfo %T) a job can be started on, now or once they are free
USABLE = {"idle", "mixed", "allocated", "completing", "planned", "reserved"}


def slurm_state(text: str) -> str | None:
    """A Layerflow state from a Slurm state word ("CANCELLED by 1000", "RUNNING", "TIMEOUT")."""
    for line in text.splitlines():
        word = line.strip().split(" ")[0].rstrip("+")
        if word:
            return SLURM_STATES.get(word, "running")
    return None


PREEMPT_SETTLE_S = 300.0  # Slurm requeues a preempted job once its steps have ended; one still PREEMPTED after this is not


def _count(v) -> int:
    try:
        return max(0, int(v))
    except (TypeError, ValueError):
        return 0


def preemption(state: str, info: dict, run: dict, mark: dict | None, ckpt: str | None,
               now: float) -> tuple[str, str | None, dict] | None:
    """The job's (state, note, mark) where a preemption is under way, else None. `state`:
    Slurm's, mapped (SLURM_STATES); `info`: what jobctl said of Slurm (its restart count);
    `run`: the run's status.json; `mark`: {restarts, since} of the preemption seen last
    (the job keeps it). Slurm PREEMPTED, or the run stopped at a preemption while Slurm still
    runs the allocation: preempted. Requeued (REQUEUED, or pending after a restart), or a new
    allocation whose run has not started yet: resuming. A preemption Slurm did not requeue
    (still PREEMPTED after PREEMPT_SETTLE_S, or forgotten; or the batch script ended after
    the warning without requeueing): failed, saying how to go on."""
    restarts, run_state = _count(info.get("restarts")), run.get("state")
    where = f"; latest checkpoint: {ckpt}" if ckpt else ""
    at = f" at step {run['step']}" if isinstance(run.get("step"), int) and run_state == "preempted" else ""
    if state == "pending" and restarts > 0 or state == "resuming":
        reason = info.get("reason")
        queue = f"; waiting in the queue: {reason}" if reason and reason not in ("None", "(null)") else ""
        return "resuming", f"requeued after a preemption{at} (Slurm restart {restarts}): it goes on from its checkpoint{queue}",             mark or {"restarts": restarts - 1, "since": now}
    if state == "running" and run_state == "preempted":
        if mark is not None and restarts > mark["restarts"]:  # the next allocation, before its run has started
            return "resuming", f"Slurm started it again (restart {restarts}): resuming{where}", mark
        state = "preempted"
    if state == "preempted":
        if mark is None or mark["restarts"] != restarts:
            mark = {"restarts": restarts, "since": now}
        gone = info.get("source") != "scontrol"
        if (info.get("state") or "").startswith("PREEMPTED") and (gone or now - mark["since"] > PREEMPT_SETTLE_S):
            return "failed", (f"Slurm preempted the job{at} and did not requeue it (is the partition's PreemptMode "
                              f"REQUEUE?){where}; `fetch` it and `train --resume` the folder to go on"), mark
        return "preempted", f"preempted{at}: checkpointed, Slurm requeues it{where}", mark
    if state == "succeeded" and run_state == "preempted":
        return "failed", (f"the run stopped at Slurm's warning{at} but the job was not requeued (no checkpoint "
                          f"newer than its start, or scontrol requeue refused){where}; `fetch` it and "
                          f"`train --resume` the folder to go on"), mark or {"restarts": restarts, "since": now}
    return None


def parse_time(text: str | None) -> int | None:
    """Slurm's time format ("minutes", "minutes:seconds", "hours:minutes:seconds",
    "days-hours[:minutes[:seconds]]") -> seconds; "UNLIMITED"/"INFINITE"/empty -> None."""
    if not text or text.strip().upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A"):
        return None
    t = text.strip()
    days = 0
    if "-" in t:
        d, _, t = t.partition("-")
        days = int(d)
        parts = [int(x) for x in t.split(":")]
        parts += [0] * (3 - len(parts))  # days-hours, days-hours:minutes
        h, m, s = parts
    else:
        parts = [int(x) for x in t.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        else:
            h, m, s = parts
    return ((days * 24 + h) * 60 + m) * 60 + s


def parse_gpus(gres: str) -> int:
    """GPUs per node from a sinfo %G gres string: "gpu:4", "gpu:a100:8(S:0-1)",
    "gpu:a100:2,gpu:v100:2", "(null)" -> 0."""
    total = 0
    for item in re.split(r",(?![^(]*\))", gres or ""):
        item = re.sub(r"\(.*?\)", "", item).strip()
        parts = item.split(":")
        if parts and parts[0] == "gpu":
            try:
                total += int(parts[-1]) if len(parts) > 1 else 1
            except ValueError:
                total += 1  # "gpu:a100" without a count: one
    return total


@dataclass
class SlurmCheck:
    """What the login node said about the partition (shown with the preflight table)."""
    partition: str | None = None
    state: str | None = None
    max_time: str | None = None
    nodes: dict[str, str] = field(default_factory=dict)  # node name -> state
    gpus_per_node: int = 0
    cpus_per_node: int = 0
    errors: list[str] = field(default_factory=list)

    def line(self) -> str:
        up = [n for n, s in self.nodes.items() if s.rstrip("*~#!%$@^-") in USABLE and not s.endswith("*")]
        return (f"slurm partition {self.partition or '?'} ({self.state or '?'}): {len(up)} of {len(self.nodes)} "
                f"node(s) up, {self.gpus_per_node} GPU(s) and {self.cpus_per_node} CPU(s) per node, "
                f"MaxTime {self.max_time or '?'}")


SLURM_PROBE = r"""
echo "@@tools"; for t in {tools}; do command -v "$t" >/dev/null 2>&1 || echo "missing $t"; done
echo "@@partition"; scontrol show partition {part} -o 2>&1
echo "@@nodes"; sinfo -h -N {parg} -o '%N|%T|%G|%c' 2>&1
"""


def check_slurm(conn: Connection, cluster: Cluster, nnodes: int, timeout: float) -> SlurmCheck:
    """The partition, its nodes and their GPUs against what the job asks; never raises for
    a Slurm problem (the errors go in the result, each naming the profile's setting)."""
    chk = SlurmCheck(partition=cluster.partition)
    part = quote(cluster.partition) if cluster.partition else ""
    res = conn.run(SLURM_PROBE.format(tools=" ".join(TOOLS), part=part,
                                      parg=f"-p {part}" if part else ""), timeout=timeout, check=False)
    parts = sections(res.stdout)
    missing = [ln.split()[1] for ln in parts.get("tools", []) if ln.startswith("missing ")]
    if missing:
        chk.errors.append(f"{conn.label}: {', '.join(missing)} not found on the login node's PATH: is it a Slurm "
                          f"login node? (the profile's backend is slurm)")
        return chk
    found = [parse_kv(ln) for ln in parts.get("partition", []) if "PartitionName=" in ln]
    if cluster.partition:
        if not found:
            every = conn.run("scontrol show partition -o", timeout=timeout, check=False).stdout
            names = [parse_kv(ln).get("PartitionName") for ln in every.splitlines() if "PartitionName=" in ln]
            chk.errors.append(f"partition {cluster.partition!r} does not exist on cluster {cluster.name!r} "
                              f"(partitions: {', '.join(n for n in names if n) or 'none'}); fix the profile's "
                              f"partition")
            return chk
        p = found[0]
    else:
        default = [p for p in found if p.get("Default") == "YES"]
        if not default:
            chk.errors.append(f"cluster {cluster.name!r} has no default partition; set the profile's partition "
                              f"(partitions: {', '.join(p.get('PartitionName', '?') for p in found) or 'none'})")
            return chk
        p = default[0]
    chk.partition, chk.state, chk.max_time = p.get("PartitionName"), p.get("State"), p.get("MaxTime")
    if chk.state != "UP":
        chk.errors.append(f"partition {chk.partition!r} is {chk.state}: Slurm starts no job there now")
    lines = parts.get("nodes", [])
    if cluster.partition is None:  # sinfo without -p listed every partition's nodes: ask for the default's
        lines = conn.run(f"sinfo -h -N -p {quote(chk.partition)} -o '%N|%T|%G|%c'", timeout=timeout,
                         check=False).stdout.splitlines()
    for ln in lines:
        cols = ln.split("|")
        if len(cols) != 4:
            continue
        chk.nodes[cols[0]] = cols[1]
        chk.gpus_per_node = max(chk.gpus_per_node, parse_gpus(cols[2]))
        try:
            chk.cpus_per_node = max(chk.cpus_per_node, int(cols[3]))
        except ValueError:
            pass
    up = [n for n, s in chk.nodes.items() if s.rstrip("*~#!%$@^-") in USABLE and not s.endswith("*")]
    if len(up) < nnodes:
        down = [f"{n} {s}" for n, s in chk.nodes.items() if n not in up]
        chk.errors.append(f"the plan needs {nnodes} node(s) but partition {chk.partition!r} has {len(up)} up"
                          + (f" ({', '.join(down)})" if down else "")
                          + "; change placement (pp x dp x tp), nproc_per_node or the partition")
    want = cluster.gpus_per_node or 0
    if want > chk.gpus_per_node:
        have = (f"at most {chk.gpus_per_node} GPU(s) per node" if chk.gpus_per_node
                else "no GPUs (no gres gpu)")
        chk.errors.append(f"gpus_per_node {want} is more than a node of partition {chk.partition!r} has: "
                          f"{have}; lower gpus_per_node or pick a GPU partition")
    limit, most = parse_time(cluster.time_limit), parse_time(chk.max_time)
    if limit is not None and most is not None and limit > most:
        chk.errors.append(f"time_limit {cluster.time_limit} is longer than partition {chk.partition!r} allows "
                          f"(MaxTime {chk.max_time}); lower time_limit")
    return chk


def _safe(text: str, allowed: str) -> str:
    return re.sub(f"[^{allowed}]", "", text)


def warning_s(cluster: Cluster) -> int | None:
    """The seconds of Slurm's warning signal (sbatch --signal=B:USR1@N), or None: the
    profile's preempt_grace_s is 0, or the time limit leaves no room for it (a warning
    due before half the time has gone would stop every allocation near its start)."""
    grace = cluster.preempt_grace_s
    if not grace:
        return None
    limit = parse_time(cluster.time_limit)
    if limit is not None and limit < 2 * grace:
        return None
    return grace


def sbatch_script(job: Job, cluster: Cluster, nnodes: int, nproc: int) -> str:
    """The batch script: it runs on the first node of the allocation and starts node.sh
    on every node with srun; at Slurm's warning it passes USR1 to the workers, and once
    they have checkpointed and stopped (the run says preempted) it requeues the job. In a
    requeued job (SLURM_RESTART_COUNT > 0) node.sh resumes from the latest checkpoint."""
    safe_name = re.sub(r"[^A-Za-z0-9_.-]", "_", job.name)[:64] or "layerflow"
    directives = [f"--job-name={safe_name}", f"--nodes={nnodes}", "--ntasks-per-node=1",
                  "--output=slurm-%j.out", "--open-mode=append", "--requeue"]
    warn = warning_s(cluster)
    if warn:
        directives.append(f"--signal=B:USR1@{warn}")
    if cluster.gpus_per_node:
        directives.append(f"--gpus-per-node={cluster.gpus_per_node}")
    if cluster.partition:
        directives.append(f"--partition={_safe(cluster.partition, 'A-Za-z0-9_,.-')}")
    if cluster.time_limit:
        directives.append(f"--time={_safe(cluster.time_limit, '0-9:-')}")
    lines = ["#!/bin/bash", *[f"#SBATCH {d}" for d in directives],
             f"# Layerflow job {job.id}: node.sh on every node (srun), torchrun's rendezvous on the first.",
             "set -u",
             # this allocation's: a cancel request and an exit file of the one before are not
             f"rm -f run/{CANCEL_FILE} batch.exit",
             'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
             # how the other nodes reach the first: its NodeAddr (the node name where none is set)
             'addr=$(scontrol show node "$head" -o | tr " " "\\n" | sed -n "s/^NodeAddr=//p" | head -n 1)',
             'export LAYERFLOW_RDZV_ADDR="${addr:-$head}"',
             "echo \"layerflow: $SLURM_JOB_ID on $SLURM_JOB_NODELIST, rendezvous on $LAYERFLOW_RDZV_ADDR\"",
             'start_ckpt=$(cat run/checkpoints/latest 2>/dev/null)',
             'export LAYERFLOW_RESUME=""',
             'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && [ -n "$start_ckpt" ]; then',
             '  LAYERFLOW_RESUME=--resume',
             '  echo "layerflow: requeued (restart $SLURM_RESTART_COUNT): resuming from $start_ckpt"',
             'fi',
             # Slurm's warning (--signal=B:USR1): to the workers, not to this shell's steps' launchers
             "warned=0",
             "trap 'warned=1; echo \"layerflow: Slurm warns of a preemption or the time limit: "
             "the run checkpoints and stops\"; scancel --signal=USR1 \"$SLURM_JOB_ID\"' USR1",
             "srun --kill-on-bad-exit=1 --nodes=\"$SLURM_NNODES\" --ntasks-per-node=1 --output=node%n.out "
             "--open-mode=append bash node.sh &",
             "step=$!",
             # a trapped signal ends `wait` early: wait again until srun has ended, then take its code
             'while kill -0 "$step" 2>/dev/null; do wait "$step"; done',
             'wait "$step"',
             "rc=$?",
             'if [ "$warned" = 1 ] && grep -q \'"state": "preempted"\' run/status.json 2>/dev/null '
             '&& [ "$(cat run/checkpoints/latest 2>/dev/null)" != "$start_ckpt" ]; then',
             '  echo "layerflow: checkpointed at $(cat run/checkpoints/latest); requeued to go on"',
             '  scontrol requeue "$SLURM_JOB_ID" && exit 0',
             'fi',
             "echo $rc > batch.exit.tmp && mv batch.exit.tmp batch.exit",
             "exit $rc", ""]
    return "\n".join(lines)


def node_script(job: Job, cluster: Cluster, nnodes: int, nproc: int) -> str:
    """What srun runs once on each node: torchrun over this node's processes (with
    --resume in a requeued job: the batch script sets LAYERFLOW_RESUME). USR1 is ignored
    from here on (torchrun would die of it); the workers set their own handler."""
    env = {TOKEN_VAR: job.token, "PYTHONUNBUFFERED": "1", **cluster.env}
    exports = "\n".join(f"export {k}={quote(v)}" for k, v in env.items())
    py = quote(cluster.python)
    resume = '${LAYERFLOW_RESUME:-}'
    if nnodes == 1 and nproc == 1 and not cluster.max_restarts:
        run = f"exec {py} -m {ENTRY} run {resume}"  # one process: no agent
    elif nnodes == 1:
        run = (f"exec {py} -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node={nproc} "
               f"--max-restarts={cluster.max_restarts or 0} -m {ENTRY} run {resume}")
    else:
        run = (f"exec {py} -m torch.distributed.run --nnodes=\"$SLURM_NNODES\" --nproc-per-node={nproc} "
               f"--rdzv-backend=c10d --rdzv-endpoint=\"$LAYERFLOW_RDZV_ADDR:{cluster.rdzv_port}\" "
               f"--rdzv-id=\"$SLURM_JOB_ID\" --rdzv-conf=is_host=\"$is_host\" --local-addr=\"$me\" "
               f"--max-restarts={cluster.max_restarts or 0} -m {ENTRY} run {resume}")
    return f"""#!/bin/bash
trap '' USR1
# Layerflow job {job.id}: one of {nnodes} node(s), started by srun in the job folder.
set -u
me=$(scontrol show node "$SLURMD_NODENAME" -o 2>/dev/null | tr " " "\\n" | sed -n "s/^NodeAddr=//p" | head -n 1)
me=${{me:-$SLURMD_NODENAME}}
if [ "$SLURM_NODEID" = 0 ]; then is_host=1; else is_host=0; fi
export LAYERFLOW_NODE="$SLURM_NODEID"  # ranks in node order (engine/runtime/distributed/mesh.py)
export LAYERFLOW_RDZV_ENDPOINT="$LAYERFLOW_RDZV_ADDR:{cluster.rdzv_port}" CUDA_DEVICE_ORDER="${{CUDA_DEVICE_ORDER:-PCI_BUS_ID}}"
echo "layerflow job {job.id}: node $SLURM_NODEID of $SLURM_NNODES ($SLURMD_NODENAME, $me)"
{link_line(job)}{exports}
{run}
"""


def layout(cluster: Cluster, world: int) -> tuple[int, int]:
    """(nodes, processes per node): nproc_per_node, else one per GPU asked, else one."""
    nproc = cluster.nproc_per_node or (cluster.gpus_per_node or 1)
    nnodes = max(1, world // nproc)
    if nnodes * nproc != world:
        raise DeployError(f"the plan needs {world} processes, not a whole number of nodes of {nproc} "
                          f"(nproc_per_node/gpus_per_node); change placement (pp x dp x tp) or the profile")
    return nnodes, nproc


def preflight_login(conn: Connection, cluster: Cluster, nnodes: int) -> tuple[PreflightReport, SlurmCheck | None]:
    timeout = max(cluster.command_timeout, 60.0)
    rep = probe_host(conn, cluster, timeout)  # python and torch, disk under WORKDIR
    report = PreflightReport([rep])
    if not rep.ok:
        return report, None
    chk = check_slurm(conn, cluster, nnodes, timeout)
    report.notes.append(chk.line() if chk.partition else "slurm: not checked")
    return report, chk


def deploy(cluster: Cluster, run_dir: str | Path, *, name: str | None = None, accept: Iterable[str] = (),
           db: JobDB | None = None, progress: Progress | None = None,
           on_preflight: Callable[[PreflightReport], None] | None = None, remote_data: str | None = None) -> Job:
    """Preflight, upload and sbatch; returns the job (state pending, Slurm id in extra).
    The data set (remote_data, the profile's data_paths, or the cluster's cache: remote/node_data.py)
    is checked or uploaded on the login node, whose file system the compute nodes share."""
    run_dir = Path(run_dir)
    db = db or JobDB()
    spec = run_spec(run_dir)
    world = spec.world
    nnodes, nproc = layout(cluster, world)
    with Connection.to(cluster, cluster.hosts[0], list(accept)) as c:
        report, chk = preflight_login(c, cluster, nnodes)
        if on_preflight:
            on_preflight(report)
        if not report.ok:
            raise DeployError("preflight failed, nothing was submitted:\n" + "\n".join(report.failures), report)
        if chk.errors:
            raise DeployError("the job does not fit the Slurm cluster, nothing was submitted:\n"
                              + "\n".join(chk.errors), report)
        try:
            dplan = plan_data(spec, run_dir, cluster, remote_data)
        except DataProblem as exc:
            raise DeployError(f"{exc}; nothing was submitted") from None
        bundle = make_bundle(run_dir, config_dir() / "bundles", exclude=["data.npz"], replace=dplan.replace(run_dir))
        job = Job(id=new_job_id(name or run_dir.name), name=name or run_dir.name, backend="slurm",
                  cluster=cluster.model_dump(mode="json"), created=time.time(), token=secrets.token_hex(12),
                  total_steps=spec.total_steps)
        job.extra = {"world_size": world, "nproc_per_node": nproc, "nnodes": nnodes, "bundle": bundle.sha256,
                     "partition": chk.partition, "remote_data": remote_data if dplan.mode == "link" else None,
                     "gpus": nnodes * (cluster.gpus_per_node or 0)}
        if dplan.mode == "cache" and dplan.npz:
            job.extra["data_link"] = dplan.path
        workdir = c.abspath(cluster.workdir)
        jobdir = f"{workdir}/jobs/{job.id}"
        job.nodes = [Node(0, c.label, jobdir)]
        # The compute nodes read the job folder and the data where the login node put them
        # (a shared file system): the data is checked or uploaded there, before sbatch.
        try:
            tar, up = upload(c, bundle, f"{workdir}/bundles",
                             (lambda d, t: progress(c.label, d, t)) if progress else None)
            extract(c, tar, jobdir)
            sent = stage_data(c, dplan, cluster, jobdir,
                              (lambda d, t: progress(f"{c.label} data", d, t)) if progress else None)
        except (DataProblem, SSHError, OSError) as exc:
            try:
                c.run(f"rm -rf {quote(jobdir)}", check=False, timeout=60)
            except SSHError:
                pass
            why = str(exc) if isinstance(exc, DataProblem) else f"upload failed: {exc}"
            raise DeployError(f"{why}; nothing was submitted") from None
        job.extra["sent"] = {"bundle": bundle.size if up else 0, "data": sent}
        job.extra["data"] = dplan.record()
        db.add_with_mirror(job, run_dir)
        try:
            c.write_bytes(f"{jobdir}/token", job.token.encode(), 0o600)
            c.write_bytes(f"{jobdir}/job.sbatch", sbatch_script(job, cluster, nnodes, nproc).encode(), 0o700)
            c.write_bytes(f"{jobdir}/node.sh", node_script(job, cluster, nnodes, nproc).encode(), 0o700)
        except (SSHError, OSError) as exc:
            job.state, job.error = "failed", f"upload failed, nothing was submitted: {exc}"
            db.save(job)
            raise DeployError(job.error) from None
        res = c.run(f"cd {quote(jobdir)} && sbatch --parsable --chdir={quote(jobdir)} job.sbatch", check=False)
        slurm_id = res.stdout.strip().split(";")[0].strip()
        if res.exit_status != 0 or not slurm_id.isdigit():
            job.state = "failed"
            job.error = f"sbatch refused the job: {sbatch_reason(res.stderr or res.stdout, cluster)}"
            db.save(job)
            raise DeployError(job.error, report)
        job.extra["slurm_id"] = slurm_id
        db.save(job)
        return job


def sbatch_reason(text: str, cluster: Cluster) -> str:
    """sbatch's own words, with the profile setting they most likely concern."""
    msg = " ".join(ln.strip() for ln in text.strip().splitlines() if ln.strip())[-400:] or "no message"
    low = msg.lower()
    hint = ("time_limit" if "time limit" in low else "partition" if "partition" in low
            else "gpus_per_node" if "gres" in low or "gpu" in low
            else "nproc_per_node / placement" if "node count" in low or "node configuration" in low else None)
    return msg + (f" (check the profile's {hint})" if hint else "")


def describe(info: dict | None) -> str:
    """A Slurm state with its reason, for a status line: "PENDING (Resources)"."""
    if not info:
        return "unknown"
    state, reason = info.get("state") or "?", info.get("reason")
    return f"{state} ({reason})" if reason and reason not in ("None", "(null)") else state


def state_text(job: Job) -> str:
    """A job's state as the jobs list and panel show it: with the Slurm id and, while it
    waits in the queue, Slurm's reason ("pending (Resources), Slurm 12")."""
    sid = job.extra.get("slurm_id")
    if job.backend != "slurm" or not sid:
        return job.state
    reason = (job.extra.get("slurm") or {}).get("reason")
    why = f" ({reason})" if job.state in ("pending", "resuming") and reason and reason not in ("None", "(null)") else ""
    return f"{job.state}{why}, Slurm {sid}"


__all__ = ["state_text", "deploy", "preemption", "warning_s", "sbatch_script", "node_script", "slurm_state", "parse_time", "parse_gpus", "parse_kv",
           "check_slurm", "layout", "describe"]
