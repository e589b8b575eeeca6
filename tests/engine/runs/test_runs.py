"""Run history without Qt: summaries from real run folders, safe deletion, CSV
export, and naming the diagram node in a real failure's traceback."""
import csv
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch

from engine.diagram.compile import compile_graph
from engine.project import load_project
from engine.runs.build import prepare_run
from engine.runs.history import (confusion_matrix, delete_run, failure_report, is_run_dir, list_runs,
                         node_from_traceback, summarize_run, write_metrics_csv)
from engine.runtime.train import run
from engine.runs.tail import read_metrics

ROOT = Path(__file__).resolve().parents[3]
EX = ROOT / "resources" / "examples"


def fake_run(d: Path, status: dict | None, records: list[dict], run_json: dict | None = None) -> Path:
    d.mkdir(parents=True)
    if status is not None:
        (d / "status.json").write_text(json.dumps(status))
    (d / "run.json").write_text(json.dumps(run_json or {"name": d.name, "total_steps": 100,
                                                       "data": {"task": "classification"}}))
    with open(d / "metrics.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return d


def records(n=20, eval_every=5):
    out = []
    for s in range(1, n + 1):
        out.append({"step": s, "epoch": 0, "time": 0.1 * s, "loss": 1.0 / s, "lr": 0.01, "samples_per_s": 100.0})
        if s % eval_every == 0:
            out.append({"step": s, "epoch": 0, "time": 0.1 * s, "lr": 0.01, "val_loss": 2.0 / s, "val_acc": s / 40})
    return out


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_summaries_states_and_best_values(tmp_path):
    now = time.time()
    a = fake_run(tmp_path / "a", {"state": "succeeded", "step": 20, "total_steps": 20, "started": now - 100,
                                  "ended": now - 40, "pid": 1}, records())
    b = fake_run(tmp_path / "b", {"state": "running", "step": 7, "total_steps": 100, "started": now - 10,
                                  "pid": dead_pid()}, records(7))
    c = fake_run(tmp_path / "c", {"state": "running", "step": 3, "total_steps": 100, "started": now - 5,
                                  "pid": os.getpid()}, records(3))
    (tmp_path / "not-a-run").mkdir()
    runs = list_runs(tmp_path)
    assert [r.path.name for r in runs] == ["c", "b", "a"]  # newest first
    sa, sb, sc = summarize_run(a), runs[1], runs[0]
    assert (sa.state, sa.step, sa.total_steps) == ("succeeded", 20, 20)
    assert sa.duration == pytest.approx(60, abs=1e-6)
    assert sa.best_val_acc == pytest.approx(0.5) and sa.best_val_loss == pytest.approx(0.1)
    assert sa.best_metric == ("val_acc", pytest.approx(0.5))
    assert sb.state == "interrupted"  # said running, but its process is gone
    assert sc.state == "running" and sc.duration >= 5
    assert sa.task == "classification"


def test_summary_of_a_folder_with_only_metrics(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "time": 1.0, "loss": 2.0}) + "\n"
                                     + json.dumps({"step": 2, "time": 3.5, "loss": 1.0, "val_loss": 1.5}) + "\n{half")
    s = summarize_run(d)
    assert (s.state, s.step, s.duration, s.best_val_loss) == ("pending", 2, 2.5, 1.5)
    assert s.best_metric == ("val_loss", 1.5)


def test_delete_run_refuses_what_it_must_not_touch(tmp_path):
    runs = tmp_path / "runs"
    r = fake_run(runs / "r1", {"state": "succeeded", "step": 1}, records(2))
    live = fake_run(runs / "live", {"state": "running", "pid": os.getpid()}, records(2))
    other = tmp_path / "precious"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="not a run folder"):
        delete_run(other)
    outside = fake_run(tmp_path / "elsewhere", {"state": "succeeded"}, [])
    with pytest.raises(ValueError, match="not inside"):
        delete_run(outside, within=runs)
    with pytest.raises(ValueError, match="still going"):
        delete_run(live, within=runs)
    delete_run(r, within=runs)
    assert not r.exists() and other.exists() and outside.exists() and live.exists()
    assert not is_run_dir(r)


def test_peak_memory_per_rank_file(tmp_path):
    from engine.runs.history import peak_memory_per_rank

    d = fake_run(tmp_path / "r", {"state": "succeeded"}, [])
    assert peak_memory_per_rank(d) is None
    (d / "peak_mem_per_rank.json").write_text(str([120.5, 118.0]))  # how the runtime writes it
    assert peak_memory_per_rank(d) == [120.5, 118.0]
    (d / "peak_mem_per_rank.json").write_text("[1, NaN]")
    assert peak_memory_per_rank(d) is None


def test_csv_export_round_trips_the_records(tmp_path):
    recs = records(12, eval_every=4) + [{"event": "end", "state": "succeeded", "step": 12, "time": 1.2}]
    recs[0]["loss"] = 0.1 + 0.2  # a float that needs all its digits
    path = write_metrics_csv(tmp_path / "m.csv", {"run-a": recs})
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(recs)
    for row, rec in zip(rows, recs):
        assert row.pop("run") == "run-a"
        back = {k: json.loads(v) if v not in ("",) and k != "event" and k != "state" else v
                for k, v in row.items() if v != ""}
        assert back == rec


def tiny_run(tmp_path, steps=6) -> Path:
    project = load_project(EX / "mlp_digits.lflow")
    project.training.eval_interval = 3
    rd = prepare_run(project, tmp_path / "run", steps=steps)
    run(rd)
    return rd


def test_a_real_run_summarised_and_its_confusion_matrix(tmp_path):
    rd = tiny_run(tmp_path)
    s = summarize_run(rd)
    assert s.state == "succeeded" and s.step == 6 and s.total_steps == 6
    recs = read_metrics(rd / "metrics.jsonl")
    assert s.best_val_acc == max(r["val_acc"] for r in recs if "val_acc" in r)
    cm = confusion_matrix(rd)
    m = torch.tensor(cm["matrix"])
    info = json.loads((rd / "run.json").read_text())
    assert m.shape == (10, 10) and int(m.sum()) == info["data"]["n_val"]
    # The diagonal share is the accuracy the runtime measured at the last evaluation.
    last_acc = [r["val_acc"] for r in recs if "val_acc" in r][-1]
    assert int(m.diag().sum()) / int(m.sum()) == pytest.approx(last_acc, abs=1e-9)
    assert (rd / "confusion.json").exists() and confusion_matrix(rd) == cm  # cached


def test_node_named_from_a_real_fx_traceback(tmp_path):
    project = load_project(EX / "mlp_digits.lflow")
    result = compile_graph(project.graph)
    spec = json.loads(json.dumps(result.spec))
    for n in spec["nodes"]:  # break fc2: it now expects 7 features
        if n["id"] == "fc2":
            n["params"]["in_features"] = 7
    from engine.runtime.model import build_graph_module

    gm = build_graph_module(spec)
    try:
        gm(torch.zeros(2, 64))
    except RuntimeError:
        tb = traceback.format_exc()
    assert "<eval_with_key>" in tb
    assert node_from_traceback(tb, project.graph.nodes) == "fc2"
    assert node_from_traceback("Traceback (most recent call last):\nValueError: x", project.graph.nodes) is None
    # failure_report finds the traceback in a rank's log
    d = fake_run(tmp_path / "failed", {"state": "failed", "error": "RuntimeError: shapes"}, [])
    (d / "logs").mkdir()
    (d / "logs" / "rank1.log").write_text("step 1\n" + tb)
    rep = failure_report(d, project.graph.nodes)
    assert (rep["rank"], rep["node"]) == (1, "fc2") and rep["traceback"].startswith("Traceback")
