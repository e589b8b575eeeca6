"""Local multi-process training: torchrun on this machine, as a Job.

    job = launch_local(run_dir, nproc)      # returns at once
    job.wait()                              # exit code; Ctrl-C ends every process
    job.failure                             # (rank, traceback) of the first rank that failed

torchrun starts in its own session (start_new_session), so a signal to its
process group never reaches the caller; torchrun in turn starts every worker in a
session of its own. terminate() therefore sends SIGTERM to torchrun's group (it
forwards it to its workers, and the runtime checkpoints and stops after the
current step), waits, and then SIGKILLs torchrun's group and every worker's group
it has seen, so no orphan survives (a remote/launch/procs.py ProcessTree: the GUI's runs
are stopped by the same class). The runtime picks gloo on CPU and nccl when GPUs
exist (engine/runtime/parallel_trainer.py). No Qt here.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from engine.runtime import ENTRY
from engine.runtime.records import RankError, RunStatus, clear_cancel, last_traceback, request_cancel
from engine.runtime.spec import RunSpec
from remote.launch import procs

CODE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds engine/


@dataclass
class LocalJob:
    """A run on this machine: its folder, and its processes (torchrun, or the trainer
    itself, and every worker: a procs.ProcessTree, the stop path the GUI's runs use too)."""
    run_dir: Path
    nproc: int
    proc: subprocess.Popen
    log_path: Path
    failure: tuple[int, str] | None = None
    returncode: int | None = None
    tree: procs.ProcessTree | None = None

    def __post_init__(self) -> None:
        if self.tree is None:
            self.tree = procs.ProcessTree(self.proc, signal.SIGTERM)
        # a stop from here (terminate, Ctrl-C, the GUI's stop through the tree) is the user's
        # cancel, even where the run would read a bare SIGTERM as a preemption (under Slurm)
        self.tree.before_stop = lambda: request_cancel(self.run_dir)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def seen(self) -> dict[int, psutil.Process]:
        """Every descendant observed (the workers)."""
        return self.tree.seen

    def rank_pid(self, rank: int) -> int | None:
        """The process of the worker with LOCAL_RANK `rank` now (torchrun starts new ones
        after a restart); None when it has none."""
        for pid in procs.descendants(self.proc.pid):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if f"LOCAL_RANK={rank}".encode() in env and ENTRY.encode() in cmd and procs.alive(pid):
                return pid
        return None

    def poll(self) -> int | None:
        """torchrun's exit code once it and every worker are gone; None before."""
        if self.returncode is None:
            rc = self.tree.poll()
            if rc is not None:
                self._finish(rc)
        return self.returncode

    def wait(self, timeout: float | None = None, on_poll=None) -> int:
        """Block until torchrun exits (or timeout: TimeoutError). Ctrl-C ends the job
        and re-raises KeyboardInterrupt. on_poll() is called about twice a second."""
        end = None if timeout is None else time.monotonic() + timeout
        try:
            while self.poll() is None:
                if end is not None and time.monotonic() > end:
                    raise TimeoutError(f"torchrun still running after {timeout} s")
                if on_poll:
                    on_poll()
                try:
                    self.proc.wait(0.5)
                except subprocess.TimeoutExpired:
                    pass
                else:
                    time.sleep(0.1)  # torchrun is gone, a worker is not yet (poll ends it)
        except KeyboardInterrupt:
            self.terminate()
            raise
        return self.returncode  # type: ignore[return-value]

    def wait_with_progress(self, out=None) -> int:
        """wait(), printing each logged step: what `python main.py train --nproc N` shows."""
        from engine.runs.tail import MetricsTail

        out = out or sys.stderr
        tail = MetricsTail(self.run_dir / "metrics.jsonl")

        def show() -> None:
            for rec in tail.poll_records():
                if "val_loss" in rec:
                    acc = f" val_acc {rec['val_acc']:.4f}" if "val_acc" in rec else ""
                    print(f"step {rec['step']}  val_loss {rec['val_loss']:.4f}{acc}", file=out)
                elif "loss" in rec and (rec["step"] % 10 == 0 or rec["step"] == 1):
                    print(f"step {rec['step']}  loss {rec['loss']:.4f}  {rec.get('samples_per_s', 0):.0f} samples/s", file=out)
        try:
            rc = self.wait(on_poll=show)
        except KeyboardInterrupt:
            print(f"interrupted: every rank stopped; run folder {self.run_dir}", file=out)
            return 130
        show()
        if rc != 0:
            print(self.describe_failure(), file=out)
        else:
            print(f"succeeded on {self.nproc} processes; run folder {self.run_dir}", file=out)
        return rc

    def terminate(self, grace: float = 30.0) -> int:
        """SIGTERM to torchrun's group; after `grace` seconds SIGKILL to it and to
        every worker group (ProcessTree.stop). Returns torchrun's exit code."""
        self.tree.stop(grace)
        self._reap()
        return self.returncode  # type: ignore[return-value]

    def preempt(self) -> list[int]:
        """What a cluster's preemption warning does: the preemption signal (SIGUSR1) to every
        worker, not to torchrun (whose default for it is to die). The run checkpoints at
        its next log step and ends as preempted. Returns the pids signalled."""
        from engine.runtime.loop import PREEMPT_SIGNAL

        if self.nproc == 1 and self.rank_pid(0) is None:  # the trainer itself, no torchrun
            pids = [self.proc.pid]
        else:
            pids = [p for p in (self.rank_pid(r) for r in range(self.nproc)) if p]
        for p in pids:
            try:
                os.kill(p, PREEMPT_SIGNAL)
            except OSError:
                pass
        return pids

    def kill(self) -> None:
        """SIGKILL to torchrun, its group, every worker seen and every group they lead."""
        self.tree.kill()
        self._reap()

    def _reap(self) -> None:
        rc = self.proc.wait()
        if self.returncode is None:
            self._finish(rc)

    def _finish(self, rc: int) -> None:
        st = RunStatus.read(self.run_dir)
        if rc == 0 and st is not None and st.state == "failed":  # it stopped restarting (recovery.give_up)
            rc = 1
        self.returncode = rc
        if rc != 0:
            self.failure = failing_rank(self.run_dir)
            if self.failure is not None:
                _record_failure(self.run_dir, *self.failure)

    def describe_failure(self) -> str:
        if self.failure is None:
            what = "torchrun" if self.nproc > 1 else "the trainer"
            return f"{what} exited with {self.returncode}; see {self.log_path}"
        rank, tb = self.failure
        try:

            step = json.loads((self.run_dir / "status.json").read_text()).get("step")
        except (OSError, ValueError):
            step = None
        at = f" at step {step}" if step else ""
        return f"rank {rank} failed first{at} (log: {self.run_dir / 'logs' / f'rank{rank}.log'}):\n{tb}"


def torchrun_root_cause(log_path: Path) -> tuple[int, int, str] | None:
    """(rank, exit code, signal name or '') of torchrun's "Root Cause (first observed
    failure)" in its log: the one place that knows of a rank killed by a signal, which
    leaves no traceback and no error file behind."""
    import re

    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return None
    i = text.rfind("Root Cause (first observed failure)")
    if i < 0:
        return None
    block = text[i:i + 2000]
    rank, code = re.search(r"rank\s*:\s*(\d+)", block), re.search(r"exitcode\s*:\s*(-?\d+)", block)
    if not rank or not code:
        return None
    sig = re.search(r"exitcode\s*:\s*-?\d+[^\n]*\((SIG[A-Z0-9]+)\)", block)
    return int(rank.group(1)), int(code.group(1)), sig.group(1) if sig else ""


def _record_failure(run_dir: Path, rank: int, text: str) -> None:
    """status.json says which rank failed first and how (the GUI and `status` read it)."""
    st = RunStatus.read(run_dir)
    if st is None:
        return
    st.failed_rank = rank
    st.failure = text.strip().splitlines()[-1][:500] if text.strip() else ""
    first = text.strip().splitlines()[0][:500] if text.strip() else ""
    if first and first != st.error and not (st.error or "").startswith("stopped restarting"):
        # what the first rank died of, not what its peers saw after (a run that stopped
        # restarting keeps saying why; the rank's own line is in `failure`)
        st.peer_error, st.error = st.error, f"rank {rank}: {first}"
    from engine.files import atomic_write

    atomic_write(Path(run_dir) / "status.json", json.dumps(st.to_json(), indent=1, sort_keys=True).encode())


def read_rank_error(path: Path) -> RankError | None:
    """logs/rank{R}.error (engine/runtime/records.py RankError)."""
    return RankError.read(path)


def failing_rank(run_dir: Path) -> tuple[int, str] | None:
    """The rank that failed first and its traceback (or how it was killed). A rank killed
    by a signal is named by torchrun's root cause; each rank that fails by itself writes
    logs/rank{R}.error with the time, and peers that fail later (a closed connection to
    the dead rank) have later times."""
    logs = Path(run_dir) / "logs"
    cause = torchrun_root_cause(logs / "launcher.log")
    if cause and cause[1] < 0:
        rank, code, sig = cause
        tail = _tail(logs / f"rank{rank}.log")
        return rank, (f"rank {rank} was killed by {sig or f'signal {-code}'} (exit code {code}); it left no "
                      f"traceback. The end of its log:\n{tail}\nkilled by {sig or f'signal {-code}'}")
    errors = [e for e in map(RankError.read, logs.glob("rank*.error")) if e is not None]
    if errors:
        first = min(errors, key=lambda e: e.time)
        return first.rank, last_traceback(_log_text(logs / f"rank{first.rank}.log")) or first.error
    for p in sorted(logs.glob("rank*.log")):  # died before the runtime could write its .error
        tb = last_traceback(_log_text(p))
        if tb:
            return int(p.stem[4:]), tb
    for p in sorted(logs.glob("torchrun/**/stderr.log")):
        tb = last_traceback(_log_text(p))
        if tb:
            rank = next((int(x) for x in p.parent.name.split("_") if x.isdigit()), -1)
            return rank, tb
    return None


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _log_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def launch_local(run_dir: str | os.PathLike, nproc: int, *, resume: bool = False,
                 code_root: str | os.PathLike | None = None, env: dict | None = None,
                 detached: bool = False, torchrun: bool | None = None) -> LocalJob:
    """Start `torchrun --standalone --nproc-per-node nproc -m engine.runtime.train RUN_DIR`
    (with `torchrun=False`, for one process only: `python -m engine.runtime.train RUN_DIR`
    itself, the default for nproc 1). Its workers stop when this process ends, however it
    ends (SIGKILL included), unless `detached`: they watch this process's pid
    (engine/runtime/loop.py watch_parent)."""
    run_dir = Path(run_dir).resolve()
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, not {nproc}")
    if not (run_dir / "run.json").exists():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no run.json)")
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for stale in logs.glob("rank*.error"):
        stale.unlink()
    clear_cancel(run_dir)  # (a cancel of an earlier attempt is not this one's)
    if torchrun is None:
        torchrun = nproc > 1
    if not torchrun and nproc != 1:
        raise ValueError(f"{nproc} processes need torchrun")
    # training.restarts: torchrun's agent starts every worker again after one fails or hangs
    # (engine/runtime/recovery.py decides at each start whether to go on)
    restarts = RunSpec.load(run_dir).training.restarts.max_restarts if torchrun else 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           f"--max-restarts={restarts}", "--monitor-interval=1",
           "--log-dir", str(logs / "torchrun"), "--redirects", "3"] if torchrun else [sys.executable]
    cmd += ["-m", ENTRY, str(run_dir)]
    if resume:
        cmd.append("--resume")
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if not detached:
        full_env["LAYERFLOW_PARENT_PID"] = str(os.getpid())
    else:
        full_env.pop("LAYERFLOW_PARENT_PID", None)
    root = str(Path(code_root) if code_root else CODE_ROOT)
    full_env["PYTHONPATH"] = root + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
    log_path = logs / "launcher.log"
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(cmd, cwd=root, env=full_env, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return LocalJob(run_dir, nproc, proc, log_path)


__all__ = ["launch_local", "LocalJob", "failing_rank"]
