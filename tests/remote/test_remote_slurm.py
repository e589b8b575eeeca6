"""The Slurm backend's scripts and parsers, as text (test_slurm_real.py runs them under a real Slurm)."""
from __future__ import annotations

import subprocess
import time

from remote.cluster import parse_cluster
from remote.jobs import Job
from remote.launch.slurm import node_script, parse_gpus, parse_kv, parse_time, sbatch_script, slurm_state


def make(**kw):
    c = parse_cluster({"name": "hpc", "hosts": [{"address": "login.example.org", "user": "me"}], "backend": "slurm",
                       "python": "/opt/my env/bin/python", "env": {"NCCL_DEBUG": "WARN", "NOTE": "a b; $(x)"},
                       "partition": "gpu", "time_limit": "02:00:00", "gpus_per_node": 4, "rdzv_port": 29500,
                       "max_restarts": 2, **kw})
    job = Job(id="j-1", name="my run; rm -rf ~", cluster=c.model_dump(), created=time.time(), token="abc123")
    return c, job


def test_sbatch_and_node_script_text():
    c, job = make()
    text = sbatch_script(job, c, nnodes=2, nproc=4)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for d in ["--job-name=my_run__rm_-rf__", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=4",
              "--partition=gpu", "--time=02:00:00", "--output=slurm-%j.out"]:
        assert f"#SBATCH {d}" in lines
    assert 'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in lines
    srun = next(ln for ln in lines if ln.startswith("srun "))
    assert "--output=node%n.out" in srun and srun.endswith("bash node.sh")
    assert "echo $rc > batch.exit.tmp && mv batch.exit.tmp batch.exit" in lines
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0  # valid shell
    node = node_script(job, c, nnodes=2, nproc=4)
    run = next(ln for ln in node.splitlines() if ln.startswith("exec "))
    assert "'/opt/my env/bin/python' -m torch.distributed.run" in run
    assert '--nnodes="$SLURM_NNODES"' in run and "--nproc-per-node=4" in run
    assert '--rdzv-endpoint="$LAYERFLOW_RDZV_ADDR:29500"' in run and '--rdzv-id="$SLURM_JOB_ID"' in run
    assert '--rdzv-conf=is_host="$is_host"' in run and '--local-addr="$me"' in run
    assert "--max-restarts=2" in run and run.endswith("-m engine.runtime.train run")
    assert "export NOTE='a b; $(x)'" in node and "export LAYERFLOW_JOB_TOKEN=abc123" in node
    assert subprocess.run(["bash", "-n"], input=node, text=True).returncode == 0
    one = node_script(job, c.model_copy(update={"max_restarts": 0}), nnodes=1, nproc=1)
    assert "torch.distributed.run" not in one and "exec '/opt/my env/bin/python' -m engine.runtime.train run" in one
    assert "--standalone" in node_script(job, c, nnodes=1, nproc=4)


def test_slurm_states_and_parsers():
    assert slurm_state("RUNNING\n") == "running"
    assert slurm_state("PENDING") == "pending"
    assert slurm_state("COMPLETED\n") == "succeeded"
    assert slurm_state("CANCELLED by 1000\n") == "cancelled"
    assert slurm_state("TIMEOUT") == "timeout" and slurm_state("OUT_OF_MEMORY") == "failed"
    assert slurm_state("NODE_FAIL") == "lost"
    assert slurm_state("") is None
    assert [parse_time(t) for t in ("30", "1:30", "02:00:00", "1-0", "2-03:04:05", "UNLIMITED", None)] == [
        1800, 90, 7200, 86400, 2 * 86400 + 3 * 3600 + 4 * 60 + 5, None, None]
    assert [parse_gpus(g) for g in ("gpu:4", "gpu:a100:8(S:0-1)", "gpu:a100:2,gpu:v100:2", "(null)", "",
                                    "gpu:a100:4(S:0),mps:400")] == [4, 8, 4, 0, 0, 4]
    kv = parse_kv("JobId=12 JobName=my run x UserId=root(0) JobState=PENDING Reason=Resources Dependency=(null)")
    assert kv["JobName"] == "my run x" and kv["JobState"] == "PENDING" and kv["Reason"] == "Resources"


def test_ssh_node_script_text():
    """The per-node script of the SSH backend (remote/launch/ssh_torchrun.py), as text."""
    from remote.launch.ssh_torchrun import layout, node_script

    c = parse_cluster({"name": "two", "hosts": [{"address": "fe80::1"}, {"address": "gpu2"}],
                       "python": "/opt/my env/bin/python", "max_restarts": 3, "rdzv_port": 29500,
                       "env": {"NOTE": "a b; $(x)"}})
    job = Job(id="j-1", name="it's $(bad)", cluster=c.model_dump(), created=time.time(), token="tok")
    text = node_script(job, c, 1, 2, 4)
    assert "echo $$ > node1.pid.tmp && mv node1.pid.tmp node1.pid" in text
    assert "'/opt/my env/bin/python' -m torch.distributed.run --nnodes=2 --nproc-per-node=4 --node-rank=1" in text
    assert "--rdzv-endpoint=[fe80::1]:29500" in text and "--max-restarts=3" in text and "--rdzv-id=tok" in text
    assert "export NOTE='a b; $(x)'" in text and "'it'\"'\"'s $(bad)'" in text
    assert "echo $rc > node1.exit.tmp && mv node1.exit.tmp node1.exit" in text
    assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0
    one = c.model_copy(update={"max_restarts": 0})
    assert "torch.distributed.run" not in node_script(job, one, 0, 1, 1)  # one process: no agent
    assert layout(c, 8) == (2, 4) and layout(c, 1) == (1, 1)
