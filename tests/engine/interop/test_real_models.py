"""Real architectures come in through torch.export and stay themselves.

Each model of tests/models/real_models.py (written like its public reference code)
imports, and then, from the saved project and weights file, as a user would:
computes what the source computes on a batch size it was not imported with, exports
to ONNX that onnxruntime runs to the same outputs, plans a pp=2 cut, and trains.
Shared weights stay one tensor through the runtime, a checkpoint and the script.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.diagram.compile import compile_graph
from engine.interop import InteropError, export_onnx, export_script, save_imported
from engine.interop.module.importer import from_module
from engine.planning.planner import make_plan
from engine.project import load_project
from engine.runs.build import prepare_run
from engine.runtime.train import run
from engine.runs.tail import read_metrics

from real_models import GPT, VISION, SharedTwice

ROOT = Path(__file__).resolve().parents[3]
MODELS = {**{k: (c, s, "float32") for k, (c, s) in VISION.items()}, "gpt": (GPT, [16], "int64")}


def _source(name: str):
    ctor, shape, dtype = MODELS[name]
    torch.manual_seed(0)
    return ctor().eval(), shape, dtype


def _batch(shape, dtype, n=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    if dtype == "int64":
        return torch.randint(0, 40, (n, *shape), generator=g)
    return torch.randn((n, *shape), generator=g)


def _imported(name: str, tmp_path: Path):
    model, shape, dtype = _source(name)
    imp = from_module(model, [shape], [dtype])
    return model, load_project(save_imported(imp, tmp_path / f"{name}.lflow")), imp


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-6))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_imports_and_equals_its_source_in_torch_and_onnx(name, tmp_path):
    model, project, imp = _imported(name, tmp_path)
    shape, dtype = MODELS[name][1], MODELS[name][2]
    result = compile_graph(project.graph)
    assert result.ok, result.errors
    assert result.total_params == sum(p.numel() for p in model.parameters())  # each parameter once
    gm = result.build(seed=123)
    from engine.runtime.model import load_weights

    load_weights(gm, project.resolve_path(project.weights))
    x = _batch(shape, dtype)  # batch 5: the import ran with 3
    with torch.no_grad():
        want, got = model(x).numpy(), gm.eval()(x).numpy()
    assert got.shape == want.shape and _rel(got, want) < 1e-4

    import onnxruntime as ort

    sess = ort.InferenceSession(str(export_onnx(project, tmp_path / f"{name}.onnx")))
    onnx_out = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    assert _rel(onnx_out, want) < 1e-4

    if name == "vit":  # nn.MultiheadAttention has no catalog layer: one Op node per call, named after it
        attn = [n for n in project.graph.nodes.values() if n.id.endswith("self_attention")]
        assert [n.type for n in attn] == ["Op", "Op"] and attn[0].params["label"] == "MultiheadAttention"
    # every imported node keeps where it came from (the module tree), saved in the file
    saved = json.loads((tmp_path / f"{name}.lflow").read_text())["diagram"]["nodes"]
    scoped = [n for n in saved if n.get("scope")]
    assert len(scoped) >= len(saved) // 2
    assert all(all(isinstance(p, str) and isinstance(t, str) for p, t in n["scope"]) for n in scoped)


@pytest.mark.parametrize("name", ["resnet", "vit", "convnext", "squeezenet"])
def test_plans_a_pipeline_and_trains_in_one_process(name, tmp_path):
    _, project, _ = _imported(name, tmp_path)
    plan = make_plan(project, 2, placement={"pp": 2, "microbatches": 2})
    assert plan.ok, plan.errors
    stages = plan.runtime_plan()["stages"]
    assert len(stages) == 2 and all(stages)
    tp_plan = make_plan(project, 2, placement={"tp": 2})
    if any(n.type == "Op" for n in project.graph.nodes.values()):
        assert any("generic Op node" in w and "replicated" in w for w in tp_plan.warnings)
    project.training.batch_size = 8
    rd = prepare_run(project, tmp_path / "run", steps=3)
    assert run(rd).state == "succeeded"
    losses = [r["loss"] for r in read_metrics(rd / "metrics.jsonl") if "loss" in r]
    assert len(losses) == 3 and all(np.isfinite(losses))


def test_gpt_keeps_its_tied_embedding_and_learns_next_tokens(tmp_path):
    model, project, imp = _imported("gpt", tmp_path)
    ties = project.graph.ties
    assert ties == {"lm_head.weight": "transformer_wte.weight"}
    nodes = project.graph.nodes
    assert nodes["transformer_wte"].type == "Embedding" and nodes["lm_head"].type == "Linear"
    assert nodes["transformer_h_0_attn_c_attn"].scope == [["transformer.h.0", "Block"], ["transformer.h.0.attn",
                                                         "CausalSelfAttention"], ["transformer.h.0.attn.c_attn", "Linear"]]
    ds = project.training.dataset
    assert (ds.kind, ds.task, ds.seq_len, ds.vocab_size) == ("synthetic_sequence", "next_token", 16, 40)

    # a pipeline cut between the embedding and the head: each stage keeps a copy (tests/engine/runtime/test_dist_tied.py)
    cut = make_plan(project, 2, placement={"pp": 2, "microbatches": 2})
    assert cut.ok and any("tied weights" in n and "transformer_wte" in n and "lm_head" in n for n in cut.notes)

    project.training.steps = 30
    project.training.batch_size = 16
    project.training.optimizer.lr = 3e-3
    project.training.optimizer.name = "adamw"
    project.training.log_interval = 1  # the first step's loss against the last's
    rd = prepare_run(project, tmp_path / "run", steps=30)
    assert run(rd).state == "succeeded"
    losses = [r["loss"] for r in read_metrics(rd / "metrics.jsonl") if "loss" in r]
    assert losses[-1] < losses[0] - 0.3  # it learns the chain
    state = torch.load(rd / "model.pt", weights_only=True)
    sd = state.get("model", state) if isinstance(state, dict) else state
    torch.testing.assert_close(sd["lm_head.weight"], sd["transformer_wte.weight"], rtol=0, atol=0)
    assert not torch.equal(sd["lm_head.weight"], imp.state["lm_head.weight"])  # trained, still one tensor


def test_a_module_called_twice_keeps_one_set_of_weights(tmp_path):
    torch.manual_seed(0)
    m = SharedTwice().eval()
    imp = from_module(m, [[8]])
    g = imp.project.graph
    assert g.ties == {"fc_call2.weight": "fc.weight", "fc_call2.bias": "fc.bias"}
    assert [n.type for n in g.nodes.values()].count("Linear") == 3
    gm = compile_graph(g).build(seed=0)
    assert gm.fc_call2.weight is gm.fc.weight
    assert sum(p.numel() for p in gm.parameters()) == sum(p.numel() for p in m.parameters()) == 99
    # the exported script holds one tensor too
    project = load_project(save_imported(imp, tmp_path / "shared.lflow"))
    from engine.data.sources import SyntheticClassification

    project.training.dataset = SyntheticClassification(kind="synthetic_classification", n_samples=64, n_features=8,
                                                       n_classes=3)
    text = export_script(project, tmp_path / "shared.py").read_text()
    assert "self.fc_call2.weight = self.fc.weight" in text


def test_imported_model_with_op_nodes_exports_a_script_that_runs_standalone(tmp_path):
    from test_interop_script import STEPS, runtime_losses, script_losses

    _, project, _ = _imported("convnext", tmp_path)
    assert any(n.type == "Op" for n in project.graph.nodes.values())  # permute, layer scale
    project.training.batch_size = 8
    project.training.steps = STEPS
    project.training.log_interval = 1  # compared step by step
    script = export_script(project, tmp_path / "convnext.py")
    text = script.read_text()
    assert "class AtenOp(nn.Module)" in text and "aten.permute.default" in text
    want = runtime_losses(project, tmp_path / "rt")
    got = script_losses(script, tmp_path / "out")
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_imported_models_train_data_parallel_equal_to_one_process(tmp_path):
    """dp=2 (DDP) on real torchrun processes gives the single-process losses for the
    GPT (tied weights) and ViT (class token, generic ops)."""
    for name in ("gpt", "vit"):
        _, project, _ = _imported(name, tmp_path)
        project.training.batch_size = 8
        project.training.eval_interval = 100
        path = tmp_path / f"{name}.lflow"
        from engine.project import save_project

        save_project(project, path)
        curves = {}
        for label, extra in (("one", []), ("dp2", ["--nproc", "2", "--dp", "2"])):
            out = tmp_path / f"{name}_{label}"
            r = subprocess.run([sys.executable, str(ROOT / "main.py"), "train", str(path), "--steps", "4",
                                "--out", str(out), *extra], cwd=ROOT, capture_output=True, text=True, timeout=400)
            assert r.returncode == 0, r.stderr[-3000:]
            curves[label] = [x["loss"] for x in read_metrics(out / "metrics.jsonl") if "loss" in x]
        np.testing.assert_allclose(curves["dp2"], curves["one"], rtol=1e-4)


def test_an_operator_that_cannot_be_represented_is_named_with_its_line():
    @torch.library.custom_op("layerflow_test::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    class UsesCustomOp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return twice(self.fc(x))

    with pytest.raises(InteropError) as e:
        from_module(UsesCustomOp(), [[4]])
    msg = str(e.value)
    assert "layerflow_test::twice is not an ATen operator" in msg
    assert "test_real_models.py" in msg and "return twice(self.fc(x))" in msg


def test_input_shapes_must_match_forward():
    torch.manual_seed(0)
    with pytest.raises(InteropError, match=r"forward takes 1 input\(s\) \(x\) but 2 input shape\(s\) were given"):
        from_module(VISION["resnet"][0](), [[3, 16, 16], [3, 16, 16]])


def test_an_op_node_cannot_name_anything_but_aten():
    from engine.diagram.graph import Graph

    for op in ("os.system", "builtins.eval", "aten.from_file.default", "torch.load", "operator.attrgetter"):
        g = Graph()
        g.add_node("Input", {"shape": [4]}, id="x")
        g.add_node("Op", {"code": [["y", op, [{"$": "in0"}], {}]]}, id="bad")
        g.add_node("Output", {}, id="out")
        g.connect("x", "out", "bad", "in")
        g.connect("bad", "out", "out", "in")
        errs = compile_graph(g).errors
        assert errs and errs[0].node == "bad" and errs[0].field == "code" and op in str(errs[0]), (op, errs)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_same_model_comes_in_from_its_onnx_export(name, tmp_path):
    """torch.onnx.export (dynamo, dynamic batch) of each family, imported again: the
    ONNX file is read as torch calls and imported through the same torch.export path."""
    import onnx

    from engine.interop import import_onnx

    model, shape, dtype = _source(name)
    prog = torch.onnx.export(model, (_batch(shape, dtype, n=3),), dynamo=True,
                             dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    path = tmp_path / f"{name}.onnx"
    onnx.save(prog.model_proto, str(path))
    imp = import_onnx(path)
    nodes = list(imp.project.graph.nodes.values())
    # the file's scope names rebuild the module tree: the nodes keep their module paths
    assert sum(1 for n in nodes if n.scope) >= len(nodes) // 2
    gm = compile_graph(imp.project.graph).build()
    gm.load_state_dict(imp.state)
    x = _batch(shape, dtype, n=5)
    with torch.no_grad():
        want, got = model(x).numpy(), gm.eval()(x).numpy()
    assert got.shape == want.shape and _rel(got, want) < 1e-4
