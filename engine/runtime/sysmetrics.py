"""System metrics of one rank: its process's CPU use and memory (and, on a GPU, the
device's utilisation and memory), sampled by a background thread every few seconds
into logs/rank{R}.system.jsonl of the run folder, one JSON object a line:

    {"step": S, "time": T, "rank": R, "cpu_pct": ..., "rss_mb": ...
     [, "gpu_util_pct": ..., "gpu_mem_mb": ..., "gpu_max_mb": ...]}

`time` is the run's clock (metrics.jsonl's), `step` the last step the loop logged
(RunFolder.status.step, which the loop sets at its log steps: the sampler reads it and
the training steps do nothing for it). cpu_pct is the process's CPU time (user +
system, all its threads) over the wall time since the last sample, in percent of one
core (top's convention: 200 = two cores busy). rss_mb: resident memory now
(/proc/self/status VmRSS; where there is no /proc, the peak from getrusage).
On CUDA: torch.cuda.memory_allocated / max_memory_allocated of the rank's device, and
torch.cuda.utilization where NVML answers (pynvml, optional).

Standard library (and torch, lazily, for CUDA) only: this runs on cluster nodes.
`SystemTail` reads the files back (the dashboard, by byte offset like metrics.jsonl).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

PERIOD_ENV = "LAYERFLOW_SYSTEM_PERIOD"  # seconds between samples; 0 turns the sampler off
DEFAULT_PERIOD_S = 5.0
KEYS = ("cpu_pct", "rss_mb", "gpu_util_pct", "gpu_mem_mb", "gpu_max_mb")


def system_file(run_dir: str | os.PathLike, rank: int) -> Path:
    return Path(run_dir) / "logs" / f"rank{rank}.system.jsonl"


def period_s() -> float:
    """The sampling period ($LAYERFLOW_SYSTEM_PERIOD, default 5 s; 0: off)."""
    raw = os.environ.get(PERIOD_ENV, "")
    try:
        v = float(raw) if raw.strip() else DEFAULT_PERIOD_S
    except ValueError:
        v = DEFAULT_PERIOD_S
    return v if v >= 0 else DEFAULT_PERIOD_S


def cpu_seconds() -> float:
    """This process's CPU time so far, all threads, user + system."""
    t = os.times()
    return t.user + t.system


def rss_mb() -> float | None:
    """Resident memory of this process now, in MB (the peak where /proc is missing)."""
    try:
        with open("/proc/self/status", "rb") as f:
            now = next((int(ln.split()[1]) / 1024.0 for ln in f if ln.startswith(b"VmRSS:")), None)  # kB
    except (OSError, ValueError, IndexError):
        now = None
    if now is not None:
        return now
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (2 ** 20 if sys.platform == "darwin" else 1024.0)  # bytes on macOS, kB elsewhere
    except (ImportError, OSError, ValueError):
        return None


def gpu_sample(device) -> dict:
    """The rank's CUDA device: memory allocated now and at most (MB), and utilisation (%)
    where NVML answers; {} on another device or without CUDA."""
    if device is None or getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return {}
    import torch  # (the trainer imported it already)

    out = {}
    try:
        out["gpu_mem_mb"] = round(torch.cuda.memory_allocated(device) / 2 ** 20, 1)
        out["gpu_max_mb"] = round(torch.cuda.max_memory_allocated(device) / 2 ** 20, 1)
    except (RuntimeError, AssertionError):
        return {}
    try:
        util = float(torch.cuda.utilization(device))  # NVML (pynvml), optional
    except Exception:  # noqa: BLE001 - no pynvml, no NVML: memory only
        util = None
    if util is not None:
        out["gpu_util_pct"] = util
    return out


def _trim(path: Path, resume_step: int) -> None:
    """A resumed run keeps the samples up to its checkpoint's step (the later steps run again)."""
    try:
        lines = path.read_text(errors="replace").splitlines(keepends=True)
    except OSError:
        return
    kept = []
    for ln in lines:
        try:
            if ln.endswith("\n") and int(json.loads(ln).get("step", 0)) <= resume_step:
                kept.append(ln)
        except (ValueError, TypeError, AttributeError):
            continue
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


class SystemSampler:
    """A daemon thread that appends one sample every `period` seconds (and one more when
    stopped) to logs/rank{rank}.system.jsonl. `clock()`: the run's clock; `step()`: the
    last logged step. Costs the training nothing per step: it only reads counters."""

    def __init__(self, run_dir: str | os.PathLike, rank: int, clock: Callable[[], float],
                 step: Callable[[], int], device=None, period: float | None = None):
        self.path = system_file(run_dir, rank)
        self.rank, self.clock, self.step, self.device = rank, clock, step, device
        self.period = period_s() if period is None else period
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._f = None
        self._last: tuple[float, float] | None = None  # (wall, cpu) at the last sample
        self.samples = 0

    @property
    def enabled(self) -> bool:
        return self.period > 0

    def start(self, resume_step: int | None = None) -> SystemSampler:
        if not self.enabled:
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if resume_step is not None and self.path.exists():
                _trim(self.path, resume_step)
            self._f = open(self.path, "a" if resume_step is not None else "w")  # noqa: SIM115 - open until stop()
        except OSError:
            return self  # no room for samples: train on without them
        self._last = (time.perf_counter(), cpu_seconds())
        self._thread = threading.Thread(target=self._run, name=f"layerflow-sysmetrics-{self.rank}", daemon=True)
        self._thread.start()
        return self

    def sample(self) -> dict:
        """One sample now (CPU % since the last one)."""
        wall, cpu = time.perf_counter(), cpu_seconds()
        w0, c0 = self._last or (wall, cpu)
        self._last = (wall, cpu)
        rec = {"step": int(self.step()), "time": round(self.clock(), 4), "rank": self.rank,
               "cpu_pct": round(100.0 * (cpu - c0) / (wall - w0), 1) if wall > w0 else 0.0}
        mem = rss_mb()
        if mem is not None:
            rec["rss_mb"] = round(mem, 1)
        rec.update(gpu_sample(self.device))
        return rec

    def _write(self) -> None:
        if self._f is None:
            return
        try:
            self._f.write(json.dumps(self.sample()) + "\n")
            self._f.flush()
            self.samples += 1
        except (OSError, ValueError):
            pass  # a full disk (or the file closed under us): the run goes on

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._write()

    def stop(self) -> None:
        """The last sample, then the file closed."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._thread = None
        self._write()
        try:
            self._f.close()
        except OSError:
            pass
        self._f = None


class SystemTail:
    """The system samples of a run's ranks (logs/rank*.system.jsonl) as dashboard records,
    {"step", "time", "cpu_pct_rank1": ..., "rss_mb_rank1": ...}, read by byte offset;
    files that appear later (ranks starting) are picked up at the next poll."""

    def __init__(self, run_dir: str | os.PathLike):
        self.logs = Path(run_dir) / "logs"
        self.offsets: dict[Path, int] = {}

    def poll_records(self) -> list[dict]:
        try:
            for p in sorted(self.logs.glob("rank*.system.jsonl")):
                self.offsets.setdefault(p, 0)
        except OSError:
            return []
        out = []
        for p, offset in list(self.offsets.items()):
            try:
                if p.stat().st_size < offset:  # rewritten (a resumed run cut it): from the start
                    offset = 0
                with open(p, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1
            self.offsets[p] = offset + end
            for ln in data[:end].splitlines():
                try:
                    r = json.loads(ln)
                except ValueError:
                    continue
                if not isinstance(r, dict):
                    continue
                rank, step, t = r.get("rank"), r.get("step"), r.get("time")
                if type(rank) is not int or type(step) is not int:
                    continue
                rec = {"step": step, "time": t}
                rec.update({f"{k}_rank{rank}": r[k] for k in KEYS if type(r.get(k)) in (int, float)})
                out.append(rec)
        return out


def read_system(run_dir: str | os.PathLike) -> dict[int, list[dict]]:
    """Every rank's samples of a run, by rank."""
    out: dict[int, list[dict]] = {}
    for p in sorted((Path(run_dir) / "logs").glob("rank*.system.jsonl")):
        for ln in p.read_text(errors="replace").splitlines():
            try:
                r = json.loads(ln)
            except ValueError:
                continue
            if isinstance(r, dict) and type(r.get("rank")) is int:
                out.setdefault(r["rank"], []).append(r)
    return out


def system_summary(run_dir: str | os.PathLike) -> dict[str, float]:
    """A run's system metrics in a few numbers (a runs table's columns): the mean CPU % and
    GPU utilisation over its ranks' samples, the peak RSS and GPU memory of any rank; only
    those it has samples of."""
    cpu, rss, util, gmem = [], [], [], []
    for samples in read_system(run_dir).values():
        for s in samples:
            for key, into in (("cpu_pct", cpu), ("rss_mb", rss), ("gpu_util_pct", util), ("gpu_max_mb", gmem),
                              ("gpu_mem_mb", gmem)):
                v = s.get(key)
                if type(v) in (int, float):
                    into.append(float(v))
    out = {}
    if cpu:
        out["cpu_pct_mean"] = round(sum(cpu) / len(cpu), 1)
    if rss:
        out["rss_mb_peak"] = max(rss)
    if util:
        out["gpu_util_pct_mean"] = round(sum(util) / len(util), 1)
    if gmem:
        out["gpu_mem_mb_peak"] = max(gmem)
    return out
