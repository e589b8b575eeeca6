"""Slurm backend: an sbatch script that runs `srun torchrun` on every allocated node.

The first host of the profile is the login node: the bundle is uploaded and
extracted there (WORKDIR must be on the cluster's shared file system), then
`sbatch --parsable --chdir JOBDIR job.sbatch` submits it. The rendezvous runs on
the first node of the allocation (from SLURM_JOB_NODELIST). Paths go on sbatch's
command line, shell-quoted, never into #SBATCH lines, which Slurm parses itself.

No Slurm runs here, so the tests check the generated text and the state mapping.
"""
from __future__ import annotations

import re
import secrets
import time
from pathlib import Path
from typing import Iterable

from remote.bundle import extract, make_bundle, upload
from remote.cluster import Cluster, config_dir
from remote.jobctl import TOKEN_VAR
from remote.jobs import Job, JobDB, Node, new_job_id
from remote.launch_ssh import DeployError, layout, world_size
from remote.ssh import Connection, quote

# sacct/squeue states -> Layerflow job states
SLURM_STATES = {
    "PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "pending", "RESIZING": "running",
    "RUNNING": "running", "COMPLETING": "running", "SUSPENDED": "running", "STAGE_OUT": "running",
    "COMPLETED": "succeeded", "CANCELLED": "cancelled",
    "FAILED": "failed", "TIMEOUT": "failed", "OUT_OF_MEMORY": "failed", "DEADLINE": "failed",
    "PREEMPTED": "failed", "BOOT_FAIL": "failed", "NODE_FAIL": "lost",
}


def slurm_state(text: str) -> str | None:
    """Map `sacct -X -n -P -o State` output ("CANCELLED by 1000", "RUNNING") to a job state."""
    for line in text.splitlines():
        word = line.strip().split(" ")[0].rstrip("+")
        if word:
            return SLURM_STATES.get(word, "running")
    return None


def sbatch_script(job: Job, cluster: Cluster, nnodes: int, nproc: int) -> str:
    safe_name = re.sub(r"[^A-Za-z0-9_.-]", "_", job.name)[:64] or "layerflow"
    directives = [f"--job-name={safe_name}", f"--nodes={nnodes}", "--ntasks-per-node=1",
                  "--output=slurm-%j.out"]
    if cluster.gpus_per_node:
        directives.append(f"--gpus-per-node={cluster.gpus_per_node}")
    if cluster.partition:
        directives.append(f"--partition={re.sub(r'[^A-Za-z0-9_,.-]', '', cluster.partition)}")
    if cluster.time_limit:
        directives.append(f"--time={re.sub(r'[^0-9:-]', '', cluster.time_limit)}")
    env = {TOKEN_VAR: job.token, "PYTHONUNBUFFERED": "1", **cluster.env}
    torchrun = " ".join([quote(cluster.python), "-m", "torch.distributed.run", '--nnodes="$SLURM_NNODES"',
                         f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                         f'--rdzv-endpoint="$head:{cluster.rdzv_port}"', '--rdzv-id="$SLURM_JOB_ID"',
                         f"--max-restarts={cluster.max_restarts}", "-m", "engine.runtime.train", "run"])
    lines = ["#!/bin/bash", *[f"#SBATCH {d}" for d in directives],
             f"# Layerflow job {job.id}: torchrun on every node, rendezvous on the first.",
             "set -u",
             *[f"export {k}={quote(v)}" for k, v in env.items()],
             'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
             f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 {torchrun}",
             "rc=$?", "echo $rc > node0.exit", "exit $rc", ""]
    return "\n".join(lines)


def submit(cluster: Cluster, run_dir: str | Path, *, name: str | None = None, accept: Iterable[str] = (),
           db: JobDB | None = None, nnodes: int | None = None) -> Job:
    """Upload to the login node and sbatch; returns the job (state pending)."""
    run_dir = Path(run_dir)
    db = db or JobDB()
    world = world_size(run_dir)
    nproc = cluster.nproc_per_node or (cluster.gpus_per_node or 1)
    nnodes = nnodes or max(1, world // nproc)
    if nnodes * nproc != world:
        raise DeployError(f"the plan needs {world} processes, not {nnodes} node(s) x {nproc}; "
                          f"set the cluster's nproc_per_node/gpus_per_node or change placement")
    bundle = make_bundle(run_dir, config_dir() / "bundles")
    job = Job(id=new_job_id(name or run_dir.name), name=name or run_dir.name, backend="slurm",
              cluster=cluster.model_dump(mode="json"), created=time.time(), token=secrets.token_hex(12))
    with Connection.to(cluster, cluster.hosts[0], accept) as c:
        workdir = c.abspath(cluster.workdir)
        jobdir = f"{workdir}/jobs/{job.id}"
        tar, _ = upload(c, bundle, f"{workdir}/bundles")
        extract(c, tar, jobdir)
        c.write_bytes(f"{jobdir}/token", job.token.encode(), 0o600)
        c.write_bytes(f"{jobdir}/job.sbatch", sbatch_script(job, cluster, nnodes, nproc).encode(), 0o700)
        out = c.run(f"cd {quote(jobdir)} && sbatch --parsable --chdir={quote(jobdir)} job.sbatch").stdout
    job.nodes = [Node(0, cluster.hosts[0].label, jobdir)]
    job.extra = {"slurm_id": out.strip().split(";")[0], "world_size": world, "nproc_per_node": nproc,
                 "nnodes": nnodes}
    db.add(job)
    return job


def state_command(slurm_id: str) -> str:
    return f"sacct -j {quote(slurm_id)} -X -n -P -o State"


def cancel_command(slurm_id: str) -> str:
    return f"scancel {quote(slurm_id)}"


__all__ = ["sbatch_script", "submit", "slurm_state", "state_command", "cancel_command", "layout"]
