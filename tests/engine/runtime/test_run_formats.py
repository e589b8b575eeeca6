"""What a run writes beside metrics.jsonl: each rank's system metrics (a sampler thread),
and TensorBoard event files read back with TensorBoard's own reader (scalars equal to
metrics.jsonl's, the settings as hparams)."""
from __future__ import annotations

import json
import math

import pytest

from engine.diagram.graph import Graph
from engine.project import Project, Training
from engine.runs.build import prepare_run
from engine.runtime.records import run_settings
from engine.runtime.sysmetrics import PERIOD_ENV, SystemTail, read_system, system_summary
from engine.runtime.train import run
from engine.runs.tail import read_metrics


def small_project(steps=60):
    g = Graph()
    g.add_node("Input", {"shape": [32]}, id="x")
    g.add_node("Linear", {"out_features": 64}, id="fc1")
    g.add_node("ReLU", {}, id="act")
    g.add_node("Linear", {"out_features": 4}, id="fc2")
    g.add_node("Output", {"loss": "cross_entropy"}, id="out")
    for a, b in [("x", "fc1"), ("fc1", "act"), ("act", "fc2"), ("fc2", "out")]:
        g.connect(a, "out", b, "in")
    tr = Training.model_validate({"dataset": {"kind": "synthetic_classification", "n_samples": 400},
                                  "optimizer": {"name": "adam", "lr": 0.01}, "batch_size": 32, "steps": steps,
                                  "eval_interval": 20, "checkpoint_interval": 30, "log_interval": 5})
    return Project(g, name="formats", training=tr)


def test_system_metrics_sampled_by_a_thread(tmp_path, monkeypatch):
    monkeypatch.setenv(PERIOD_ENV, "0.05")
    rd = prepare_run(small_project(400), tmp_path / "run")
    assert run(rd).state == "succeeded"
    samples = read_system(rd)[0]
    assert len(samples) >= 2  # every 50 ms of a run that takes longer, and one at the end
    times = [s["time"] for s in samples]
    assert times == sorted(times)
    for s in samples:
        assert s["rank"] == 0 and 0.0 <= s["cpu_pct"] <= 100.0 * 64 and 20.0 < s["rss_mb"] < 1e6
    assert samples[-1]["step"] == 400  # the last logged step
    end = next(r for r in read_metrics(rd / "metrics.jsonl") if r.get("event") == "end")
    assert samples[-1]["time"] == pytest.approx(end["time"], abs=1.0)  # the run's clock
    # the dashboard's reading: per-rank keys, by byte offset
    tail = SystemTail(rd)
    recs = tail.poll_records()
    assert len(recs) == len(samples) and {"cpu_pct_rank0", "rss_mb_rank0"} <= set(recs[0])
    assert tail.poll_records() == []
    # a runs table's columns
    summary = system_summary(rd)
    assert summary["rss_mb_peak"] == max(s["rss_mb"] for s in samples)
    assert summary["cpu_pct_mean"] == pytest.approx(sum(s["cpu_pct"] for s in samples) / len(samples), abs=0.06)
    assert "gpu_util_pct_mean" not in summary


def test_system_sampler_off(tmp_path, monkeypatch):
    monkeypatch.setenv(PERIOD_ENV, "0")
    rd = prepare_run(small_project(10), tmp_path / "run")
    assert run(rd).state == "succeeded"
    assert read_system(rd) == {}


def test_tensorboard_scalars_and_hparams(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    monkeypatch.setenv(PERIOD_ENV, "0")
    rd = prepare_run(small_project(), tmp_path / "run")
    assert run(rd).state == "succeeded"
    assert list(rd.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(rd), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    recs = [r for r in read_metrics(rd / "metrics.jsonl") if "event" not in r]
    for key in ("loss", "val_loss", "val_acc", "lr", "samples_per_s"):
        want = [(r["step"], r[key]) for r in recs if key in r and ("val_loss" not in r or key.startswith("val_"))]
        got = [(e.step, e.value) for e in acc.Scalars(key)]
        assert [s for s, _ in got] == [s for s, _ in want], key
        for (_, a), (_, b) in zip(got, want):
            assert a == pytest.approx(b, rel=1e-6), key  # float32 in the event file
    # hparams: the run's settings, and the metric columns, in the plugin's session start
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    settings = run_settings(json.loads((rd / "run.json").read_text()))
    assert start.hparams["training.optimizer.lr"].number_value == pytest.approx(0.01)
    assert start.hparams["training.batch_size"].number_value == 32
    assert start.hparams["plan.dp"].number_value == 1
    assert start.hparams["training.optimizer.name"].string_value == "adam"
    assert set(start.hparams) == set(settings)
    exp = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in exp.metric_infos} >= {"loss", "val_loss", "val_acc"}
    assert not math.isnan(acc.Scalars("val_acc")[-1].value)


def test_tensorboard_resume_purges_the_steps_run_again(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv(PERIOD_ENV, "0")
    rd = prepare_run(small_project(), tmp_path / "run")

    def progress(step, total, rec):
        if step >= 40:
            raise KeyboardInterrupt  # stopped at 40; latest checkpoint: 30 (and 40, where it stopped)

    assert run(rd, progress=progress).state == "cancelled"
    (rd / "checkpoints" / "latest").write_text("step_30")  # go on from 30: steps 35, 40 run again
    assert run(rd, resume=True).state == "succeeded"
    acc = EventAccumulator(str(rd), size_guidance={"scalars": 0})
    acc.Reload()
    steps = [e.step for e in acc.Scalars("loss")]
    assert steps == sorted(set(steps)) == [r["step"] for r in read_metrics(rd / "metrics.jsonl") if "loss" in r]


def test_without_tensorboard_one_log_line_and_the_run_trains_on(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if the package were not installed
    monkeypatch.setenv(PERIOD_ENV, "0")
    rd = prepare_run(small_project(10), tmp_path / "run")
    assert run(rd).state == "succeeded"
    assert not list(rd.glob("events.out.tfevents.*"))
    log = (rd / "logs" / "rank0.log").read_text()
    assert log.count("tensorboard package is not installed") == 1


def test_record_scalars():
    from engine.runtime.records import record_scalars

    assert record_scalars({"step": 5, "epoch": 0, "time": 1.0, "loss": 0.5, "lr": 0.01, "samples_per_s": 100,
                           "peak_mem_mb": 12.5, "steps": 5}) == {"loss": 0.5, "lr": 0.01, "samples_per_s": 100.0,
                                                                 "peak_mem_mb": 12.5}
    assert record_scalars({"step": 10, "time": 2.0, "lr": 0.01, "val_loss": 0.4, "val_acc": 0.9}) == \
        {"val_loss": 0.4, "val_acc": 0.9}  # the evaluation's lr repeats its step's
    assert record_scalars({"step": 0, "event": "compiled", "mode": "blocks", "seconds": 12.5, "blocks": 3}) == \
        {"compile_seconds": 12.5}
    assert record_scalars({"event": "end", "state": "succeeded", "step": 10}) == {}
    assert record_scalars({"step": 1, "loss": float("nan"), "flag": True}) == {}
