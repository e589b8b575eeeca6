"""What recovering from a lost rank or host costs, and what a checkpoint blocks (issue 56).

    python bench/recovery_cost.py [--kills 2] [--cluster-kills 2] [--gpts 2x128,8x512]

1. Time lost per failure, locally: the digits MLP on 2 processes (torchrun, gloo), rank 1
   SIGKILLed 5 steps after its second checkpoint, the run restarting by itself. Its parts:
   detection (the kill to the agent seeing it: torchrun's log line), restart (the failure
   to the next attempt being recorded: recovery.py's down_s, i.e. the agent stopping the
   group, the backoff, new processes importing torch, the rendezvous and the checkpoint's
   load), to the first step (from there to the attempt's first step), and redo (the steps
   after the checkpoint trained again, at the run's own step time).
2. The same on the loopback cluster of the tests (two sshd hosts on 127.0.0.2 and .3,
   tests/remote/sshd_helpers.py; as tests/remote/test_elastic.py): dp=2, one process per
   host, host 2 lost (its processes SIGKILLed, its sshd stopped: sshd_helpers.lose_host);
   the job goes on on host 1 at dp=1, two micro-batches per step. Parts from host 1's
   torchrun log (LOGLEVEL=INFO) and run folder: detection (the kill to the agent's "failed"
   line; rank 0's own gloo error comes first), the rendezvous without host 2 (to "Rendezvous
   complete"), the new worker (to its attempt in attempts.jsonl: torch's import, the
   backoff, the process group, the re-plan, the checkpoint's load), then its first step, and
   redo at the new attempt's step time. Every job process and sshd it started is ended,
   also on Ctrl-C or SIGTERM.
3. What the steps wait for a checkpoint, synchronous against asynchronous
   (training.checkpoint_async), on the examples' GPT (nanoGPT's architecture from
   tests/models/real_models.py, imported as bench/compile_speed.py does; the transformer
   example is one block classifying sequences, no GPT) at two sizes, one process, AdamW: the
   run's checkpoint records (blocked_s, write_s). An async save still in flight when the
   next is due makes that one wait for it (one save in flight).
Not a test: numbers depend on this machine and its load (printed with each table).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "remote"))  # the test fixtures' sshd (sshd_helpers.py)
sys.path.insert(0, str(ROOT / "tests" / "models"))  # the GPT of the tests (nanoGPT's architecture)

from engine.project import Restarts, load_project  # noqa: E402
from engine.runs.build import prepare_run  # noqa: E402
from engine.runtime.records import RunStatus  # noqa: E402
from engine.runtime.recovery import read_attempts  # noqa: E402
from engine.runtime.train import run  # noqa: E402
from remote.launch.local import launch_local  # noqa: E402

EX = ROOT / "resources" / "examples"


def one_kill(tmp: Path, steps: int) -> dict:
    p = load_project(EX / "mlp_digits.lflow")
    p.training = p.training.model_copy(update={"steps": steps, "checkpoint_interval": steps // 10,
                                               "eval_interval": 10 ** 6, "log_interval": 1,
                                               "restarts": Restarts(backoff_s=0.5)})
    d = prepare_run(p, tmp / f"run{time.perf_counter_ns()}", placement={"dp": 2})
    job = launch_local(d, 2)
    try:
        target = 2 * (steps // 10) + 5
        while (RunStatus.read(d) or RunStatus()).step < target:
            time.sleep(0.02)
        killed = time.time()
        os.kill(job.rank_pid(1), signal.SIGKILL)
        if job.wait(timeout=600) != 0:
            raise SystemExit(job.describe_failure())
    finally:  # (Ctrl-C: torchrun and its workers ended here)
        if job.poll() is None:
            job.terminate(grace=5.0)
    recs = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    restart = next(r for r in recs if r.get("event") == "restart")
    attempt = read_attempts(d)[1]
    first = next(r for r in recs if "loss" in r and r["step"] == restart["step"] + 1)
    # step times of the unbroken stretch before the kill (metrics "time": seconds of training)
    times = [r["time"] for r in recs if "loss" in r and r["step"] <= attempt["after"]["step"]]
    step_s = statistics.median(b - a for a, b in zip(times, times[1:]))
    seen = _agent_saw(d, killed)
    return {"detection_s": seen - killed if seen else float("nan"), "down_s": restart["down_s"],
            "load_s": first["time"] - restart["time"],
            "redo_s": (attempt["after"]["step"] - restart["step"]) * step_s,
            "redo_steps": attempt["after"]["step"] - restart["step"],
            "total_s": (attempt["started"] - killed) + (first["time"] - restart["time"])
            + (attempt["after"]["step"] - restart["step"]) * step_s}


def _agent_saw(log: Path, after: float) -> float | None:
    """When torchrun logged the failed worker."""
    if log.is_dir():
        log = log / "logs" / "launcher.log"
    return _logged_at(log, r"failed \(exitcode", after)


def _logged_at(log: Path, pattern: str, after: float) -> float | None:
    """The first line of a torchrun log matching `pattern` at or after `after` (less a second):
    its lines carry the time of day (`E1207 23:28:41.582000 ...`)."""
    text = log.read_text(errors="replace")
    for m in re.finditer(r"^[EIW](\d{4}) (\d\d):(\d\d):(\d\d\.\d+) (.*)$", text, re.M):
        if not re.search(pattern, m.group(5)):
            continue
        h, mi, sec = int(m.group(2)), int(m.group(3)), float(m.group(4))
        lt = time.localtime(after)
        t = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, h, mi, 0, 0, 0, -1)) + sec
        if t >= after - 1:
            return t
    return None


def cluster_kill(tmp: Path, steps: int) -> dict:
    """The loopback cluster of the tests (two sshd hosts on 127.0.0.2/3, tests/remote/test_elastic.py):
    the digits MLP at dp=2, one process per host; host 2 lost 5 steps after the second checkpoint
    (its processes SIGKILLed, its sshd stopped); the job goes on on host 1 at dp=1 with two
    micro-batches per step. The parts as locally, read from host 1's run folder and torchrun log."""
    from sshd_helpers import SshEnv, cwd_of, free_port, lose_host

    from remote.cluster import parse_cluster
    from remote.jobctl import cancel, job_pids, read
    from remote.launch.ssh_torchrun import deploy, prepare
    from remote.tracker import Tracker

    p = load_project(EX / "mlp_digits.lflow")
    interval = steps // 10
    p.training = p.training.model_copy(update={"steps": steps, "checkpoint_interval": interval,
                                               "eval_interval": 10 ** 6, "log_interval": 1,
                                               "restarts": Restarts(backoff_s=0.5)})
    rd = prepare(p, tmp / f"prepared{time.perf_counter_ns()}" / "run", steps=steps, placement={"dp": 2})
    (tmp / "ssh").mkdir(exist_ok=True)
    env = SshEnv(Path(tempfile.mkdtemp(dir=tmp / "ssh")))
    job = None
    try:
        for srv in env.servers:
            srv.start()
        # LOGLEVEL=INFO: torchrun's agent logs its rendezvous rounds (with the time of day)
        c = parse_cluster(env.cluster("bench", tmp / "work", rdzv_port=free_port(env.servers[0].addr),
                                      env={"OMP_NUM_THREADS": "1", "LOGLEVEL": "INFO"}))
        job = deploy(c, rd)
        home = Path(job.nodes[0].jobdir) / "run"
        target = 2 * interval + 5
        with Tracker(job.id, lost_after=3.0) as tr:
            deadline = time.monotonic() + 300
            while (RunStatus.read(home) or RunStatus()).step < target:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the cluster job did not reach step {target}")
                time.sleep(0.02)
            killed = time.time()
            lose_host(job, job.nodes[1], env.servers[1])
            end = tr.follow(interval=0.5)
        if end.state != "succeeded":
            raise SystemExit(f"the cluster job ended {end.state}: {end.error}")
        recs = [json.loads(line) for line in (home / "metrics.jsonl").read_text().splitlines()]
        restart = next(r for r in recs if r.get("event") == "restart")
        attempt = read_attempts(home)[1]
        first = next(r for r in recs if "loss" in r and r["step"] == restart["step"] + 1)
        # the steps redone run at the new attempt's step time (dp=1, two micro-batches)
        times = [r["time"] for r in recs if "loss" in r and r["time"] >= first["time"]]
        step_s = statistics.median(b - a for a, b in zip(times, times[1:]))
        log = Path(job.nodes[0].jobdir) / "node0.out"  # host 1's torchrun
        seen = _agent_saw(log, killed)
        regrouped = _logged_at(log, r"Rendezvous complete for workers", seen or killed)
        redo = attempt["after"]["step"] - restart["step"]
        nan = float("nan")
        return {"error_s": attempt["after"]["at"] - killed, "detection_s": seen - killed if seen else nan,
                "rendezvous_s": regrouped - seen if seen and regrouped else nan,
                "worker_s": attempt["started"] - regrouped if regrouped else nan,
                "waited_s": attempt.get("waited_s", 0.0), "load_s": first["time"] - restart["time"],
                "redo_s": redo * step_s, "redo_steps": redo,
                "total_s": (attempt["started"] - killed) + (first["time"] - restart["time"]) + redo * step_s,
                "world": f"{read_attempts(home)[0]['world']} -> {attempt['world']}",
                "accumulation": (attempt.get("resized") or {}).get("accumulation")}
    finally:  # nothing left behind: the job on both hosts (they are this machine), then the sshds
        if job is not None:
            for n in job.nodes:
                pid = read(str(Path(n.jobdir, f"node{n.index}.pid")))
                if pid and job_pids(job.token, int(pid)):
                    cancel(n.jobdir, n.index, 5.0)
        work = str(tmp / "work")  # (interrupted inside deploy: no job yet, its processes by their folder)
        for q in (int(x) for x in os.listdir("/proc") if x.isdigit()):
            if cwd_of(q).startswith(work):
                try:
                    os.kill(q, signal.SIGKILL)
                except OSError:
                    pass
        for srv in env.servers:
            srv.stop()


def gpt_project(tmp: Path, blocks: int, width: int) -> tuple[Path, int]:
    """The examples' GPT (nanoGPT's architecture, tests/models/real_models.py, imported as
    bench/compile_speed.py does): vocabulary 2048, 64 tokens. (The project file, parameters.)"""
    import torch
    from real_models import GPT

    from engine.interop import save_imported
    from engine.interop.module.importer import from_module

    torch.manual_seed(0)
    m = GPT(vocab_size=2048, block_size=64, n_layer=blocks, n_head=4, n_embd=width).eval()
    n = sum(x.numel() for x in m.parameters())
    return save_imported(from_module(m, [[64]], ["int64"]), tmp / f"gpt{blocks}x{width}.lflow"), n


def blocking(tmp: Path, path: Path, asynchronous: bool, steps: int, batch: int) -> tuple[float, float]:
    """(median wait of the steps per checkpoint, median whole save) of one process's run, AdamW."""
    p = load_project(path)
    p.training = p.training.model_copy(update={"steps": steps, "epochs": None, "batch_size": batch,
                                               "checkpoint_interval": max(1, steps // 4),
                                               "eval_interval": 10 ** 6, "checkpoint_async": asynchronous})
    p.training.optimizer.name = "adamw"
    d = prepare_run(p, tmp / f"ck{path.stem}{asynchronous}")
    state = run(d).state
    if _interrupted:  # the runtime takes Ctrl-C as a stop of its run: the bench stops too
        raise KeyboardInterrupt
    if state != "succeeded":
        raise SystemExit(f"the {path.stem} run failed")
    recs = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    ck = [r for r in recs if r.get("event") == "checkpoint"]
    return statistics.median(r["blocked_s"] for r in ck), statistics.median(r["write_s"] for r in ck)


_interrupted = False


def _interrupt(*_):
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt  # a SIGTERM cleans up as Ctrl-C does (the finally blocks)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=2, help="local kills")
    ap.add_argument("--cluster-kills", type=int, default=2, help="lost hosts on the loopback cluster")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--gpts", default="2x128,8x512", help="BLOCKSxWIDTH,...")
    ap.add_argument("--gpt-steps", type=int, default=8)
    ap.add_argument("--gpt-batch", type=int, default=4)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        os.environ["LAYERFLOW_CONFIG_DIR"] = str(tmp / "config")  # the job database of this bench only
        print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
        rows = [one_kill(tmp, args.steps) for _ in range(args.kills)]
        print("local, 2 processes, rank 1 SIGKILLed:")
        print("| failure | detection | restart (to the attempt recorded) | then to its first step | redo | total lost |")
        print("|---|---|---|---|---|---|")
        for i, r in enumerate(rows, 1):
            print(f"| kill {i} | {r['detection_s']:.2f} s | {r['down_s']:.2f} s | {r['load_s']:.2f} s | "
                  f"{r['redo_s']:.2f} s ({r['redo_steps']} steps) | {r['total_s']:.2f} s |")
        print(f"load average {os.getloadavg()[0]:.2f}\n", flush=True)
        rows = [cluster_kill(tmp, args.steps) for _ in range(args.cluster_kills)]
        print("loopback cluster, dp=2 on 2 sshd hosts, host 2 lost:")
        print("| failure | detection | rendezvous without host 2 | new worker to the attempt recorded | "
              "then to its first step | redo | total lost |")
        print("|---|---|---|---|---|---|---|")
        for i, r in enumerate(rows, 1):
            print(f"| host lost {i} | {r['detection_s']:.2f} s (rank 0's error at {r['error_s']:.2f} s) | "
                  f"{r['rendezvous_s']:.2f} s | {r['worker_s']:.2f} s (backoff {r['waited_s']:g} s) | "
                  f"{r['load_s']:.2f} s | {r['redo_s']:.2f} s ({r['redo_steps']} steps) | {r['total_s']:.2f} s |")
        print(f"world {rows[-1]['world']}, accumulation {rows[-1]['accumulation']}; "
              f"load average {os.getloadavg()[0]:.2f}\n", flush=True)
        print("| model | checkpoint, steps wait (sync) | (async) | ratio | whole save (async) |")
        print("|---|---|---|---|---|")
        for spec in args.gpts.split(","):
            blocks, width = (int(x) for x in spec.split("x"))
            path, n = gpt_project(tmp, blocks, width)
            (s, _), (a, w) = (blocking(tmp, path, False, args.gpt_steps, args.gpt_batch),
                              blocking(tmp, path, True, args.gpt_steps, args.gpt_batch))
            print(f"| GPT {blocks} blocks, width {width} ({n / 1e6:.1f}M parameters) | {s * 1e3:.1f} ms | "
                  f"{a * 1e3:.1f} ms | {s / a:.1f}x | "
                  f"{w * 1e3:.0f} ms |", flush=True)
        print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
