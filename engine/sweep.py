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

The queue (`SweepRunner`) makes each run's folder with the one builder (engine/run.py
build_run, under the project's runs/ as `train` does) tagged with `sweep.json` (the sweep
id, the point), starts it with the local launcher (remote/launch_local.py) or deploys
it to a cluster (remote/launch.py, one job per run), watches its metrics.jsonl, and
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
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

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
    file's, each several-process point planned (engine/run.py plan_run). SweepError names
    the point and the key."""
    from engine.errors import CheckFailed
    from engine.run import RunError, plan_run

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


# ----- the queue ---------------------------------------------------------------------------
@dataclass
class SweepRun:
    """One run of the queue, as the CLI and the Sweep panel show it."""
    index: int
    point: dict
    nproc: int
    state: str = "queued"  # queued | preparing | running | stopping | succeeded | failed | cancelled | stopped
    run_dir: Path | None = None
    step: int = 0
    total_steps: int | None = None
    note: str = ""  # "stopped early: <rule>", an error
    started: float | None = None
    ended: float | None = None
    last: dict = field(default_factory=dict)  # the last training record

    @property
    def label(self) -> str:
        return point_label(self.point)

    @property
    def done(self) -> bool:
        return self.state not in ("queued", *ACTIVE)

    @property
    def shown_state(self) -> str:
        return f"stopped early: {self.note}" if self.state == "stopped" else self.state

    def to_json(self) -> dict:
        return {"index": self.index, "point": self.point, "nproc": self.nproc, "state": self.state,
                "run_dir": str(self.run_dir) if self.run_dir else None, "step": self.step,
                "total_steps": self.total_steps, "note": self.note, "started": self.started, "ended": self.ended}


class _LocalHandle:
    """A run started on this machine (remote/launch_local.py LocalJob)."""

    def __init__(self, run_dir: Path, nproc: int):
        from remote.launch_local import launch_local

        self.run_dir = run_dir
        self.job = launch_local(run_dir, nproc)
        self.metrics = run_dir / "metrics.jsonl"

    def poll(self) -> bool:
        """True once the run and every process of it are gone."""
        return self.job.poll() is not None

    def request_stop(self, grace: float) -> None:
        self.job.tree.request_stop(grace)  # SIGTERM: checkpoint, end as cancelled; SIGKILL after grace

    def kill(self) -> None:
        self.job.kill()

    def state(self) -> tuple[str, int, str]:
        from engine.runtime.records import RunStatus

        st = RunStatus.read(self.run_dir)
        if st is None:
            return ("failed" if self.job.returncode else "pending"), 0, ""
        if st.state == "running" and self.job.returncode is not None:
            return ("failed" if self.job.returncode else "interrupted"), st.step, st.error or ""
        return st.state, st.step, st.error or ""


class _ClusterHandle:
    """A run deployed as one job on a cluster (remote/launch.py deploy; remote/tracker.py)."""

    def __init__(self, run_dir: Path, cluster: str, name: str):
        from remote.cluster import ClusterStore
        from remote.jobs import JobDB
        from remote.launch import deploy
        from remote.tracker import Tracker

        self.run_dir = run_dir
        job = deploy(ClusterStore().get(cluster), run_dir, name=name)
        self.db = JobDB()
        self.tracker = Tracker(job.id, db=self.db)
        self.job_id = job.id
        self.metrics = self.db.mirror_dir(job.id) / "metrics.jsonl"
        self.record = job

    def poll(self) -> bool:
        self.record = self.tracker.poll()
        return self.record.done

    def request_stop(self, grace: float) -> None:
        self.record = self.tracker.cancel(grace)

    def kill(self) -> None:
        self.request_stop(0)

    def state(self) -> tuple[str, int, str]:
        r = self.record
        return r.state, int(r.step or 0), r.error or ""


EventFn = Callable[[str, SweepRun], None]  # ("started" | "progress" | "finished", run)


class SweepRunner:
    """The queue: `parallel` runs at once (local), or one cluster job per run (`cluster`).

        runner = SweepRunner(project, sweep)      # checks every point (SweepError)
        runner.run(on_event=print)                # blocks; stop() from another thread ends it

    Its state is runs/sweep-<id>.json, written at each change."""

    POLL_S = 0.5

    def __init__(self, project, sweep, *, parallel: int | None = None, cluster: str | None = None,
                 runs_dir: str | os.PathLike | None = None, sweep_id: str | None = None, grace_s: float = 30.0):
        from engine.runs import check_runs_inside, runs_dir as project_runs

        self.project = project
        self.sweep = load_sweep(sweep)
        for k, v in (("parallel", parallel),):
            if v is not None and (type(v) is not int or v < 1):
                raise SweepError(f"{k} must be a whole number of at least 1, not {v!r}")
        self.planned = check_sweep(project, self.sweep)
        self.cluster = cluster
        nprocs = [p.nproc for p in self.planned]
        if cluster:
            self.parallel = parallel or self.sweep.parallel or len(self.planned)
        else:
            self.parallel = parallel or self.sweep.parallel or default_parallel(nprocs)
        self.grace_s = grace_s
        self.runs_dir = Path(runs_dir) if runs_dir else project_runs(project.directory)
        if runs_dir is None:
            check_runs_inside(project.directory)
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.sweep.name) or "sweep"
        self.id = sweep_id or f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.runs = [SweepRun(p.index, p.point, p.nproc) for p in self.planned]
        self._handles: dict[int, Any] = {}
        self._tails: dict[int, Any] = {}
        self._reasons: dict[int, str] = {}
        self._stop = threading.Event()
        self.lock = threading.RLock()
        self.started: float | None = None
        self.ended: float | None = None

    @property
    def state_file(self) -> Path:
        return self.runs_dir / f"sweep-{self.id}.json"

    def queue_text(self) -> str:
        """The queue as a table (what `sweep --dry-run` prints)."""
        keys = list(self.sweep.parameters)
        rows = [["#", *keys, "procs", "state"]]
        for r in self.runs:
            rows.append([str(r.index + 1), *(_fmt(r.point.get(k)) for k in keys), str(r.nproc), r.shown_state])
        return _table(rows)

    # -- running ----------------------------------------------------------------------------
    def stop(self) -> None:
        """End the sweep: queued runs are not started, running ones stop as a user's Stop does."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, on_event: EventFn | None = None) -> list[SweepRun]:
        """Run the queue to its end (or until stop()); returns the runs."""
        self.started = time.time()
        self._save()
        try:
            while True:
                if not self.step(on_event):
                    break
                time.sleep(self.POLL_S)
        except BaseException:  # Ctrl-C, an error of ours: no run is left behind
            self._stop.set()
            for i, h in list(self._handles.items()):
                try:
                    h.request_stop(min(self.grace_s, 10.0))
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
            end = time.monotonic() + min(self.grace_s, 10.0) + 5
            while self._handles and time.monotonic() < end:
                for i, h in list(self._handles.items()):
                    if h.poll():
                        self._finish(i, h, on_event)
                time.sleep(0.2)
            for h in self._handles.values():
                h.kill()
            raise
        finally:
            self.ended = time.time()
            self._save()
        return self.runs

    def step(self, on_event: EventFn | None = None) -> bool:
        """One turn of the queue: poll the running runs, apply the stop rules, start what
        fits. False once nothing is left to do."""
        with self.lock:
            for i, h in list(self._handles.items()):
                self._watch(i, h, on_event)
            if self._stop.is_set():
                for r in self.runs:
                    if r.state == "queued":
                        r.state, r.note = "cancelled", "the sweep was stopped before it started"
                for i, h in self._handles.items():
                    if self.runs[i].state == "running":
                        self.runs[i].state = "stopping"
                        h.request_stop(self.grace_s)
            while not self._stop.is_set() and len(self._handles) < self.parallel:
                nxt = next((r for r in self.runs if r.state == "queued"), None)
                if nxt is None:
                    break
                self._start(nxt, on_event)
            return bool(self._handles) or any(r.state == "queued" for r in self.runs)

    def _start(self, r: SweepRun, on_event) -> None:
        from engine.run import build_run

        r.state = "preparing"
        planned = self.planned[r.index]
        name = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.project.name) or "run"
        out = self.runs_dir / f"{name}-{self.id}-{r.index + 1:02d}"
        try:
            built = build_run(planned.project, out)
            r.run_dir, r.total_steps = built.run_dir, built.spec.total_steps
            tag = {"sweep": self.id, "index": r.index, "point": r.point, "sweep_file": self.sweep.to_json()}
            (built.run_dir / TAG_FILE).write_text(json.dumps(tag, indent=1))
            if self.cluster:
                h = _ClusterHandle(built.run_dir, self.cluster, f"{self.id}-{r.index + 1:02d}")
            else:
                h = _LocalHandle(built.run_dir, r.nproc)
        except (LayerflowError, OSError, ValueError) as exc:
            r.state, r.note, r.ended = "failed", str(exc).splitlines()[0], time.time()
            self._save()
            if on_event:
                on_event("finished", r)
            return
        from engine.tail import MetricsTail

        self._handles[r.index] = h
        self._tails[r.index] = MetricsTail(h.metrics)
        r.state, r.started = "running", time.time()
        self._save()
        if on_event:
            on_event("started", r)

    def _watch(self, i: int, h, on_event) -> None:
        r = self.runs[i]
        ended = h.poll()
        progressed = False
        for rec in self._tails[i].poll_records():
            if "loss" in rec or "val_loss" in rec:
                r.last = {**r.last, **rec}
                if isinstance(rec.get("step"), int):
                    r.step, progressed = max(r.step, rec["step"]), True
            if i in self._reasons or r.state == "stopping":
                continue
            reason = self._broken(rec)
            if reason:
                self._reasons[i] = reason
                r.state = "stopping"
                h.request_stop(self.grace_s)
        if ended:
            self._finish(i, h, on_event)
        elif progressed and on_event:
            on_event("progress", r)

    def _broken(self, rec: dict) -> str | None:
        if self.sweep.nan:
            for k in ("loss", "val_loss"):
                v = _number(rec.get(k))
                if v is not None and not math.isfinite(v):
                    return f"{k} became {v} at step {rec.get('step')}"
        for rule in self.sweep.rules:
            why = rule.broken_by(rec)
            if why:
                return why
        return None

    def _finish(self, i: int, h, on_event) -> None:
        from engine.runtime.records import RunStatus

        r = self.runs[i]
        del self._handles[i]
        for rec in self._tails.pop(i).poll_records():
            if "loss" in rec and isinstance(rec.get("step"), int):
                r.last, r.step = {**r.last, **rec}, max(r.step, rec["step"])
        state, step, error = h.state()
        r.step = max(r.step, step)
        r.ended = time.time()
        reason = self._reasons.get(i)
        if reason is None and self.sweep.nan and state == "failed" and "loss became" in (error or ""):
            reason = error.split(":")[0]  # the run stopped itself on a NaN loss
        if reason and state == "succeeded":  # it ended before the stop reached it
            r.state, r.note = "succeeded", f"broke a stop rule at its end: {reason}"
        elif reason:
            r.state, r.note = "stopped", reason
            st = RunStatus.read(h.run_dir)
            if st is not None:  # the run's own record says why it ended early (runs table, GUI)
                st.extra["stopped_early"] = reason
                try:
                    st.write(h.run_dir)
                except OSError:
                    pass
        else:
            r.state = state if state in ("succeeded", "failed", "cancelled", "interrupted", "timeout", "lost") else "failed"
            if r.state != "succeeded":
                r.note = error.splitlines()[0] if error else ("stopped with the sweep" if self._stop.is_set() else "")
        self._save()
        if on_event:
            on_event("finished", r)

    # -- its record ------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"id": self.id, "project": str(self.project.path) if getattr(self.project, "path", None) else None,
                "cluster": self.cluster, "parallel": self.parallel, "started": self.started, "ended": self.ended,
                "sweep": self.sweep.to_json(), "runs": [r.to_json() for r in self.runs]}

    def _save(self) -> None:
        from engine.project import atomic_write

        try:
            self.runs_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(self.state_file, json.dumps(self.to_json(), indent=1).encode())
        except OSError:
            pass  # the queue goes on; its record is a convenience

    def progress_line(self, r: SweepRun) -> str:
        done = sum(1 for x in self.runs if x.done)
        loss = _number(r.last.get("loss"))
        extra = f"  loss {loss:.4f}" if loss is not None else ""
        return (f"[{done}/{len(self.runs)}] #{r.index + 1} {r.label}: {r.shown_state}"
                + (f" {r.step}/{r.total_steps}" if r.total_steps else "") + extra)


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
