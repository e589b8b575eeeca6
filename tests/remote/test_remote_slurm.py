"""The Slurm backend's scripts and parsers, as text (test_slurm_real.py runs them under a real Slurm)."""
from __future__ import annotations

import subprocess
import time

from remote.cluster import parse_cluster
from remote.jobs import Job
from remote.launch.slurm import (PREEMPT_SETTLE_S, node_script, parse_gpus, parse_kv, parse_time, preemption,
                                 sbatch_script, slurm_state, warning_s)


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
    assert "--output=node%n.out" in srun and srun.endswith("bash node.sh &")  # (in the background: traps run)
    assert "echo $rc > batch.exit.tmp && mv batch.exit.tmp batch.exit" in lines
    # preemption: requeued by Slurm, warned 60 s before (the default), USR1 passed to the workers
    assert "#SBATCH --requeue" in lines and "#SBATCH --signal=B:USR1@60" in lines
    assert any(ln.startswith("trap '") and 'scancel --signal=USR1 "$SLURM_JOB_ID"' in ln and ln.endswith("USR1")
               for ln in lines)
    assert 'scontrol requeue "$SLURM_JOB_ID" && exit 0' in text and "rm -f run/cancel.requested batch.exit" in lines
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0  # valid shell
    node = node_script(job, c, nnodes=2, nproc=4)
    run = next(ln for ln in node.splitlines() if ln.startswith("exec "))
    assert "'/opt/my env/bin/python' -m torch.distributed.run" in run
    assert '--nnodes="$SLURM_NNODES"' in run and "--nproc-per-node=4" in run
    assert '--rdzv-endpoint="$LAYERFLOW_RDZV_ADDR:29500"' in run and '--rdzv-id="$SLURM_JOB_ID"' in run
    assert '--rdzv-conf=is_host="$is_host"' in run and '--local-addr="$me"' in run
    assert "--max-restarts=2" in run and run.endswith("-m engine.runtime.train run ${LAYERFLOW_RESUME:-}")
    assert node.splitlines()[1] == "trap '' USR1"  # torchrun would die of it; the workers handle it
    assert "export NOTE='a b; $(x)'" in node and "export LAYERFLOW_JOB_TOKEN=abc123" in node
    assert subprocess.run(["bash", "-n"], input=node, text=True).returncode == 0
    one = node_script(job, c.model_copy(update={"max_restarts": 0}), nnodes=1, nproc=1)
    assert "torch.distributed.run" not in one and "exec '/opt/my env/bin/python' -m engine.runtime.train run " in one
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


def test_the_warning_follows_the_profile_and_leaves_room_in_the_time_limit():
    c, job = make()
    assert warning_s(c) == 60  # the default
    assert warning_s(c.model_copy(update={"preempt_grace_s": 0})) is None  # no warning: only --requeue
    assert warning_s(c.model_copy(update={"preempt_grace_s": 300})) == 300
    short = c.model_copy(update={"time_limit": "1"})  # a warning due at the start would stop every allocation there
    assert warning_s(short) is None and "#SBATCH --signal" not in sbatch_script(job, short, 1, 1)
    assert "#SBATCH --requeue" in sbatch_script(job, short, 1, 1).splitlines()
    from remote.cluster import ClusterError

    try:
        make(preempt_grace_s=-1)
    except ClusterError as exc:
        assert "preempt_grace_s" in str(exc)
    else:
        raise AssertionError("a negative grace was accepted")


def test_preemption_states_are_no_end_until_slurm_lets_the_job_go():
    from remote.jobs import TERMINAL

    assert slurm_state("PREEMPTED") == "preempted" and slurm_state("REQUEUED") == "resuming"
    assert not {"preempted", "resuming"} & TERMINAL
    run = {"state": "preempted", "step": 41}
    scon = {"source": "scontrol", "restarts": "0"}
    # Slurm still runs the allocation, the run stopped at the signal: preempted (its restart count noted)
    state, note, mark = preemption("running", {**scon, "state": "RUNNING"}, run, None, "step_41", 100.0)
    assert (state, mark) == ("preempted", {"restarts": 0, "since": 100.0}) and "step_41" in note and "41" in note
    # requeued: pending after a restart, with Slurm's reason
    state, note, mark = preemption("pending", {**scon, "state": "PENDING", "restarts": "1", "reason": "BeginTime"},
                                   run, mark, "step_41", 101.0)
    assert state == "resuming" and "waiting in the queue: BeginTime" in note and mark["restarts"] == 0
    assert preemption("resuming", {**scon, "state": "REQUEUED"}, run, mark, None, 101.0)[0] == "resuming"
    # the next allocation runs, its run has not written yet: resuming; once it has, no preemption is under way
    assert preemption("running", {**scon, "state": "RUNNING", "restarts": "1"}, run, mark, None, 102.0)[0] == "resuming"
    assert preemption("running", {**scon, "state": "RUNNING", "restarts": "1"}, {"state": "running"}, mark, None,
                      103.0) is None
    assert preemption("succeeded", {**scon, "state": "COMPLETED"}, {"state": "succeeded"}, mark, None, 104.0) is None
    # a PREEMPTED job Slurm does not requeue (PreemptMode CANCEL) ends, after a while, as failed, saying how to go on
    pre = {**scon, "state": "PREEMPTED"}
    state, _, mark = preemption("preempted", pre, run, None, "step_41", 200.0)
    assert state == "preempted"
    state, note, _ = preemption("preempted", pre, run, mark, "step_41", 200.0 + PREEMPT_SETTLE_S + 1)
    assert state == "failed" and "did not requeue" in note and "train --resume" in note
    assert preemption("preempted", {**pre, "source": "sacct"}, run, mark, None, 201.0)[0] == "failed"
    # the batch script ended after Slurm's warning without requeueing
    assert preemption("succeeded", {**scon, "state": "COMPLETED"}, run, None, None, 300.0)[0] == "failed"
    # a user's scancel is Slurm's CANCELLED, whatever the run wrote
    assert preemption("cancelled", {**scon, "state": "CANCELLED"}, run, None, None, 300.0) is None


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
