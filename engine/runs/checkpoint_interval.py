"""How often to checkpoint: the Young/Daly interval from what a run measured.

A checkpoint costs the steps C seconds (what they wait for a save); a failure costs the
work since the last checkpoint, half an interval on average. Young (1974) and Daly
(2006) give the interval that loses least time between the two:

    tau = sqrt(2 x C x M)

with M the run's mean time between failures. C comes from the run's own checkpoint
records in metrics.jsonl ({"event": "checkpoint", "blocked_s", "write_s"}, written by
engine/runtime/loop.py's Checkpointer): the median of blocked_s, the time that blocks
training (for a save made while the steps wait it is the whole save, write_s; one
written behind the steps, training.checkpoint_async, blocks them only while the state
is copied). M is a per-device MTBF divided by the run's devices (a run of N devices
stops when any one of them fails). tau becomes steps with the run's measured step time
(the global batch over its median samples/s, as the runs table measures it).

The default per-device MTBF comes from Meta's Llama 3 report ("The Llama 3 Herd of
Models", 2024, section 3.3.4): 419 unexpected interruptions in a 54-day snapshot of
pre-training on 16,384 H100 GPUs, i.e. 16,384 x 54 x 24 / 419 = about 50,700
device-hours between failures per device (a 16,384-GPU job: one failure every 3.1 h).
Clusters differ: the setting `device_mtbf_h` overrides it ($LAYERFLOW_DEVICE_MTBF_H, else
reliability.json in Layerflow's config folder, which save_device_mtbf_hours writes;
`layerflow runs --mtbf-hours H` for one listing). No Qt: the Training dock and the
CLI both show what `suggest_for_runs` returns.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from .history import _read_json  # (one reader of a run folder's JSON files)

# Llama 3 (Meta, 2024, section 3.3.4): 419 unexpected interruptions in 54 days on 16,384 GPUs
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384
DEVICE_MTBF_H = LLAMA3_GPUS * LLAMA3_DAYS * 24 / LLAMA3_INTERRUPTIONS  # ~50,677 device-hours
DEFAULT_SOURCE = (f"Llama 3's {LLAMA3_INTERRUPTIONS} interruptions in {LLAMA3_DAYS} days "
                  f"on {LLAMA3_GPUS:,} GPUs")
MTBF_ENV = "LAYERFLOW_DEVICE_MTBF_H"
SETTINGS_FILE = "reliability.json"  # in the config folder: {"device_mtbf_h": hours}
WARMUP_RECORDS = 3  # the first step records (compile, caches, allocator) say little of the step time
NEEDS = ("a finished or running run of this project with a checkpoint written "
         "(its metrics.jsonl records what each save cost) and a few logged steps")


def young_daly_s(cost_s: float, mtbf_s: float) -> float:
    """tau = sqrt(2 x C x M): the checkpoint interval, in seconds, that loses least time
    to saves (C each) and to the work redone after failures (M apart on average)."""
    if not (cost_s >= 0 and mtbf_s > 0):
        raise ValueError(f"the save time ({cost_s} s) must be >= 0 and the MTBF ({mtbf_s} s) > 0")
    return math.sqrt(2.0 * cost_s * mtbf_s)


# ----- the setting -----------------------------------------------------------------
def _settings_path() -> Path:
    from engine.trust import config_home

    return config_home() / SETTINGS_FILE


def _hours(v) -> float | None:
    try:
        h = float(v)
    except (TypeError, ValueError):
        return None
    return h if math.isfinite(h) and h > 0 else None


def device_mtbf_hours() -> tuple[float, str]:
    """(hours between failures of one device, where that number comes from): the
    environment's $LAYERFLOW_DEVICE_MTBF_H, else the saved setting, else Llama 3's."""
    h = _hours(os.environ.get(MTBF_ENV))
    if h is not None:
        return h, f"${MTBF_ENV}"
    try:
        h = _hours(json.loads(_settings_path().read_text()).get("device_mtbf_h"))
    except (OSError, ValueError, AttributeError):
        h = None
    if h is not None:
        return h, f"the setting device_mtbf_h ({SETTINGS_FILE})"
    return DEVICE_MTBF_H, DEFAULT_SOURCE


def save_device_mtbf_hours(hours: float | None) -> None:
    """Remember a per-device MTBF (hours) for the suggestions; None: back to Llama 3's."""
    from engine.files import atomic_write

    if hours is not None and _hours(hours) is None:
        raise ValueError(f"device_mtbf_h must be a positive number of hours, not {hours!r}")
    p = _settings_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(p, (json.dumps({"device_mtbf_h": hours}) + "\n").encode())


# ----- the suggestion --------------------------------------------------------------
@dataclass
class Suggestion:
    steps: int  # the suggested training.checkpoint_interval
    tau_s: float
    cost_s: float  # C: the median time a save blocked the steps
    mtbf_s: float  # M: the run's mean time between failures
    step_s: float  # the measured step time
    devices: int
    device_mtbf_h: float
    mtbf_source: str
    saves: int  # how many saves C was measured from
    write_s: float | None = None  # the median whole save (longer than C when written behind the steps)
    run: str | None = None  # the run it was measured in (its folder's name)
    current: int | None = None  # that run's checkpoint_interval
    total_steps: int | None = None
    line: str = ""  # the formula with its numbers, one line
    short: str = ""  # the same without where C and M come from
    formula: str = ""  # the formula with its numbers alone: "tau = sqrt(...) = ... s, at ... s a step"

    def __str__(self) -> str:
        return self.line


def _num(v: float) -> str:
    """Seconds, readable: 0.0106, 3.7, 10, 268.3, 91,218,600."""
    if v >= 10_000:
        return f"{v:,.0f}"
    if v >= 1:
        return f"{v:,.1f}".removesuffix(".0")
    return f"{v:.3g}"


def suggest(cost_s: float, step_s: float, devices: int = 1, device_mtbf_h: float | None = None, *,
            mtbf_source: str | None = None, saves: int = 1, write_s: float | None = None, run: str | None = None,
            current: int | None = None, total_steps: int | None = None) -> Suggestion:
    """The Young/Daly interval in steps for saves of `cost_s` seconds, steps of `step_s`
    seconds and `devices` devices of `device_mtbf_h` hours MTBF each (None: the setting,
    else Llama 3's), with the formula and its numbers as one line."""
    if not (step_s > 0 and math.isfinite(step_s)):
        raise ValueError(f"the step time must be a positive number of seconds, not {step_s!r}")
    devices = max(1, int(devices))
    if device_mtbf_h is None:
        device_mtbf_h, source = device_mtbf_hours()
    else:
        source = mtbf_source or "given"
    mtbf_s = device_mtbf_h * 3600.0 / devices
    tau = young_daly_s(cost_s, mtbf_s)
    steps = max(1, round(tau / step_s))
    many = f"{devices} devices" if devices > 1 else "1 device"
    formula = (f"tau = sqrt(2 x C x M) = sqrt(2 x {_num(cost_s)} s x {_num(mtbf_s)} s) = {_num(tau)} s, "
               f"at {_num(step_s)} s a step")
    short = f"every {steps:,} steps: {formula}"
    line = (f"{short} (C: what a save blocked the steps, median of {saves}"
            f"{f' in {run}' if run else ''}; M: {device_mtbf_h:,.0f} h per device / {many}, {source})")
    if cost_s > mtbf_s / 2:
        line += "; the saves take longer than half the time between failures: the formula no longer holds"
    elif total_steps and steps >= total_steps:
        line += f"; longer than the run ({total_steps:,} steps): its last checkpoint is the one that counts"
    return Suggestion(steps, tau, cost_s, mtbf_s, step_s, devices, device_mtbf_h, source, saves, write_s, run,
                      current, total_steps, line, short, formula)


def _pos(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 else None


def measured(run_dir: str | os.PathLike, records: list[dict] | None = None) -> dict | None:
    """What a run measured for the suggestion: {cost_s, write_s, saves, step_s, devices,
    interval, total_steps}, or None when it has no checkpoint record or no step time."""
    from engine.runs.tail import read_metrics
    from engine.runtime.recovery import read_attempts

    p = Path(run_dir)
    if records is None:
        records = read_metrics(p / "metrics.jsonl")
    saves = [r for r in records if r.get("event") == "checkpoint" and _pos(r.get("blocked_s")) is not None]
    if not saves:
        return None
    info = _read_json(p / "run.json")
    training = info.get("training") if isinstance(info.get("training"), dict) else {}
    batch = training.get("batch_size")
    steps = [r for r in records if "event" not in r and isinstance(r.get("step"), int) and _pos(r.get("loss")) is not None
             and (_pos(r.get("samples_per_s")) or 0) > 0]
    if not steps or not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        return None
    rates = [r["samples_per_s"] for r in steps[WARMUP_RECORDS:] or steps]
    step_s = batch / statistics.median(rates)
    world = [a.get("world") for a in read_attempts(p) if isinstance(a.get("world"), int) and a["world"] >= 1]
    plan = info.get("plan") if isinstance(info.get("plan"), dict) else {}
    dims = [plan.get(k) for k in ("pp", "dp", "tp")]
    devices = world[-1] if world else (math.prod(dims) if all(isinstance(d, int) and d >= 1 for d in dims) else 1)
    writes = [v for v in (_pos(r.get("write_s")) for r in saves) if v is not None]
    interval = training.get("checkpoint_interval")
    total = info.get("total_steps")
    return {"cost_s": statistics.median(r["blocked_s"] for r in saves), "saves": len(saves),
            "write_s": statistics.median(writes) if writes else None, "step_s": step_s, "devices": int(devices),
            "interval": interval if isinstance(interval, int) else None,
            "total_steps": total if isinstance(total, int) else None}


def suggest_for_run(run_dir: str | os.PathLike, device_mtbf_h: float | None = None,
                    records: list[dict] | None = None) -> Suggestion | None:
    """The suggestion from one run's measurements (None: it has none yet)."""
    m = measured(run_dir, records)
    if m is None:
        return None
    return suggest(m["cost_s"], m["step_s"], m["devices"], device_mtbf_h, saves=m["saves"], write_s=m["write_s"],
                   run=Path(run_dir).name, current=m["interval"], total_steps=m["total_steps"])


def suggest_for_runs(directory: str | os.PathLike, device_mtbf_h: float | None = None,
                     max_runs: int = 20, name: str | None = None) -> Suggestion | None:
    """The suggestion from the newest run under `directory` (a project's runs folder) that
    measured its checkpoints, looking at `max_runs` runs at most; None when none did.
    `name`: only the runs of that project (the name run.json records; projects in one
    folder share its runs folder)."""
    from engine.runs.history import is_run_dir
    from engine.runtime.records import RunStatus

    d = Path(directory)
    if not d.is_dir():
        return None

    def started(p: Path) -> float:  # (status.json only: the metrics of runs not looked at stay unread)
        st = RunStatus.read(p)
        if st is not None and st.started is not None:
            return st.started
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0
    runs = sorted((p for p in d.iterdir() if is_run_dir(p)
                   and (name is None or (_read_json(p / "run.json").get("name") or p.name) == name)),
                  key=lambda p: (started(p), p.name), reverse=True)
    for p in runs[:max_runs]:
        got = suggest_for_run(p, device_mtbf_h)
        if got is not None:
            return got
    return None
