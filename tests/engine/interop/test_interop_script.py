"""The exported PyTorch script: readable, standalone, and it trains with the same
losses as Layerflow's runtime for the same seed (single process and DDP)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.diagram.graph import Graph
from engine.interop import export_script
from engine.project import Project, Training, load_project
from engine.data.sources import SyntheticClassification, SyntheticImages
from engine.runs.build import prepare_run
from engine.runtime.train import run
from engine.runs.tail import read_metrics

from interop_models import project_with_weights

ROOT = Path(__file__).resolve().parents[3]
EX = ROOT / "resources" / "examples"
STEPS = 6


def dropout_mlp(folder: Path) -> Project:
    g = Graph()
    g.add_node("Input", {"shape": [16]}, id="x")
    g.add_node("Linear", {"out_features": 32}, id="fc1")
    g.add_node("Dropout", {"p": 0.3}, id="drop")  # uses the RNG while training
    g.add_node("ReLU", {}, id="relu")
    g.add_node("Linear", {"out_features": 32}, id="fc2")
    g.add_node("Add", {}, id="skip")
    g.add_node("Linear", {"out_features": 3}, id="head")
    g.add_node("Output", {"loss": "cross_entropy"}, id="out")
    for s, d, port in [("x", "fc1", "in"), ("fc1", "drop", "in"), ("drop", "relu", "in"), ("relu", "fc2", "in"),
                       ("fc2", "skip", "a"), ("relu", "skip", "b"), ("skip", "head", "in"), ("head", "out", "in")]:
        g.connect(s, "out", d, port)
    tr = Training(dataset=SyntheticClassification(kind="synthetic_classification", n_samples=256, n_features=16,
                                                  n_classes=3),
                  batch_size=16, steps=STEPS, eval_interval=3, seed=5,
                  optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9}, schedule={"name": "cosine", "warmup_steps": 2},
                  grad_clip=1.0)
    return Project(g, name="dropout_mlp", training=tr, path=folder / "dropout_mlp.lflow")


def runtime_losses(project: Project, run_dir: Path) -> list[float]:
    if project.training.log_interval is None:  # compared step by step (the script then logs each step too)
        project.training.log_interval = 1
    rd = prepare_run(project, run_dir, steps=STEPS)
    assert run(rd).state == "succeeded"
    return [r["loss"] for r in read_metrics(rd / "metrics.jsonl") if "loss" in r]


def script_losses(script: Path, out: Path, launcher: list[str] | None = None) -> list[float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)  # standalone: nothing from Layerflow on the path
    cmd = (launcher or [sys.executable]) + [str(script), "--steps", str(STEPS), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=script.parent, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_script_reads_like_pytorch(tmp_path):
    path = export_script(dropout_mlp(tmp_path), tmp_path / "dropout_mlp.py")
    text = path.read_text()
    assert "class Model(nn.Module):" in text
    assert "self.fc1 = nn.Linear(16, 32, bias=True)" in text and "self.drop = nn.Dropout(0.3)" in text
    assert "skip = fc2 + relu" in text and "# (B, 32)" in text
    assert "torchrun --standalone --nproc_per_node=2 dropout_mlp.py" in text
    assert "import engine" not in text and "from engine" not in text  # standalone
    assert "GraphModule" not in text


@pytest.mark.parametrize("which", ["dropout_mlp", "dropout_mlp+accumulate", "dropout_mlp+log4", "dropout_mlp+bf16",
                                   "transformer_synthetic"])
def test_script_losses_equal_the_runtime(which, tmp_path):
    project = dropout_mlp(tmp_path) if which.startswith("dropout_mlp") else load_project(EX / f"{which}.lflow")
    if which.endswith("+accumulate"):  # training.grad_accumulation: 2 micro-batches of 8, one step
        project.training.grad_accumulation = 2
    if which.endswith("+log4"):  # a line every 4 steps (and at evaluations): the mean loss of its steps
        project.training.log_interval = 4
    if which.endswith("+bf16"):  # placement.mixed_precision: the forward autocasts in one process too
        project.placement.mixed_precision = "bf16"
        fp32 = runtime_losses(dropout_mlp(tmp_path), tmp_path / "run_fp32")
    want = runtime_losses(project, tmp_path / "run")
    if which.endswith("+bf16"):  # really in bf16 (not the float32 losses), and still close to them
        assert want != pytest.approx(fp32, rel=1e-4) and want == pytest.approx(fp32, rel=0.05)
    script = export_script(project, tmp_path / f"{which}.py")
    got = script_losses(script, tmp_path / "script_out")
    logged = [s for s in range(1, STEPS + 1) if s % project.training.log_interval == 0 or s % 3 == 0 or s == STEPS]
    assert len(got) == len(want) == len(logged)
    assert got == pytest.approx(want, rel=1e-6, abs=1e-7)


def test_script_starts_from_imported_weights(tmp_path):
    """A project with a weights file (as an import leaves it): the file travels
    beside the script and training starts from it, as in the runtime."""
    project = project_with_weights("cnn_bn", tmp_path)
    project.training = Training(dataset=SyntheticImages(kind="synthetic_images", n_samples=128, channels=3, height=12,
                                                        width=12, n_classes=5),
                                batch_size=16, steps=STEPS, eval_interval=3, seed=3)
    want = runtime_losses(project, tmp_path / "run")
    out = tmp_path / "export"
    script = export_script(project, out / "cnn.py")
    assert (out / "cnn.weights.pt").exists()
    assert script_losses(script, tmp_path / "script_out") == pytest.approx(want, rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("name", ["attention_parts", "cnn_rect"])
def test_script_prints_the_newer_layers_and_computes_the_same(name, tmp_path):
    """RMSNorm, Transpose, Slice, Scale (numbers and per-element constants), MatMul and
    non-square kernels: readable lines, and the script's Model with the weights file
    gives the runtime's outputs; attention_parts also trains to the runtime's losses."""
    import importlib.util

    import torch

    from engine.diagram.compile import compile_graph
    from engine.data.sources import SyntheticSequence
    from engine.runtime.model import load_weights

    from interop_models import sample

    project = project_with_weights(name, tmp_path)
    project.training = Training(
        dataset=SyntheticSequence(kind="synthetic_sequence", n_samples=128, seq_len=10, vocab_size=32, n_classes=4)
        if name == "attention_parts" else
        SyntheticImages(kind="synthetic_images", n_samples=128, channels=3, height=12, width=10, n_classes=3),
        batch_size=16, steps=STEPS, eval_interval=3, seed=3, log_interval=1)
    script = export_script(project, tmp_path / "export" / f"{name}.py")
    text = script.read_text()
    lines = {"attention_parts": ["self.rms = nn.RMSNorm(16, eps=1e-06, elementwise_affine=True)",
                                 "self.kt = Transpose(1, 2)", "scores = q @ kt", "self.scaled = Scale(0.25, 0.0)",
                                 "self.every2 = Slice(1, 2, 8, 2)", "self.tail = Slice(-1, 4, None, 1)",
                                 "self.affine = Scale(0.5, 0.1, (12,))", "class Slice(nn.Module):"],
             "cnn_rect": ["self.conv = nn.Conv2d(3, 6, (3, 5), stride=(1, 2), padding=(1, 2), dilation=1",
                          "self.maxpool = nn.MaxPool2d((2, 1), stride=(2, 1), padding=0)",
                          "self.avgpool = nn.AvgPool2d((3, 1), stride=1, padding=(1, 0))",
                          "self.swap_hw = Transpose(-1, -2)", "self.per_channel = Scale(1.0, 0.0, (6, 1, 1))"]}[name]
    for line in lines:
        assert line in text, line
    spec = importlib.util.spec_from_file_location(f"exported_{name}", script)
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look it up
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[spec.name]
    model = mod.Model()
    model.load_state_dict(torch.load(script.with_name(f"{name}.weights.pt"), weights_only=True))
    gm = compile_graph(project.graph).build()
    load_weights(gm, str(tmp_path / project.weights))
    x = sample(project.graph, 3, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), gm.eval()(x), rtol=0, atol=0)
    if name == "attention_parts":
        want = runtime_losses(project, tmp_path / "run")
        assert script_losses(script, tmp_path / "script_out") == pytest.approx(want, rel=1e-6, abs=1e-7)


def test_script_of_digits_brings_its_data(tmp_path):
    project = load_project(EX / "mlp_digits.lflow")
    project.training.log_interval = 1  # compared step by step
    script = export_script(project, tmp_path / "digits.py")
    assert (tmp_path / "digits.data.npz").exists()
    want = runtime_losses(project, tmp_path / "run")
    assert script_losses(script, tmp_path / "out") == pytest.approx(want, rel=1e-6, abs=1e-7)


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def torchrun_runtime_losses(project: Project, run_dir: Path, **prepare) -> list[float]:
    """The losses of Layerflow's distributed runtime on 2 processes (each step's)."""
    if project.training.log_interval is None:
        project.training.log_interval = 1
    rd = prepare_run(project, run_dir, steps=STEPS, **prepare)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(TORCHRUN + ["-m", "engine.runtime.train", str(rd)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [r["loss"] for r in read_metrics(rd / "metrics.jsonl") if "loss" in r]


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
@pytest.mark.parametrize("kind", ["ddp", "fsdp", "pp"])
def test_script_under_torchrun_equals_the_distributed_runtime(kind, tmp_path):
    """dp=2 with DDP or FSDP2, or a 2-stage 1F1B pipeline (2 micro-batches) whose cut
    the skip connection crosses."""
    project = dropout_mlp(tmp_path)
    project.graph.set_param("drop", "p", 0.0)  # replicas draw their own dropout masks
    if kind == "pp":
        project.placement.pp, project.placement.microbatches = 2, 2
    else:
        project.placement.dp, project.placement.data_parallel = 2, kind
    want = torchrun_runtime_losses(project, tmp_path / "run")
    script = export_script(project, tmp_path / f"{kind}.py")
    if kind == "pp":
        text = script.read_text()
        assert "STAGES = [['fc1', 'drop', 'relu', 'fc2'], ['skip', 'head']]" in text
        assert "def forward_stage1(self, relu, fc2):" in text
    got = script_losses(script, tmp_path / "out", launcher=TORCHRUN)
    assert len(got) == STEPS
    assert got == pytest.approx(want, rel=1e-6, abs=1e-7)


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_script_under_torchrun_equals_the_tensor_parallel_runtime(tmp_path):
    """tp=2 on the transformer: fc_in column-wise into fc_out row-wise (the Megatron
    pair, Shard(-1) in between), the attention's heads split over the two ranks, and
    the norms sequence-parallel (each rank normalizes 8 of the 16 tokens)."""
    from engine.planning.planner import make_plan

    project = load_project(EX / "transformer_synthetic.lflow")
    plan = make_plan(project, 2, placement={"tp": 2}, styles={"attn": "colwise", "fc_in": "colwise",
                                                              "fc_out": "rowwise", "ln1": "sequence",
                                                              "ln2": "sequence", "ln_f": "sequence"})
    assert plan.ok, plan.errors
    want = torchrun_runtime_losses(project, tmp_path / "run", placement={"tp": 2}, plan=plan.runtime_plan())
    script = export_script(project, tmp_path / "tp.py", plan=plan)
    text = script.read_text()
    assert "TPEntry.from_json(e" in text and "class Layout:" in text and "ColwiseParallel(" in text
    assert "SequenceParallel(" in text and "'style': 'sequence'" in text
    assert "torchrun --standalone --nproc_per_node=2 transformer_synthetic.py" in text
    got = script_losses(script, tmp_path / "out", launcher=TORCHRUN)
    assert len(got) == len(want) == STEPS
    assert got == pytest.approx(want, rel=1e-4)


def test_cli_export_script_with_a_plan(tmp_path):
    """`export --script` writes the project's data parallelism (placement dp=2, FSDP)."""
    from app.cli import main
    from engine.project import save_project

    project = dropout_mlp(tmp_path)
    project.placement.dp, project.placement.data_parallel = 2, "fsdp"
    save_project(project, tmp_path / "p.lflow")
    assert main(["export", str(tmp_path / "p.lflow"), "--script", str(tmp_path / "p.py")]) == 0
    text = (tmp_path / "p.py").read_text()
    assert "'dp': 2" in text and "'data_parallel': 'fsdp'" in text and "fully_shard(" in text
    assert "torchrun --standalone --nproc_per_node=2 p.py" in text


def test_a_data_set_that_does_not_fit_is_refused(tmp_path):
    from engine.interop import InteropError

    project = dropout_mlp(tmp_path)
    project.training.dataset.n_features = 7
    with pytest.raises(InteropError, match="shape is \\[16\\] but the data set's samples are \\[7\\]"):
        export_script(project, tmp_path / "bad.py")
    assert not (tmp_path / "bad.py").exists()


LINT_LAYOUTS = {"one": {}, "ddp": {"dp": 2}, "fsdp_syncbn": {"dp": 2, "data_parallel": "fsdp", "sync_batchnorm": True},
                "pp": {"pp": 2}, "tp": {"tp": 2, "data_parallel": "fsdp"}}


@pytest.mark.parametrize("example", ["mlp_digits", "cnn_digits", "resnet_synthetic", "transformer_synthetic"])
def test_every_exported_script_lints_clean_and_holds_only_what_its_plan_uses(example, tmp_path):
    """pyflakes' checks through ruff (unused imports, undefined names, unused locals) and
    py_compile, for every example under every layout the tests train; a one-process
    script carries no FSDP, pipeline or tensor-parallel code."""
    import py_compile
    import shutil as _shutil

    from engine.planning.planner import make_plan

    ruff = _shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    assert Path(ruff).exists(), "ruff is a test dependency (pyproject's [test] extra)"
    written = []
    for name, placement in LINT_LAYOUTS.items():
        project = load_project(EX / f"{example}.lflow")
        project.placement = project.placement.derive(**placement)
        world = project.placement.world
        plan = make_plan(project, world)
        if not plan.ok:
            continue  # a layout this model cannot take (the planner says why elsewhere)
        script = export_script(project, tmp_path / name / f"{example}.py", plan=plan if world > 1 else None)
        py_compile.compile(str(script), doraise=True)
        written.append(script)
        text = script.read_text()
        if name == "one":
            for absent in ("fully_shard", "PipelineStage", "apply_tp", "class Stage", "convert_sync_batchnorm",
                           "infer_stage_shapes"):
                assert absent not in text, absent
        if name == "pp":
            assert "PipelineStage(" in text and "class Stage(nn.Module)" in text and "fully_shard" not in text
    assert len(written) >= 4, [p.parent.name for p in written]
    r = subprocess.run([ruff, "check", "--no-cache", "--isolated", "--select", "F,E9", "--output-format", "concise",
                        *map(str, written)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
