"""A job that loses a node goes on with the nodes left (engine/runtime/elastic.py, torchrun
--nnodes MIN:MAX): the two loopback sshd hosts of the fixtures, real torchrun on each, the
second host's processes killed and its sshd stopped mid-run. The job goes on on the first
host with dp halved and two micro-batches per step; when the host is back, the tracker starts
its node again, the job grows back to dp=2 at a checkpoint, and its losses are those of an
unbroken dp=2 run."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from sshd_helpers import free_port, lose_host

from engine.project import load_project
from engine.runtime.recovery import read_attempts
from remote.cluster import parse_cluster
from remote.jobctl import job_pids
from remote.launch.local import launch_local
from remote.launch.ssh_torchrun import deploy, prepare
from remote.tracker import Tracker

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"
# steps of a few ms: enough of them that the job is still running when the host is back
STEPS = 4000
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("remote-deploy")]


def _losses(metrics: Path) -> dict[int, float]:
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r["step"] for r in recs if "loss" in r]
    assert len(steps) == len(set(steps)), "a step is in metrics.jsonl twice"
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


def _attempts(run: Path) -> list[dict]:
    return read_attempts(run) if run.exists() else []


def test_a_lost_host_shrinks_the_job_which_grows_back_and_ends_as_an_unbroken_run(sshd_pair, tmp_path, config_dir):
    project = load_project(EXAMPLES / "mlp_digits.lflow")
    project.training = project.training.model_copy(update={
        "steps": STEPS, "checkpoint_interval": 100, "eval_interval": 100_000, "log_interval": 1})
    run = prepare(project, tmp_path / "prepared" / "run", steps=STEPS, placement={"dp": 2})
    unbroken = tmp_path / "unbroken"
    shutil.copytree(run, unbroken)
    assert launch_local(unbroken, 2).wait(timeout=300) == 0
    want = _losses(unbroken / "metrics.jsonl")

    c = parse_cluster(sshd_pair.cluster("two", tmp_path / "work", rdzv_port=free_port("127.0.0.2")))
    job = deploy(c, run)
    assert job.extra["nodes_bounds"] == [1, 2]
    second = sshd_pair.servers[1]
    node1 = job.nodes[1]
    try:
        with Tracker(job.id, lost_after=3.0) as tr:
            deadline = time.monotonic() + 240
            while not (tr.poll().step or 0) >= 110:  # past the checkpoint at step 100
                assert time.monotonic() < deadline, "the job did not reach step 110"
                time.sleep(0.2)
            lose_host(job, node1, second)
            home = Path(job.nodes[0].jobdir) / "run"
            while not (node1.host in tr.poll().extra.get("lost_nodes", [])
                       and [a["world"] for a in _attempts(home)][-1:] == [1]):  # the job went on, on host 1 alone
                assert time.monotonic() < deadline + 60 and not tr.job.done, (tr.job.state, tr.job.error)
                time.sleep(0.2)
            shrunk_at = tr.job.step
            second.start()  # the host is back: the tracker starts its node again, the job grows
            job = tr.follow(interval=0.5)
    finally:
        second.start()
    assert job.state == "succeeded", job.error
    assert job.extra.get("lost_nodes") == [] and [r["host"] for r in job.extra["rejoined"]] == [node1.host]
    got = _losses(home / "metrics.jsonl")
    assert sorted(got) == list(range(1, STEPS + 1))
    for s in got:
        assert got[s] == pytest.approx(want[s], rel=1e-4, abs=1e-6), s
    attempts = read_attempts(home)
    assert [a["world"] for a in attempts] == [2, 1, 2], attempts
    shrunk, grown = attempts[1], attempts[2]
    assert shrunk["resized"]["to"] == {"pp": 1, "dp": 1, "tp": 1}
    assert shrunk["resized"]["accumulation"] == 2 and shrunk["resumed_from"] >= 100
    # (the checkpoint it resumed from was whole on node 0, node 1's parts sent there: the losses
    # after it are the unbroken run's)
    # grown back at a checkpoint made when the node joined (nothing redone), on the planned layout
    assert grown["layout"] == {"pp": 1, "dp": 2, "tp": 1} and "resized" not in grown
    assert grown["after"]["error"] == f"grown: {node1.host} joined again" and grown["after"]["preempted"]
    assert grown["resumed_from"] == grown["after"]["step"] >= shrunk_at
    events = [json.loads(line) for line in (home / "metrics.jsonl").read_text().splitlines() if '"event"' in line]
    assert [(e["event"], e.get("world")) for e in events if e["event"] in ("restart", "preempted")] == [
        ("restart", 1), ("preempted", None), ("restart", 2)]
    for n in job.nodes:  # nothing left on either host
        pid = int(Path(n.jobdir, f"node{n.index}.pid").read_text())
        assert job_pids(job.token, pid) == []
