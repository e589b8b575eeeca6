"""Deploy over real SSH and track through faults. The "hosts" are loopback sshds on this
machine, so the tests can also look at the remote files and processes directly."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from engine.project import load_project
from engine.run import prepare_run
from remote.cluster import parse_cluster
from remote.jobctl import job_pids
from remote.jobs import JobDB
from remote.launch_ssh import DeployError, deploy
from remote.tracker import Tracker

from sshd_helpers import free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("remote-deploy")]


def make_run(tmp_path: Path, steps: int, name: str = "run") -> Path:
    project = load_project(EXAMPLES / "mlp_digits.lflow")
    project.training.checkpoint_interval = max(50, steps // 2)
    project.training.eval_interval = max(25, steps // 4)
    return prepare_run(project, tmp_path / name, steps=steps)


def remote_file(job, rel: str, node: int | None = None) -> bytes:
    n = job.nodes[job.metrics_node if node is None else node]
    return Path(n.jobdir, rel).read_bytes()  # loopback hosts: the remote file is right here


def wait_for(pred, timeout=120.0, every=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError("condition not reached in time")


def assert_no_process_left(job):
    for n in job.nodes:
        pid = Path(n.jobdir, f"node{n.index}.pid").read_text().strip()
        assert job_pids(job.token, int(pid)) == []
        ps = subprocess.run(["ps", "-o", "pid=,stat=", "-g", pid], capture_output=True, text=True).stdout
        assert [ln for ln in ps.splitlines() if "Z" not in ln.split()[1]] == []  # zombies are dead already


@pytest.fixture
def cluster1(sshd_pair, tmp_path, config_dir):
    return parse_cluster(sshd_pair.cluster("one", tmp_path / "work", n_hosts=1,
                                           rdzv_port=free_port("127.0.0.2")))


def test_deploy_one_node_streams_metrics_complete(cluster1, tmp_path):
    run_dir = make_run(tmp_path, 60)
    uploads = []
    job = deploy(cluster1, run_dir, progress=lambda h, d, t: uploads.append((h, d, t)))
    assert job.state == "running" and uploads[-1][1] == uploads[-1][2]
    with Tracker(job.id) as tr:
        seen = []
        tr.on_metrics = seen.extend
        job = tr.follow(interval=0.3)
    assert job.state == "succeeded", job.error
    mirror = JobDB().mirror_dir(job.id) / "metrics.jsonl"
    assert mirror.read_bytes() == remote_file(job, "run/metrics.jsonl")  # byte for byte
    assert seen[-1]["event"] == "end" and [r["step"] for r in seen if "loss" in r] == list(range(1, 61))
    assert job.step == 60
    out = tmp_path / "fetched"
    with Tracker(job.id) as tr:
        tr.fetch(out)
    assert (out / "model.pt").is_file() and (out / "checkpoints" / "latest").is_file()
    assert (out / "logs" / "rank0.log").is_file() and (out / "logs" / "node0.out").is_file()
    # the same bundle again: its hash is on the host already, so nothing is uploaded
    uploads.clear()
    job2 = deploy(cluster1, run_dir, progress=lambda h, d, t: uploads.append((h, d, t)))
    assert len(uploads) == 1 and job2.extra["bundle"] == job.extra["bundle"]
    with Tracker(job2.id) as tr:
        assert tr.follow(interval=0.3).state == "succeeded"


def test_unreachable_host_fails_preflight_and_launches_nothing(sshd_pair, tmp_path, config_dir):
    data = sshd_pair.cluster("two", tmp_path / "work", rdzv_port=free_port("127.0.0.2"))
    data["hosts"][1]["port"] = free_port("127.0.0.3")
    project = load_project(EXAMPLES / "mlp_digits.lflow")
    run_dir = prepare_run(project, tmp_path / "run", steps=5, placement={"dp": 2})
    with pytest.raises(DeployError, match=r"(?s)preflight failed.*127\.0\.0\.3") as ei:
        deploy(parse_cluster(data), run_dir)
    assert ei.value.report is not None and not ei.value.report.ok
    assert not (tmp_path / "work" / "jobs").exists() and JobDB().list() == []


def test_connection_cut_mid_run_resumes_without_loss(sshd_pair, tmp_path, config_dir, relay_factory):
    """The tracker's link goes through a relay; stopping it cuts every connection."""
    s = sshd_pair.servers[0]
    relay = relay_factory((s.addr, s.port))
    kh = tmp_path / "kh"
    kh.write_text(sshd_pair.known_hosts.read_text() + s.public_key_line().replace(
        f"[{s.addr}]:{s.port}", f"[127.0.0.1]:{relay.port}") + "\n")
    data = sshd_pair.cluster("relayed", tmp_path / "work", n_hosts=1, rdzv_port=free_port("127.0.0.2"),
                             known_hosts=str(kh), command_timeout=15)
    data["hosts"][0].update(address="127.0.0.1", port=relay.port, rdzv_address="127.0.0.2")
    job = deploy(parse_cluster(data), make_run(tmp_path, 1500))
    seen = []
    tr = Tracker(job.id, on_metrics=seen.extend, lost_after=600)
    wait_for(lambda: tr.poll() and seen)
    cut_at = len(seen)
    relay.stop()
    job = tr.poll()
    assert not tr.nodes[0].reachable and job.state == "running"  # not lost: only briefly unreachable
    wait_for(lambda: Path(job.nodes[0].jobdir, "node0.exit").exists())  # the run went on without us
    relay.start()
    job = tr.follow(interval=0.2)
    tr.close()
    assert job.state == "succeeded", job.error
    mirror = JobDB().mirror_dir(job.id) / "metrics.jsonl"
    assert mirror.read_bytes() == remote_file(job, "run/metrics.jsonl")
    steps = [r["step"] for r in seen if "loss" in r]
    assert steps == list(range(1, 1501)) and cut_at < len(seen)


def test_app_restart_reattaches_from_the_job_database(cluster1, tmp_path):
    job = deploy(cluster1, make_run(tmp_path, 1500))
    first = []
    tr = Tracker(job.id, on_metrics=first.extend)
    wait_for(lambda: tr.poll() and first)
    tr.close()
    del tr  # "the app quits"; a crash mid-append leaves half a line in the mirror:
    mirror = JobDB().mirror_dir(job.id) / "metrics.jsonl"
    with open(mirror, "ab") as f:
        f.write(b'{"step": 12345, "lo')
    db = JobDB()  # "the app starts again"
    assert [j.id for j in db.active()] == [job.id]
    rest = []
    with Tracker(db.active()[0].id, db, on_metrics=rest.extend) as tr:
        job = tr.follow(interval=0.3)
    assert job.state == "succeeded"
    assert mirror.read_bytes() == remote_file(job, "run/metrics.jsonl")
    steps = [r["step"] for r in first + rest if "loss" in r]
    assert steps == list(range(1, 1501))  # none lost, none twice
    assert db.active() == []


def test_cancel_leaves_no_process(cluster1, tmp_path):
    job = deploy(cluster1, make_run(tmp_path, 200000))
    with Tracker(job.id) as tr:
        wait_for(lambda: tr.poll().state == "running" and tr.job.step)
        job = tr.cancel(grace=10)
    assert job.state == "cancelled"
    assert_no_process_left(job)
    assert Path(job.nodes[0].jobdir, "cancelled").exists()


def test_hostile_names_round_trip(sshd_pair, tmp_path, config_dir):
    evil = "we ird; $(touch PWNED) `touch PWNED2` 'q' \"d\" \\ & |"
    work = tmp_path / f"work {evil}"
    data = sshd_pair.cluster("evil", work, n_hosts=1, rdzv_port=free_port("127.0.0.2"),
                             env={"OMP_NUM_THREADS": "1", "LF_NOTE": evil})
    job = deploy(parse_cluster(data), make_run(tmp_path, 5), name=evil)
    assert job.name == evil and JobDB().get(job.id).name == evil
    assert job.nodes[0].jobdir.startswith(str(work))
    with Tracker(job.id) as tr:
        assert tr.follow(interval=0.3).state == "succeeded"
    out = Path(job.nodes[0].jobdir, "node0.out").read_text()
    assert evil in out
    for root in (tmp_path, Path.home(), Path(job.nodes[0].jobdir)):
        assert not list(root.glob("PWNED*"))
    assert not Path("PWNED").exists() and not Path("/PWNED").exists()
