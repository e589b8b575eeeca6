"""Runs copied to a real MLflow sqlite store, read back with MLflow's own client: params
equal the run's settings, each metric's history equals metrics.jsonl's, the tags, the
end state; syncing again logs nothing twice; the CLI does the same."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.engine.runtime.test_run_formats import small_project

from engine.runs.build import prepare_run
from engine.runtime.records import run_settings
from engine.runtime.sysmetrics import PERIOD_ENV, read_system
from engine.runtime.train import run
from engine.runs.tail import read_metrics
from engine.runs.tracking import (
    MlflowFollower,
    MlflowSync,
    TrackingError,
    check_uri,
    log_runs,
)

ROOT = Path(__file__).resolve().parents[3]
pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
pytest.importorskip("sqlalchemy", reason="MLflow's sqlite store needs sqlalchemy (the mlflow extra)")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    import os

    os.environ[PERIOD_ENV] = "0.05"
    try:
        rd = prepare_run(small_project(200), tmp_path_factory.mktemp("mlf") / "run")
        assert run(rd).state == "succeeded"
    finally:
        del os.environ[PERIOD_ENV]
    return rd


def history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_a_finished_run_read_back(finished_run, tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (rd, run_id, _), = log_runs([finished_run], uri)
    client = MlflowClient(tracking_uri=uri)
    r = client.get_run(run_id)
    settings = run_settings(json.loads((rd / "run.json").read_text()))
    assert r.data.params == {k: str(v) for k, v in settings.items()}
    assert r.data.params["training.optimizer.lr"] == "0.01" and r.data.params["plan.dp"] == "1"
    recs = [x for x in read_metrics(rd / "metrics.jsonl") if "event" not in x]
    for key in ("loss", "val_loss", "val_acc", "lr", "samples_per_s"):
        want = sorted((x["step"], x[key]) for x in recs if key in x and ("val_loss" not in x or key.startswith("val_")))
        assert history(client, run_id, key) == want, key  # (an evaluation record's lr repeats its step's)
    samples = read_system(rd)[0]
    assert history(client, run_id, "system/cpu_pct_rank0") == sorted((s["step"], s["cpu_pct"]) for s in samples)
    assert r.data.tags["layerflow.project"] == "formats" and r.data.tags["layerflow.layout"] == "pp1 x dp1 x tp1"
    assert r.data.tags["layerflow.run_folder"] == str(rd.resolve()) and r.info.run_name == rd.name
    assert r.info.status == "FINISHED"
    assert client.get_experiment(r.info.experiment_id).name == "formats"
    # again: the same MLflow run, nothing logged twice
    assert log_runs([finished_run], uri)[0][1:] == (run_id, 0)
    assert len(client.get_metric_history(run_id, "loss")) == len([x for x in recs if "loss" in x])


def test_followed_as_it_trains(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv(PERIOD_ENV, "0")
    uri = f"sqlite:///{tmp_path / 'live.db'}"
    rd = prepare_run(small_project(150), tmp_path / "live")
    follower = MlflowFollower(rd, uri, experiment="live", interval=0.05).start()
    assert run(rd).state == "succeeded"
    assert follower.wait(60) and follower.error is None
    client = MlflowClient(tracking_uri=uri)
    run_id = MlflowSync(rd, uri).run_id
    recs = [x for x in read_metrics(rd / "metrics.jsonl") if "loss" in x and "event" not in x]
    assert history(client, run_id, "loss") == sorted((x["step"], x["loss"]) for x in recs)
    assert client.get_run(run_id).info.status == "FINISHED"


def test_bad_uri_one_line():
    with pytest.raises(TrackingError, match="file store is deprecated"):
        check_uri("/tmp/mlruns")
    assert check_uri("sqlite:///x.db") == "sqlite:///x.db"


def test_cli_track_mlflow(finished_run, tmp_path):
    uri = f"sqlite:///{tmp_path / 'cli.db'}"
    out = subprocess.run([sys.executable, "main.py", "track", "mlflow", str(finished_run), "--uri", uri,
                          "--experiment", "cli"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert finished_run.name in out.stdout and "cli" in out.stdout
    bad = subprocess.run([sys.executable, "main.py", "track", "mlflow", str(tmp_path), "--uri", uri],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode != 0 and "not a run folder" in bad.stderr


def test_train_hook_start_mlflow(tmp_path, monkeypatch):
    """app/cli/track_cmds.start_mlflow, what `train --mlflow URI` calls around its training."""
    from mlflow.tracking import MlflowClient

    from app.cli.cli_errors import CliError
    from app.cli.track_cmds import start_mlflow

    monkeypatch.setenv(PERIOD_ENV, "0")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / "cfg"))
    rd = prepare_run(small_project(40), tmp_path / "run")
    assert start_mlflow(rd) is None  # no URI anywhere: no MLflow
    with pytest.raises(CliError, match="file store is deprecated"):
        start_mlflow(rd, str(tmp_path / "mlruns"))
    uri = f"sqlite:///{tmp_path / 'hook.db'}"
    follower = start_mlflow(rd, uri, interval=0.1)
    try:
        assert run(rd).state == "succeeded"
    finally:
        follower.stop()
    run_id = MlflowSync(rd, uri).run_id
    assert MlflowClient(tracking_uri=uri).get_run(run_id).info.status == "FINISHED"


def test_train_command_logs_to_mlflow(tmp_path):
    """`layerflow train PROJECT --mlflow URI`: the run is in the store, finished, with every loss."""
    import os

    from mlflow.tracking import MlflowClient

    from engine.project import save_project

    save_project(small_project(30), tmp_path / "p.lflow")
    uri = f"sqlite:///{tmp_path / 'train.db'}"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update({PERIOD_ENV: "0", "LAYERFLOW_CONFIG_DIR": str(tmp_path / "cfg")})
    out = subprocess.run([sys.executable, "main.py", "train", str(tmp_path / "p.lflow"), "--out", str(tmp_path / "run"),
                          "--mlflow", uri], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert out.returncode == 0, out.stderr
    assert f"MLflow: logging to {uri}" in out.stderr
    rd = tmp_path / "run"
    run_id = MlflowSync(rd, uri).run_id
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(run_id).info.status == "FINISHED"
    want = sorted((r["step"], r["loss"]) for r in read_metrics(rd / "metrics.jsonl") if "loss" in r)
    assert [s for s, _ in history(client, run_id, "loss")] == [s for s, _ in want]
    bad = subprocess.run([sys.executable, "main.py", "train", str(tmp_path / "p.lflow"), "--mlflow",
                          str(tmp_path / "mlruns")], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
                         check=False)
    assert bad.returncode != 0 and "file store is deprecated" in bad.stderr and "Traceback" not in bad.stderr
