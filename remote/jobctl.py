"""Node-side helper, shipped in every bundle as layerflow_jobctl.py (stdlib only).

    python layerflow_jobctl.py status JOBDIR NODE        -> one JSON line
    python layerflow_jobctl.py cancel JOBDIR NODE GRACE  -> one JSON line
    python layerflow_jobctl.py board JOBDIR NODE RECORD SECONDS
        keeps the job's record on the cluster's shared job board (remote/board.py) current
        until the job ends: state and step every SECONDS, and once more at the end

Asking the node itself keeps each tracker round to one SSH command per node and
keeps shell quoting out of the logic. A job's processes are found two ways: the
process group of the node script (setsid made it a session leader: pid == pgid),
and the environment token LAYERFLOW_JOB_TOKEN that every process of the job
inherits; the second matters because torchrun starts each worker in a session of
its own, out of reach of a signal to the launcher's group.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

TOKEN_VAR = "LAYERFLOW_JOB_TOKEN"


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def job_pids(token: str, pgid: int | None) -> list[int]:
    """Every live process of this job: in its process group or carrying its token."""
    me, found = os.getpid(), []
    needle = f"{TOKEN_VAR}={token}".encode()
    # another user's job (a teammate following it): its token is private, its process
    # group is not, and the node shell leading that group lives as long as the job
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            stat = read(f"/proc/{pid}/stat") or ""
            fields = stat.rsplit(")", 1)[1].split()
            state, pg = fields[0], int(fields[2])
            if state == "Z":  # a zombie is already dead; its parent will reap it
                continue
            if pgid and pg == pgid:
                found.append(pid)
                continue
            if token:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(pid)
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return sorted(found)


def sizes(jobdir: str, node: int) -> dict:
    out = {}
    for rel in (f"node{node}.out", "run/metrics.jsonl"):
        try:
            out[rel] = os.path.getsize(os.path.join(jobdir, rel))
        except OSError:
            pass
    logs = os.path.join(jobdir, "run", "logs")
    try:
        for name in sorted(os.listdir(logs)):
            if name.endswith(".log"):
                out[f"run/logs/{name}"] = os.path.getsize(os.path.join(logs, name))
    except OSError:
        pass
    return out


def status(jobdir: str, node: int) -> dict:
    pid = read(os.path.join(jobdir, f"node{node}.pid"))
    exit_code = read(os.path.join(jobdir, f"node{node}.exit"))
    token = read(os.path.join(jobdir, "token")) or ""
    pids = job_pids(token, int(pid) if pid else None) if token or pid else []
    st = read(os.path.join(jobdir, "run", "status.json"))
    try:
        st = json.loads(st) if st else None
    except ValueError:
        st = None  # caught mid-write; the next round reads it
    return {"node": node, "pid": int(pid) if pid else None, "exit": int(exit_code) if exit_code else None,
            "alive": bool(pids), "pids": pids, "cancelled": os.path.exists(os.path.join(jobdir, "cancelled")),
            "status": st, "sizes": sizes(jobdir, node)}


def signal_all(pids: list[int], pgid: int | None, sig: int) -> None:
    if pgid:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass


def cancel(jobdir: str, node: int, grace: float) -> dict:
    """TERM the job's processes on this node, wait up to `grace` s, KILL what is left, verify."""
    with open(os.path.join(jobdir, "cancelled"), "a"):
        pass
    pid = read(os.path.join(jobdir, f"node{node}.pid"))
    pgid = int(pid) if pid else None
    token = read(os.path.join(jobdir, "token")) or ""
    pids = job_pids(token, pgid)
    signal_all(pids, pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        time.sleep(0.1)
        pids = job_pids(token, pgid)
    killed = list(pids)
    if pids:
        signal_all(pids, pgid, signal.SIGKILL)
        for _ in range(50):
            time.sleep(0.1)
            pids = job_pids(token, pgid)
            if not pids:
                break
    return {"node": node, "killed": killed, "left": pids}


def node_state(info: dict) -> str:
    """A node's job state from its status(): what the tracker concludes for one node."""
    run_state = (info.get("status") or {}).get("state")
    if info["exit"] is not None:
        if info["exit"]:
            return "failed"
        return "cancelled" if run_state == "cancelled" else "succeeded"
    if info["cancelled"] and not info["alive"]:
        return "cancelled"
    if info["alive"]:
        return "running"
    return "lost" if info["pid"] else "pending"


def board(jobdir: str, node: int, record: str, every: float) -> dict:
    """Keep the job board's record of this job current until the job has ended."""
    while True:
        info = status(jobdir, node)
        state = node_state(info)
        try:
            with open(record) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            rec = None  # not written yet, or replaced meanwhile: the next round
        if rec is not None:
            st = info.get("status") or {}
            rec.update(state=state, step=st.get("step", rec.get("step")), updated=time.time(),
                       error=st.get("error") if state == "failed" else None)
            tmp = f"{record}.{os.getpid()}.tmp"
            try:
                with open(tmp, "w") as f:
                    json.dump(rec, f, sort_keys=True)
                os.chmod(tmp, 0o664)
                os.replace(tmp, record)
            except OSError:
                pass  # the board is a courtesy to teammates: never a reason to fail
        if state not in ("running", "pending"):
            return {"node": node, "state": state}
        time.sleep(every)


def main(argv: list[str]) -> int:
    cmd, jobdir, node = argv[0], argv[1], int(argv[2])
    if cmd == "status":
        out = status(jobdir, node)
    elif cmd == "cancel":
        out = cancel(jobdir, node, float(argv[3]))
    elif cmd == "board":
        out = board(jobdir, node, argv[3], float(argv[4]))
    else:
        print(f"unknown command {cmd!r}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
