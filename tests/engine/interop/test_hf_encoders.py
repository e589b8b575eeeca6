"""Hugging Face-style encoders (BERT, T5's encoder; tests/models/hf_models.py, written like
transformers' modeling code) import clean and export (issue 55, item 4): the all-ones
attention mask they build from the input's sizes is folded into the attention that reads
it instead of four Op nodes computing a constant, T5's casts of a float32 value to float32
go (its layer norms then read as RMSNorm), each parameter comes in once, and the diagram
exports to ONNX that onnxruntime runs to the source's outputs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.diagram.compile import compile_graph
from engine.interop import export_onnx, save_imported
from engine.interop.module.importer import from_module
from engine.project import load_project

from hf_models import BertForSequenceClassification, T5EncoderForClassification

ENCODERS = {"bert": BertForSequenceClassification, "t5": T5EncoderForClassification}


def _source(name):
    torch.manual_seed(0)
    model = ENCODERS[name]().eval()
    if name == "t5":
        with torch.no_grad():  # a trained bias table, not N(0, 1) noise larger than the scores
            model.block[0].layer[0].SelfAttention.relative_attention_bias.weight.mul_(0.3)
    return model


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_an_hf_encoder_imports_without_nodes_that_compute_a_constant_and_exports(name, tmp_path):
    import onnxruntime as ort

    model = _source(name)
    imp = from_module(model, [[10]], ["int64"])
    project = load_project(save_imported(imp, tmp_path / f"{name}.lflow"))
    g = project.graph
    result = compile_graph(g)
    assert result.ok and not result.warnings, result.warnings
    assert result.total_params == sum(p.numel() for p in model.parameters())
    # nothing left of the mask helpers: torch.ones((B, T)), its unsqueezes and cast, (1 - m) * min
    codes = {nid: [c[1] for c in n.params["code"]] for nid, n in g.nodes.items() if n.type == "Op"}
    assert not [nid for nid in g.nodes if nid.startswith(("ones", "unsqueeze", "to"))]
    assert not [nid for nid, ops in codes.items() if ops[-1] in ("aten.to.dtype", "aten.type_as.default")]
    assert "Scale" not in {n.type for n in g.nodes.values()}
    if name == "t5":  # one Op left: the relative position bias, computed once in block 0
        assert list(codes) == ["block_0_layer_0_SelfAttention_add_3"]
        assert sum(n.type == "RMSNorm" for n in g.nodes.values()) == 5
    x = torch.randint(0, 30, (5, 10), generator=torch.Generator().manual_seed(4))
    gm = result.build(seed=0)
    gm.load_state_dict(imp.state)
    with torch.no_grad():
        want = model(x).numpy()
        np.testing.assert_allclose(gm.eval()(x).numpy(), want, rtol=1e-4, atol=1e-5)
    sess = ort.InferenceSession(str(export_onnx(project, tmp_path / f"{name}.onnx")))
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


class PaddedBert(BertForSequenceClassification):
    """The mask made from the token ids (0 is padding), as a pipeline passes it."""

    def forward(self, input_ids):
        return super().forward(input_ids, attention_mask=(input_ids != 0).to(torch.long))


def test_a_mask_made_from_the_tokens_stays_data():
    """Only values made from sizes alone are folded: a mask computed from the input's
    values is computed where the model computes it, and a padded position changes the output."""
    torch.manual_seed(0)
    model = PaddedBert().eval()
    imp = from_module(model, [[10]], ["int64"])
    result = compile_graph(imp.project.graph)
    gm = result.build(seed=0)
    gm.load_state_dict(imp.state)
    ids = torch.randint(1, 30, (4, 10), generator=torch.Generator().manual_seed(5))
    ids[:, 7:] = 0  # padding
    with torch.no_grad():
        want = model(ids)
        torch.testing.assert_close(gm.eval()(ids), want, rtol=1e-4, atol=1e-5)
        assert (BertForSequenceClassification.forward(model, ids) - want).abs().max() > 1e-4  # the mask matters


def test_a_cast_that_changes_the_dtype_is_kept():
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return (self.fc(x).to(torch.float64) * (1 + 1e-12)).to(torch.float32)

    torch.manual_seed(0)
    imp = from_module(Twice().eval(), [[4]])
    ops = [c[1] for n in imp.project.graph.nodes.values() if n.type == "Op" for c in n.params["code"]]
    assert ops.count("aten.to.dtype") == 2


def test_a_llama_style_decoder_with_a_no_grad_rotary_embedding_imports_and_exports(tmp_path):
    """modeling_llama's rotary embedding is `@torch.no_grad()`: recorded as calls (not a
    wrap_with_set_grad_enabled subgraph, which failed the import naming every rotary
    multiply); its RMSNorms, written with casts to float32 and back, come in as RMSNorm."""
    import onnxruntime as ort

    from hf_models import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM().eval()
    imp = from_module(model, [[12]], ["int64"])
    project = load_project(save_imported(imp, tmp_path / "llama.lflow"))
    result = compile_graph(project.graph)
    assert result.ok and not result.warnings, result.warnings
    assert result.total_params == sum(p.numel() for p in model.parameters())
    assert sum(n.type == "RMSNorm" for n in project.graph.nodes.values()) == 5  # 2 per layer and the last
    ds = project.training.dataset
    assert (ds.kind, ds.task, ds.vocab_size) == ("synthetic_sequence", "next_token", 40)
    x = torch.randint(0, 40, (5, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = model(x).numpy()
    sess = ort.InferenceSession(str(export_onnx(project, tmp_path / "llama.onnx")))
    np.testing.assert_allclose(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0], want, rtol=1e-4, atol=1e-5)
