"""The shared job board, with two real users of one cluster.

Two local users (made here with useradd, in a group made here) log in to the loopback
sshd, each from a "machine" of their own (a config folder of their own: cluster profile
and job database). Both deploy to the cluster, whose shared_dir is group-writable. Each
sees both jobs, read from the cluster's board; each follows the other's (metrics by byte
offset); each may cancel only their own; the board shows how every job ended, and no
process of either is left."""
from __future__ import annotations

import grp
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.cli import main

from sshd_helpers import REMOTE_PYTHON

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"


@pytest.fixture
def team(sshd_pair, tmp_path):
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("the job board test makes two users: it needs root and useradd (the CI runs as root)")
    tag = secrets.token_hex(3)
    group, users = f"lflab{tag}", [f"lfa{tag}", f"lfb{tag}"]
    subprocess.run(["groupadd", group], check=True)
    for u in users:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", "-G", group, u], check=True)
        subprocess.run(["usermod", "-p", "*", u], check=True)  # no password, yet not locked: key login only
    # the users run this interpreter and read the test's key files: let them through the
    # folders above them (o+x only), as long as the test lasts
    changed: dict[Path, int] = {}
    for p in (Path(sys.executable), Path(os.path.realpath(sys.executable)), Path(sys.prefix), tmp_path,
              sshd_pair.root):
        for d in [p, *p.parents]:
            if d.is_dir() and not d.stat().st_mode & stat.S_IXOTH:
                changed[d] = d.stat().st_mode
                os.chmod(d, d.stat().st_mode | stat.S_IXOTH)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 0, grp.getgrnam(group).gr_gid)
    os.chmod(shared, 0o2775)
    try:
        yield users, shared
    finally:
        for u in users:
            subprocess.run(["pkill", "-KILL", "-u", u], check=False)
        time.sleep(0.5)
        for u in users:
            subprocess.run(["userdel", "-r", "-f", u], check=False, capture_output=True)
        subprocess.run(["groupdel", group], check=False)
        for d, mode in changed.items():
            os.chmod(d, stat.S_IMODE(mode))


def _board(capsys) -> dict[str, dict]:
    assert main(["jobs", "--cluster", "lab", "--all", "--json"]) == 0
    return {r["id"]: r for r in json.loads(capsys.readouterr().out)}


def _until(fn, timeout: float = 90.0, every: float = 1.0):
    end = time.monotonic() + timeout
    while True:
        got = fn()
        if got or time.monotonic() > end:
            return got
        time.sleep(every)


@pytest.mark.slow
@pytest.mark.xdist_group("remote-deploy")
def test_everyone_sees_and_follows_every_job_and_cancels_only_their_own(sshd_pair, team, tmp_path, monkeypatch,
                                                                         capsys, qtbot):
    (alice, bob), shared = team
    s = sshd_pair.servers[0]

    def as_(user: str) -> None:  # this user's own machine: profile and job database
        monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / f"cfg-{user}"))

    proj = tmp_path / "mlp.lflow"
    shutil.copy(EXAMPLES / "mlp_digits.lflow", proj)
    ids = {}
    for u in (alice, bob):
        as_(u)
        assert main(["cluster", "add", "lab", "--host", f"{u}@{s.addr}:{s.port}", "--identity",
                     str(sshd_pair.client_key), "--workdir", str(shared / f"work-{u}"), "--python", REMOTE_PYTHON,
                     "--known-hosts", str(sshd_pair.known_hosts), "--env", "OMP_NUM_THREADS=1",
                     "--shared-dir", str(shared)]) == 0
        capsys.readouterr()
        code = main(["deploy", str(proj), "--cluster", "lab", "--steps", "1000000", "--out", str(tmp_path / f"rd-{u}")])
        out, err = capsys.readouterr()
        assert code == 0, err
        ids[u] = out.strip()
    assert (shared / "jobs" / f"{ids[alice]}.json").is_file()

    # each sees both jobs, with their owners, from the cluster (not from their own database)
    for u in (alice, bob):
        as_(u)
        board = _until(lambda: (b := _board(capsys)) and all(b[i]["state"] == "running" and b[i]["step"]
                                                                for i in ids.values()) and b)
        assert board, "the board never showed both jobs running"
        assert {board[ids[alice]]["owner"], board[ids[bob]]["owner"]} == {alice, bob}
        assert board[ids[alice]]["world_size"] == 1 and len(board[ids[alice]]["hosts"]) == 1

    # bob follows alice's job: its metrics arrive by byte offset, none lost or repeated
    as_(bob)
    assert main(["jobs", "--cluster", "lab", "--all"]) == 0
    table = capsys.readouterr().out
    assert f"{bob} (you)" in table and alice in table and table.count("running") == 2
    import layerflow as lf

    assert {r["owner"] for r in lf.cluster_jobs("lab")} == {alice, bob}
    assert main(["status", ids[alice]]) == 0
    out = capsys.readouterr().out
    assert "running" in out and f"owner: {alice} (a teammate's job: read only)" in out
    job = lf.Job(ids[alice])
    first = job.status().step
    assert _until(lambda: job.status().step > first + 5, timeout=60)
    lines = (job.mirror / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(ln)["step"] for ln in lines if '"loss"' in ln]
    assert len(steps) >= 2 and steps == sorted(set(steps))
    job.close()

    # the Remote jobs panel's Everyone view: both jobs, with owners; Cancel only on his own
    from app.jobs_panel import JobsController, JobsPanel

    controller = JobsController()
    panel = JobsPanel(controller)
    qtbot.addWidget(panel)
    try:
        panel.show_everyone("lab")
        qtbot.waitUntil(lambda: sorted(panel.job_ids()) == sorted(ids.values()), timeout=60_000)
        owners = {panel.table.item(r, 0).text(): panel.table.item(r, 6).text() for r in range(panel.table.rowCount())}
        assert owners == {ids[alice]: alice, ids[bob]: bob}
        panel.select_job(ids[alice])
        assert not panel.buttons["Cancel"].isEnabled() and alice in panel.buttons["Cancel"].toolTip()
        panel.select_job(ids[bob])
        assert panel.buttons["Cancel"].isEnabled()
    finally:
        controller.shutdown()

    # ... but cannot cancel it; his own he can
    assert main(["cancel", ids[alice]]) == 2
    assert f"belongs to {alice}" in capsys.readouterr().err
    assert main(["cancel", ids[bob]]) == 0
    as_(alice)
    assert main(["status", ids[alice]]) == 0 and "running" in capsys.readouterr().out  # untouched by bob
    assert main(["status", ids[bob]]) == 0  # and she follows his, read only
    assert f"owner: {bob} (a teammate's job: read only)" in capsys.readouterr().out
    assert main(["cancel", ids[alice]]) == 0
    capsys.readouterr()

    # the board says how each ended (node 0 keeps its record), and nothing of either is left
    board = _until(lambda: (b := _board(capsys)) and all(b[i]["state"] == "cancelled" for i in ids.values()) and b)
    assert board, _board(capsys)
    for u in (alice, bob):
        left = _until(lambda: not subprocess.run(["pgrep", "-u", u], capture_output=True).stdout, timeout=30)
        assert left, subprocess.run(["ps", "-u", u, "-o", "pid,args"], capture_output=True, text=True).stdout
