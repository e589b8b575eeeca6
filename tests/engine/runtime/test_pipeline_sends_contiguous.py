"""A pipeline stage sends contiguous tensors (found by bench/import_coverage.py, issue 55):
torch's pipelining makes the next stage's receive buffers with the strides of what was
sent, and gloo refuses a non-contiguous one ("input tensor has to be contiguous"), so
every imported ViT, ConvNeXt, GoogLeNet, Llama and T5 failed at pp=2, each cut at a
transpose or a permute: what a stage sends forward, and the input gradients it sends back."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.diagram.compile import compile_graph
from engine.diagram.graph import Graph
from engine.runtime.distributed.stages import build_stage_module
from engine.runs.tail import read_metrics

ROOT = Path(__file__).resolve().parents[3]


def _diagram():
    g = Graph()
    g.add_node("Input", {"shape": [4, 6]}, id="x")
    g.add_node("Linear", {"in_features": 6, "out_features": 5}, id="fc")
    g.add_node("Transpose", {"dim0": 1, "dim1": 2}, id="t")
    g.add_node("Flatten", {}, id="flat")
    g.add_node("Output", {"loss": "mse"}, id="out")
    for a, b in (("x", "fc"), ("fc", "t"), ("t", "flat"), ("flat", "out")):
        g.connect(a, "out", b, "in")
    gm = compile_graph(g).build(seed=0)
    return gm, [n.name for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]


def test_a_stage_cut_after_a_transpose_sends_it_contiguous():
    gm, ids = _diagram()
    cut = ids.index("t") + 1
    first = build_stage_module(gm, [ids[:cut], ids[cut:]], 0)
    x = torch.randn(3, 4, 6)
    sent = first(x)
    assert sent.shape == (3, 5, 4) and sent.is_contiguous()
    assert torch.equal(sent, gm.fc(x).transpose(1, 2))
    second = build_stage_module(gm, [ids[:cut], ids[cut:]], 1)
    torch.testing.assert_close(second(sent), gm(x))


def test_a_stage_that_begins_with_a_transpose_sends_its_input_gradient_back_contiguous():
    gm, ids = _diagram()
    cut = ids.index("t")
    second = build_stage_module(gm, [ids[:cut], ids[cut:]], 1)
    received = gm.fc(torch.randn(3, 4, 6)).detach().requires_grad_()
    # as the pipeline computes it (autograd.grad: no leaf's .grad, which would take the leaf's strides)
    (grad,) = torch.autograd.grad(second(received).pow(2).sum(), received)
    assert grad.is_contiguous()  # (the gradient of a transpose is a transposed view)
    torch.testing.assert_close(grad, 2 * received.detach())


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
@pytest.mark.parametrize("name", ["vit", "convnext"])
def test_an_imported_model_trains_at_pp2_equal_to_one_process(tmp_path, name):
    """ViT's cut sends a transpose's output; ConvNeXt's receives a permute's gradient."""
    from engine.interop import save_imported
    from engine.interop.module.importer import from_module
    from engine.project import load_project, save_project
    from reference_models import ConvNeXtTV
    from real_models import VisionTransformer

    ctor, shape = {"vit": (VisionTransformer, [3, 16, 16]), "convnext": (ConvNeXtTV, [3, 32, 32])}[name]
    torch.manual_seed(0)
    project = load_project(save_imported(from_module(ctor().eval(), [shape]), tmp_path / "vit.lflow"))
    project.training.batch_size = 8
    project.training.eval_interval = 100
    save_project(project, tmp_path / "vit.lflow")
    curves = {}
    for label, extra in (("one", []), ("pp2", ["--nproc", "2", "--pp", "2", "--microbatches", "2"])):
        r = subprocess.run([sys.executable, str(ROOT / "main.py"), "train", str(tmp_path / "vit.lflow"), "--steps", "3",
                            "--out", str(tmp_path / label), *extra], cwd=ROOT, capture_output=True, text=True, timeout=400)
        assert r.returncode == 0, r.stderr[-3000:]
        curves[label] = [x["loss"] for x in read_metrics(tmp_path / label / "metrics.jsonl") if "loss" in x]
    np.testing.assert_allclose(curves["pp2"], curves["one"], rtol=1e-5)
