"""Which plot and series each metrics record key feeds, and how they are named.

A metrics record (one line of metrics.jsonl, engine/runtime/loop.py) is a dict of
numbers; `spec_for` maps each key to the `SeriesSpec` it feeds (plot, legend label,
train or validation style, whether the EMA slider applies, the rank), or None for
keys that are not plotted; `series_values` gives the plottable numbers of one record.
`PLOTS` lists the dashboard's plots in order (`PlotSpec`). Plain Python: no Qt, no
numpy, so the naming can be read and tested on its own.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PlotSpec:
    id: str
    title: str
    y_label: str
    log_able: bool = False  # the log-y toggle applies to it
    legend_at_bottom: bool = False  # rising curves: keep the legend off their end


PLOTS = [
    PlotSpec("loss", "Loss", "loss", log_able=True),
    PlotSpec("acc", "Accuracy", "accuracy", legend_at_bottom=True),
    PlotSpec("lr", "Learning rate", "lr", log_able=True),
    PlotSpec("throughput", "Throughput", "samples/s"),
    PlotSpec("memory", "Peak memory per rank", "MB", legend_at_bottom=True),
    PlotSpec("step_time", "Step time per rank", "ms", legend_at_bottom=True),
]


# The System tab: each rank's own process, sampled every few seconds
# (engine/runtime/sysmetrics.py, logs/rankR.system.jsonl; SystemTail's keys).
SYSTEM_PLOTS = [
    PlotSpec("cpu", "CPU per rank", "% of a core", legend_at_bottom=True),
    PlotSpec("rss", "Memory (RSS) per rank", "MB", legend_at_bottom=True),
    PlotSpec("gpu_util", "GPU utilisation per rank", "%", legend_at_bottom=True),
    PlotSpec("gpu_mem", "GPU memory per rank", "MB", legend_at_bottom=True),
]
SYSTEM_IDS = {p.id for p in SYSTEM_PLOTS}

LOG_PLOTS = {p.id for p in PLOTS if p.log_able}


@dataclass(frozen=True)
class SeriesSpec:
    key: str  # series key: the record key, or key[rank] for per-rank lists
    plot: str
    label: str
    eval: bool = False  # sparse points (one per evaluation): dashed line with dots
    smooth: bool = False  # the EMA slider applies
    rank: int = 0


_STATIC = {
    "loss": SeriesSpec("loss", "loss", "train", smooth=True),
    "val_loss": SeriesSpec("val_loss", "loss", "val", eval=True),
    "acc": SeriesSpec("acc", "acc", "train", smooth=True),
    "train_acc": SeriesSpec("train_acc", "acc", "train", smooth=True),
    "val_acc": SeriesSpec("val_acc", "acc", "val", eval=True),
    "val_top5": SeriesSpec("val_top5", "acc", "val top-5", eval=True),
    "lr": SeriesSpec("lr", "lr", "lr"),
    "samples_per_s": SeriesSpec("samples_per_s", "throughput", "samples/s", smooth=True),
    "step_ms": SeriesSpec("step_ms", "step_time", "rank 0", rank=0),  # a one-process run's (several: step_ms_rankR)
}
# Peak memory: a list per rank (`"peak_mem_mb": [r0, r1]`), a scalar (rank 0), or
# one key per rank (`"peak_mem_mb_rank1"`); all land on the memory plot.
_MEM = re.compile(r"^(peak_)?mem(ory)?(_\w*?)?(_rank(?P<rank>\d+))?$")
# One rank's own numbers in a multi-process run (engine/runs/tail.py RankMetricsTail):
# its step time, its throughput and, on a last pipeline stage, its replica's loss.
PER_RANK = re.compile(r"^(?P<what>step_ms|samples_per_s|loss)_rank(?P<rank>\d+)$")
_PER_RANK_PLOT = {"step_ms": ("step_time", "rank {}"), "samples_per_s": ("throughput", "rank {}"),
                  "loss": ("loss", "rank {} (its replica)")}


SYSTEM = re.compile(r"^(?P<what>cpu_pct|rss_mb|gpu_util_pct|gpu_mem_mb|gpu_max_mb)_rank(?P<rank>\d+)$")
_SYSTEM_PLOT = {"cpu_pct": ("cpu", "rank {}"), "rss_mb": ("rss", "rank {}"), "gpu_util_pct": ("gpu_util", "rank {}"),
                "gpu_mem_mb": ("gpu_mem", "rank {}"), "gpu_max_mb": ("gpu_mem", "rank {} peak")}


_SPEC_CACHE: dict[str, SeriesSpec | None] = {}
_RANK_CACHE: dict[tuple[str, int], SeriesSpec] = {}


def spec_for(key: str) -> SeriesSpec | None:
    """The series a record key feeds (None: not plotted); cached, records repeat keys."""
    try:
        return _SPEC_CACHE[key]
    except KeyError:
        pass
    spec = _STATIC.get(key)
    if spec is None and (m := SYSTEM.match(key)):
        plot, label = _SYSTEM_PLOT[m.group("what")]
        r = int(m.group("rank"))
        spec = SeriesSpec(key, plot, label.format(r), rank=r)
    elif spec is None and (m := PER_RANK.match(key)):
        plot, label = _PER_RANK_PLOT[m.group("what")]
        r = int(m.group("rank"))
        spec = SeriesSpec(key, plot, label.format(r), smooth=plot != "step_time", rank=r)
    elif spec is None:
        m = _MEM.match(key)
        if m:
            r = int(m.group("rank") or 0)
            spec = SeriesSpec(key, "memory", f"rank {r}", rank=r)
    _SPEC_CACHE[key] = spec
    return spec


def _rank_spec(key: str, rank: int) -> SeriesSpec:
    spec = _RANK_CACHE.get((key, rank))
    if spec is None:
        spec = _RANK_CACHE[(key, rank)] = SeriesSpec(f"{key}[{rank}]", "memory", f"rank {rank}", rank=rank)
    return spec


def series_values(record: dict) -> list[tuple[SeriesSpec, float]]:
    """The plottable finite numbers of one metrics record."""
    out = []
    for k, v in record.items():
        spec = spec_for(k)
        if spec is None:
            continue
        tv = type(v)
        if tv is float or tv is int:
            if math.isfinite(v):
                out.append((spec, float(v)))
        elif tv is list and spec.plot == "memory":  # one value per rank
            for r, x in enumerate(v):
                if (type(x) is float or type(x) is int) and math.isfinite(x):
                    out.append((_rank_spec(k, r), float(x)))
    return out


_PARTS = re.compile(r"[-_/ ]+")


def short_labels(names: list[str]) -> list[str]:
    """Short labels that still tell runs apart: each name's shortest tail of whole
    parts (split at - _ / and spaces) that no other name ends with, e.g.
    cnn-20261206-031500 and cnn-20261206-031513 -> 031500 and 031513; a name that
    is all of another's tail keeps itself whole; equal names get #2, #3."""
    out = []
    for i, name in enumerate(names):
        cuts = [m.end() for m in _PARTS.finditer(name)]  # where a tail of whole parts may start
        tails = [name[c:] for c in reversed(cuts) if name[c:]] + [name]
        others = [n for j, n in enumerate(names) if j != i]
        label = next((t for t in tails if not any(o == t or o.endswith(t) and _at_cut(o, t) for o in others)), name)
        out.append(label)
    seen: dict[str, int] = {}
    for i, label in enumerate(out):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            out[i] = f"{label} #{seen[label]}"
    return out


def _at_cut(name: str, tail: str) -> bool:
    """`tail` ends `name` as whole parts (a separator, or nothing, before it)."""
    head = name[: len(name) - len(tail)]
    return not head or _PARTS.fullmatch(head[-1]) is not None
