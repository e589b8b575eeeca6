"""Single-process training: learning, resume on the same trajectory, schedules, data sets."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from engine.diagram.graph import Graph
from engine.project import Project, Training, load_project
from engine.runs.build import RunError, prepare_run
from engine.runtime.steps import lr_lambda
from engine.runtime.train import run
from engine.runs.tail import read_metrics

EX = Path(__file__).resolve().parents[3] / "resources" / "examples"


def losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r}


def test_mlp_digits_learns(tmp_path):
    rd = prepare_run(load_project(EX / "mlp_digits.lflow"), tmp_path / "run")
    status = run(rd)
    assert status.state == "succeeded"
    recs = read_metrics(rd / "metrics.jsonl")
    evals = [r for r in recs if "val_acc" in r]
    assert evals[-1]["val_acc"] >= 0.9
    assert recs[-1] == {**recs[-1], "event": "end", "state": "succeeded", "step": 300}
    assert {"step", "epoch", "time", "loss", "lr", "samples_per_s"} <= set(recs[0])
    assert (rd / "model.pt").exists() and (rd / "checkpoints" / "latest").read_text() == "step_300"


def dropout_project(steps=40):
    """An MLP with dropout and a cosine schedule: resume must restore RNG and scheduler."""
    g = Graph()
    g.add_node("Input", {"shape": [32]}, id="x")
    g.add_node("Linear", {"out_features": 32}, id="fc1")
    g.add_node("Dropout", {"p": 0.3}, id="drop")
    g.add_node("Linear", {"out_features": 4}, id="fc2")
    g.add_node("Output", {"loss": "cross_entropy"}, id="out")
    for a, b in [("x", "fc1"), ("fc1", "drop"), ("drop", "fc2"), ("fc2", "out")]:
        g.connect(a, "out", b, "in")
    tr = Training.model_validate({"dataset": {"kind": "synthetic_classification", "n_samples": 400},
                                  "optimizer": {"name": "adam", "lr": 0.01},
                                  "schedule": {"name": "cosine", "warmup_steps": 5},
                                  "batch_size": 32, "steps": steps, "eval_interval": 10, "checkpoint_interval": 10,
                                  "log_interval": 1})  # every step's loss recorded: resume is compared step by step
    return Project(g, name="drop", training=tr)


def test_logged_losses_are_the_mean_of_the_steps_between_log_steps(tmp_path):
    """The hot path keeps losses on the device and records them every few steps: a record
    is the mean of the steps since the last one, equal (to float precision) to the
    losses recorded one by one on the same trajectory."""
    every = prepare_run(dropout_project(), tmp_path / "every")
    run(every)
    per_step = losses(every)
    p = dropout_project()
    p.training.log_interval = 7
    rd = prepare_run(p, tmp_path / "seven")
    run(rd)
    recs = [r for r in read_metrics(rd / "metrics.jsonl") if "loss" in r]
    # multiples of 7, and the eval/checkpoint steps (10, 20, ...) and the last, which log too
    assert [r["step"] for r in recs] == [7, 10, 14, 20, 21, 28, 30, 35, 40]
    last = 0
    for r in recs:
        n = r["step"] - last
        assert r.get("steps", 1) == n
        assert r["loss"] == pytest.approx(sum(per_step[s] for s in range(last + 1, r["step"] + 1)) / n, rel=1e-5)
        last = r["step"]
    # left to itself the interval follows the step time: the first steps one by one, then more
    p.training.log_interval = None
    p.training.steps = 400
    p.training.eval_interval = p.training.checkpoint_interval = 1000
    auto = prepare_run(p, tmp_path / "auto")
    run(auto)
    steps = [r["step"] for r in read_metrics(auto / "metrics.jsonl") if "loss" in r]
    assert steps[:3] == [1, 2, 3] and steps[-1] == 400
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert max(gaps) > 1 and max(gaps) <= 100 and len(steps) < 400


def test_a_nan_is_caught_at_the_next_log_step_with_the_steps_named(tmp_path):
    p = dropout_project()
    p.training.log_interval = 5
    rd = prepare_run(p, tmp_path / "nan")
    data = dict(np.load(rd / "data.npz"))
    data["x_train"][:] = np.nan  # every batch makes a NaN loss
    np.savez(rd / "data.npz", **data)
    with pytest.raises(FloatingPointError, match=r"loss became nan in steps 1-5: lower the learning rate"):
        run(rd)
    assert json.loads((rd / "status.json").read_text())["state"] == "failed"


def test_stop_and_resume_gives_the_same_losses(tmp_path):
    ref = prepare_run(dropout_project(), tmp_path / "ref")
    run(ref)
    expected = losses(ref)
    assert len(expected) == 40

    # 1. stopped by the user at step 25 (a checkpoint is written on stop)
    rd = prepare_run(dropout_project(), tmp_path / "stopped")

    def stop_at_25(step, total, rec):
        if step == 25:
            raise KeyboardInterrupt

    assert run(rd, progress=stop_at_25).state == "cancelled"
    assert run(rd, resume=True).state == "succeeded"
    assert losses(rd) == expected  # exactly: same data order, RNG, optimizer and schedule

    # 2. crashed at step 27 with no checkpoint since step 20: metrics after 20 are cut off
    rd2 = prepare_run(dropout_project(), tmp_path / "crashed")

    def crash_at_27(step, total, rec):
        if step == 27:
            raise RuntimeError("power cut")

    with pytest.raises(RuntimeError):
        run(rd2, progress=crash_at_27)
    assert json.loads((rd2 / "status.json").read_text())["state"] == "failed"
    run(rd2, resume=True)
    recs = read_metrics(rd2 / "metrics.jsonl")
    steps = [r["step"] for r in recs if "loss" in r]
    assert steps == list(range(1, 41))  # no step lost or repeated
    assert losses(rd2) == expected


def test_checkpoints_are_dcp_and_an_older_runs_state_pt_still_resumes(tmp_path):
    """One checkpoint format: the single-process trainer writes DCP, as the distributed
    one does (so any layout resumes it). A run written before that holds state.pt; it
    resumes on the same trajectory too."""
    import torch

    from engine.runtime.train import load_spec
    from engine.runtime.trainer import Trainer

    ref = prepare_run(dropout_project(), tmp_path / "ref")
    run(ref)
    expected = losses(ref)
    rd = prepare_run(dropout_project(), tmp_path / "old")

    def stop_at_25(step, total, rec):
        if step == 25:
            raise KeyboardInterrupt

    assert run(rd, progress=stop_at_25).state == "cancelled"
    ckpt = rd / "checkpoints" / (rd / "checkpoints" / "latest").read_text().strip()
    assert (ckpt / ".metadata").exists() and (ckpt / "extra.pt").exists() and not (ckpt / "state.pt").exists()
    # the same checkpoint as an older Layerflow wrote it: one torch.save of the whole state
    t = Trainer(rd, load_spec(rd), torch.device("cpu"))
    state = t.load_checkpoint(ckpt)
    old = {**state, "model": t.model.state_dict(), "optimizer": t.opt.state_dict(), "scheduler": t.sched.state_dict()}
    for f in ckpt.iterdir():
        f.unlink()
    torch.save(old, ckpt / "state.pt")
    assert run(rd, resume=True).state == "succeeded"
    assert losses(rd) == expected


def test_lr_schedules():
    f = lr_lambda({"name": "cosine", "warmup_steps": 10, "min_lr_ratio": 0.1}, 110)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(110) == pytest.approx(0.1)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5)
    g = lr_lambda({"name": "step", "warmup_steps": 0, "step_size": 10, "gamma": 0.5}, 100)
    assert [g(s) for s in (0, 9, 10, 25)] == [1, 1, 0.5, 0.25]
    assert lr_lambda({"name": "constant"}, 10)(5) == 1.0


def csv_project(tmp_path, text, **ds):
    (tmp_path / "d.csv").write_text(text)
    g = Graph()
    g.add_node("Input", {"shape": [2]}, id="x")
    g.add_node("Linear", {"out_features": 2}, id="fc")
    g.add_node("Output", {}, id="out")
    g.connect("x", "out", "fc", "in")
    g.connect("fc", "out", "out", "in")
    tr = Training.model_validate({"dataset": {"kind": "csv", "path": "d.csv", **ds}, "batch_size": 4, "steps": 3})
    p = Project(g, training=tr, path=tmp_path / "p.lflow")
    return p


def test_csv_dataset_trains(tmp_path):
    rows = "\n".join(f"{i % 7},{(i * 3) % 5},{'cat' if i % 2 else 'dog'}" for i in range(40))
    p = csv_project(tmp_path, "a,b,label\n" + rows + "\n", target="label")
    rd = prepare_run(p, tmp_path / "run")
    assert run(rd).state == "succeeded"
    z = np.load(rd / "data.npz")
    assert z["x_train"].shape[1] == 2 and set(np.unique(z["y_train"])) <= {0, 1}


def test_csv_bad_line_is_named(tmp_path):
    p = csv_project(tmp_path, "a,b,label\n1,2,cat\n1,oops,dog\n", target="label")
    from engine.project import ProjectError
    with pytest.raises(ProjectError, match="line 3"):
        prepare_run(p, tmp_path / "run")


def test_npz_dataset_and_shape_mismatch_message(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.normal(size=(50, 3)).astype(np.float32), y=rng.integers(0, 2, 50))
    p = csv_project(tmp_path, "x\n", target=0)
    p.training = Training.model_validate({"dataset": {"kind": "npz", "path": "d.npz"}, "batch_size": 4, "steps": 2})
    with pytest.raises(RunError, match=r"node 'x' \(Input\): shape is \[2\] but the data set's samples are \[3\]"):
        prepare_run(p, tmp_path / "run")
    p.graph.set_param("x", "shape", [3])
    assert run(prepare_run(p, tmp_path / "run2")).state == "succeeded"


def test_epochs_instead_of_steps(tmp_path):
    p = dropout_project()
    p.training.steps, p.training.epochs = None, 2
    rd = prepare_run(p, tmp_path / "run")
    spec = json.loads((rd / "run.json").read_text())
    assert spec["total_steps"] == 2 * (320 // 32)
    assert math.isfinite(run(rd).step)


@pytest.mark.parametrize("name", ["mlp_digits", "cnn_digits", "resnet_synthetic", "transformer_synthetic"])
def test_every_example_trains(tmp_path, name):
    rd = prepare_run(load_project(EX / f"{name}.lflow"), tmp_path / "run", steps=4)
    assert run(rd).state == "succeeded"
    recs = [r for r in read_metrics(rd / "metrics.jsonl") if "loss" in r]
    assert len(recs) == 4 and all(math.isfinite(r["loss"]) for r in recs)


def test_regression_with_mse(tmp_path):
    g = Graph()
    g.add_node("Input", {"shape": [16]}, id="x")
    g.add_node("Linear", {"out_features": 32}, id="fc1")
    g.add_node("Tanh", id="act")
    g.add_node("Linear", {"out_features": 1}, id="fc2")
    g.add_node("Output", {"loss": "mse"}, id="out")
    for a, b in [("x", "fc1"), ("fc1", "act"), ("act", "fc2"), ("fc2", "out")]:
        g.connect(a, "out", b, "in")
    tr = Training.model_validate({"dataset": {"kind": "synthetic_regression"}, "optimizer": {"lr": 0.01},
                                  "batch_size": 64, "steps": 150, "eval_interval": 150})
    rd = prepare_run(Project(g, training=tr), tmp_path / "run")
    run(rd)
    recs = read_metrics(rd / "metrics.jsonl")
    first = next(r["loss"] for r in recs if "loss" in r)
    last = [r for r in recs if "val_loss" in r][-1]  # (the last checkpoint's record comes after it)
    assert last["val_loss"] < 0.5 * first and "val_acc" not in last


def test_a_torchrun_restart_resumes_from_the_latest_checkpoint(tmp_path):
    """torchrun --max-restarts runs the entry again with TORCHELASTIC_RESTART_COUNT set:
    the run goes on from its checkpoint, and metrics after it are not repeated."""
    import os
    import subprocess
    import sys

    rd = prepare_run(dropout_project(), tmp_path / "run")

    def crash_at_27(step, total, rec):
        if step == 27:
            raise RuntimeError("a node went away")

    with pytest.raises(RuntimeError):
        run(rd, progress=crash_at_27)
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, TORCHELASTIC_RESTART_COUNT="1", PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, "-m", "engine.runtime.train", str(rd)], cwd=root, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "resumed from step_20" in (rd / "logs" / "rank0.log").read_text()
    assert [s for s in losses(rd)] == list(range(1, 41))


def _accumulated(tmp_path, example: str, acc: int) -> dict:
    p = load_project(EX / f"{example}.lflow")
    p.training.grad_accumulation = acc
    p.training.log_interval = 1  # compared step by step
    rd = prepare_run(p, tmp_path / f"{example}_{acc}", steps=20)
    assert run(rd).state == "succeeded"
    return losses(rd)


def test_gradient_accumulation_is_one_step_over_the_whole_batch(tmp_path):
    """Without batch-dependent layers 2 micro-batches of 32 give the batch of 64's losses
    (its loss: the mean of the micro-batch means); BatchNorm normalizes each micro-batch
    by its own statistics, so there they differ."""
    one, two = _accumulated(tmp_path, "mlp_digits", 1), _accumulated(tmp_path, "mlp_digits", 2)
    assert sorted(two) == list(range(1, 21))
    for s in one:
        assert two[s] == pytest.approx(one[s], rel=1e-5), s
    one, two = _accumulated(tmp_path, "cnn_digits", 1), _accumulated(tmp_path, "cnn_digits", 2)
    assert max(abs(two[s] - one[s]) / one[s] for s in one) > 1e-4


def test_gradient_accumulation_must_divide_the_batch(tmp_path, capsys):
    from app.cli import main

    with pytest.raises(ValueError, match="training.batch_size 64 is not divisible by training.grad_accumulation 3"):
        Training(batch_size=64, grad_accumulation=3)
    assert main(["train", str(EX / "mlp_digits.lflow"), "--accumulate", "3", "--out", str(tmp_path / "r")]) == 2
    assert "training.batch_size 64 is not divisible by training.grad_accumulation 3" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    p = load_project(EX / "mlp_digits.lflow")
    p.training.grad_accumulation = 2
    with pytest.raises(RunError, match="training.grad_accumulation 2 runs in one process only"):
        prepare_run(p, tmp_path / "dp", placement={"dp": 2})
