"""Sweeps: many runs of one project over a grid (or a random sample) of settings.

A sweep file is JSON (or a dict, from the Python API or the Sweep panel):

    {"method": "grid",                       # or "random" (then "budget" runs, drawn with "seed")
     "parameters": {"training.optimizer.lr": [1e-3, 3e-3, 1e-2],
                    "placement.dp": [1, 2]},
     "steps": 100,                           # optional: training.steps of every run
     "stop": {"nan": true,                   # a run whose loss turns NaN ends (it fails itself too)
              "rules": [{"metric": "loss", "above": 2.0, "at_step": 20}]},
     "parallel": 2}                          # runs at once (default: as the cores allow)

Every key names a setting of the project file (`training.<field>[.<field>]`,
`placement.<field>`); each value is checked as the project file's is (engine/project.py:
the Training model, Placement.derive), and each point as a run is (a several-process
placement is planned), before anything runs: a bad one is one line naming the key.

The queue (remote/sweep_queue.py `SweepRunner`: it launches, so it lives beside the
launchers) makes each run's folder with the one builder (engine/runs/build.py
build_run, under the project's runs/ as `train` does) tagged with `sweep.json` (the sweep
id, the point), starts it with the local launcher (remote/launch/local.py) or deploys
it to a cluster (remote/launch/__init__.py, one job per run), watches its metrics.jsonl, and
stops a run that breaks a stop rule the way a user's Stop does (SIGTERM: the run
checkpoints and ends as cancelled); its status.json then says `stopped_early`. The
queue's own state is runs/sweep-<id>.json. No Qt here: the CLI, the API and the
Sweep panel drive the same runner.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine.errors import LayerflowError

SWEEP_KEYS = ("name", "method", "budget", "seed", "parameters", "steps", "stop", "parallel")
RULE_KEYS = ("metric", "above", "below", "at_step")
TAG_FILE = "sweep.json"  # in each run folder: {"sweep": id, "index": i, "point": {...}}
WAITING = ("queued", "preparing")
ACTIVE = ("preparing", "running", "stopping")


class SweepError(LayerflowError, ValueError):
    """A sweep file the project cannot run; one line naming the key at fault."""


# ----- the sweep file -----------------------------------------------------------------
@dataclass
class StopRule:
    metric: str
    at_step: int = 0
    above: float | None = None
    below: float | None = None

    def describe(self) -> str:
        what = f"above {self.above:g}" if self.above is not None else f"below {self.below:g}"
        return f"{self.metric} {what} at step {self.at_step}"

    def broken_by(self, rec: dict) -> str | None:
        step, v = rec.get("step"), _number(rec.get(self.metric))
        if not isinstance(step, int) or step < self.at_step or v is None or math.isnan(v):
            return None
        if (self.above is not None and v > self.above) or (self.below is not None and v < self.below):
            return f"{self.describe()} ({self.metric} {v:.4g} at step {step})"
        return None

    def to_json(self) -> dict:
        d = {"metric": self.metric, "at_step": self.at_step}
        if self.above is not None:
            d["above"] = self.above
        if self.below is not None:
            d["below"] = self.below
        return d


def _number(v) -> float | None:
    if isinstance(v, dict) and "float" in v:  # non-finite floats as the runtime writes them
        try:
            return float(v["float"])
        except (TypeError, ValueError):
            return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


@dataclass
class Sweep:
    parameters: dict[str, Any]  # key -> list of values (grid or random) or {"low", "high", "log", "int"} (random)
    method: str = "grid"
    budget: int | None = None
    seed: int = 0
    steps: int | None = None
    nan: bool = True
    rules: list[StopRule] = field(default_factory=list)
    parallel: int | None = None
    name: str = "sweep"

    # -- reading ------------------------------------------------------------------------
    @classmethod
    def from_json(cls, d, where: str = "sweep") -> Sweep:
        if not isinstance(d, dict):
            raise SweepError(f"{where}: a sweep is a JSON object with \"parameters\", not {type(d).__name__}")
        if "sweep" in d and isinstance(d["sweep"], dict) and "parameters" not in d:
            d, where = d["sweep"], f"{where}.sweep"  # a project-like file with a "sweep" section
        for k in d:
            if k not in SWEEP_KEYS:
                raise SweepError(f"{where}.{k}: unknown key; a sweep has {', '.join(SWEEP_KEYS)}")
        method = d.get("method", "grid")
        if method not in ("grid", "random"):
            raise SweepError(f"{where}.method: must be \"grid\" or \"random\", not {method!r}")
        budget = _count(d.get("budget"), f"{where}.budget", allow_none=True)
        if method == "random" and budget is None:
            raise SweepError(f"{where}.budget: a random sweep needs a budget (how many runs)")
        seed = d.get("seed", 0)
        if type(seed) is not int:
            raise SweepError(f"{where}.seed: must be a whole number, not {seed!r}")
        params = d.get("parameters")
        if not isinstance(params, dict) or not params:
            raise SweepError(f"{where}.parameters: give at least one setting to vary, e.g. "
                             "{\"training.optimizer.lr\": [0.001, 0.003]}")
        for key, values in params.items():
            w = f"{where}.parameters.{key}"
            if not isinstance(key, str) or not key.startswith(("training.", "placement.")):
                raise SweepError(f"{w}: a setting is training.<field> or placement.<field>")
            if isinstance(values, dict):
                if method != "random":
                    raise SweepError(f"{w}: a range ({{\"low\", \"high\"}}) needs method \"random\"; a grid takes a list")
                extra = set(values) - {"low", "high", "log", "int"}
                if extra:
                    raise SweepError(f"{w}.{sorted(extra)[0]}: unknown key; a range has low, high, log, int")
                lo, hi = _number(values.get("low")), _number(values.get("high"))
                if lo is None or hi is None or not lo <= hi:
                    raise SweepError(f"{w}: a range needs numbers low <= high, not {values!r}")
                if values.get("log") and lo <= 0:
                    raise SweepError(f"{w}.low: a log range needs low > 0, not {lo:g}")
            elif not isinstance(values, list) or not values:
                raise SweepError(f"{w}: must be a non-empty list of values, not {values!r}")
        stop = d.get("stop", {})
        if not isinstance(stop, dict):
            raise SweepError(f"{where}.stop: must be an object {{\"nan\": true, \"rules\": [...]}}, not {stop!r}")
        for k in stop:
            if k not in ("nan", "rules"):
                raise SweepError(f"{where}.stop.{k}: unknown key; stop has nan, rules")
        nan = stop.get("nan", True)
        if not isinstance(nan, bool):
            raise SweepError(f"{where}.stop.nan: must be true or false, not {nan!r}")
        rules = []
        raw_rules = stop.get("rules", [])
        if not isinstance(raw_rules, list):
            raise SweepError(f"{where}.stop.rules: must be a list of rules, not {raw_rules!r}")
        for i, r in enumerate(raw_rules):
            w = f"{where}.stop.rules[{i}]"
            if not isinstance(r, dict):
                raise SweepError(f"{w}: a rule is {{\"metric\": \"loss\", \"above\": 2.0, \"at_step\": 20}}")
            for k in r:
                if k not in RULE_KEYS:
                    raise SweepError(f"{w}.{k}: unknown key; a rule has {', '.join(RULE_KEYS)}")
            if not isinstance(r.get("metric"), str) or not r["metric"]:
                raise SweepError(f"{w}.metric: name a metric of metrics.jsonl (loss, val_loss, val_acc)")
            if ("above" in r) == ("below" in r):
                raise SweepError(f"{w}: give one of above or below")
            lim_key = "above" if "above" in r else "below"
            lim = _number(r[lim_key])
            if lim is None or not math.isfinite(lim):
                raise SweepError(f"{w}.{lim_key}: must be a number, not {r[lim_key]!r}")
            at = r.get("at_step", 0)
            if type(at) is not int or at < 0:
                raise SweepError(f"{w}.at_step: must be a whole number of at least 0, not {at!r}")
            rules.append(StopRule(r["metric"], at, lim if lim_key == "above" else None,
                                  lim if lim_key == "below" else None))
        name = d.get("name", "sweep")
        if not isinstance(name, str) or not name.strip():
            raise SweepError(f"{where}.name: must be a non-empty text, not {name!r}")
        return cls(dict(params), method, budget, seed, _count(d.get("steps"), f"{where}.steps", allow_none=True),
                   nan, rules, _count(d.get("parallel"), f"{where}.parallel", allow_none=True), name.strip())

    def to_json(self) -> dict:
        d: dict[str, Any] = {"name": self.name, "method": self.method, "parameters": self.parameters}
        if self.budget is not None:
            d["budget"] = self.budget
        if self.method == "random":
            d["seed"] = self.seed
        if self.steps is not None:
            d["steps"] = self.steps
        d["stop"] = {"nan": self.nan, "rules": [r.to_json() for r in self.rules]}
        if self.parallel is not None:
            d["parallel"] = self.parallel
        return d

    # -- the points -----------------------------------------------------------------------
    def points(self) -> list[dict]:
        """Every run's settings, in queue order: the grid in the order the file lists the
        values (its first `budget` when one is given), or `budget` random draws."""
        keys = list(self.parameters)
        if self.method == "grid":
            grid = [dict(zip(keys, combo)) for combo in itertools.product(*(self.parameters[k] for k in keys))]
            return grid[:self.budget] if self.budget else grid
        rng = random.Random(self.seed)
        if all(isinstance(v, list) for v in self.parameters.values()):  # draws without repeating a point
            grid = [dict(zip(keys, combo)) for combo in itertools.product(*(self.parameters[k] for k in keys))]
            return [grid[i] for i in sorted(rng.sample(range(len(grid)), min(self.budget or 0, len(grid))))]
        return [{k: _draw(rng, v) for k, v in self.parameters.items()} for _ in range(self.budget or 0)]


def _draw(rng: random.Random, spec):
    if isinstance(spec, list):
        return rng.choice(spec)
    lo, hi = float(spec["low"]), float(spec["high"])
    if spec.get("log"):
        v = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    else:
        v = rng.uniform(lo, hi)
    return int(round(v)) if spec.get("int") else float(f"{v:.6g}")


def _count(v, where: str, allow_none: bool = False) -> int | None:
    if v is None and allow_none:
        return None
    if type(v) is not int or v < 1:
        raise SweepError(f"{where}: must be a whole number of at least 1, not {v!r}")
    return v


def load_sweep(source) -> Sweep:
    """A Sweep from a JSON file's path, a JSON text, or a dict; SweepError names the key."""
    if isinstance(source, Sweep):
        return source
    if isinstance(source, dict):
        return Sweep.from_json(source)
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SweepError(f"{path}: cannot read the sweep file ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SweepError(f"{path}: not JSON (line {getattr(exc, 'lineno', '?')}: {getattr(exc, 'msg', exc)})") from None
    return Sweep.from_json(data, path.name)


# ----- applying a point to the project ----------------------------------------------------
def point_label(point: dict) -> str:
    """`lr=0.003 dp=2`: each key's last part and its value."""
    return " ".join(f"{k.rsplit('.', 1)[-1]}={v:g}" if isinstance(v, float) else f"{k.rsplit('.', 1)[-1]}={v}"
                    for k, v in point.items())


def apply_point(project, point: dict, steps: int | None = None):
    """A copy of `project` with the point's settings, each checked as the project file's is
    (Training model; Placement.derive); SweepError names the key."""
    from engine.project import PlacementError, Training

    p = project.copy()
    tr = p.training.model_dump(mode="json")
    place: dict = {}
    if steps is not None:
        tr["steps"], tr["epochs"] = steps, None
    for key, value in point.items():
        section, _, rest = key.partition(".")
        if section == "placement":
            if rest not in type(p.placement).model_fields:
                raise SweepError(f"{key}: placement has no field '{rest}' (it has "
                                 f"{', '.join(type(p.placement).model_fields)})")
            place[rest] = value
            continue
        node, parts = tr, rest.split(".")
        for i, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                known = ", ".join(node) if isinstance(node, dict) else ""
                raise SweepError(f"{key}: training.{'.'.join(parts[:i + 1])} is not a setting"
                                 + (f" (there: {known})" if known else ""))
            if i == len(parts) - 1:
                node[part] = value
                if key == "training.steps":
                    tr["epochs"] = None
            else:
                node = node[part]
    try:
        p.training = Training.model_validate(tr)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = ".".join(str(x) for x in err.get("loc") or ())
        msg = err["msg"].removeprefix("Value error, ")
        where = f"training.{loc}" if loc else "training"
        got = f", not {err['input']!r}" if loc and err["type"] != "extra_forbidden" else ""
        raise SweepError(f"{where}: {msg}{got}") from None
    if place:
        try:
            p.placement = p.placement.derive(**place)
        except PlacementError as exc:
            raise SweepError(str(exc)) from None
    return p


@dataclass
class Planned:
    """One point, checked: its project, its process count, the planner's warnings."""
    index: int
    point: dict
    project: Any
    nproc: int
    warnings: list[str] = field(default_factory=list)


def check_sweep(project, sweep: Sweep) -> list[Planned]:
    """Every point applied and checked before anything runs: each value as the project
    file's, each several-process point planned (engine/runs/build.py plan_run). SweepError names
    the point and the key."""
    from engine.errors import CheckFailed
    from engine.runs.build import RunError, plan_run

    points = sweep.points()
    if not points:
        raise SweepError("sweep.budget: no point to run")
    # each value alone first: the message names the value's own key and index
    for key, values in sweep.parameters.items():
        for i, v in enumerate(values if isinstance(values, list) else []):
            try:
                apply_point(project, {key: v})
            except SweepError as exc:
                raise SweepError(f"sweep.parameters.{key}[{i}]: {exc}") from None
    out = []
    for i, point in enumerate(points):
        label = f"sweep point {i + 1} ({point_label(point)})"
        try:
            p = apply_point(project, point, sweep.steps)
        except SweepError as exc:
            raise SweepError(f"{label}: {exc}") from None
        pl = p.placement
        world, warnings = pl.pp * pl.dp * pl.tp, []
        if world > 1:
            try:
                _plan, warnings = plan_run(p)
            except CheckFailed as exc:
                raise SweepError(f"{label}: {exc.errors[0] if exc.errors else exc}") from None
            except RunError as exc:
                raise SweepError(f"{label}: {exc}") from None
        if p.training.grad_accumulation > 1 and world > 1:
            raise SweepError(f"{label}: training.grad_accumulation {p.training.grad_accumulation} runs in one "
                             f"process only, and placement asks for {world}")
        out.append(Planned(i, point, p, world, warnings))
    return out


def default_parallel(nprocs: list[int], cores: int | None = None) -> int:
    """Runs at once on this machine: as many as the cores hold, given the largest run's processes."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max([1, *nprocs]))


def read_sweep_state(path: str | os.PathLike) -> dict:
    """A runs/sweep-<id>.json, as written by the runner."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SweepError(f"{path}: not a sweep record ({exc})") from None
    return d if isinstance(d, dict) else {}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return "" if v is None else str(v)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
