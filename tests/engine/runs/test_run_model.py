"""A run's model (issue 42, item 1): export carrying a run's weights (ONNX and script,
checked numerically), use a run's weights as the project's, fine-tune from a run,
predict, and the checkpoint policy (the last N and the best), with real short runs."""
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from app.cli import main as cli
from engine.diagram.compile import compile_graph
from engine.diagram.graph import Graph
from engine.interop import InteropError
from engine.runs.weights import available_checkpoints, checkpoint_path, run_state
from engine.project import Project, Training, load_project, save_project
from engine.runs.build import prepare_run
from engine.runtime.spec import RunSpec
from engine.runtime.train import run as train_run
from engine.runs.tail import read_metrics

STEPS = 40


def mlp(steps=STEPS, keep=2, metric="val_loss") -> Project:
    g = Graph()
    g.add_node("Input", {"shape": [16]}, id="x")
    g.add_node("Linear", {"out_features": 32}, id="fc1")
    g.add_node("ReLU", {}, id="relu")
    g.add_node("Linear", {"out_features": 4}, id="fc2")
    g.add_node("Output", {"loss": "cross_entropy"}, id="out")
    for a, b in [("x", "fc1"), ("fc1", "relu"), ("relu", "fc2"), ("fc2", "out")]:
        g.connect(a, "out", b, "in")
    tr = Training.model_validate({"dataset": {"kind": "synthetic_classification", "n_samples": 400, "n_features": 16,
                                              "n_classes": 4},
                                  "optimizer": {"name": "adam", "lr": 0.02}, "batch_size": 32, "steps": steps,
                                  "eval_interval": 10, "checkpoint_interval": 10, "log_interval": 10,
                                  "keep_checkpoints": keep, "best_metric": metric})
    return Project(g, name="mlp", training=tr)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A saved project and one finished run of it (40 steps, a checkpoint every 10, keep 2)."""
    d = tmp_path_factory.mktemp("proj")
    path = save_project(mlp(), d / "mlp.lflow")
    rd = prepare_run(load_project(path), d / "runs" / "r1")
    assert train_run(rd).state == "succeeded"
    return path, rd


def outputs_of(project_path, state, x):
    """The diagram's outputs with `state` (None: the initial weights of the project's seed)."""
    p = load_project(project_path)
    gm = compile_graph(p.graph).build(seed=p.training.seed)
    if state is not None:
        gm.load_state_dict(state)
    gm.eval()
    with torch.no_grad():
        return gm(torch.as_tensor(x)).numpy()


def final_state(rd):
    return torch.load(rd / "model.pt", weights_only=True)


X = np.random.default_rng(1).normal(size=(5, 16)).astype(np.float32)


# ----- the checkpoint policy -------------------------------------------------------------
def test_only_the_last_k_and_the_best_checkpoints_remain_and_resume_works(trained, tmp_path):
    _path, rd0 = trained
    rd = tmp_path / "run"
    shutil.copytree(rd0, rd)
    ck = rd / "checkpoints"
    evals = {r["step"]: r["val_loss"] for r in read_metrics(rd / "metrics.jsonl") if "val_loss" in r}
    assert sorted(evals) == [10, 20, 30, 40]
    best = f"step_{min(evals, key=lambda s: (evals[s], s))}"
    kept = sorted(p.name for p in ck.glob("step_*"))
    assert set(kept) == {"step_30", "step_40", best}
    assert (ck / "best").read_text() == best and (ck / "latest").read_text() == "step_40"
    scores = json.loads((ck / "scores.json").read_text())
    assert scores["metric"] == "val_loss" and set(scores["scores"]) == set(kept)
    # resume: 30 more steps, still the last 2 and the best; the trajectory goes on from step 40
    spec = RunSpec.load(rd)
    spec.total_steps = 70
    spec.save(rd)
    status = train_run(rd, resume=True)
    assert status.state == "succeeded" and status.step == 70
    evals = {r["step"]: r["val_loss"] for r in read_metrics(rd / "metrics.jsonl") if "val_loss" in r}
    assert sorted(evals) == [10, 20, 30, 40, 50, 60, 70]
    best = f"step_{min(evals, key=lambda s: (evals[s], s))}"
    kept = {p.name for p in ck.glob("step_*")}
    # step_40 was resumed from: kept while that process went on from it
    assert kept == {"step_60", "step_70", best, "step_40"}
    assert (ck / "best").read_text() == best
    # resumed once more (nothing to do beyond 70 -> 80): step_40 is no longer protected
    spec = RunSpec.load(rd)
    spec.total_steps = 80
    spec.save(rd)
    assert train_run(rd, resume=True).state == "succeeded"
    evals = {r["step"]: r["val_loss"] for r in read_metrics(rd / "metrics.jsonl") if "val_loss" in r}
    best = f"step_{min(evals, key=lambda s: (evals[s], s))}"
    assert {p.name for p in ck.glob("step_*")} == {"step_70", "step_80", best}


def test_val_acc_is_best_when_highest_and_keep_none_keeps_all(tmp_path):
    p = mlp(steps=30, keep=None, metric="val_acc")
    rd = prepare_run(p, tmp_path / "run")
    assert train_run(rd).state == "succeeded"
    assert {q.name for q in (rd / "checkpoints").glob("step_*")} == {"step_10", "step_20", "step_30"}
    accs = {r["step"]: r["val_acc"] for r in read_metrics(rd / "metrics.jsonl") if "val_acc" in r}
    top = max(accs.values())
    best = (rd / "checkpoints" / "best").read_text()
    assert accs[int(best[5:])] == top and best == f"step_{min(s for s in accs if accs[s] == top)}"


def test_checkpoint_policy_fields_round_trip_and_are_left_out_at_their_defaults(tmp_path):
    p = mlp(keep=3, metric="val_loss")
    assert "keep_checkpoints" not in p.dumps() and "best_metric" not in p.dumps()
    p.training = p.training.model_copy(update={"keep_checkpoints": 5, "best_metric": "val_acc"})
    q = load_project(save_project(p, tmp_path / "p.lflow"))
    assert (q.training.keep_checkpoints, q.training.best_metric) == (5, "val_acc")


# ----- reading a run's weights -----------------------------------------------------------
def test_checkpoints_of_a_run_and_their_weights(trained):
    path, rd = trained
    have = available_checkpoints(rd)
    assert have[:3] == ["final", "latest", "best"] and "step_40" in have
    assert checkpoint_path(rd, None) == ("final", rd / "model.pt")
    project = load_project(path)
    final = final_state(rd)
    # the DCP checkpoint of the last step holds the final weights
    step40 = run_state(project, rd, "step_40")
    assert set(step40) == set(final)
    assert max(float((step40[k] - final[k]).abs().max()) for k in final) == 0.0
    with pytest.raises(InteropError, match="has no checkpoint step_5 .*it has final, latest, best"):
        run_state(project, rd, "step_5")


def test_a_run_of_another_diagram_is_refused_naming_the_parameter(trained, tmp_path):
    path, rd = trained
    p = load_project(path)
    p.graph.set_param("fc1", "out_features", 24)
    other = save_project(p, tmp_path / "other.lflow")
    code = cli(["export", str(other), "--run", str(rd), "--onnx", str(tmp_path / "m.onnx")])
    assert code == 2 and not (tmp_path / "m.onnx").exists()
    with pytest.raises(InteropError, match=r"parameter 'fc1.weight' has shape \[32, 16\] in the run but \[24, 16\]"):
        run_state(load_project(other), rd, "final")
    with pytest.raises(InteropError, match=r"parameter 'fc1.weight' has shape"):
        run_state(load_project(other), rd, "best")  # (a DCP checkpoint: refused from its metadata)


# ----- export -------------------------------------------------------------------------------
def test_onnx_from_a_run_computes_the_trained_model(trained, tmp_path, capsys):
    import onnxruntime as ort

    path, rd = trained
    out = tmp_path / "trained.onnx"
    assert cli(["export", str(path), "--run", str(rd), "--onnx", str(out)]) == 0
    assert "weights of r1, final" in capsys.readouterr().out
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: X})[0]
    want = outputs_of(path, final_state(rd), X)
    initial = outputs_of(path, None, X)
    diff = float(np.abs(got - want).max())
    print(f"ONNX vs trained max abs diff {diff:.2e}; trained vs initial {float(np.abs(want - initial).max()):.3f}")
    assert diff < 1e-5
    assert float(np.abs(got - initial).max()) > 1e-2
    # the API, at the best checkpoint
    from layerflow import Project as Api

    best = Api.load(path).export_onnx(tmp_path / "best.onnx", run=rd, checkpoint="best")
    sess = ort.InferenceSession(str(best), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: X})[0]
    assert np.abs(got - outputs_of(path, run_state(load_project(path), rd, "best"), X)).max() < 1e-5


def test_script_from_a_run_loads_the_weights_it_was_exported_with(trained, tmp_path):
    path, rd = trained
    from layerflow import Project as Api

    script = Api.load(path).export_script(tmp_path / "trained.py", run=rd)
    assert (tmp_path / "trained.weights.pt").is_file()
    spec = importlib.util.spec_from_file_location("trained_script", script)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["trained_script"] = mod
    try:
        spec.loader.exec_module(mod)
        with torch.no_grad():
            got = mod.load_model()(torch.as_tensor(X)).numpy()
    finally:
        sys.modules.pop("trained_script", None)
    want = outputs_of(path, final_state(rd), X)
    assert float(np.abs(got - want).max()) < 1e-6
    assert float(np.abs(got - outputs_of(path, None, X)).max()) > 1e-2


# ----- use, fine-tune, predict --------------------------------------------------------------
def test_use_run_weights_then_export_carries_them(trained, tmp_path, capsys):
    path0, rd = trained
    path = tmp_path / "mlp.lflow"
    shutil.copyfile(path0, path)
    assert cli(["weights", "use", str(path), str(rd), "--checkpoint", "step_30"]) == 0
    p = load_project(path)
    assert p.weights == "mlp.weights.pt"
    state = torch.load(tmp_path / "mlp.weights.pt", weights_only=True)
    want = run_state(p, rd, "step_30")
    assert all(torch.equal(state[k], want[k]) for k in want)
    assert cli(["export", str(path), "--onnx", str(tmp_path / "m.onnx")]) == 0
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: X})[0]
    assert np.abs(got - outputs_of(path, want, X)).max() < 1e-5
    # the API: the in-memory project follows, and can still be saved
    from layerflow import Project as Api

    api = Api.load(path)
    api.use_run_weights(rd)  # final
    assert api.core.weights == "mlp.weights.pt"
    api.save()


def test_fine_tune_starts_from_the_runs_weights(trained, tmp_path, capsys):
    path, rd = trained
    out = tmp_path / "ft"
    assert cli(["train", str(path), "--init-from", f"{rd}:best", "--steps", "2", "--out", str(out)]) == 0
    assert "initial weights: r1 (step_" in capsys.readouterr().err
    init = torch.load(out / "weights.pt", weights_only=True)
    want = run_state(load_project(path), rd, "best")
    assert all(torch.equal(init[k], want[k]) for k in want)
    assert RunSpec.load(out).weights == "weights.pt"
    snap = load_project(out / "project.lflow")  # the run's snapshot names the copy beside it
    assert snap.weights == "weights.pt" and snap.input_file(snap.weights, "weights") == out / "weights.pt"
    # its first loss is the trained model's, far below a fresh start's
    first = next(r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r)
    fresh = next(r["loss"] for r in read_metrics(rd / "metrics.jsonl") if "loss" in r)
    assert first < fresh


def test_predict_cli_and_api(trained, tmp_path, capsys):
    path, rd = trained
    np.save(tmp_path / "x.npy", X)
    from layerflow import Project as Api

    got = Api.load(path).predict(X, run=rd)
    want = outputs_of(path, final_state(rd), X)
    assert got.shape == (5, 4) and np.abs(got - want).max() < 1e-6
    assert np.abs(Api.load(path).predict(tmp_path / "x.npy", run=rd, batch_size=2) - want).max() < 1e-6
    assert cli(["predict", str(path), "--run", str(rd), "--input", str(tmp_path / "x.npy"),
                "-o", str(tmp_path / "y.npy"), "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 and lines[0].startswith("x[0]: ") and lines[0].count("%") == 2
    assert int(lines[0].split(": ")[1].split()[0]) == int(want[0].argmax())
    assert np.abs(np.load(tmp_path / "y.npy") - want).max() < 1e-6
    np.save(tmp_path / "bad.npy", np.zeros((3, 7), np.float32))
    assert cli(["predict", str(path), "--run", str(rd), "--input", str(tmp_path / "bad.npy")]) == 2
    assert "takes samples of shape [16]" in capsys.readouterr().err


def test_predict_a_folder_of_images_from_the_command_line(tmp_path):
    """A real `main.py predict` on a folder of PNGs: one line per image with its top classes."""
    import subprocess

    from PIL import Image

    g = Graph()
    g.add_node("Input", {"shape": [3, 8, 8]}, id="x")
    g.add_node("Flatten", {}, id="flat")
    g.add_node("Linear", {"out_features": 3}, id="fc")
    g.add_node("Output", {"loss": "cross_entropy"}, id="out")
    for a, b in [("x", "flat"), ("flat", "fc"), ("fc", "out")]:
        g.connect(a, "out", b, "in")
    tr = Training.model_validate({"dataset": {"kind": "synthetic_images", "n_samples": 64, "channels": 3, "height": 8,
                                              "width": 8, "n_classes": 3}, "batch_size": 16, "steps": 4,
                                  "eval_interval": 4, "checkpoint_interval": 4})
    path = save_project(Project(g, name="img", training=tr), tmp_path / "img.lflow")
    rd = prepare_run(load_project(path), tmp_path / "runs" / "r")
    assert train_run(rd).state == "succeeded"
    pics = tmp_path / "pics"
    (pics / "sub").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in ("a.png", "sub/b.png"):
        Image.fromarray(rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)).save(pics / name)
    root = Path(__file__).resolve().parents[3]
    r = subprocess.run([sys.executable, str(root / "main.py"), "predict", str(path), "--run", str(rd), "--input",
                        str(pics), "--top", "2", "-o", str(tmp_path / "out.npy")],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["a.png", "sub/b.png"] and all(ln.count("%") == 2 for ln in lines)
    out = np.load(tmp_path / "out.npy")
    assert out.shape == (2, 3)
    r = subprocess.run([sys.executable, str(root / "main.py"), "weights", "list", str(rd)],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0 and r.stdout.split()[:2] == ["final", "latest"]


def test_two_process_run_keeps_its_policy_and_its_checkpoints_export(tmp_path):
    """Data parallel over 2 processes: rank 0 applies the policy after each whole save; a
    DCP checkpoint written by two ranks is read back in this one process."""
    p = mlp(steps=40, keep=1)
    path = save_project(p, tmp_path / "mlp.lflow")
    rd = tmp_path / "runs" / "dp2"
    assert cli(["train", str(path), "--nproc", "2", "--out", str(rd)]) == 0
    evals = {r["step"]: r["val_loss"] for r in read_metrics(rd / "metrics.jsonl") if "val_loss" in r}
    best = f"step_{min(evals, key=lambda s: (evals[s], s))}"
    assert {q.name for q in (rd / "checkpoints").glob("step_*")} == {"step_40", best}
    state = run_state(load_project(path), rd, "latest")
    final = final_state(rd)
    assert all(torch.equal(state[k], final[k]) for k in final)


def test_api_fine_tune_records_where_its_weights_came_from(trained, tmp_path):
    from layerflow import Project as Api

    path, rd = trained
    run = Api.load(path).fine_tune(rd, "step_30", steps=2, out=tmp_path / "ft")
    assert run.wait(timeout=240).state == "succeeded"
    init = torch.load(tmp_path / "ft" / "weights.pt", weights_only=True)
    want = run_state(load_project(path), rd, "step_30")
    assert all(torch.equal(init[k], want[k]) for k in want)
    note = json.loads((tmp_path / "ft" / "init_from.json").read_text())
    assert note == {"run": str(rd.resolve()), "checkpoint": "step_30"}
