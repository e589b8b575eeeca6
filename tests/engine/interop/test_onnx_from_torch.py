"""ONNX files that torch itself writes (torch.onnx.export(..., dynamo=True)) of the vision
networks users have most: BatchNorm everywhere, depthwise convolutions, squeeze-and-
excitation, residual adds (ResNet-18's basic blocks, MobileNetV2's inverted residuals,
EfficientNet-B0's MBConv). Written like their public reference code
(tests/models/real_models.py), narrow and at 32x32 so each runs in seconds. Each file is
checked first against onnxruntime (the file is right), then imported: the diagram computes
what the source computes, with the file's weights, and says nothing false about them.

Both files torch writes are read: optimized (its default: BatchNorm folded into the
convolutions) and unoptimized (BatchNormalization nodes, running statistics as
broadcast constants: the files whose import ended in a traceback, issue 55)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from engine.diagram.compile import compile_graph
from engine.interop import import_onnx

from real_models import EfficientNet, MobileNetV2, ResNet18

SHAPE = (3, 32, 32)


NETS = {"resnet18": ResNet18, "mobilenet_v2": MobileNetV2, "efficientnet_b0": EfficientNet}


def trained_like(model: torch.nn.Module) -> torch.nn.Module:
    """Running statistics and affine weights away from their initial 0/1 (a trained
    network's), so folding or dropping a BatchNorm shows in the outputs."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
    return model.eval()


def torch_onnx(model: torch.nn.Module, path, optimize: bool = True):
    """The file torch writes: dynamo exporter, dynamic batch."""
    prog = torch.onnx.export(model, (torch.randn(3, *SHAPE),), dynamo=True, optimize=optimize,
                             dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    onnx.save(prog.model_proto, str(path))
    return path


def _rel(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-6))


def source(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return trained_like(NETS[name]())


@pytest.mark.parametrize("optimize", [True, False], ids=["optimized", "unoptimized"])
@pytest.mark.parametrize("name", sorted(NETS))
def test_a_file_torch_writes_imports_and_computes_what_its_source_computes(name, optimize, tmp_path):
    import onnxruntime as ort

    model = source(name)
    path = torch_onnx(model, tmp_path / f"{name}.onnx", optimize)
    x = torch.randn(5, *SHAPE, generator=torch.Generator().manual_seed(1))  # not the export's batch
    with torch.no_grad():
        want = model(x).numpy()
    sess = ort.InferenceSession(str(path))
    assert _rel(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0], want) < 1e-4  # the file is right

    imp = import_onnx(path)
    result = compile_graph(imp.project.graph)
    assert result.ok, result.errors
    gm = result.build(seed=0)
    gm.load_state_dict(imp.state)
    with torch.no_grad():
        got = gm.eval()(x).numpy()
    assert got.shape == want.shape and _rel(got, want) < 1e-4
    # nothing said about weights the diagram has (the ONNX reader's copies are no "unused parameters")
    assert not [n for n in imp.notes if "not in the diagram" in n], imp.notes
    if not optimize:  # BatchNormalization nodes: every weight of the source, each once
        assert result.total_params == sum(p.numel() for p in model.parameters())
        assert sum(1 for n in imp.project.graph.nodes.values() if n.type == "BatchNorm2d") == \
            sum(1 for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    else:  # BatchNorm folded by torch's optimizer: the file's weights, each once
        floats = sum(int(np.prod(i.dims)) for i in onnx.load(str(path)).graph.initializer
                     if i.data_type == onnx.TensorProto.FLOAT and int(np.prod(i.dims)) > 1)
        assert result.total_params == floats


def test_a_swin_file_torch_writes_with_its_mask_filled_by_scatternd_imports(tmp_path):
    """torch's exporter writes Swin's attention mask, filled region by region, as ScatterND
    on constants and its != as Not(Equal): both read (the import named 19 operators before)."""
    from reference_models import SwinTransformer

    torch.manual_seed(0)
    model = SwinTransformer().eval()
    path = torch_onnx(model, tmp_path / "swin.onnx")
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"ScatterND", "Not"} <= ops
    imp = import_onnx(path)
    gm = compile_graph(imp.project.graph).build(seed=0)
    gm.load_state_dict(imp.state)
    x = torch.randn(5, *SHAPE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x).numpy()
        assert _rel(gm.eval()(x).numpy(), want) < 1e-4
