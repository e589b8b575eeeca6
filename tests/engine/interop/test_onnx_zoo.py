"""The ONNX model-zoo classics that ship inside the onnx package import, re-export and
compute what the original file computes (onnxruntime on both).

The files hold their weights as ConstantOfShape fills; the test gives them random
initializers of the same shapes (scaled by fan-in so activations stay finite) and
compares logits (the final Softmax is cut off, so a saturated softmax cannot hide a
difference). The files fix the batch at 1: the original runs sample by sample, the
re-export on the whole batch.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from engine.interop import export_onnx, import_onnx, save_imported
from engine.project import load_project

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = sorted(p.name[len("light_"):-len(".onnx")] for p in LIGHT.glob("light_*.onnx"))


def randomized(path: Path) -> onnx.ModelProto:
    m = onnx.load(str(path))
    g = m.graph
    rng = np.random.default_rng(0)
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    keep, weights = [], []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in consts:
            shape = [int(v) for v in consts[n.input[0]]]
            if len(shape) == 1:  # biases, BatchNorm scales, means and variances (positive)
                arr = rng.uniform(0.5, 1.5, shape)
            else:
                arr = rng.normal(0, np.sqrt(2.0 / max(1, int(np.prod(shape[1:])))), shape)
            weights.append(numpy_helper.from_array(arr.astype(np.float32), n.output[0]))
        else:
            keep.append(n)
    if keep[-1].op_type == "Softmax":  # compare logits
        soft = keep.pop()
        g.output[0].name = soft.input[0]
    used = {i for n in keep for i in n.input}
    del g.node[:]
    g.node.extend(keep)
    old = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(old + weights)
    names = {i.name for i in g.initializer}
    real = [i for i in g.input if i.name not in names and i.name in used]
    del g.input[:]
    g.input.extend(real)
    return m


@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_imports_and_reexports_equal(name, tmp_path):
    import onnxruntime as ort

    assert len(MODELS) == 9
    src = tmp_path / f"{name}.onnx"
    onnx.save(randomized(LIGHT / f"light_{name}.onnx"), str(src))
    project = load_project(save_imported(import_onnx(src), tmp_path / f"{name}.lflow"))
    assert len(project.graph.nodes) > 20
    again = export_onnx(project, tmp_path / f"{name}_again.onnx")
    onnx.checker.check_model(str(again))
    x = np.random.default_rng(1).standard_normal((2, 3, 224, 224)).astype(np.float32)
    s0, s1 = ort.InferenceSession(str(src)), ort.InferenceSession(str(again))
    want = np.concatenate([s0.run(None, {s0.get_inputs()[0].name: x[i:i + 1]})[0] for i in range(2)])
    got = s1.run(None, {s1.get_inputs()[0].name: x})[0]
    assert got.shape == want.shape and np.isfinite(want).all() and want.std() > 1e-3
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
