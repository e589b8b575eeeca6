"""Node-side helper, shipped in every bundle as layerflow_jobctl.py (stdlib only).

    python layerflow_jobctl.py status JOBDIR NODE        -> one JSON line
    python layerflow_jobctl.py cancel JOBDIR NODE GRACE  -> one JSON line
    python layerflow_jobctl.py board JOBDIR NODE RECORD SECONDS
        keeps the job's record on the cluster's shared job board (remote/board.py) current
        until the job ends: state and step every SECONDS, and once more at the end
    python layerflow_jobctl.py slurm JOBDIR SLURM_ID         -> one JSON line (on the login node)
    python layerflow_jobctl.py slurm-cancel JOBDIR SLURM_ID GRACE -> one JSON line
    python layerflow_jobctl.py rejoin JOBDIR NODE        -> one JSON line
        starts the node's script again (a node of an elastic job that came back: the
        tracker asks), after ending what is left of its old processes here

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
import subprocess
import sys
import time

TOKEN_VAR = "LAYERFLOW_JOB_TOKEN"
# engine/runtime/records.py CANCEL_FILE (this file ships alone: the name is repeated here):
# written into the run folder before a cancel signals the run, so that the run ends as
# cancelled, never as preempted (engine/runtime/loop.py StopSignal)
CANCEL_FILE = "cancel.requested"


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


def sizes(jobdir: str, node: int, outs: tuple[str, ...] | None = None) -> dict:
    out = {}
    for rel in (*(outs if outs is not None else (f"node{node}.out",)), "run/metrics.jsonl"):
        try:
            out[rel] = os.path.getsize(os.path.join(jobdir, rel))
        except OSError:
            pass
    logs = os.path.join(jobdir, "run", "logs")
    try:
        for name in sorted(os.listdir(logs)):
            if name.endswith((".log", ".system.jsonl")):  # rank logs and each rank's system samples
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


def request_cancel(jobdir: str) -> None:
    """The job folder's `cancelled` (the tracker's record) and the run's CANCEL_FILE (the run's)."""
    with open(os.path.join(jobdir, "cancelled"), "a"):
        pass
    try:
        with open(os.path.join(jobdir, "run", CANCEL_FILE), "w") as f:
            f.write(f"{time.time():.3f}\n")
    except OSError:
        pass  # no run folder: nothing there to tell


def cancel(jobdir: str, node: int, grace: float) -> dict:
    """TERM the job's processes on this node, wait up to `grace` s, KILL what is left, verify."""
    request_cancel(jobdir)
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


def _here(pid: int, jobdir: str) -> bool:
    """The process works in this job folder (several nodes of a job on one machine, as on
    loopback, carry the same token: the folder tells them apart)."""
    try:
        return os.readlink(f"/proc/{pid}/cwd").startswith(os.path.realpath(jobdir))
    except OSError:
        return False


REJOIN_EVERY_S = 60.0  # a node is started again at most this often (several trackers may ask)


def rejoin(jobdir: str, node: int) -> dict:
    """Start node NODE's script again, in a session of its own as deploy did, after ending
    what is left here of its old processes (a node cut off and back: its workers may still
    wait on their peers). The rendezvous takes it in (torchrun --nnodes MIN:MAX)."""
    import fcntl

    mark = os.path.join(jobdir, f"node{node}.rejoin")
    with open(mark, "a+") as m:
        fcntl.flock(m, fcntl.LOCK_EX)  # (two trackers asking at once: one start)
        m.seek(0)
        try:
            since = time.time() - float(m.read().strip())
        except ValueError:  # (never started again)
            since = None
        if since is not None and since < REJOIN_EVERY_S:
            return {"node": node, "started": False, "why": f"started again {since:.0f} s ago"}
        pid = read(os.path.join(jobdir, f"node{node}.pid"))
        pgid = int(pid) if pid else None
        token = read(os.path.join(jobdir, "token")) or ""
        old = [p for p in job_pids(token, pgid) if _here(p, jobdir)]
        if old:
            signal_all(old, None, signal.SIGKILL)
        for name in (f"node{node}.pid", f"node{node}.exit", os.path.join("run", CANCEL_FILE)):
            try:
                os.unlink(os.path.join(jobdir, name))
            except OSError:
                pass
        with open(os.path.join(jobdir, f"node{node}.out"), "ab") as out:
            proc = subprocess.Popen(["sh", f"node{node}.sh"], cwd=jobdir, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        m.seek(0)
        m.truncate()
        m.write(f"{time.time():.3f}\n")
    return {"node": node, "started": True, "pid": proc.pid, "killed": old}


def node_state(info: dict) -> str:
    """A node's job state from its status(): what the tracker concludes for one node."""
    run_state = (info.get("status") or {}).get("state")
    if info["exit"] is not None:
        if info["exit"]:
            return "failed"
        return run_state if run_state in ("cancelled", "preempted") else "succeeded"
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


# Slurm's states once a job has ended (squeue and scontrol drop the "+" of "CANCELLED+")
SLURM_ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
               "DEADLINE", "PREEMPTED", "SPECIAL_EXIT", "REVOKED"}


def _slurm_cmd(args: list[str]) -> tuple[int, str, str]:
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, "", str(exc)
    return r.returncode, r.stdout, r.stderr


def kv_pairs(line: str) -> dict:
    """`scontrol show ... -o` (Key=Value separated by spaces; a value may hold spaces) -> dict."""
    out, key = {}, None
    for tok in line.strip().split(" "):
        k, sep, v = tok.partition("=")
        if sep and k and k[0].isalpha() and all(c.isalnum() or c in "_:/" for c in k):
            key, out[k] = k, v
        elif key is not None:
            out[key] += " " + tok
    return out


def slurm_job(jobdir: str, slurm_id: str) -> dict:
    """What Slurm says of the job: scontrol while it remembers the job, then sacct (when
    accounting is on), then the batch script's exit file. source says which answered."""
    rc, out, err = _slurm_cmd(["scontrol", "show", "job", "-o", slurm_id])
    line = next((ln for ln in out.splitlines() if "JobState=" in ln), None)
    if rc == 0 and line:
        kv = kv_pairs(line)
        return {"source": "scontrol", "state": kv.get("JobState"), "reason": kv.get("Reason"),
                "nodes": kv.get("NodeList"), "exit": kv.get("ExitCode"), "run_time": kv.get("RunTime"),
                "time_limit": kv.get("TimeLimit"), "batch_host": kv.get("BatchHost"),
                "restarts": kv.get("Restarts")}  # (how often Slurm requeued it)
    rc, out, _ = _slurm_cmd(["sacct", "-j", slurm_id, "-X", "-n", "-P", "-o", "State,Reason,NodeList,ExitCode"])
    rows = [ln.split("|") for ln in out.splitlines() if ln.strip()]
    if rc == 0 and rows and len(rows[0]) == 4:
        state, reason, nodes, code = rows[0]
        return {"source": "sacct", "state": state.split(" ")[0].rstrip("+"), "reason": reason, "nodes": nodes,
                "exit": code}
    code = read(os.path.join(jobdir, "batch.exit"))
    if code is not None:
        return {"source": "exit file", "state": "COMPLETED" if code == "0" else "FAILED", "exit": f"{code}:0"}
    return {"source": None, "state": None, "error": (err or "").strip()[-300:]}


def _outs(jobdir: str) -> tuple[str, ...]:
    try:
        names = os.listdir(jobdir)
    except OSError:
        return ()
    return tuple(sorted(n for n in names if n.endswith(".out") and (n.startswith("node") or n.startswith("slurm-"))))


def slurm_status(jobdir: str, slurm_id: str) -> dict:
    st = read(os.path.join(jobdir, "run", "status.json"))
    try:
        st = json.loads(st) if st else None
    except ValueError:
        st = None
    return {"node": 0, "slurm": slurm_job(jobdir, slurm_id), "status": st, "sizes": sizes(jobdir, 0, _outs(jobdir)),
            "cancelled": os.path.exists(os.path.join(jobdir, "cancelled")),
            "checkpoint": read(os.path.join(jobdir, "run", "checkpoints", "latest"))}


def slurm_steps(slurm_id: str) -> list[str]:
    """The job's steps Slurm still runs (squeue -s), batch and extern included."""
    rc, out, _ = _slurm_cmd(["squeue", "-h", "-s", "-j", slurm_id, "-o", "%i"])
    return [ln.strip() for ln in out.splitlines() if ln.strip()] if rc == 0 else []


def slurm_cancel(jobdir: str, slurm_id: str, grace: float) -> dict:
    """scancel, then wait (up to grace s) until Slurm says the job ended and no step is left."""
    request_cancel(jobdir)
    rc, _, err = _slurm_cmd(["scancel", slurm_id])
    deadline = time.monotonic() + grace
    while True:
        job, steps = slurm_job(jobdir, slurm_id), slurm_steps(slurm_id)
        ended = job.get("state") in SLURM_ENDED or job.get("source") is None
        if (ended and not steps) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return {"node": 0, "scancel": rc, "error": err.strip()[-300:] if rc else None, "state": job.get("state"),
            "left": [f"step {x}" for x in steps] + ([] if ended else [f"job {slurm_id} still {job.get('state')}"])}


def main(argv: list[str]) -> int:
    cmd, jobdir = argv[0], argv[1]
    node = int(argv[2]) if cmd in ("status", "cancel", "board", "rejoin") else 0
    if cmd == "status":
        out = status(jobdir, node)
    elif cmd == "cancel":
        out = cancel(jobdir, node, float(argv[3]))
    elif cmd == "board":
        out = board(jobdir, node, argv[3], float(argv[4]))
    elif cmd == "rejoin":
        out = rejoin(jobdir, node)
    elif cmd == "slurm":
        out = slurm_status(jobdir, argv[2])
    elif cmd == "slurm-cancel":
        out = slurm_cancel(jobdir, argv[2], float(argv[3]))
    else:
        print(f"unknown command {cmd!r}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
