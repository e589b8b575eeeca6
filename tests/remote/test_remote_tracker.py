"""Tracker states and streaming on hand-made job folders (real sshd, no training):
pending, running, succeeded, failed, lost (vanished / unreachable); half lines wait."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from remote.cluster import parse_cluster
from remote.jobctl import TOKEN_VAR
from remote.jobs import Job, JobDB, Node
from remote.tracker import CancelError, Follower, Tracker

from sshd_helpers import free_port

JOBCTL = Path(__file__).resolve().parents[2] / "remote" / "jobctl.py"


def fake_job(env, tmp_path, *, port=None, nodes=1):
    c = parse_cluster(env.cluster("fake", tmp_path / "work", n_hosts=nodes, command_timeout=5))
    if port:
        c.hosts[0].port = port
    job = Job(id=f"fake-{time.time_ns()}", name="fake", cluster=c.model_dump(mode="json"), created=time.time(),
              token=os.urandom(6).hex(), state="running", total_steps=3)
    for i, h in enumerate(c.hosts):
        d = tmp_path / "work" / "jobs" / job.id / f"node{i}"
        (d / "run").mkdir(parents=True)
        shutil.copy(JOBCTL, d / "layerflow_jobctl.py")
        (d / "token").write_text(job.token)
        job.nodes.append(Node(i, h.label, str(d)))
    JobDB().add(job)
    return job


def start_node(job, i=0, command="sleep 60"):
    d = job.nodes[i].jobdir
    return subprocess.Popen(["setsid", "sh", "-c", f"echo $$ > node{i}.pid; exec {command}"], cwd=d,
                            env={**os.environ, TOKEN_VAR: job.token})


def test_states_and_half_lines(sshd_pair, tmp_path, config_dir):
    job = fake_job(sshd_pair, tmp_path)
    d = Path(job.nodes[0].jobdir)
    got = []
    with Tracker(job.id, on_metrics=got.extend) as tr:
        assert tr.poll().state == "pending"  # launched, no pid yet
        p = start_node(job)
        for _ in range(100):
            if (d / "node0.pid").exists():
                break
            time.sleep(0.05)
        (d / "run" / "metrics.jsonl").write_bytes(b'{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
        assert tr.poll().state == "running" and [r["step"] for r in got] == [1]  # the half line waits
        with open(d / "run" / "metrics.jsonl", "ab") as f:
            f.write(b'ss": 0.5}\n')
        tr.poll()
        assert [r["step"] for r in got] == [1, 2] and tr.job.step == 2
        os.killpg(p.pid, signal.SIGKILL)  # the processes vanish without an exit code
        p.wait()
        assert tr.poll().state == "lost" and "vanished" in tr.job.error
    # the same folder, ended properly this time
    job2 = fake_job(sshd_pair, tmp_path)
    d2 = Path(job2.nodes[0].jobdir)
    (d2 / "node0.pid").write_text("999999")
    (d2 / "run" / "status.json").write_text(json.dumps({"state": "succeeded"}))
    (d2 / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    (d2 / "node0.exit").write_text("0\n")
    with Tracker(job2.id) as tr:
        assert tr.poll().state == "succeeded" and tr.job.metrics_node == 0
    job3 = fake_job(sshd_pair, tmp_path)
    d3 = Path(job3.nodes[0].jobdir)
    (d3 / "node0.pid").write_text("999999")
    (d3 / "run" / "logs").mkdir()
    (d3 / "run" / "logs" / "rank0.log").write_text("Traceback ...\nValueError: bad shape\n")
    (d3 / "node0.exit").write_text("1\n")
    logs = []
    with Tracker(job3.id, on_log=lambda name, lines: logs.append((name, lines))) as tr:
        job3 = tr.poll()
    assert job3.state == "failed" and "exited with 1" in job3.error and "bad shape" in job3.error
    assert ("rank0.log", ["Traceback ...", "ValueError: bad shape"]) in logs
    assert JobDB().get(job3.id).state == "failed"  # persisted


def test_one_failed_node_fails_the_job_and_stops_the_others(sshd_pair, tmp_path, config_dir):
    job = fake_job(sshd_pair, tmp_path, nodes=2)
    p = start_node(job, 1)
    d0, d1 = (Path(n.jobdir) for n in job.nodes)
    (d0 / "node0.pid").write_text("999999")
    (d0 / "node0.exit").write_text("3\n")
    for _ in range(100):
        if (d1 / "node1.pid").exists():
            break
        time.sleep(0.05)
    with Tracker(job.id) as tr:
        assert tr.poll().state == "failed"
    assert p.wait(timeout=30) != 0  # node 1's processes were ended, not left waiting on a rendezvous


def test_unreachable_node_becomes_lost_after_the_grace(sshd_pair, tmp_path, config_dir):
    job = fake_job(sshd_pair, tmp_path, port=free_port("127.0.0.2"))
    with Tracker(job.id, lost_after=3600) as tr:
        assert tr.poll().state == "running" and not tr.nodes[0].reachable
    with Tracker(job.id, lost_after=0) as tr:
        tr.poll()
        assert tr.poll().state == "lost" and "unreachable" in tr.job.error
        with pytest.raises(CancelError, match=r"cancel incomplete: \w+@127\.0\.0\.2:\d+"):
            tr.cancel(grace=1)  # says which host it could not reach; claims nothing
    assert JobDB().get(job.id).state == "lost"



def test_follower_thread_streams_and_stops(sshd_pair, tmp_path, config_dir):
    job = fake_job(sshd_pair, tmp_path)
    d = Path(job.nodes[0].jobdir)
    p = start_node(job)
    got, states = [], []
    f = Follower(job.id, interval=0.1, on_metrics=got.extend, on_state=lambda j: states.append(j.state)).start()
    (d / "run" / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    for _ in range(200):
        if got:
            break
        time.sleep(0.05)
    (d / "run" / "status.json").write_text(json.dumps({"state": "succeeded"}))
    (d / "node0.exit").write_text("0\n")
    os.killpg(p.pid, signal.SIGTERM)
    p.wait()
    f.thread.join(30)
    assert not f.thread.is_alive() and f.error is None
    assert f.job.state == "succeeded" and got == [{"step": 1, "loss": 1.0}] and states[-1] == "succeeded"
    f2 = Follower(fake_job(sshd_pair, tmp_path).id, interval=0.1).start()  # pending forever
    f2.stop()
    assert not f2.thread.is_alive()


def test_two_trackers_share_the_mirror_without_duplicates(sshd_pair, tmp_path, config_dir):
    """The GUI and a terminal follow the same job at once: the mirror gets each line once,
    and each tracker hands every line to its own callbacks once."""
    import threading

    job = fake_job(sshd_pair, tmp_path)
    d = Path(job.nodes[0].jobdir)
    p = start_node(job)
    got = {0: [], 1: []}
    stop = threading.Event()

    trackers = [Tracker(job.id, on_metrics=got[k].extend) for k in (0, 1)]  # both from the start

    def follow(k):
        with trackers[k] as tr:
            while not stop.is_set():
                tr.poll()
            tr.poll()

    threads = [threading.Thread(target=follow, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    with open(d / "run" / "metrics.jsonl", "ab") as f:
        for step in range(1, 201):
            f.write(json.dumps({"step": step, "loss": 1.0 / step}).encode() + b"\n")
            f.flush()
            if step % 20 == 0:
                time.sleep(0.05)
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(60)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    mirror = JobDB().mirror_dir(job.id) / "metrics.jsonl"
    assert mirror.read_bytes() == (d / "run" / "metrics.jsonl").read_bytes()
    for k in (0, 1):
        assert [r["step"] for r in got[k]] == list(range(1, 201))


def test_run_restarted_on_the_node_rewrites_metrics(sshd_pair, tmp_path, config_dir):
    """torchrun --max-restarts starts the run again and its metrics.jsonl shrinks: the
    mirror keeps the common lines, drops the rest, and the new lines follow."""
    job = fake_job(sshd_pair, tmp_path)
    d = Path(job.nodes[0].jobdir)
    p = start_node(job)
    remote = d / "run" / "metrics.jsonl"

    def lines(steps, tag):
        return b"".join(json.dumps({"step": s, "loss": 1.0, "try": tag}).encode() + b"\n" for s in steps)
    remote.write_bytes(lines(range(1, 11), 0))
    got = []
    try:
        with Tracker(job.id, on_metrics=got.extend) as tr:
            tr.poll()
            remote.write_bytes(lines(range(1, 3), 0) + lines(range(3, 5), 1))  # resumed after step 2
            tr.poll()
            with open(remote, "ab") as f:
                f.write(lines(range(5, 12), 1))
            tr.poll()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    mirror = JobDB().mirror_dir(job.id) / "metrics.jsonl"
    assert mirror.read_bytes() == remote.read_bytes()
    assert [(r["step"], r["try"]) for r in got] == [(s, 0) for s in range(1, 11)] + [(s, 1) for s in range(3, 12)]


def test_a_resume_that_cuts_and_writes_on_between_two_polls_is_mirrored_whole(sshd_pair, tmp_path, config_dir):
    """A resume cuts metrics.jsonl back to its checkpoint (here only the preempted attempt's
    end line) and writes on at once: by the next poll the file is longer than the mirror
    again, with other bytes where the mirror's last line was. The mirror must not read on
    from its own size (half a line of garbage): it finds the common lines and goes on."""
    job = fake_job(sshd_pair, tmp_path)
    d = Path(job.nodes[0].jobdir)
    p = start_node(job)
    remote = d / "run" / "metrics.jsonl"
    loss = b"".join(json.dumps({"step": s, "loss": 1.0}).encode() + b"\n" for s in range(1, 6))
    remote.write_bytes(loss + b'{"event": "end", "state": "preempted", "step": 5}\n')
    got = []
    try:
        with Tracker(job.id, on_metrics=got.extend) as tr:
            tr.poll()
            remote.write_bytes(loss + json.dumps({"step": 5, "event": "restart", "attempt": 1, "reason": "preempted",
                                                  "failed_at_step": 5, "world": 2}).encode() + b"\n"
                               + json.dumps({"step": 6, "loss": 0.5}).encode() + b"\n")
            tr.poll()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    mirror = JobDB().mirror_dir(job.id) / "metrics.jsonl"
    assert mirror.read_bytes() == remote.read_bytes()
    assert [r.get("event") or r["step"] for r in got] == [1, 2, 3, 4, 5, "end", "restart", 6]


def test_system_samples_of_every_node_are_mirrored(sshd_pair, tmp_path, config_dir):
    """Each rank's logs/rankR.system.jsonl (its CPU and memory samples) comes back into the
    mirror's logs/ by byte offset, half lines waiting, for the dashboard's System tab; the
    samples go to on_system, never to the log callback."""
    from engine.runtime.sysmetrics import SystemTail

    job = fake_job(sshd_pair, tmp_path, nodes=2)
    for i, n in enumerate(job.nodes):
        d = Path(n.jobdir)
        (d / f"node{i}.pid").write_text("999999")
        (d / "run" / "logs").mkdir()
        (d / "run" / "logs" / f"rank{i}.system.jsonl").write_bytes(
            json.dumps({"step": 5, "time": 1.0, "rank": i, "cpu_pct": 99.0, "rss_mb": 300.0 + i}).encode()
            + b'\n{"step": 10, "ti')
    (Path(job.nodes[0].jobdir) / "run" / "metrics.jsonl").write_text('{"step": 5, "loss": 1.0}\n')
    (Path(job.nodes[0].jobdir) / "run" / "logs" / "rank0.log").write_text("step 5\n")
    system, logs = [], []
    with Tracker(job.id, on_system=lambda name, recs: system.append((name, recs)),
                 on_log=lambda name, lines: logs.append(name)) as tr:
        tr.poll()
        mirror = tr.mirror
        assert sorted(n for n, _ in system) == ["rank0.system.jsonl", "rank1.system.jsonl"]
        assert logs == ["rank0.log"]
        recs = SystemTail(mirror).poll_records()
        assert sorted((r["step"], k, v) for r in recs for k, v in r.items() if k.startswith("rss")) == \
            [(5, "rss_mb_rank0", 300.0), (5, "rss_mb_rank1", 301.0)]
        with open(Path(job.nodes[1].jobdir) / "run" / "logs" / "rank1.system.jsonl", "ab") as f:
            f.write(b'me": 2.0, "rank": 1, "cpu_pct": 50.0, "rss_mb": 310.0}\n')
        tr._system_listed.clear()  # (listed every few seconds: now)
        tr.poll()
        assert [(r["step"], r["rss_mb_rank1"]) for r in SystemTail(mirror).poll_records()[-1:]] == [(10, 310.0)]
        assert system[-1] == ("rank1.system.jsonl", [{"step": 10, "time": 2.0, "rank": 1, "cpu_pct": 50.0,
                                                      "rss_mb": 310.0}])
