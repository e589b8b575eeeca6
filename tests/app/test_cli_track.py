"""`layerflow track tensorboard` writes the event files of a run that has none (read back
with TensorBoard's reader); `track uri` saves the MLflow URI in the user's settings."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.runs.build import prepare_run
from engine.runtime.train import run
from engine.runs.tail import read_metrics

from tests.engine.runtime.test_run_formats import small_project

ROOT = Path(__file__).resolve().parents[2]


def cli(*args, env=None):
    return subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})}, check=False)


def test_track_tensorboard_of_a_run_without_files(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("LAYERFLOW_TENSORBOARD", "0")
    monkeypatch.setenv("LAYERFLOW_SYSTEM_PERIOD", "0")
    rd = prepare_run(small_project(20), tmp_path / "run")
    assert run(rd).state == "succeeded" and not list(rd.glob("events.out.tfevents.*"))
    monkeypatch.delenv("LAYERFLOW_TENSORBOARD")
    out = cli("track", "tensorboard", str(rd))
    assert out.returncode == 0, out.stderr
    acc = EventAccumulator(str(rd), size_guidance={"scalars": 0})
    acc.Reload()
    want = [(r["step"], r["loss"]) for r in read_metrics(rd / "metrics.jsonl") if "loss" in r]
    got = [(e.step, e.value) for e in acc.Scalars("loss")]
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)
    assert "has TensorBoard files already" in cli("track", "tensorboard", str(rd)).stdout


def test_track_uri_saved(tmp_path):
    env = {"LAYERFLOW_CONFIG_DIR": str(tmp_path / "cfg"), "QT_QPA_PLATFORM": "offscreen"}
    assert cli("track", "uri", env=env).stdout.strip() == "(none)"
    bad = cli("track", "uri", str(tmp_path / "mlruns"), env=env)
    assert bad.returncode != 0 and "file store is deprecated" in bad.stderr
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    assert cli("track", "uri", uri, env=env).returncode == 0
    assert cli("track", "uri", env=env).stdout.strip() == uri
    assert cli("track", "uri", "--clear", env=env).returncode == 0
    assert cli("track", "uri", env=env).stdout.strip() == "(none)"


def test_the_editor_and_the_command_share_one_saved_uri_and_an_older_one_is_read(tmp_path, monkeypatch):
    """The URI is a plain file of the config folder (the commands read it without Qt); the
    editor's Settings read and write that same file; a URI an older version kept in the
    editor's gui.ini is still the saved one until the user sets another."""
    from app.settings import Settings
    from engine.runs.tracking import saved_uri

    cfg = tmp_path / "cfg"
    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(cfg))
    cfg.mkdir()
    (cfg / "gui.ini").write_text("[General]\nmlflow_uri=sqlite:////old/m.db\ntheme=dark\n")
    assert saved_uri() == "sqlite:////old/m.db" == Settings(cfg).mlflow_uri()
    env = {"LAYERFLOW_CONFIG_DIR": str(cfg), "QT_QPA_PLATFORM": "offscreen"}
    assert cli("track", "uri", env=env).stdout.strip() == "sqlite:////old/m.db"
    Settings(cfg).set_mlflow_uri("http://127.0.0.1:5000")
    assert cli("track", "uri", env=env).stdout.strip() == "http://127.0.0.1:5000"
    assert cli("track", "uri", "--clear", env=env).returncode == 0
    assert Settings(cfg).mlflow_uri() is None  # cleared: the old gui.ini value does not come back
