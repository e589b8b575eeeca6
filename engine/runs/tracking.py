"""Runs logged to MLflow: a run folder's settings, metrics and system metrics copied to an
MLflow tracking store (a server, http(s)://..., or a database, sqlite:///path.db;
MLflow's file store is deprecated), live or after the fact.

The copy is made by the process that launched or watches the run, from the records the
run folder holds (metrics.jsonl, logs/rankR.system.jsonl, run.json, status.json), not by
the ranks: so it is the same for a run on this machine and for a cluster run's mirror
(remote/tracker.py appends to it as the job goes), and the runtime that ships to nodes
does not need MLflow. `MlflowSync(run_dir, uri).sync()` logs what is new since its last
call and can be called again at any time, by any process: which MLflow run a folder
became, and how far it was copied, is kept in RUN_DIR/mlflow.json (per tracking URI),
so syncing twice logs nothing twice. `MlflowFollower` syncs every few seconds in a
thread until the run ends (the GUI's and `layerflow track mlflow --follow`'s).

In MLflow: an experiment named after the project (or as asked); a run named after the
run folder, with
    params    records.run_settings: training.optimizer.lr, training.batch_size, plan.dp, ...
    metrics   the numbers of metrics.jsonl at their step (records.record_scalars: loss,
              val_loss, val_acc, lr, samples_per_s, peak_mem_mb, ...), and system/cpu_pct_rank0, system/rss_mb_rank0, ...
    tags      layerflow.project, layerflow.layout (pp x dp x tp), layerflow.run_folder,
              mlflow.runName
and its end state (FINISHED, FAILED, KILLED) once the run's end record is copied.

mlflow is an optional extra (`mlflow-skinny` with `sqlalchemy` and `alembic` for a
database store): imported here, lazily; `require_mlflow` names what to install.
"""
from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path

from engine.errors import LayerflowError
from engine.runtime.records import (
    RunStatus,
    record_scalars,
    run_settings,
    write_text_atomic,
)
from engine.runtime.sysmetrics import KEYS as SYSTEM_KEYS

URI_ENV = "MLFLOW_TRACKING_URI"
STATE_FILE = "mlflow.json"
END_STATES = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED", "preempted": "KILLED"}
BATCH = 1000  # metrics per log_batch call (MLflow's limit)
INSTALL = "pip install 'layerflow[mlflow]' (mlflow-skinny, sqlalchemy, alembic)"


class TrackingError(LayerflowError, RuntimeError):
    """MLflow is missing, or the tracking URI cannot be used; the message says which."""


def resolve_uri(explicit: str | None = None) -> str | None:
    """The tracking URI to use: the one given, else $MLFLOW_TRACKING_URI, else None."""
    uri = (explicit or os.environ.get(URI_ENV) or "").strip()
    return uri or None


SAVED_URI_FILE = "tracking.json"  # in the config folder: {"mlflow_uri": ...} (`layerflow track uri`)


def saved_uri() -> str | None:
    """The tracking URI the user saved (`layerflow track uri URI`, or the editor), or None.
    A plain JSON file in the config folder, so a command reads it without Qt; a URI saved by
    an older version in the editor's gui.ini is still read."""
    from engine.trust import config_home

    home = config_home()
    try:
        uri = json.loads((home / SAVED_URI_FILE).read_text()).get("mlflow_uri")
    except FileNotFoundError:
        uri = _older_saved_uri(home / "gui.ini")
    except (OSError, ValueError, AttributeError):
        uri = None
    return uri.strip() if isinstance(uri, str) and uri.strip() else None


def _older_saved_uri(ini: Path) -> str | None:
    import configparser

    cp = configparser.ConfigParser(interpolation=None)
    try:
        cp.read(ini, encoding="utf-8")
        return cp.get("General", "mlflow_uri", fallback=None)
    except (configparser.Error, OSError, UnicodeDecodeError):
        return None


def save_uri(uri: str | None) -> None:
    """Remember `uri` (checked) as the URI runs are logged to; None forgets it."""
    from engine.files import atomic_write
    from engine.trust import config_home

    home = config_home()
    home.mkdir(parents=True, exist_ok=True)
    atomic_write(home / SAVED_URI_FILE, (json.dumps({"mlflow_uri": check_uri(uri) if uri else None}) + "\n").encode())


def check_uri(uri: str) -> str:
    """`uri` if it is one MLflow tracks to; a one-line TrackingError naming it otherwise.
    A plain path or file:// is refused: MLflow's file store is deprecated."""
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    ok = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks")
    if scheme not in ok and not scheme.startswith(tuple(f"{s}+" for s in ok)):
        raise TrackingError(f"MLflow tracking URI {uri!r}: expected a server (http://host:5000) or a database "
                            f"(sqlite:///path/to/mlflow.db); MLflow's file store is deprecated")
    return uri


def require_mlflow():
    try:
        import mlflow  # noqa: F401
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise TrackingError(f"MLflow is not installed ({exc.name or 'mlflow'}): {INSTALL}") from None
    return MlflowClient


def _layout(run_json: dict) -> str:
    plan = run_json.get("plan") if isinstance(run_json.get("plan"), dict) else {}
    return " x ".join(f"{k}{plan.get(k, 1)}" for k in ("pp", "dp", "tp"))


def _read_lines(path: Path, offset: int) -> tuple[list[dict], int]:
    """The complete JSON lines of `path` after `offset`, and the new offset; a file shorter
    than the offset (a resumed run cut it back) reads from the start again."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return [], offset
    if size < offset:
        offset = 0
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    out = []
    for ln in data[:end].splitlines():
        try:
            r = json.loads(ln)
        except ValueError:
            continue
        if isinstance(r, dict):
            out.append(r)
    return out, offset + end


class MlflowSync:
    """One run folder copied to one tracking URI, as far as it has got (see the module)."""

    def __init__(self, run_dir: str | os.PathLike, uri: str, experiment: str | None = None):
        self.run_dir = Path(run_dir).resolve()
        self.uri = check_uri(uri)
        self.experiment = experiment
        self.client = require_mlflow()(tracking_uri=self.uri)
        self.ended = False

    # ----- the state kept in the run folder ---------------------------------------------
    def _state_all(self) -> dict:
        try:
            d = json.loads((self.run_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return d if isinstance(d, dict) else {}

    def state(self) -> dict:
        s = self._state_all().get(self.uri)
        return s if isinstance(s, dict) else {}

    def _save(self, state: dict) -> None:
        d = self._state_all()
        d[self.uri] = state
        write_text_atomic(self.run_dir / STATE_FILE, json.dumps(d, indent=1, sort_keys=True))

    @property
    def run_id(self) -> str | None:
        return self.state().get("run_id")

    # ----- copying --------------------------------------------------------------------
    def _run_json(self) -> dict:
        try:
            d = json.loads((self.run_dir / "run.json").read_text())
        except (OSError, ValueError):
            return {}
        return d if isinstance(d, dict) else {}

    def _start(self) -> dict:
        from mlflow.entities import Param

        rj = self._run_json()
        name = self.experiment or rj.get("name") or self.run_dir.parent.name or "layerflow"
        exp = self.client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
        st = RunStatus.read(self.run_dir)
        start_ms = int(st.started * 1000) if st and st.started else None
        tags = {"mlflow.runName": self.run_dir.name, "layerflow.project": str(rj.get("name", "")),
                "layerflow.layout": _layout(rj), "layerflow.run_folder": str(self.run_dir)}
        run = self.client.create_run(exp_id, start_time=start_ms, tags=tags, run_name=self.run_dir.name)
        params = [Param(k, str(v)) for k, v in run_settings(rj).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(run.info.run_id, params=params[i:i + 100])
        state = {"run_id": run.info.run_id, "experiment_id": exp_id, "offsets": {}}
        self._save(state)
        return state

    def sync(self) -> int:
        """Log what the run folder has that this URI has not; returns how many metric
        values were logged. Ends the MLflow run once the run's end record is copied."""
        from mlflow.entities import Metric

        state = self.state()
        if not state.get("run_id"):
            state = self._start()
        run_id, offsets = state["run_id"], dict(state.get("offsets", {}))
        st = RunStatus.read(self.run_dir)
        t0 = st.started if st and st.started else time.time()
        metrics: list[Metric] = []
        end_state = None

        def ts(rec) -> int:
            t = rec.get("time")
            return int((t0 + (t if isinstance(t, (int, float)) and math.isfinite(t) else 0.0)) * 1000)

        recs, offsets["metrics.jsonl"] = _read_lines(self.run_dir / "metrics.jsonl", offsets.get("metrics.jsonl", 0))
        for r in recs:
            if r.get("event") == "end":
                end_state = r.get("state")
            step = r.get("step")
            if type(step) is not int:
                continue
            metrics += [Metric(k, v, ts(r), step) for k, v in record_scalars(r).items()]
        for p in sorted((self.run_dir / "logs").glob("rank*.system.jsonl")):
            rel = f"logs/{p.name}"
            recs, offsets[rel] = _read_lines(p, offsets.get(rel, 0))
            for r in recs:
                rank, step = r.get("rank"), r.get("step")
                if type(rank) is not int or type(step) is not int:
                    continue
                for k in SYSTEM_KEYS:
                    v = r.get(k)
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                        metrics.append(Metric(f"system/{k}_rank{rank}", float(v), ts(r), step))
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(run_id, metrics=metrics[i:i + BATCH])
        if end_state is not None:
            end_ms = int(st.ended * 1000) if st and st.ended else None
            self.client.set_terminated(run_id, END_STATES.get(end_state, "FAILED"), end_time=end_ms)
            self.ended = True
        state["offsets"] = offsets
        self._save(state)
        return len(metrics)


def log_runs(run_dirs, uri: str, experiment: str | None = None) -> list[tuple[Path, str, int]]:
    """Finished (or running) run folders copied to `uri`: (folder, MLflow run id, values logged) each."""
    out = []
    for d in run_dirs:
        d = Path(d)
        if not (d / "metrics.jsonl").exists() and not (d / "run.json").exists():
            raise TrackingError(f"{d}: not a run folder (no run.json or metrics.jsonl)")
        s = MlflowSync(d, uri, experiment)
        n = s.sync()
        out.append((d, s.run_id, n))
    return out


class MlflowFollower:
    """Syncs a run folder to MLflow every `interval` seconds in a daemon thread until the
    run ends (its end record copied, or its status final) or `stop()` is called, which
    syncs once more. Errors of the store are kept (`error`), never raised into the caller's thread."""

    def __init__(self, run_dir: str | os.PathLike, uri: str, experiment: str | None = None, interval: float = 5.0):
        self.sync = MlflowSync(run_dir, uri, experiment)  # (checks the URI and that MLflow is installed, here)
        self.interval = interval
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> MlflowFollower:
        self._thread = threading.Thread(target=self._loop, name="layerflow-mlflow", daemon=True)
        self._thread.start()
        return self

    def _once(self) -> None:
        with self._lock:
            try:
                self.sync.sync()
            except Exception as exc:  # noqa: BLE001 - a store that is down must not stop the run or the GUI
                self.error = f"MLflow ({self.sync.uri}): {type(exc).__name__}: {exc}"

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._once()
            if self.sync.ended:
                return
            st = RunStatus.read(self.sync.run_dir)
            if st is not None and st.done:
                self._once()  # the end record, written before status.json's final state
                return

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if not self.sync.ended:
            self._once()

    def wait(self, timeout: float | None = None) -> bool:
        """Until the run ended and was copied (True), or `timeout` seconds."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.sync.ended
