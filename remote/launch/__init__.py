"""One entry for every backend: `check` a cluster and `deploy` a run folder on it.

The profile's `backend` picks remote/launch/ssh_torchrun.py (torchrun on each host over SSH) or
remote/launch/slurm.py (sbatch on the login node; Slurm picks the nodes). The CLI,
the Python API and the GUI call these two and never the backends directly.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from remote.launch import slurm as launch_slurm, ssh_torchrun as launch_ssh
from remote.cluster import Cluster
from remote.jobs import Job
from remote.preflight import PreflightReport, preflight
from remote.ssh import Connection


def check(cluster: Cluster, *, accept: Iterable[str] = ()) -> PreflightReport:
    """Preflight: every host (SSH), or the login node and its Slurm partition (Slurm)."""
    if cluster.backend != "slurm":
        return preflight(cluster, accept=accept)
    with Connection.to(cluster, cluster.hosts[0], list(accept)) as c:
        report, chk = launch_slurm.preflight_login(c, cluster, nnodes=1)
        if chk is not None and chk.errors:
            report.hosts[0].fail("; ".join(chk.errors))
        return report


def deploy(cluster: Cluster, run_dir: str | Path, **kw) -> Job:
    """Launch a prepared run folder (launch_ssh.prepare) on the cluster; returns the job."""
    backend = launch_slurm if cluster.backend == "slurm" else launch_ssh
    return backend.deploy(cluster, run_dir, **kw)


__all__ = ["check", "deploy"]
