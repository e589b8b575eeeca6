"""Run history: the run folders under a project's runs directory, summarised.

A run folder follows the run-folder contract (engine/runs/build.py): run.json, status.json,
metrics.jsonl, logs/rank{R}.log, checkpoints/, model.pt. Everything here reads those
files only, so it works the same for a run that is going on, one that finished
yesterday, and one whose process died without a word. No Qt: the runs panel and
the CLI both use it.
"""
from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from engine.errors import LayerflowError
from engine.runtime.records import ENDED_STATES, RunStatus, epoch_seconds, last_traceback, pid_alive
from engine.runs.tail import read_metrics

RUNS_DIRNAME = "runs"
# The files that make a folder a run folder; delete_run refuses anything else, so a
# wrong path can never wipe an unrelated directory.
RUN_MARKERS = ("run.json", "status.json", "metrics.jsonl")


INSTALLED_EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"


def user_data_home() -> Path:
    """$LAYERFLOW_DATA_DIR when set (tests), else the platform's user data folder."""
    env = os.environ.get("LAYERFLOW_DATA_DIR")
    if env:
        return Path(env)
    from platformdirs import user_data_dir

    return Path(user_data_dir("layerflow", appauthor=False))


def user_projects_home() -> Path:
    """$LAYERFLOW_PROJECTS_DIR when set (tests), else ~/Layerflow: where the bundled
    examples are copied to be opened, edited and run as the user's own."""
    env = os.environ.get("LAYERFLOW_PROJECTS_DIR")
    return Path(env) if env else Path.home() / "Layerflow"


def runs_dir(project_dir: str | os.PathLike) -> Path:
    """Where a project's runs live: <project folder>/runs; for the bundled examples, a
    folder in the user's data folder, never the source tree or the installed package.
    (Where a new run may be written: check_runs_inside.)"""
    d = Path(project_dir)
    if d.resolve() == INSTALLED_EXAMPLES:
        return user_data_home() / "example-runs"
    return d / RUNS_DIRNAME


class RunsOutsideProject(LayerflowError, ValueError):
    """A project's `runs` is a link that leads out of its folder."""


def check_runs_inside(project_dir: str | os.PathLike, run_dir: str | os.PathLike | None = None) -> None:
    """A new run folder stays inside the project's folder unless the user chose another:
    a `runs` link that leads elsewhere (a project from someone else) is refused, not
    followed (RunsOutsideProject, one line). `run_dir`: the folder about to be made (None:
    the default one, under runs/); a folder the user chose (the CLI's --out, the API's out=,
    anywhere but under the project's own runs/) is theirs to pick. Called where every run
    is prepared (layerflow.prepare.prepare_training: CLI, Python API, editor)."""
    d = Path(project_dir)
    runs = runs_dir(d)
    if runs != d / RUNS_DIRNAME:  # the bundled examples: the user's data folder
        return
    if run_dir is not None and Path(os.path.abspath(run_dir)).parent != Path(os.path.abspath(runs)):
        return
    home = Path(os.path.realpath(d))
    real = Path(os.path.realpath(runs))
    if home not in real.parents:
        raise RunsOutsideProject(f"{runs}: is a link to {real}, outside the project's folder; runs are written "
                                 "inside it unless you choose a folder: pass --out FOLDER (out= in Python), or "
                                 "remove the link")


def is_run_dir(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and any((p / m).is_file() for m in RUN_MARKERS)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass
class RunSummary:
    path: Path
    name: str
    state: str  # running | succeeded | failed | cancelled | interrupted | pending
    step: int = 0
    total_steps: int | None = None
    started: float | None = None  # epoch seconds
    ended: float | None = None
    duration: float | None = None  # seconds (up to now for a running run)
    best_val_loss: float | None = None
    best_val_acc: float | None = None
    error: str | None = None
    task: str | None = None  # classification | regression
    stopped_early: str | None = None  # the sweep's stop rule that ended it (engine/runs/sweep.py)
    sweep: str | None = None  # the sweep id it belongs to (its sweep.json)

    @property
    def best_metric(self) -> tuple[str, float] | None:
        """The headline validation number: best accuracy, else lowest loss."""
        if self.best_val_acc is not None:
            return "val_acc", self.best_val_acc
        if self.best_val_loss is not None:
            return "val_loss", self.best_val_loss
        return None

    @property
    def finished(self) -> bool:
        return self.state in ENDED_STATES


def _finite(v) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def summarize_run(path: str | os.PathLike, records: list[dict] | None = None) -> RunSummary:
    """One run's status, length and best validation numbers, from its files."""
    p = Path(path)
    status = RunStatus.read(p) or RunStatus()
    info = _read_json(p / "run.json")
    if records is None:
        records = read_metrics(p / "metrics.jsonl")
    steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
    val_loss = [v for v in (_finite(r.get("val_loss")) for r in records) if v is not None]
    val_acc = [v for v in (_finite(r.get("val_acc")) for r in records) if v is not None]
    times = [v for v in (_finite(r.get("time")) for r in records) if v is not None]

    state = status.state
    if state == "running" and status.pid is not None and not pid_alive(status.pid):
        state = "interrupted"  # the process died without writing its final state
    step = max([status.step, *steps])
    total = status.total_steps if status.total_steps is not None else info.get("total_steps")
    total = total if isinstance(total, int) and not isinstance(total, bool) else None
    started, ended = status.started, status.ended
    if started is None:
        started = epoch_seconds(info.get("created"))
    if started is not None:
        end = ended if ended is not None else (time.time() if state == "running" else None)
        duration = end - started if end is not None else None
    else:
        duration = None
    if duration is None and len(times) >= 2:
        duration = times[-1] - times[0]
    data = info.get("data") if isinstance(info.get("data"), dict) else {}
    err = status.error
    early = status.extra.get("stopped_early")
    tag = _read_json(p / "sweep.json")
    return RunSummary(
        path=p, name=str(info.get("name") or p.name), state=state, step=step, total_steps=total,
        started=started, ended=ended, duration=duration,
        best_val_loss=min(val_loss) if val_loss else None,
        best_val_acc=max(val_acc) if val_acc else None,
        error=str(err) if err else None, task=data.get("task"),
        stopped_early=str(early) if early else None,
        sweep=str(tag["sweep"]) if tag.get("sweep") else None,
    )


def list_runs(directory: str | os.PathLike) -> list[RunSummary]:
    """Every run folder directly under `directory` (a project's runs dir), newest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    runs = [summarize_run(p) for p in d.iterdir() if is_run_dir(p)]
    runs.sort(key=lambda r: (r.started or r.path.stat().st_mtime, r.path.name), reverse=True)
    return runs


# ----- the runs table: settings as columns, final and best metrics ---------------------
# (column, where in run.json) of the settings a table shows: what a sweep varies
SETTING_COLUMNS = (
    ("optimizer", ("training", "optimizer", "name")), ("lr", ("training", "optimizer", "lr")),
    ("batch_size", ("training", "batch_size")), ("seed", ("training", "seed")),
    ("compile", ("training", "compile")), ("pp", ("plan", "pp")), ("dp", ("plan", "dp")), ("tp", ("plan", "tp")),
    ("schedule", ("plan", "schedule")), ("microbatches", ("plan", "microbatches")),
    ("mixed_precision", ("plan", "mixed_precision")),
)
METRIC_COLUMNS = ("final_loss", "best_loss", "final_val_loss", "best_val_loss", "best_val_acc", "samples_per_s",
                  "peak_mem_mb", "predicted_step_s", "measured_step_s", "step_time_ratio",
                  # from the ranks' system samples (engine/runtime/sysmetrics.py system_summary)
                  "cpu_pct_mean", "rss_mb_peak", "gpu_util_pct_mean", "gpu_mem_mb_peak",
                  # the restarts after a failed or hung rank, and the time the run was down for them
                  "restarts", "down_s",
                  # what a checkpoint blocked the steps (median; engine/runs/checkpoint_interval.py)
                  "checkpoint_s")
# Columns of text after the metrics: the layout each attempt ran ("dp2 → dp1": its world changed)
TEXT_COLUMNS = ("layouts",)
LOWER_IS_BETTER = {"restarts", "down_s", "checkpoint_s", "final_loss", "best_loss", "final_val_loss", "best_val_loss", "peak_mem_mb", "measured_step_s",
                   "predicted_step_s", "duration"}


def _dig(d, path):
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def shown_state(s: RunSummary) -> str:
    """The state as the runs table says it: `stopped early: <rule>` for a run a sweep ended."""
    return f"stopped early: {s.stopped_early}" if s.stopped_early and s.state != "succeeded" else s.state


def run_row(path: str | os.PathLike) -> dict:
    """One run as a row of the runs table: name, state, sweep, its settings (SETTING_COLUMNS,
    and the point its sweep varied), final and best metrics, throughput (median samples/s),
    peak memory (MB, the largest rank's), the plan's predicted step time against the measured
    one (the global batch over the median samples/s) and their ratio (measured / predicted),
    and the system samples' summary (mean CPU %, peak RSS; GPU utilisation and memory)."""
    from engine.runtime.sysmetrics import system_summary
    p = Path(path)
    records = read_metrics(p / "metrics.jsonl")
    s = summarize_run(p, records)
    info = _read_json(p / "run.json")
    tag = _read_json(p / "sweep.json")
    settings = {name: _dig(info, where) for name, where in SETTING_COLUMNS}
    point = tag.get("point") if isinstance(tag.get("point"), dict) else {}
    for k, v in point.items():  # a swept setting not among the usual columns gets its own
        short = k.rsplit(".", 1)[-1]
        if short not in settings or settings[short] is None:
            settings[short] = v
    train = [r for r in records if isinstance(r.get("step"), int) and _finite(r.get("loss")) is not None]
    losses = [float(r["loss"]) for r in train]
    vloss = [v for v in (_finite(r.get("val_loss")) for r in records) if v is not None]
    rates = sorted(v for v in (_finite(r.get("samples_per_s")) for r in train[3:] or train) if v is not None and v > 0)
    rate = rates[len(rates) // 2] if rates else None
    mems = [v for v in (_finite(r.get("peak_mem_mb")) for r in records) if v is not None]
    per_rank = peak_memory_per_rank(p)
    peak = max(per_rank) if per_rank else (max(mems) if mems else None)
    batch = _dig(info, ("training", "batch_size"))
    measured = batch / rate if rate and isinstance(batch, (int, float)) else None
    predicted = _finite(_dig(info, ("predicted", "step_s")))
    metrics = {
        "final_loss": losses[-1] if losses else None, "best_loss": min(losses) if losses else None,
        "final_val_loss": vloss[-1] if vloss else None, "best_val_loss": s.best_val_loss,
        "best_val_acc": s.best_val_acc, "samples_per_s": rate, "peak_mem_mb": peak,
        "predicted_step_s": predicted, "measured_step_s": measured,
        "step_time_ratio": measured / predicted if measured and predicted else None,
        **{k: None for k in ("cpu_pct_mean", "rss_mb_peak", "gpu_util_pct_mean", "gpu_mem_mb_peak")},
        **system_summary(p),
        **restarts_summary(p),
        "checkpoint_s": checkpoint_cost(records),
    }
    return {"name": s.name if s.name != "run" else p.name, "run": p.name, "path": str(p), "state": shown_state(s),
            "sweep": s.sweep, "index": tag.get("index"), "step": s.step, "total_steps": s.total_steps,
            "duration": s.duration, "started": s.started, "settings": settings, "point": point, **metrics}


def restarts_summary(run_dir: Path) -> dict:
    """restarts: how often the run started again by itself (attempts.jsonl); down_s: the
    seconds between each failure and the attempt after it, added up (engine/runtime/recovery.py);
    layouts: the layout each attempt ran, "dp2 → dp1" where the world changed (attempt_layouts)."""
    from engine.runtime.recovery import read_attempts

    attempts = read_attempts(run_dir)
    down = [a["started"] - a["after"]["at"] for a in attempts[1:]
            if isinstance(a.get("after"), dict) and isinstance(a["after"].get("at"), (int, float))
            and isinstance(a.get("started"), (int, float))]
    return {"restarts": max(0, len(attempts) - 1) if attempts else None,
            "down_s": round(sum(max(0.0, d) for d in down), 3) if down else None,
            "layouts": attempt_layouts(attempts)}


def layout_text(layout, world=None) -> str | None:
    """One attempt's layout, short: the mesh axes of more than one ("pp2×dp2"; "dp1" for one
    process), or its world ("world 4") when the attempt recorded no layout."""
    if isinstance(layout, dict):
        axes = [(k, layout.get(k)) for k in ("pp", "dp", "tp", "ep", "cp")]
        axes = [(k, v) for k, v in axes if isinstance(v, int) and not isinstance(v, bool) and v >= 1]
        if axes:
            return "×".join(f"{k}{v}" for k, v in axes if v > 1) or "dp1"
    if isinstance(world, int) and not isinstance(world, bool):
        return f"world {world}"
    return None


def attempt_layouts(attempts: list[dict]) -> str | None:
    """The layouts a run's attempts ran (attempts.jsonl's records, oldest first), the same
    one in a row said once: "dp2", or "dp2 → dp1" when a restart got a smaller world."""
    out: list[str] = []
    for a in attempts:
        t = layout_text(a.get("layout"), a.get("world"))
        if t is not None and (not out or out[-1] != t):
            out.append(t)
    return " → ".join(out) if out else None


def checkpoint_cost(records: list[dict]) -> float | None:
    """The median seconds a checkpoint blocked the steps (the Checkpointer's
    {"event": "checkpoint", "blocked_s"} records); None: the run recorded none."""
    blocked = sorted(v for v in (_finite(r.get("blocked_s")) for r in records if r.get("event") == "checkpoint")
                     if v is not None)
    if not blocked:
        return None
    n = len(blocked)
    return blocked[n // 2] if n % 2 else (blocked[n // 2 - 1] + blocked[n // 2]) / 2


def runs_table(directory: str | os.PathLike, *, sweep: str | None = None) -> list[dict]:
    """run_row of every run folder under `directory` (a project's runs dir), newest first;
    `sweep`: only that sweep's runs, in queue order."""
    d = Path(directory)
    if not d.is_dir():
        return []
    rows = [run_row(p) for p in d.iterdir() if is_run_dir(p)]
    if sweep is not None:
        rows = sorted((r for r in rows if r["sweep"] == sweep), key=lambda r: (r["index"] is None, r["index"] or 0))
    else:
        rows.sort(key=lambda r: (r["started"] or 0, r["run"]), reverse=True)
    return rows


def row_value(row: dict, key: str):
    """A column of a row by name: a metric, a field, or a setting (lr, dp, ...)."""
    if key in row and key not in ("settings", "point"):
        return row[key]
    if key in row.get("settings", {}):
        return row["settings"][key]
    short = key.rsplit(".", 1)[-1]
    return row.get("settings", {}).get(short, row.get("point", {}).get(key))


_FILTER = re.compile(r"^\s*(?P<key>[\w.]+)\s*(?P<op><=|>=|!=|==|=|<|>|~)\s*(?P<value>.*?)\s*$")


def filter_rows(rows: list[dict], filters: list[str]) -> list[dict]:
    """Rows passing every filter: `KEY=VALUE`, `KEY!=VALUE`, `KEY<X`, `KEY<=X`, `KEY>X`, `KEY>=X`
    (numbers), `KEY~TEXT` (contains); KEY is a column (lr, dp, state, best_val_acc, ...).
    ValueError names a filter that cannot be read."""
    tests = []
    for f in filters:
        m = _FILTER.match(f)
        if not m:
            raise ValueError(f"--filter {f!r}: write KEY=VALUE, KEY<NUMBER, KEY>NUMBER or KEY~TEXT (e.g. dp=2, lr<0.01)")
        key, op, want = m["key"], m["op"], m["value"]
        if op in ("<", "<=", ">", ">="):
            try:
                float(want)
            except ValueError:
                raise ValueError(f"--filter {f!r}: {op} compares numbers; {want!r} is not one") from None
        tests.append((key, op, want))

    def ok(row, key, op, want) -> bool:
        v = row_value(row, key)
        if op == "~":
            return v is not None and want.lower() in str(v).lower()
        if op in ("=", "==", "!="):
            try:
                same = v is not None and float(v) == float(want)
            except (TypeError, ValueError):
                same = str(v) == want
            return same if op != "!=" else not same
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return False
        w = float(want)
        return {"<": v < w, "<=": v <= w, ">": v > w, ">=": v >= w}[op]

    return [r for r in rows if all(ok(r, *t) for t in tests)]


def sort_rows(rows: list[dict], key: str, descending: bool | None = None) -> list[dict]:
    """Rows by a column, best first by default (lowest loss, highest accuracy); rows
    without the value last."""
    if descending is None:
        descending = key not in LOWER_IS_BETTER
    have = [r for r in rows if isinstance(row_value(r, key), (int, float, str))]
    rest = [r for r in rows if r not in have]
    try:
        have.sort(key=lambda r: row_value(r, key), reverse=descending)
    except TypeError:
        have.sort(key=lambda r: str(row_value(r, key)), reverse=descending)
    return have + rest


def best_row(rows: list[dict], metric: str) -> dict | None:
    """The best run by `metric` (lowest for a loss, a time or memory; highest otherwise)."""
    have = [r for r in rows if isinstance(row_value(r, metric), (int, float))]
    return sort_rows(have, metric)[0] if have else None


def delete_run(path: str | os.PathLike, *, within: str | os.PathLike | None = None) -> None:
    """Remove a run folder. Refuses a folder that is not a run, one outside `within`,
    and a run whose process is still alive (stop it first)."""
    p = Path(path).resolve()
    if not is_run_dir(p):
        raise ValueError(f"{p}: not a run folder (none of {', '.join(RUN_MARKERS)} in it); nothing deleted")
    if within is not None and Path(within).resolve() not in p.parents:
        raise ValueError(f"{p}: not inside {within}; nothing deleted")
    status = RunStatus.read(p) or RunStatus()
    if status.state == "running" and pid_alive(status.pid):
        raise ValueError(f"{p.name}: the run is still going (pid {status.pid}); stop it before deleting")
    shutil.rmtree(p)


def peak_memory_per_rank(path: str | os.PathLike) -> list[float] | None:
    """MB per rank from peak_mem_per_rank.json (written by a multi-process run at its end)."""
    try:
        data = json.loads((Path(path) / "peak_mem_per_rank.json").read_text())
    except (OSError, ValueError):
        return None
    if isinstance(data, list) and data and all(_finite(v) is not None for v in data):
        return [float(v) for v in data]
    return None


# ----- CSV export ---------------------------------------------------------------
def record_columns(records: list[dict]) -> list[str]:
    """Every key of the records, in order of first appearance."""
    cols: dict[str, None] = {}
    for r in records:
        for k in r:
            cols.setdefault(k, None)
    return list(cols)


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    if isinstance(v, float):
        return repr(v)  # round-trips exactly
    return str(v)


def write_metrics_csv(path: str | os.PathLike, runs: dict[str, list[dict]]) -> Path:
    """Write the records of one or more runs as CSV: a `run` column, then every metric
    key seen; a missing value is an empty cell. Written atomically."""
    import io

    from engine.project import atomic_write  # late: keeps this module light

    cols = record_columns([r for recs in runs.values() for r in recs])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["run", *cols])
    for name, recs in runs.items():
        for r in recs:
            w.writerow([name, *(_cell(r.get(c)) for c in cols)])
    atomic_write(path, buf.getvalue().encode("utf-8"))
    return Path(path)


# ----- failures -----------------------------------------------------------------
# fx-generated forward code shows up in tracebacks as `File "<eval_with_key>.N", line L,
# in forward` followed by the generated line, e.g. `fc2 = self.fc2(relu_1);  relu_1 = None`.
_FX_FRAME = re.compile(r'File "<eval_with_key>[^"]*", line \d+, in \w+\s*\n\s*(?P<code>[^\n]*)')
_ASSIGN = re.compile(r"^\s*(?P<target>[A-Za-z_]\w*)\s*=\s*(?P<rhs>[^;]*)")


def node_from_traceback(text: str, node_ids) -> str | None:
    """The diagram node a traceback failed in, when its fx frames tell: the innermost
    generated line that calls a node (`x = self.<node>(...)`) or assigns to one."""
    ids = set(node_ids)
    for m in reversed(list(_FX_FRAME.finditer(text or ""))):
        code = m.group("code")
        a = _ASSIGN.match(code)
        if not a:
            continue
        for name in re.findall(r"self\.([A-Za-z_]\w*)", a.group("rhs")):
            if name in ids:
                return name
        target = a.group("target")
        if target in ids:
            return target
        # Function layers (Add/Concat) get fx names like `add_1`; the node id is the prefix.
        base = re.sub(r"_\d+$", "", target)
        if base in ids:
            return base
    return None


def failure_report(path: str | os.PathLike, node_ids=()) -> dict:
    """What went wrong in a failed run: {rank, traceback, node} from the rank logs
    (the first rank that has a traceback) or status.json's error."""
    p = Path(path)
    status = RunStatus.read(p) or RunStatus()
    if status.failed_rank is not None:  # the launcher knew which rank died first
        rank = status.failed_rank
        log = p / "logs" / f"rank{rank}.log"
        try:
            tb = last_traceback(log.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            tb = None
        tb = tb or status.error or status.failure or ""
        return {"rank": rank, "traceback": tb, "node": node_from_traceback(tb, node_ids), "log": str(log)}
    logs = sorted((p / "logs").glob("rank*.log"), key=lambda f: (len(f.name), f.name))
    for log in [*logs, p / "logs" / "launcher.log"]:
        try:
            tb = last_traceback(log.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if tb:
            m = re.match(r"rank(\d+)\.log", log.name)
            return {"rank": int(m.group(1)) if m else None, "traceback": tb,
                    "node": node_from_traceback(tb, node_ids), "log": str(log)}
    text = status.error or None
    return {"rank": None, "traceback": text, "node": node_from_traceback(text or "", node_ids), "log": None}


# ----- confusion matrix -----------------------------------------------------------
def _val_batches(run: Path, data, max_samples: int, batch_size: int = 512):
    """(x, y) batches of a run's first max_samples validation samples, wherever its data is:
    the run folder's data.npz, or a set read in place (the user's .npz included)."""
    import numpy as np
    import torch

    if data.source:
        from engine.runtime.datasets import eval_batches, open_source

        seen = 0
        for x, y in eval_batches(open_source(data.source, "val"), batch_size):
            if seen >= max_samples:
                return
            yield x, y
            seen += len(y)
        return
    with np.load(run / data.path, allow_pickle=False) as z:
        x_val, y_val = z["x_val"][:max_samples], z["y_val"][:max_samples]
    for i in range(0, len(x_val), batch_size):
        yield torch.as_tensor(x_val[i:i + batch_size]), y_val[i:i + batch_size]


def confusion_matrix(path: str | os.PathLike, max_samples: int = 20_000) -> dict | None:
    """{"matrix": n_classes x n_classes counts [true][pred], "labels"} of a finished
    classification run on its validation set (model.pt + its data); None when the run
    has no final model or is not a classification. Cached in confusion.json."""
    p = Path(path)
    cache = p / "confusion.json"
    model_file = p / "model.pt"
    if cache.is_file() and model_file.is_file() and cache.stat().st_mtime >= model_file.stat().st_mtime:
        cached = _read_json(cache)
        if "matrix" in cached:
            return cached
    from engine import trust
    from engine.runtime.spec import RunSpec

    spec = RunSpec.load(p)  # SpecError names the field at fault
    if spec.loss != "cross_entropy" or not model_file.is_file():
        return None
    trust.check_run_folder(p)  # the folder's model builds its Custom nodes: only with consent (NotTrusted)
    import numpy as np
    import torch

    from engine.runtime.batches import forward
    from engine.runtime.model import build_graph_module

    gm = build_graph_module(spec.model, device="cpu")
    gm.load_state_dict(torch.load(model_file, map_location="cpu", weights_only=True))
    gm.eval()
    preds, trues = [], []
    with torch.no_grad():
        for x, y in _val_batches(p, spec.data, max_samples):
            out = forward(gm, x)
            out = out[0] if isinstance(out, tuple) else out
            preds.append(out.argmax(dim=-1).reshape(-1).numpy())
            trues.append(np.asarray(y).reshape(-1).astype(np.int64))
    pred = np.concatenate(preds) if preds else np.zeros(0, dtype=np.int64)
    true = np.concatenate(trues) if trues else np.zeros(0, dtype=np.int64)
    n = int(spec.data.n_classes or max(int(true.max(initial=0)), int(pred.max(initial=0))) + 1)
    m = np.zeros((n, n), dtype=np.int64)
    ok = (true >= 0) & (true < n) & (pred >= 0) & (pred < n)
    np.add.at(m, (true[ok], pred[ok]), 1)
    result = {"matrix": m.tolist(), "labels": [str(i) for i in range(n)]}
    try:
        from engine.project import atomic_write

        atomic_write(cache, json.dumps(result).encode())
    except OSError:
        pass  # a read-only run folder: compute again next time
    return result
