"""Deploy over real SSH and track through faults. The "hosts" are loopback sshds on this
machine, so the tests can also look at the remote files and processes directly."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from engine.project import load_project
from remote.cluster import parse_cluster
from remote.jobctl import job_pids
from remote.jobs import JobDB
from remote.launch.ssh_torchrun import DeployError, deploy, prepare
from remote.tracker import Tracker

from sshd_helpers import free_port, relayed_cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("remote-deploy")]


_RUNS: dict = {}


def make_run(tmp_path: Path, steps: int, name: str = "run", dp: int = 1) -> Path:
    """A prepared run folder (prepared once per process and copied: preparing takes seconds)."""
    key = (steps, dp)
    if key not in _RUNS:
        project = load_project(EXAMPLES / "mlp_digits.lflow")
        project.training.checkpoint_interval = max(50, steps // 2)
        project.training.eval_interval = max(25, steps // 4)
        project.training.log_interval = 1  # a line per step: every one must arrive once
        import tempfile
        _RUNS[key] = prepare(project, Path(tempfile.mkdtemp(prefix="lf-run-")) / "run", steps=steps,
                             placement={"dp": dp})
    dest = tmp_path / name
    shutil.copytree(_RUNS[key], dest)
    return dest


def remote_file(job, rel: str, node: int | None = None) -> bytes:
    n = job.nodes[job.metrics_node if node is None else node]
    return Path(n.jobdir, rel).read_bytes()  # loopback hosts: the remote file is right here


def wait_for(pred, timeout=120.0, every=0.2, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"{what}: not reached in {timeout:g} s")


def assert_no_process_left(job):
    for n in job.nodes:
        pid = Path(n.jobdir, f"node{n.index}.pid").read_text().strip()
        assert job_pids(job.token, int(pid)) == []
        ps = subprocess.run(["ps", "-o", "pid=,stat=", "-g", pid], capture_output=True, text=True).stdout
        assert [ln for ln in ps.splitlines() if "Z" not in ln.split()[1]] == []  # zombies are dead already


EVIL = "we ird; $(touch PWNED) `touch PWNED2` 'q' \"d\" \\ & |"


def test_deploy_one_node_streams_metrics_complete_with_hostile_names(sshd_pair, tmp_path, config_dir):
    """Hostile text in the work dir, the job name and an env value is data, never code."""
    work = tmp_path / f"work {EVIL}"
    cluster = parse_cluster(sshd_pair.cluster("evil", work, n_hosts=1, rdzv_port=free_port("127.0.0.2"),
                                              env={"OMP_NUM_THREADS": "1", "LF_NOTE": EVIL}))
    uploads = []
    job = deploy(cluster, make_run(tmp_path, 60), name=EVIL, progress=lambda h, d, t: uploads.append((h, d, t)))
    assert job.state == "running" and uploads[-1][1] == uploads[-1][2]
    assert job.name == EVIL and JobDB().get(job.id).name == EVIL and job.nodes[0].jobdir.startswith(str(work))
    with Tracker(job.id) as tr:
        seen = []
        tr.on_metrics = seen.extend
        job = tr.follow(interval=0.3)
    assert job.state == "succeeded", job.error
    mirror = JobDB().mirror_dir(job.id) / "metrics.jsonl"
    assert mirror.read_bytes() == remote_file(job, "run/metrics.jsonl")  # byte for byte
    assert seen[-1]["event"] == "end" and [r["step"] for r in seen if "loss" in r] == list(range(1, 61))
    assert job.step == 60
    from engine.runs.history import summarize_run  # the mirror reads like a local run folder
    summary = summarize_run(mirror.parent)
    assert (summary.state, summary.step, summary.total_steps) == ("succeeded", 60, 60)
    out = tmp_path / "fetched"
    with Tracker(job.id) as tr:
        tr.fetch(out)
    assert (out / "model.pt").is_file() and (out / "checkpoints" / "latest").is_file()
    assert (out / "logs" / "rank0.log").is_file() and EVIL in (out / "logs" / "node0.out").read_text()
    for root in (tmp_path, Path.home(), Path(job.nodes[0].jobdir), Path.cwd(), Path("/")):
        assert not list(root.glob("PWNED*"))


def test_deploy_two_nodes_ddp(sshd_pair, tmp_path, config_dir):
    """2 nodes x 1 process, gloo, c10d rendezvous on 127.0.0.2: trains to the end and
    every metric line comes back."""
    c = parse_cluster(sshd_pair.cluster("two", tmp_path / "work", rdzv_port=free_port("127.0.0.2")))
    job = deploy(c, make_run(tmp_path, 30, dp=2))
    assert [n.host.split("@")[1].split(":")[0] for n in job.nodes] == ["127.0.0.2", "127.0.0.3"]
    seen = []
    with Tracker(job.id, on_metrics=seen.extend) as tr:
        job = tr.follow(interval=0.5)
    assert job.state == "succeeded", job.error
    assert [r["step"] for r in seen if "loss" in r] == list(range(1, 31)) and seen[-1]["event"] == "end"
    assert (JobDB().mirror_dir(job.id) / "metrics.jsonl").read_bytes() == remote_file(job, "run/metrics.jsonl")
    for n in job.nodes:  # torchrun ran on both nodes and exited cleanly
        assert Path(n.jobdir, f"node{n.index}.exit").read_text().strip() == "0"
    logs = sorted(p.name for p in (JobDB().mirror_dir(job.id) / "logs").glob("rank*.log"))
    assert logs[0] == "rank0.log"


def test_unreachable_host_fails_preflight_and_launches_nothing(sshd_pair, tmp_path, config_dir):
    data = sshd_pair.cluster("two", tmp_path / "work", rdzv_port=free_port("127.0.0.2"))
    data["hosts"][1]["port"] = free_port("127.0.0.3")
    run_dir = make_run(tmp_path, 5, dp=2)
    with pytest.raises(DeployError, match=r"(?s)preflight failed.*127\.0\.0\.3") as ei:
        deploy(parse_cluster(data), run_dir)
    assert ei.value.report is not None and not ei.value.report.ok
    assert not (tmp_path / "work" / "jobs").exists() and JobDB().list() == []


def test_cut_link_then_app_restart_lose_and_repeat_nothing(sshd_pair, tmp_path, config_dir, relay_factory):
    """The tracker's link goes through a relay. Stopping the relay cuts every connection
    mid-run; the same tracker resumes when it is back. Then the app "quits" (with half a
    line in its mirror, as a crash mid-append leaves it) and a new tracker reattaches
    from the job database. Every metric line arrives exactly once."""
    s = sshd_pair.servers[0]
    relay = relay_factory((s.addr, s.port))
    data = relayed_cluster(sshd_pair, tmp_path, relay)
    job = deploy(parse_cluster(data), make_run(tmp_path, 2500))
    seen = []
    tr = Tracker(job.id, on_metrics=seen.extend, lost_after=600)
    wait_for(lambda: tr.poll() and seen)
    relay.stop()  # --- cut
    job = tr.poll()
    assert not tr.nodes[0].reachable and job.state == "running"  # not lost: only briefly unreachable
    n_cut = len(seen)
    time.sleep(1.0)  # the run goes on without us
    relay.start()  # --- back: the same tracker reconnects and resumes from its offset
    wait_for(lambda: tr.poll() and len(seen) > n_cut)
    tr.close()  # --- the app quits, leaving half a line behind
    mirror = JobDB().mirror_dir(job.id) / "metrics.jsonl"
    with open(mirror, "ab") as f:
        f.write(b'{"step": 12345, "lo')
    db = JobDB()  # --- the app starts again and reattaches to the job (running, unless it just ended)
    assert [j.id for j in db.list()] == [job.id]
    with Tracker(db.list()[0].id, db, on_metrics=seen.extend) as tr2:
        job = tr2.follow(interval=0.3)
    assert job.state == "succeeded", job.error
    assert mirror.read_bytes() == remote_file(job, "run/metrics.jsonl")
    assert [r["step"] for r in seen if "loss" in r] == list(range(1, 2501))  # none lost, none twice
    assert db.active() == []


def test_cancel_leaves_no_process_on_either_node(sshd_pair, tmp_path, config_dir):
    c = parse_cluster(sshd_pair.cluster("two", tmp_path / "work", rdzv_port=free_port("127.0.0.2")))
    job = deploy(c, make_run(tmp_path, 200000, dp=2))
    with Tracker(job.id) as tr:
        wait_for(lambda: tr.poll().state == "running" and tr.job.step)
        job = tr.cancel(grace=10)
    assert job.state == "cancelled"
    assert_no_process_left(job)
    assert all(Path(n.jobdir, "cancelled").exists() for n in job.nodes) and len(job.nodes) == 2
