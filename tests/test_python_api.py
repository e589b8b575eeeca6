"""`import layerflow as lf`: the README's example run as written, and the API's behaviour
(editing, checks and their errors, placement, runs followed, cancelled and resumed,
a module imported with its weights) on real runs and real files."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import layerflow as lf

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "resources" / "examples"


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_the_readme_example_runs_and_two_processes_equal_one(tmp_path):
    code = readme_example()
    assert len([ln for ln in code.splitlines() if ln.strip()]) <= 12
    env = dict(os.environ, PYTHONPATH=str(ROOT), LAYERFLOW_DATA_DIR=str(tmp_path / "data"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^total\s+9,610\s+18\.9K$", out, re.M), out  # the summary table's totals
    assert "mesh: pp=1 x dp=2 x tp=1 = 2 ranks" in out  # the plan printed
    printed = [ln.split() for ln in out.splitlines() if re.fullmatch(r"\d+ (\d+\.\d+|None)", ln)]
    losses = {int(s): float(v) for s, v in printed if v != "None"}
    assert max(losses) == 60 and losses[60] < losses[min(losses)]  # followed to the last step, and it learned
    (run_dir,) = (tmp_path / "runs").iterdir()
    run = lf.Run(run_dir)
    assert run.status().state == "succeeded" and dict(run.losses()) == pytest.approx(losses)
    # the same project on one process: DDP over 2 ranks ends with the single-process weights
    one = lf.Project.load(run_dir / "project.lflow").train(dp=1, out=tmp_path / "one")
    assert one.wait().state == "succeeded" and one._job.nproc == 1
    two_w = torch.load(run_dir / "model.pt", weights_only=True)
    one_w = torch.load(one.dir / "model.pt", weights_only=True)
    assert two_w.keys() == one_w.keys()
    for k in one_w:
        torch.testing.assert_close(two_w[k], one_w[k], rtol=1e-4, atol=1e-5)


def _mlp() -> lf.Project:
    p = lf.Project.new("api", dataset={"kind": "digits"}, steps=20, eval_interval=10)
    x = p.add("Input", shape=[64])
    h = p.add("ReLU", p.add("Linear", x, out_features=32, id="fc1"), id="act")
    p.add("Output", p.add("Linear", h, out_features=10, id="head"), loss="cross_entropy", id="out")
    return p


def test_editing_and_its_errors_name_what_is_wrong():
    p = _mlp()
    assert p.nodes == ["input1", "fc1", "act", "head", "out"]
    assert p.graph.incoming("head")["in"].src == "act"
    with pytest.raises(lf.GraphError, match="unknown layer type 'Linaer' \\(did you mean Linear"):
        p.add("Linaer", "act")
    with pytest.raises(lf.GraphError, match="Linear: unknown parameter 'out_feature' \\(did you mean out_features"):
        p.add("Linear", "act", out_feature=3)
    with pytest.raises(lf.GraphError, match="no node named 'nope'"):
        p.add("ReLU", "nope")
    with pytest.raises(lf.GraphError, match="ReLU takes 1 input"):
        p.add("ReLU", "fc1", "act")
    assert p.nodes == ["input1", "fc1", "act", "head", "out"]  # nothing half added
    a = p.add("Add", "fc1", "act")  # inputs in port order: a, b
    assert {port: e.src for port, e in p.graph.incoming(a).items()} == {"a": "fc1", "b": "act"}
    p.remove(a)
    with pytest.raises(lf.LayerflowError, match="would make a cycle"):
        p.connect("head", "fc1.in")
    # a setting changed on the model is checked before use, naming the field
    p.training.batch_size = 0
    with pytest.raises(lf.ProjectError, match="training: batch_size"):
        p.validate()
    p.training.batch_size = 64
    with pytest.raises(lf.ProjectError, match="training: optimizer.lr"):
        lf.Project.new("bad", optimizer={"lr": -1})
    with pytest.raises(lf.GraphError, match="node 'fc1' \\(Linear\\): out_features must be at least 1, not 0"):
        p.set("fc1", out_features=0)
    # the diagram's errors: every one, naming the node
    p.remove("act")
    with pytest.raises(lf.CheckFailed) as err:
        p.validate()
    assert any("'head'" in e for e in err.value.errors), err.value.errors
    p.add("ReLU", "fc1", id="act")
    p.connect("act", "head")
    assert p.validate() == []
    s = p.summary()
    assert s["fc1"]["params"] == 64 * 32 + 32 and s.total_params == 64 * 32 + 32 + 33 * 10
    assert "head" in str(s) and str(s).splitlines()[-1].startswith("total")


def test_place_plan_and_autoplace(tmp_path):
    p = _mlp()
    plan = p.place(pp=2)
    assert p.placement.pp == 2 and len(plan.doc["stages"]) == 2
    assert plan.run_plan().pp == 2  # the typed plan the runtime reads
    assert "stage 1" in str(plan)
    before = p.placement.model_copy()
    with pytest.raises(lf.CheckFailed, match="the placement cannot run") as err:
        p.place(pp=2, schedule="1f1b", microbatches=1)
    assert any("microbatches" in e for e in err.value.errors)
    assert p.placement == before  # left as it was
    with pytest.raises(lf.RunError, match="placement.dp"):
        p.plan(dp=0)
    p.place(pp=1)
    plan = p.autoplace(devices=2)
    assert plan.reasons and p.placement.pp * p.placement.dp * p.placement.tp == 2
    path = p.save(tmp_path / "api.lflow")
    again = lf.Project.load(path)
    assert again.placement == p.placement
    assert len({again.graph.nodes[n].pos for n in again.nodes}) == len(again.nodes)  # laid out when saved
    assert lf.Project.load(path).diff(p).changes == []


def test_a_run_is_followed_cancelled_and_resumed(tmp_path):
    p = _mlp()
    p.training.steps = 100_000
    p.training.log_interval = 1
    p.training.checkpoint_interval = 1_000_000
    run = p.train(out=tmp_path / "r")
    first = next(r for r in run.metrics(follow=True, timeout=120) if "loss" in r)
    assert first["step"] >= 1 and run.running
    st = run.cancel()
    assert st.state == "cancelled" and 1 <= st.step < 100_000 and not run.running
    assert run._job.poll() is not None  # the trainer's process is gone
    assert (run.dir / "checkpoints").is_dir()  # a cancelled run checkpoints where it stopped
    assert f"cancelled at step {st.step}" in run.logs()  # rank0.log, as Job.logs reads a cluster job's
    more = run.resume(steps=st.step + 5)
    assert more.wait(timeout=300).state == "succeeded"
    steps = [s for s, _ in more.losses()]
    assert steps == sorted(set(steps)) and steps[-1] == st.step + 5  # no step repeated, none lost
    with pytest.raises(lf.LayerflowError, match="not a run folder"):
        lf.Run(tmp_path)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def test_from_module_keeps_its_weights_through_save_load_and_onnx(tmp_path):
    import onnxruntime as ort

    torch.manual_seed(0)
    model = Tiny().eval()
    p = lf.Project.from_module(model, input_shape=[3, 8, 8], name="tiny")
    assert p.summary().total_params == sum(t.numel() for t in model.parameters())
    with pytest.raises(lf.LayerflowError, match="save the project first"):
        p.train()
    path = p.save(tmp_path / "tiny.lflow")
    assert (tmp_path / "tiny.weights.pt").is_file()
    loaded = lf.Project.load(path)
    onnx_path = loaded.export_onnx(tmp_path / "tiny.onnx")
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    (got,) = ort.InferenceSession(str(onnx_path)).run(None, {ort.InferenceSession(str(onnx_path)).get_inputs()[0].name: x})
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    script = loaded.export_script(tmp_path / "tiny_train.py")
    assert "import torch" in script.read_text()


def test_the_cli_prints_the_apis_errors(tmp_path):
    """The command line is the layer over the API: its errors are the API's, one line each."""
    bad = tmp_path / "bad.lflow"
    data = json.loads((EXAMPLES / "mlp_digits.lflow").read_text())
    data["training"]["optimizer"]["lr"] = -1
    bad.write_text(json.dumps(data))
    with pytest.raises(lf.ProjectError) as err:
        lf.Project.load(bad)
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "summary", str(bad)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: {err.value}"


@pytest.mark.slow
def test_a_sweep_from_the_api_returns_its_runs(tmp_path):
    p = _mlp()
    p.save(tmp_path / "api.lflow")
    seen = []
    rows = p.sweep({"parameters": {"training.optimizer.lr": [0.001, 0.05]}, "steps": 6}, parallel=2,
                   on_event=lambda kind, run: seen.append((kind, run.index)))
    assert [r["settings"]["lr"] for r in rows] == [0.001, 0.05] and [r["index"] for r in rows] == [0, 1]
    assert all(r["state"] == "succeeded" and r["step"] == 6 and r["final_loss"] is not None for r in rows)
    assert all(Path(r["path"]).parent == tmp_path / "runs" for r in rows)
    assert {("finished", 0), ("finished", 1), ("started", 0), ("started", 1)} <= set(seen)
    with pytest.raises(lf.SweepError, match="training.no_such"):
        p.sweep({"parameters": {"training.no_such": [1]}})


@pytest.mark.parametrize("shadow", ["engine.py", "remote.py", "engine/"])
def test_a_users_own_engine_module_is_named_in_one_line(tmp_path, shadow):
    """A notebook folder with its own engine.py (or remote.py, or an engine/ folder of data):
    `import layerflow` there says which file shadows which package, instead of failing deep
    inside with "'engine' is not a package"; without it, the same import works."""
    if shadow.endswith("/"):
        (tmp_path / shadow).mkdir()
    else:
        (tmp_path / shadow).write_text("x = 1\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", "import layerflow"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    name = shadow.strip("/").removesuffix(".py")
    assert last.startswith("ImportError: layerflow: ") and f"shadows Layerflow's own package '{name}'" in last
    assert (str(tmp_path / shadow) in last) if shadow.endswith(".py") else "without __init__.py" in last
    (tmp_path / shadow).unlink() if not shadow.endswith("/") else (tmp_path / shadow).rmdir()
    ok = subprocess.run([sys.executable, "-c", "import layerflow, engine; print(engine.__file__)"], cwd=tmp_path,
                        env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip() == str(ROOT / "engine" / "__init__.py"), ok.stderr
