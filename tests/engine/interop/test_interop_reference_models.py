"""Issue 43, items 2-4: imports that check themselves on real tokens, drop dead calls,
keep a value computed once, and name what they cannot bring in (models written like
their public reference code: tests/models/reference_models.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import engine.interop.module.importer as mi
from engine.diagram.compile import compile_graph
from engine.interop import InteropError
from engine.interop.module.importer import from_module

from real_models import GPT


class TwoTables(nn.Module):
    """Token ids into a 40-row word table and, shifted, a 7-row type table: ids must stay below 7."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(40, 8)
        self.tte = nn.Embedding(7, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, idx):
        return self.head((self.wte(idx) + self.tte(idx)).mean(1))


def _checked_on(monkeypatch):
    seen = []
    real = mi._check_outputs

    def spy(imported, module, samples):
        seen.append([s.clone() for s in samples])
        return real(imported, module, samples)

    monkeypatch.setattr(mi, "_check_outputs", spy)
    return seen


def test_token_inputs_are_checked_on_random_ids_within_the_vocabulary(monkeypatch):
    seen = _checked_on(monkeypatch)
    torch.manual_seed(0)
    from_module(GPT().eval(), [[16]], ["int64"])
    ids = seen[-1][0]
    assert ids.dtype == torch.int64 and ids.min() >= 0 and ids.max() < 40
    assert len(ids.unique()) > 10  # not all zeros: the check sees real tokens
    torch.manual_seed(0)
    from_module(TwoTables().eval(), [[12]], ["int64"])
    ids = seen[-1][0]
    assert ids.max() < 7 and len(ids.unique()) > 3  # the smallest table bounds them
    from_module(TwoTables().eval(), [[12]], ["int64"], vocab=3)  # the user's vocabulary
    assert seen[-1][0].max() < 3
    # seeded: the same ids each time
    from_module(TwoTables().eval(), [[12]], ["int64"])
    assert torch.equal(seen[-1][0], ids)


def test_calls_whose_results_reach_no_output_are_not_imported():
    from reference_models import HFEncoder

    torch.manual_seed(0)
    model = HFEncoder().eval()
    imp = from_module(model, [[10]], ["int64"])
    g = imp.project.graph
    result = compile_graph(g)
    assert result.ok and not [w for w in result.warnings if "does not reach an Output" in str(w)]
    assert not {"ones", "unsqueeze", "rsub", "zeros_like"} & set(g.nodes)  # the mask helpers are gone
    assert result.total_params == sum(p.numel() for p in model.parameters())
    assert set(imp.state) == set(result.build(seed=0).state_dict())
    gm = result.build(seed=0)
    gm.load_state_dict(imp.state)
    x = torch.randint(0, 30, (4, 10))
    with torch.no_grad():
        torch.testing.assert_close(gm.eval()(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_torchvision_style_convnext_comes_in_from_its_onnx_export(tmp_path):
    """torch.onnx (dynamo) writes AdaptiveAvgPool2d's flatten as an as_strided Gather whose
    indices are computed from the batch size (arange(B) * 16 + ...): integer values that
    must stay integers (no Scale node), read as int64 by index_select."""
    import onnx

    from engine.interop import import_onnx
    from reference_models import ConvNeXtTV

    torch.manual_seed(0)
    model = ConvNeXtTV().eval()
    with torch.no_grad():  # trained layer scales (equal initial ones would be one ONNX initializer)
        for name, p in model.named_parameters():
            if name.endswith("layer_scale"):
                p.uniform_(0.1, 1.0)
    prog = torch.onnx.export(model, (torch.randn(3, 3, 32, 32),), dynamo=True,
                             dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    path = tmp_path / "convnext.onnx"
    onnx.save(prog.model_proto, str(path))
    imp = import_onnx(path)
    result = compile_graph(imp.project.graph)
    assert result.ok and result.total_params == sum(p.numel() for p in model.parameters())
    gm = result.build(seed=0)
    gm.load_state_dict(imp.state)
    x = torch.randn(5, 3, 32, 32)  # another batch size than the export's
    with torch.no_grad():
        torch.testing.assert_close(gm.eval()(x), model(x), rtol=1e-4, atol=1e-5)


def test_an_lm_returning_last_position_logits_gets_a_loss_and_data_that_train_it(tmp_path):
    import numpy as np

    from engine.interop import save_imported
    from engine.project import load_project
    from engine.runs.build import prepare_run
    from engine.runtime.train import run
    from engine.runs.tail import read_metrics
    from reference_models import gpt_last_logits

    torch.manual_seed(0)
    imp = from_module(gpt_last_logits().eval(), [[16]], ["int64"])
    assert any(n.startswith("the traced forward keeps one position: its output is [1, 40] per sample for 16 input "
                            "positions") and "return the logits of all positions" in n for n in imp.notes), imp.notes
    assert any("it trains with cross_entropy on one token per sequence" in n for n in imp.notes)
    project = load_project(save_imported(imp, tmp_path / "gpt_last.lflow"))
    assert project.graph.nodes["output"].params["loss"] == "cross_entropy"
    ds = project.training.dataset
    assert (ds.kind, ds.task, ds.vocab_size, ds.n_classes) == ("synthetic_sequence", "classify", 40, 40)
    project.training.batch_size = 16
    project.training.optimizer.lr = 3e-3
    project.training.optimizer.name = "adamw"
    project.training.log_interval = 1
    rd = prepare_run(project, tmp_path / "run", steps=40)
    assert run(rd).state == "succeeded"
    losses = [r["loss"] for r in read_metrics(rd / "metrics.jsonl") if "loss" in r]
    assert all(np.isfinite(losses)) and np.mean(losses[-5:]) < losses[0] - 0.3  # it learns


def test_last_position_logits_against_a_token_files_targets_are_named_on_the_output_before_run(tmp_path):
    """nanoGPT imported by module import keeps one position; a token file's targets are one per
    position: build_run (the CLI's train) and the editor's data problems say it on the Output
    node, with both shapes and what to do, instead of the loss's 'Expected input batch_size (32)
    to match target batch_size (2048)' at step 1."""
    from app.analysis import data_problems
    from engine.data.describe import describe
    from engine.diagram.compile import compile_graph
    from engine.interop import save_imported
    from engine.project import load_project
    from engine.runs.build import RunError, build_run
    from reference_models import gpt_last_logits_on_tokens

    path, imp = gpt_last_logits_on_tokens(tmp_path)
    project = load_project(path)
    want = ("node 'output' (Output): the model's logits are [1, 40] per sample but the data set's targets are [16], "
            "one per position (16 positions): the loss would compare 1 prediction(s) per sample with 16 target(s); "
            "the model keeps one position of its output")
    with pytest.raises(RunError) as e:
        build_run(project, tmp_path / "run")
    assert want in str(e.value) and "return every position's logits" in str(e.value), str(e.value)
    assert not (tmp_path / "run").exists()
    problems = data_problems(compile_graph(project.graph), describe(project))
    assert [(p.node, p.field) for p in problems if want in p.message] == [("output", "training.dataset")], problems
    own = load_project(  # the same model on its own synthetic set (one label per sequence): no such problem
        save_imported(imp, tmp_path / "own.lflow"))
    assert not [p for p in data_problems(compile_graph(own.graph), describe(own)) if "positions" in p.message]


def _t5(tmp_path):
    from engine.interop import save_imported
    from engine.project import load_project
    from reference_models import T5Encoder

    torch.manual_seed(0)
    model = T5Encoder().eval()
    with torch.no_grad():  # a trained bias table, not N(0, 1) noise larger than the scores
        model.block[0].SelfAttention.relative_attention_bias.weight.mul_(0.3)
    imp = from_module(model, [[10]], ["int64"])
    return model, imp, load_project(save_imported(imp, tmp_path / "t5.lflow"))


def test_a_t5_style_encoder_exports_to_onnx_through_torchs_fallback(tmp_path):
    """torch.onnx's decomposition reads a Reshape after the float-masked attention as a view
    of strides the decomposed attention no longer has; the export falls back to torch.export's
    own decomposition first, and onnxruntime computes what the source computes."""
    import numpy as np
    import onnxruntime as ort

    from engine.interop import export_onnx

    model, _, project = _t5(tmp_path)
    sess = ort.InferenceSession(str(export_onnx(project, tmp_path / "t5.onnx")))
    x = torch.randint(0, 32, (5, 10))
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_an_onnx_export_failure_names_the_node_and_operator(tmp_path):
    from engine.diagram.graph import Graph
    from engine.interop import export_onnx
    from engine.project import Project

    g = Graph()
    g.add_node("Input", {"shape": [4]}, id="x")
    g.add_node("Linear", {"in_features": 4, "out_features": 4}, id="fc")
    g.add_node("Op", {"inputs": 1, "code": [["j", "aten.special_bessel_j0.default", [{"$": "in0"}], {}]]},
               id="bessel")
    g.add_node("Output", {"loss": "mse"}, id="out")
    g.connect("x", "out", "fc", "in")
    g.connect("fc", "out", "bessel", "in")
    g.connect("bessel", "out", "out", "in")
    with pytest.raises(InteropError) as e:
        export_onnx(Project(g), tmp_path / "b.onnx")
    msg = str(e.value)
    assert "node 'bessel' (Op)" in msg and "bessel_j0" in msg and "has no ONNX translation" in msg, msg
    assert "\n" not in msg and not (tmp_path / "b.onnx").exists()


def test_training_only_auxiliary_classifiers_are_named_at_import():
    from reference_models import GoogLeNet

    torch.manual_seed(0)
    model = GoogLeNet().eval()
    imp = from_module(model, [[3, 16, 16]])
    aux = sum(p.numel() for m in (model.aux1, model.aux2) for p in m.parameters())
    total = sum(p.numel() for p in model.parameters())
    lines = [n for n in imp.notes if "not in the diagram" in n]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert f"{aux} of the module's {total} parameters" in lines[0]
    assert "'aux1', 'aux2' run only in training mode" in lines[0]
    # the parameter count: the diagram's plus the named modules' is the module's
    assert imp.n_params + aux == total
    assert model.training is False and not model.aux1.training
    # without auxiliary classifiers nothing is said
    assert not [n for n in from_module(GoogLeNet(aux_logits=False).eval(), [[3, 16, 16]]).notes
                if "not in the diagram" in n]


def test_a_value_computed_once_and_handed_on_is_one_node_fed_to_its_users(tmp_path):
    """T5: the first block computes the relative position bias, the others are handed it;
    the import keeps one node computing it (no per-block copy tied to the same table)."""
    from engine.planning.planner import make_plan

    model, imp, project = _t5(tmp_path)
    g = project.graph
    assert g.ties == {}
    table = [k for k in imp.state if k.endswith("relative_attention_bias_weight")]
    assert len(table) == 1  # one node holds the bias table
    bias = table[0].partition(".")[0]
    readers = sorted(g.successors(bias))
    assert len(readers) == 3 and all("scaled_dot_product_attention" in r for r in readers)
    assert [r.split("_SelfAttention")[0] for r in readers] == ["block_0", "block_1", "block_2"]
    assert g.nodes[bias].scope[0][0] == "block.0"  # computed where the source computes it
    result = compile_graph(g)
    assert result.ok and result.total_params == sum(p.numel() for p in model.parameters())
    gm = result.build(seed=0)
    gm.load_state_dict(imp.state)
    x = torch.randint(0, 32, (5, 10))
    with torch.no_grad():
        torch.testing.assert_close(gm.eval()(x), model(x), rtol=1e-5, atol=1e-5)
    plan = make_plan(project, 2, placement={"pp": 2, "microbatches": 2})  # no tie pins the blocks together
    assert plan.ok, plan.errors


def test_shifted_window_attention_with_its_mask_built_in_forward_equals_its_source(tmp_path):
    """torchvision's Swin fills its attention mask slice by slice (in-place writes whose
    results nothing reads); the import keeps them, so the mask is not left at zero."""
    from engine.interop import save_imported
    from engine.project import load_project
    from engine.runtime.model import load_weights
    from reference_models import SwinTransformer

    torch.manual_seed(0)
    model = SwinTransformer().eval()
    imp = from_module(model, [[3, 32, 32]])
    project = load_project(save_imported(imp, tmp_path / "swin.lflow"))
    result = compile_graph(project.graph)
    assert result.ok and result.total_params == sum(p.numel() for p in model.parameters())
    gm = result.build(seed=1)
    load_weights(gm, project.resolve_path(project.weights))
    x = torch.randn(5, 3, 32, 32)  # another batch than the import's
    with torch.no_grad():
        want = model(x)
        torch.testing.assert_close(gm.eval()(x), want, rtol=1e-4, atol=1e-5 * want.abs().max().item())
        # the mask matters: without the shift's -100 entries the output differs
        model.features[1][1].attn.shift_size = [0, 0]
        assert (model(x) - want).abs().max() > 1e-3
