"""remote/launch/procs.py on real process trees shaped like a torchrun launch: a leader in a
group of its own, a worker in a session of its own (out of the leader's group), and
the worker's helper in the worker's group."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from remote.launch.procs import ProcessTree, alive, descendants, group_pids, signal_tree, stop_tree

# The worker: on SIGTERM ends its helper and exits (polite), or ignores it (stuck).
WORKER = r"""
import signal, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
def term(*_):
    helper.kill(); helper.wait(); sys.exit(0)
signal.signal(signal.SIGTERM, term if sys.argv[1] == "polite" else signal.SIG_IGN)
print(helper.pid, flush=True)
time.sleep(120)
"""

# The leader: passes SIGTERM on to its worker and waits for it (as torchrun does), or
# exits at once and leaves the worker behind; its exit code is 7 either way.
LEADER = r"""
import signal, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]], stdout=subprocess.PIPE,
                          start_new_session=True)
helper = worker.stdout.readline().decode().strip()
def term(*_):
    if sys.argv[1] == "polite":
        worker.send_signal(signal.SIGTERM); worker.wait()
    sys.exit(7)
signal.signal(signal.SIGTERM, term)
print(worker.pid, helper, flush=True)
time.sleep(120)
"""


def start(mode: str):
    leader = subprocess.Popen([sys.executable, "-c", LEADER, mode, WORKER], stdout=subprocess.PIPE,
                              start_new_session=True)
    worker, helper = map(int, leader.stdout.readline().split())
    return leader, worker, helper


@pytest.fixture
def cleanup():
    pids = []
    yield pids
    for pid in pids:  # whatever failed, leave nothing behind
        for send in (os.killpg, os.kill):
            try:
                send(pid, signal.SIGKILL)
            except OSError:
                pass


def test_the_tree_is_found_beyond_the_group(cleanup):
    leader, worker, helper = start("polite")
    cleanup += [leader.pid, worker, helper]
    assert descendants(leader.pid) >= {worker, helper}
    assert group_pids(leader.pid) == [leader.pid]  # the worker lives in a session of its own
    assert group_pids(worker) == sorted([worker, helper])
    assert alive(worker) and not alive(2 ** 22 + 1)
    leader.kill()
    time.sleep(0.3)
    assert not alive(leader.pid)  # a zombie until reaped: not alive
    leader.wait()


def test_a_polite_stop_ends_before_the_grace_and_keeps_the_exit_code(cleanup):
    leader, worker, helper = start("polite")
    cleanup += [leader.pid, worker, helper]
    seen: dict = {}
    t0 = time.monotonic()
    left = stop_tree(leader.pid, leader.pid, 30.0, signal.SIGTERM, seen=seen)
    assert left == [] and time.monotonic() - t0 < 20
    assert {worker, helper} <= set(seen)
    assert leader.wait(5) == 7  # nothing in procs reaped the leader: Popen still has its code
    assert not any(alive(p) for p in (worker, helper))


def test_a_stuck_worker_is_killed_with_its_group_after_the_grace(cleanup):
    leader, worker, helper = start("stuck")  # the leader exits, the worker ignores SIGTERM
    cleanup += [leader.pid, worker, helper]
    t0 = time.monotonic()
    left = stop_tree(leader.pid, leader.pid, 1.5, signal.SIGTERM)
    took = time.monotonic() - t0
    assert left == []
    assert took >= 1.4  # the worker had its grace period before SIGKILL
    assert not alive(worker) and not alive(helper)  # the helper in the worker's group too
    assert leader.wait(5) == 7


def test_signal_tree_kills_every_group_and_group_only_does_not(cleanup):
    leader, worker, helper = start("stuck")
    cleanup += [leader.pid, worker, helper]
    seen: dict = {}
    assert signal_tree(leader.pid, leader.pid, signal.SIGCONT, seen=seen, group_only=True) == [leader.pid]
    hit = signal_tree(leader.pid, leader.pid, signal.SIGKILL, seen=seen)
    assert set(hit) == {leader.pid, worker, helper}
    assert leader.wait(5) == -signal.SIGKILL
    end = time.monotonic() + 5
    while time.monotonic() < end and (alive(worker) or alive(helper)):
        time.sleep(0.05)
    assert not alive(worker) and not alive(helper)


def _poll_until_done(tree, timeout: float) -> tuple[int | None, float]:
    """What the GUI does: poll() at 20 Hz, never blocking; (exit code, longest poll call)."""
    end, longest = time.monotonic() + timeout, 0.0
    while time.monotonic() < end:
        t = time.monotonic()
        code = tree.poll()
        longest = max(longest, time.monotonic() - t)
        if code is not None:
            return code, longest
        time.sleep(0.05)
    return None, longest


def test_a_process_tree_stopped_from_a_poll_kills_a_stuck_worker_after_the_grace(cleanup):
    """The one stop path of both launchers (ProcessTree): request_stop asks, poll()
    escalates to SIGKILL once the grace is over and calls the run over only when the
    leader *and* its worker (in a session of its own) are gone."""
    leader, worker, helper = start("stuck")  # the leader exits on SIGTERM, the worker ignores it
    cleanup += [leader.pid, worker, helper]
    tree = ProcessTree(leader, signal.SIGTERM, grace_s=30.0)
    assert {worker, helper} <= set(tree.seen) and tree.poll() is None
    t0 = time.monotonic()
    tree.request_stop(1.0)
    code, longest = _poll_until_done(tree, 15)
    took = time.monotonic() - t0
    assert code == 7 and tree.stop_requested  # the leader's own exit code, kept for Popen
    assert took >= 0.9  # the worker had its grace before SIGKILL
    assert longest < 1.0  # no poll call waited out the grace
    assert not alive(worker) and not alive(helper) and tree.leftovers() == []


def test_a_worker_that_outlives_its_leader_is_ended_before_the_run_is_over(cleanup):
    leader, worker, helper = start("polite")
    cleanup += [leader.pid, worker, helper]
    tree = ProcessTree(leader, signal.SIGTERM, grace_s=5.0)
    os.kill(leader.pid, signal.SIGKILL)  # the leader dies without passing anything on
    leader.wait(5)
    assert alive(worker)
    assert tree.poll() is None  # not over: its worker still runs; poll asked it to end (SIGTERM)
    code, _ = _poll_until_done(tree, 10)
    assert code == -signal.SIGKILL and not alive(worker) and not alive(helper)


def test_a_process_tree_stop_waits_and_returns_the_exit_code(cleanup):
    leader, worker, helper = start("polite")
    cleanup += [leader.pid, worker, helper]
    tree = ProcessTree(leader, signal.SIGTERM)
    assert tree.stop(20.0) == 7 and tree.leftovers() == [] and not alive(worker)


def test_jobctl_rejoin_ends_what_is_left_of_the_node_and_starts_its_script_once(tmp_path):
    """jobctl rejoin (the tracker, for a returning node of an elastic job): a process of the
    node's job still working in its folder is ended first, the node's script runs again in a
    session of its own (a fresh pid file, no stale exit code or cancel request), and a second
    ask within REJOIN_EVERY_S starts nothing."""
    from remote import jobctl

    jobdir = tmp_path / "node1"
    (jobdir / "run").mkdir(parents=True)
    (jobdir / "token").write_text("tok")
    (jobdir / "node1.exit").write_text("1")
    (jobdir / "run" / jobctl.CANCEL_FILE).write_text("0")
    (jobdir / "node1.sh").write_text("echo $$ > node1.pid\nexec sleep 60\n")
    old = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=jobdir,
                           env={**os.environ, jobctl.TOKEN_VAR: "tok"})
    elsewhere = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=tmp_path,
                                 env={**os.environ, jobctl.TOKEN_VAR: "tok"})  # another node's, on this machine
    try:
        time.sleep(0.3)
        got = jobctl.rejoin(str(jobdir), 1)
        assert got["started"] and got["killed"] == [old.pid]
        assert old.wait(5) == -signal.SIGKILL and elsewhere.poll() is None
        assert not (jobdir / "node1.exit").exists() and not (jobdir / "run" / jobctl.CANCEL_FILE).exists()
        for _ in range(50):
            if (jobdir / "node1.pid").exists():
                break
            time.sleep(0.1)
        pid = int((jobdir / "node1.pid").read_text())
        assert pid == got["pid"] and os.getpgid(pid) == pid and alive(pid)
        again = jobctl.rejoin(str(jobdir), 1)
        assert not again["started"] and "ago" in again["why"] and alive(pid)
    finally:
        for p in (old, elsewhere):
            p.kill()
            p.wait()
        if (jobdir / "node1.pid").exists():
            os.killpg(int((jobdir / "node1.pid").read_text()), signal.SIGKILL)
