"""Local multi-process training: torchrun on this machine, as a Job.

    job = launch_local(run_dir, nproc)      # returns at once
    job.wait()                              # exit code; Ctrl-C ends every process
    job.failure                             # (rank, traceback) of the first rank that failed

torchrun starts in its own session (start_new_session), so a signal to its
process group never reaches the caller; torchrun in turn starts every worker in a
session of its own. terminate() therefore sends SIGTERM to torchrun's group (it
forwards it to its workers, and the runtime checkpoints and stops after the
current step), waits, and then SIGKILLs torchrun's group and every worker's group
it has seen, so no orphan survives. The runtime picks gloo on CPU and nccl when
GPUs exist (engine/runtime/parallel.py). No Qt here: the GUI's Run button uses
this same class from a thread or a timer.
"""
from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from remote.procs import alive, descendants

CODE_ROOT = Path(__file__).resolve().parents[1]  # the folder that holds engine/


@dataclass
class LocalJob:
    run_dir: Path
    nproc: int
    proc: subprocess.Popen
    log_path: Path
    seen: set[int] = field(default_factory=set)  # every descendant observed (workers)
    failure: tuple[int, str] | None = None
    returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _observe(self) -> None:
        self.seen |= descendants(self.proc.pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            self._observe()
            rc = self.proc.poll()
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
        except KeyboardInterrupt:
            self.terminate()
            raise
        return self.returncode  # type: ignore[return-value]

    def wait_with_progress(self, out=None) -> int:
        """wait(), printing each logged step: what `python main.py train --nproc N` shows."""
        from engine.tail import MetricsTail

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
        every worker group. Returns torchrun's exit code."""
        self._observe()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace
        while time.monotonic() < end and (self.proc.poll() is None or any(alive(p) for p in self.seen)):
            self._observe()
            time.sleep(0.1)
        self.kill()
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        self._observe()
        for pid in [self.proc.pid, *self.seen]:
            for send in (os.killpg, os.kill):
                try:
                    send(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        rc = self.proc.wait()
        if self.returncode is None:
            self._finish(rc)

    def _finish(self, rc: int) -> None:
        self.returncode = rc
        if rc != 0:
            self.failure = failing_rank(self.run_dir)

    def describe_failure(self) -> str:
        if self.failure is None:
            return f"torchrun exited with {self.returncode}; see {self.log_path}"
        rank, tb = self.failure
        return f"rank {rank} failed first (log: {self.run_dir / 'logs' / f'rank{rank}.log'}):\n{tb}"


def failing_rank(run_dir: Path) -> tuple[int, str] | None:
    """The rank that failed first and its traceback. Each failing rank writes
    logs/rank{R}.error with the time; peers that fail later (a closed connection
    to the dead rank) have later times."""
    logs = Path(run_dir) / "logs"
    errors = []
    for p in logs.glob("rank*.error"):
        try:
            errors.append(ast.literal_eval(p.read_text()))
        except (OSError, ValueError, SyntaxError):
            continue
    if errors:
        first = min(errors, key=lambda e: e["time"])
        return first["rank"], _last_traceback(logs / f"rank{first['rank']}.log") or first["error"]
    for p in sorted(logs.glob("rank*.log")):  # died before the runtime could write its .error
        tb = _last_traceback(p)
        if tb:
            return int(p.stem[4:]), tb
    for p in sorted(logs.glob("torchrun/**/stderr.log")):
        tb = _last_traceback(p)
        if tb:
            rank = next((int(x) for x in p.parent.name.split("_") if x.isdigit()), -1)
            return rank, tb
    return None


def _last_traceback(path: Path) -> str | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    i = text.rfind("Traceback (most recent call last)")
    return text[i:].strip() if i >= 0 else None


def launch_local(run_dir: str | os.PathLike, nproc: int, *, resume: bool = False,
                 code_root: str | os.PathLike | None = None, env: dict | None = None,
                 detached: bool = False) -> LocalJob:
    """Start `torchrun --standalone --nproc-per-node nproc -m engine.runtime.train RUN_DIR`.
    Its workers stop when this process ends, however it ends (SIGKILL included), unless
    `detached`: they watch this process's pid (engine/runtime/train.py watch_parent)."""
    run_dir = Path(run_dir).resolve()
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, not {nproc}")
    if not (run_dir / "run.json").exists():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no run.json)")
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for stale in logs.glob("rank*.error"):
        stale.unlink()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--log-dir", str(logs / "torchrun"), "--redirects", "3",
           "-m", "engine.runtime.train", str(run_dir)]
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
