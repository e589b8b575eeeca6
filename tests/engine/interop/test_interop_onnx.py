"""ONNX export (checked by onnxruntime) and import (diagram + weights), round trips.

Each model is exported once per module (the dynamo exporter takes seconds)."""
import json

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from engine.diagram.compile import compile_graph
from engine.interop import InteropError, export_onnx, import_onnx, save_imported
from engine.project import load_project
from engine.runtime.model import load_weights

from interop_models import MODELS, project_with_weights, sample

ort = pytest.importorskip("onnxruntime")
# one worker runs the whole file, so the module fixture exports each model once
pytestmark = pytest.mark.xdist_group("interop_onnx")
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (project, reference module in eval mode, path of the .onnx)."""
    folder = tmp_path_factory.mktemp("onnx")
    out = {}
    for name in MODELS:
        project = project_with_weights(name, folder)
        gm = compile_graph(project.graph).build(seed=0)
        load_weights(gm, str(folder / project.weights))
        out[name] = (project, gm.eval(), export_onnx(project, folder / f"{name}.onnx"))
    return out


def run_ort(path, x: torch.Tensor) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]


def forward(gm, x):
    with torch.no_grad():
        return gm(x).numpy()


@pytest.mark.parametrize("name", list(MODELS))
def test_onnxruntime_equals_torch_for_any_batch(exported, name):
    project, gm, path = exported[name]
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    batch_dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param and not batch_dim.HasField("dim_value")  # dynamic batch
    for batch in (1, 5):
        x = sample(project.graph, batch, seed=batch)
        np.testing.assert_allclose(run_ort(path, x), forward(gm, x), **TOL)


@pytest.mark.parametrize("name", list(MODELS))
def test_import_gives_the_same_function_names_and_parameter_count(exported, name):
    project, gm, path = exported[name]
    imp = import_onnx(path)
    src, got = compile_graph(project.graph), compile_graph(imp.project.graph)
    assert got.ok, got.errors
    assert got.total_params == src.total_params  # exactly
    # Every layer comes back under its own name, type and parameters as drawn (Dropout's p
    # and the loss from the embedded diagram, which the file's own computation confirmed).
    for nid, node in project.graph.nodes.items():
        assert imp.project.graph.nodes[nid].type == node.type
        assert imp.project.graph.nodes[nid].params == node.params
    for nid, info in src.nodes.items():
        assert got.nodes[nid].params == info.params, nid
    new = got.build(seed=1)
    new.load_state_dict(imp.state)
    new.eval()
    x = sample(project.graph, 3, seed=11)
    np.testing.assert_allclose(forward(new, x), forward(gm, x), **TOL)


@pytest.mark.parametrize("name", ["resnet", "transformer", "attention_parts", "cnn_rect"])
def test_export_import_export_round_trip(exported, name, tmp_path):
    project, gm, path = exported[name]
    first = import_onnx(path)
    saved = save_imported(first, tmp_path / f"{name}.lflow")
    assert (tmp_path / f"{name}.weights.pt").exists()
    again = load_project(saved)
    assert again.weights == f"{name}.weights.pt"
    path2 = export_onnx(again, tmp_path / f"{name}2.onnx")
    x = sample(project.graph, 4, seed=5)
    np.testing.assert_allclose(run_ort(path2, x), forward(gm, x), **TOL)
    second = import_onnx(path2)
    assert second.project.graph.to_dict() == first.project.graph.to_dict()
    assert set(second.state) == set(first.state)
    for k in first.state:
        torch.testing.assert_close(second.state[k], first.state[k], rtol=0, atol=0)


def test_import_without_torch_metadata_reads_ops(tmp_path):
    """A foreign file (optimized export, opset 18, no module scopes): Gemm, MatMul+Add,
    the Erf form of GELU, Sigmoid*x, ReduceMean pooling and BatchNorm folded into Conv."""
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(4, 8)
            self.fc2 = nn.Linear(8, 3)

        def forward(self, x):
            h = torch.relu(self.bn(self.conv(x)))
            h = torch.flatten(self.pool(h), 1)
            return self.fc2(nn.functional.silu(nn.functional.gelu(self.fc(h))))

    torch.manual_seed(0)
    m = Net().eval()
    m.bn.running_mean.uniform_(-0.5, 0.5)
    x = torch.randn(2, 3, 6, 6)
    prog = torch.onnx.export(m, (x,), dynamo=True, opset_version=18,
                             dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    model = prog.model_proto
    for n in model.graph.node:
        del n.metadata_props[:]
    onnx.save(model, str(tmp_path / "foreign.onnx"))
    imp = import_onnx(tmp_path / "foreign.onnx")
    types = [n.type for n in imp.project.graph.nodes.values()]
    assert types == ["Input", "Conv2d", "ReLU", "AdaptiveAvgPool2d", "Reshape", "Linear", "GELU", "SiLU", "Linear", "Output"]
    gm = compile_graph(imp.project.graph).build()
    gm.load_state_dict(imp.state)
    gm.eval()
    torch.testing.assert_close(gm(x), m(x), **TOL)
    # laid out left to right, one column per layer
    xs = [n.pos[0] for n in imp.project.graph.nodes.values()]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)


def _model(nodes, inputs, outputs, inits=(), extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *extra_opsets])


def test_unsupported_operators_are_listed_at_once_and_nothing_is_written(tmp_path):
    f = TensorProto.FLOAT
    w = helper.make_tensor("w", f, [4, 4], np.eye(4, dtype=np.float32).ravel().tolist())
    nodes = [
        helper.make_node("Cos", ["x"], ["c1"], name="cos1"),  # read as torch.cos
        helper.make_node("Fancy", ["c1"], ["c2"], name="fancy1", domain="com.example"),
        helper.make_node("Fancy", ["c2"], ["c3"], name="fancy2", domain="com.example"),
        helper.make_node("Unique", ["c3"], ["s"], name="uniq"),
        helper.make_node("MatMul", ["s", "w"], ["y"], name="mm"),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("x", f, ["N", 3, 4])],
                   [helper.make_tensor_value_info("y", f, ["N", 3, 4])], [w],
                   extra_opsets=[helper.make_opsetid("com.example", 1)])
    onnx.save(model, str(tmp_path / "bad.onnx"))
    with pytest.raises(InteropError) as e:
        import_onnx(tmp_path / "bad.onnx")
    text = str(e.value)
    assert "3 operator(s) cannot be read" in text
    assert "node 'fancy1' (Fancy, domain com.example)" in text and "node 'fancy2'" in text
    assert "node 'uniq' (Unique)" in text and "cos1" not in text.split("(the catalog")[0]

    from app.cli import main

    assert main(["import", str(tmp_path / "bad.onnx"), "-o", str(tmp_path / "bad.lflow")]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]


def test_a_batch_moved_off_dim_0_is_named(tmp_path):
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0, 2], name="batch_swap")]
    model = _model(nodes, [helper.make_tensor_value_info("x", f, ["N", 3, 4])],
                   [helper.make_tensor_value_info("y", f, [3, "N", 4])], [])
    onnx.save(model, str(tmp_path / "swap.onnx"))
    with pytest.raises(InteropError, match=r"output 0 has shape \(3, B, 4\): a diagram's outputs are tensors with "
                                           r"the batch first"):
        import_onnx(tmp_path / "swap.onnx")


def test_onnx_names_become_unique_identifiers(tmp_path):
    f = TensorProto.FLOAT
    inits, nodes, prev = [], [], "input"
    for i, name in enumerate(["layer.0/fc-1", "class", "1x", "layer.0:fc-1"]):
        inits += [helper.make_tensor(f"w{i}", f, [4, 4], np.random.rand(16).astype(np.float32).tolist()),
                  helper.make_tensor(f"b{i}", f, [4], np.random.rand(4).astype(np.float32).tolist())]
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"y{i}"], transB=1, name=name))
        prev = f"y{i}"
    nodes.append(helper.make_node("Relu", [prev], ["out put"], name="forward"))
    model = _model(nodes, [helper.make_tensor_value_info("input", f, ["N", 4])],
                   [helper.make_tensor_value_info("out put", f, ["N", 4])], inits)
    onnx.save(model, str(tmp_path / "names.onnx"))
    imp = import_onnx(tmp_path / "names.onnx")
    ids = list(imp.project.graph.nodes)
    assert all(i.isidentifier() for i in ids) and len(set(ids)) == len(ids)
    assert "class" not in ids and "input" not in ids and "forward" not in ids
    x = np.random.rand(2, 4).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    gm = compile_graph(imp.project.graph).build()
    gm.load_state_dict(imp.state)
    np.testing.assert_allclose(gm(torch.from_numpy(x)).detach().numpy(), sess.run(None, {"input": x})[0], **TOL)


def test_cli_export_then_import(exported, tmp_path):
    from app.cli import main

    project, gm, _ = exported["mlp"]
    from engine.project import save_project

    # the weights file travels as a path relative to the project
    (tmp_path / project.weights).write_bytes((project.directory / project.weights).read_bytes())
    save_project(project.copy(), tmp_path / "mlp.lflow")
    assert main(["export", str(tmp_path / "mlp.lflow"), "--onnx", str(tmp_path / "m.onnx")]) == 0
    assert main(["import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "back.lflow")]) == 0
    back = load_project(tmp_path / "back.lflow")
    assert back.weights == "back.weights.pt"
    assert json.loads(back.dumps())["diagram"]["nodes"][1]["id"] == "fc1"
    new = compile_graph(back.graph).build()
    load_weights(new, str(tmp_path / back.weights))
    x = sample(project.graph, 3)
    np.testing.assert_allclose(forward(new.eval(), x), forward(gm, x), **TOL)
    assert main(["import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "back.lflow")]) == 2  # exists
    assert main(["export", str(tmp_path / "mlp.lflow")]) == 2  # nothing asked


def test_import_of_an_optimized_torch_transformer(tmp_path):
    """torch.onnx's default export folds and renames weights (a transposed in_proj
    becomes `val_2`, equal LayerNorm weights are shared) and writes the encoder layer
    out op by op: it comes in as its parts, each keeping its module path (`enc`,
    `enc.self_attn`: a block in the editor), and computes what the model computes."""
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(30, 16)
            self.enc = nn.TransformerEncoderLayer(16, 2, 32, 0.0, batch_first=True)
            self.head = nn.Linear(16, 3)

        def forward(self, x):
            return self.head(self.enc(self.emb(x)).mean(dim=1))

    torch.manual_seed(0)
    m = Tiny().eval()
    x = torch.randint(0, 30, (2, 6))
    prog = torch.onnx.export(m, (x,), dynamo=True, opset_version=18,
                             dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    onnx.save(prog.model_proto, str(tmp_path / "tiny.onnx"))
    imp = import_onnx(tmp_path / "tiny.onnx")
    nodes = imp.project.graph.nodes
    assert nodes["emb_embedding"].type == "Embedding" and nodes["head"].type == "Linear"
    inside = {nid: n for nid, n in nodes.items() if n.scope and n.scope[0][0] == "enc"}
    assert {nid: n.type for nid, n in inside.items() if n.type != "Op" and "self_attn" not in nid} == {
        "enc_add": "Add", "enc_norm1": "LayerNorm", "enc_linear1": "Linear", "enc_relu": "ReLU",
        "enc_linear2": "Linear", "enc_add_1": "Add", "enc_norm2": "LayerNorm"}
    assert all(n.scope[0] == ["enc", "TransformerEncoderLayer"] for n in inside.values())
    assert {n.type for nid, n in inside.items() if "self_attn" in nid} >= {"MatMul", "Softmax"}
    result = compile_graph(imp.project.graph)
    # q, k and v read one packed in_proj tensor: tied, so it is counted once; the optimizer
    # dropped out_proj's all-zero bias from the file, so that one is not there to count
    assert "out_proj.bias" not in {i.name.rpartition("self_attn.")[2] for i in prog.model_proto.graph.initializer}
    assert result.total_params == sum(p.numel() for p in m.parameters()) - m.enc.self_attn.out_proj.bias.numel()
    assert sum(k.endswith("__weight") for k in imp.project.graph.ties) == 2  # k and v tied to q's tensor
    gm = result.build()
    gm.load_state_dict(imp.state)
    torch.testing.assert_close(gm.eval()(x), m(x), **TOL)


def test_export_refusals_name_the_cause(tmp_path):
    from engine.diagram.graph import Graph
    from engine.project import Project

    g = Graph()
    g.add_node("Input", {"shape": [4]}, id="x")
    g.add_node("Linear", {"out_features": 4}, id="fc")
    g.add_node("Custom", {"path": "interop_models:BesselLayer"}, id="np_layer")
    g.add_node("Output", {}, id="out")
    g.connect("fc", "out", "np_layer", "in")
    g.connect("np_layer", "out", "out", "in")
    with pytest.raises(InteropError, match="fix them before exporting"):  # x is not connected
        export_onnx(Project(g), tmp_path / "a.onnx")
    g.connect("x", "out", "fc", "in")
    from engine import trust

    with pytest.raises(InteropError, match="bessel_j0 has no ONNX translation.*Custom layers \\(np_layer\\)"), \
            trust.allowing(["interop_models:BesselLayer"]):
        export_onnx(Project(g), tmp_path / "a.onnx")
    assert not any(tmp_path.iterdir())


def test_every_listed_operator_imports_from_a_plain_onnx_graph(tmp_path):
    """A hand-written ONNX graph (no torch metadata) with each operator the importer
    promises: Conv, BatchNormalization, Relu, MaxPool, AveragePool, Mul, Concat,
    GlobalAveragePool, Flatten, Gemm, MatMul+Add, Gelu, Sigmoid, Tanh, Dropout,
    Identity, LayerNormalization, Reshape, Softmax, Add; outputs equal onnxruntime's.
    Identity computes nothing, so it leaves no node; Dropout keeps the file's ratio."""
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT
    inits = []

    def const(name, shape, scale=0.3, positive=False):
        a = rng.random(shape) + 0.5 if positive else rng.normal(size=shape) * scale
        inits.append(onnx.numpy_helper.from_array(a.astype(np.float32), name))
        return name

    N = helper.make_node
    nodes = [
        N("Conv", ["x", const("cw", [4, 2, 3, 3]), const("cb", [4])], ["c"], pads=[1, 1, 1, 1], name="conv"),
        N("BatchNormalization", ["c", const("s", [4], positive=True), const("b", [4]), const("m", [4]),
                                 const("v", [4], positive=True)], ["bn"], epsilon=1e-3, name="bn"),
        N("Relu", ["bn"], ["r"], name="relu"),
        N("MaxPool", ["r"], ["mp"], kernel_shape=[2, 2], strides=[2, 2], name="maxpool"),
        N("AveragePool", ["mp"], ["ap"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
          count_include_pad=1, name="avgpool"),
        N("Mul", ["ap", "mp"], ["mu"], name="mul"),
        N("Concat", ["mu", "mp"], ["cat"], axis=1, name="concat"),
        N("GlobalAveragePool", ["cat"], ["gap"], name="gap"),
        N("Flatten", ["gap"], ["fl"], axis=1, name="flatten"),
        N("Gemm", ["fl", const("gw", [12, 8]), const("gb", [12])], ["g"], transB=1, name="gemm"),
        N("Gelu", ["g"], ["ge"], name="gelu"),
        N("MatMul", ["ge", const("mw", [12, 12])], ["mm"], name="matmul"),
        N("Add", ["mm", const("mb", [12])], ["lin"], name="bias"),
        N("Sigmoid", ["lin"], ["sg"], name="sigmoid"),
        N("Tanh", ["sg"], ["th"], name="tanh"),
        N("Dropout", ["th"], ["dr"], name="dropout"),
        N("Identity", ["dr"], ["idn"], name="identity"),
        N("Add", ["idn", "lin"], ["res"], name="residual"),
        N("LayerNormalization", ["res", const("lw", [12], positive=True), const("lb", [12])], ["ln"],
          axis=-1, epsilon=1e-5, name="layernorm"),
        N("Reshape", ["ln", "shape"], ["rs"], name="reshape"),
        N("Softmax", ["rs"], ["y"], axis=-1, name="softmax"),
    ]
    inits.append(onnx.numpy_helper.from_array(np.array([0, 3, 4], dtype=np.int64), "shape"))
    graph = helper.make_graph(nodes, "plain", [helper.make_tensor_value_info("x", f, ["N", 2, 8, 8])],
                              [helper.make_tensor_value_info("y", f, ["N", 3, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp_path / "plain.onnx"))
    imp = import_onnx(tmp_path / "plain.onnx")
    types = {n.type for n in imp.project.graph.nodes.values()}
    assert types == {"Input", "Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "AvgPool2d", "Mul", "Concat",
                     "AdaptiveAvgPool2d", "Flatten", "Linear", "GELU", "Sigmoid", "Tanh", "Dropout",
                     "Add", "LayerNorm", "Reshape", "Softmax", "Output"}
    assert imp.project.graph.nodes["matmul"].params["bias"] is True  # MatMul + Add: one Linear
    result = compile_graph(imp.project.graph)
    assert result.total_params == sum(int(np.prod(t.dims)) for t in inits if t.name not in ("m", "v", "shape"))
    x = rng.normal(size=(3, 2, 8, 8)).astype(np.float32)
    gm = result.build()
    gm.load_state_dict(imp.state)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(forward(gm.eval(), torch.from_numpy(x)), want, **TOL)


def test_training_starts_from_the_imported_weights(exported, tmp_path):
    from engine.project import Training
    from engine.data.sources import SyntheticImages
    from engine.runs.build import prepare_run
    from engine.runtime.train import load_spec
    from engine.runtime.trainer import Trainer

    imp = import_onnx(exported["cnn_bn"][2])
    ds = imp.project.training.dataset  # a synthetic set of the input's shape: trainable at once
    assert (ds.kind, ds.channels, ds.height, ds.width, ds.n_classes) == ("synthetic_images", 3, 12, 12, 5)
    imp.project.training = Training(dataset=SyntheticImages(kind="synthetic_images", n_samples=64, channels=3,
                                                            height=12, width=12, n_classes=5),
                                    batch_size=16, steps=2, seed=9)
    project = load_project(save_imported(imp, tmp_path / "cnn.lflow"))
    rd = prepare_run(project, tmp_path / "run")
    trainer = Trainer(rd, load_spec(rd), torch.device("cpu"))  # builds the model as a run does
    for k, v in imp.state.items():
        torch.testing.assert_close(trainer.model.state_dict()[k], v, rtol=0, atol=0)
    assert all(np.isfinite(trainer.train_step(s)) for s in range(2))


@pytest.mark.parametrize("content", [b"", b"\x00\xffnot a model at all" * 10, b'{"format_version": 1}'])
def test_a_file_that_is_not_onnx_gets_a_clear_error(tmp_path, content):
    (tmp_path / "x.onnx").write_bytes(content)
    with pytest.raises(InteropError, match="x.onnx"):
        import_onnx(tmp_path / "x.onnx")
    with pytest.raises(InteropError, match="no such file"):
        import_onnx(tmp_path / "missing.onnx")


def test_new_operators_import_from_a_plain_onnx_graph(tmp_path):
    """No torch metadata: Transpose (one swap), Slice with constant starts/ends/axes/steps
    (and the whole-range Slice torch writes for the batch, which is no layer), MatMul of
    two computed tensors, Mul/Add/Sub/Div by scalars and broadcast constants, RMSNorm as
    SimplifiedLayerNormalization, Conv and pools with non-square kernels. Constants of
    the file that multiply or add tensors are initializers, so possibly learned: they
    come in as Op nodes that own them as weights; scalars fold into one Scale."""
    rng = np.random.default_rng(1)
    f = TensorProto.FLOAT
    inits = []

    def const(name, a, dtype=np.float32):
        inits.append(onnx.numpy_helper.from_array(np.asarray(a, dtype=dtype), name))
        return name

    N = helper.make_node
    big = 2**63 - 1
    nodes = [
        N("Conv", ["x", const("cw", rng.normal(size=(4, 2, 3, 5)) * 0.3), const("cb", rng.normal(size=4))], ["c"],
          kernel_shape=[3, 5], pads=[1, 2, 1, 2], strides=[1, 2], name="conv"),
        N("MaxPool", ["c"], ["mp"], kernel_shape=[2, 1], strides=[2, 1], name="maxpool"),
        N("AveragePool", ["mp"], ["ap"], kernel_shape=[1, 3], strides=[1, 1], pads=[0, 1, 0, 1],
          count_include_pad=1, name="avgpool"),
        N("Mul", ["ap", const("per_channel", rng.normal(size=(1, 4, 1, 1)))], ["pc"], name="per_channel_mul"),
        N("Reshape", ["pc", const("shape", [0, 4, 16], np.int64)], ["seq"], name="reshape"),   # (N, 4, 16)
        N("Transpose", ["seq"], ["tok"], perm=[0, 2, 1], name="transpose"),                     # (N, 16, 4)
        N("Slice", ["tok", const("zero", [0], np.int64), const("big", [big], np.int64), const("ax0", [0], np.int64)],
          ["whole"], name="batch_slice"),
        N("Slice", ["whole", const("s1", [1], np.int64), const("e1", [-1], np.int64), const("ax1", [1], np.int64),
                    const("st1", [2], np.int64)], ["odd"], name="odd_rows"),                   # (N, 7, 4)
        N("SimplifiedLayerNormalization", ["odd", const("rw", rng.random(4) + 0.5)], ["rms"], axis=-1,
          epsilon=1e-5, name="rmsnorm"),
        N("Transpose", ["rms"], ["rmsT"], perm=[0, 2, 1], name="transpose2"),                   # (N, 4, 7)
        N("MatMul", ["rms", "rmsT"], ["gram"], name="gram"),                                   # (N, 7, 7)
        N("Div", ["gram", const("two", 2.0)], ["half"], name="halve"),
        N("Sub", ["half", const("one", [1.0])], ["shifted"], name="minus_one"),
        N("Mul", [const("decay", rng.random(7)), "shifted"], ["decayed"], name="decay"),
        N("Add", ["decayed", const("bias", rng.normal(size=(7, 1)))], ["y"], name="bias"),
    ]
    graph = helper.make_graph(nodes, "plain", [helper.make_tensor_value_info("x", f, ["N", 2, 8, 8])],
                              [helper.make_tensor_value_info("y", f, ["N", 7, 7])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    onnx.save(model, str(tmp_path / "new_ops.onnx"))
    imp = import_onnx(tmp_path / "new_ops.onnx")
    nodes_ = imp.project.graph.nodes
    assert [n.type for n in nodes_.values()] == [
        "Input", "Conv2d", "MaxPool2d", "AvgPool2d", "Op", "Reshape", "Transpose", "Slice", "RMSNorm",
        "Transpose", "MatMul", "Scale", "Op", "Op", "Output"]  # x / 2 - 1: one Scale
    assert {k: nodes_["conv"].params[k] for k in ("kernel_size", "stride", "padding")} == \
        {"kernel_size": [3, 5], "stride": [1, 2], "padding": [1, 2]}
    assert nodes_["maxpool"].params["kernel_size"] == [2, 1] and nodes_["avgpool"].params["padding"] == [0, 1]
    assert nodes_["odd_rows"].params == {"dim": 1, "start": 1, "end": -1, "step": 2}
    assert nodes_["transpose"].params == {"dim0": 1, "dim1": 2}
    assert nodes_["halve"].params == {"scale": 0.5, "shift": -1.0, "shape": []}
    assert [nodes_[k].params["weights"] for k in ("decay", "bias")] == [
        {"decay": {"shape": [7], "dtype": "float32", "grad": True}},
        {"bias": {"shape": [7, 1], "dtype": "float32", "grad": True}}]
    assert nodes_["rmsnorm"].params == {"normalized_shape": 4, "eps": 1e-5, "elementwise_affine": True}
    result = compile_graph(imp.project.graph)
    assert result.total_params == 4 * 2 * 3 * 5 + 4 + 4 + 4 + 7 + 7  # conv, RMSNorm, the three initializers
    x = rng.normal(size=(3, 2, 8, 8)).astype(np.float32)
    gm = result.build()
    gm.load_state_dict(imp.state)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(forward(gm.eval(), torch.from_numpy(x)), want, **TOL)


def test_torch_export_without_metadata_reads_rmsnorm_attention_parts(tmp_path):
    """nn.RMSNorm as torch.onnx decomposes it (Pow, ReduceMean, Add eps, Sqrt,
    Reciprocal, Mul, Mul weight), q @ k^T * scale, slicing and x * a + b, from an
    optimized export whose module scopes were stripped; and a RMSNormalization
    op (opset 23)."""
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.RMSNorm(8, eps=1e-6)
            self.q = nn.Linear(8, 8)

        def forward(self, x):
            h = self.norm(x)
            s = (self.q(h) @ h.transpose(1, 2)) * 0.125
            return s[:, 1:5].softmax(-1) * 3.0 + 0.5

    torch.manual_seed(0)
    m = Net().eval()
    m.norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(2, 6, 8)
    prog = torch.onnx.export(m, (x,), dynamo=True, opset_version=20,
                             dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    model = prog.model_proto
    for n in model.graph.node:
        del n.metadata_props[:]
    onnx.save(model, str(tmp_path / "parts.onnx"))
    imp = import_onnx(tmp_path / "parts.onnx")
    assert [n.type for n in imp.project.graph.nodes.values()] == \
        ["Input", "RMSNorm", "Linear", "Transpose", "MatMul", "Scale", "Slice", "Softmax", "Scale", "Output"]
    rms = next(n for n in imp.project.graph.nodes.values() if n.type == "RMSNorm")
    assert rms.params == {"normalized_shape": 8, "eps": 1e-6, "elementwise_affine": True}
    assert [n.params for n in imp.project.graph.nodes.values() if n.type == "Scale"] == \
        [{"scale": 0.125, "shift": 0.0, "shape": []}, {"scale": 3.0, "shift": 0.5, "shape": []}]
    gm = compile_graph(imp.project.graph).build()
    gm.load_state_dict(imp.state)
    torch.testing.assert_close(gm.eval()(x), m(x), **TOL)

    f = TensorProto.FLOAT
    w = onnx.numpy_helper.from_array(np.linspace(0.5, 1.5, 8).astype(np.float32), "w")
    node = helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=-1, epsilon=1e-4)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", f, ["N", 6, 8])],
                          [helper.make_tensor_value_info("y", f, ["N", 6, 8])], [w])
    m23 = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    onnx.checker.check_model(m23)
    onnx.save(m23, str(tmp_path / "rms23.onnx"))
    imp = import_onnx(tmp_path / "rms23.onnx")
    gm = compile_graph(imp.project.graph).build()
    gm.load_state_dict(imp.state)
    want = ort.InferenceSession(m23.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(forward(gm.eval(), x), want, **TOL)


def test_operators_the_catalog_refuses_come_in_as_torch_calls(tmp_path):
    """A 4-D permute, a Slice along two axes, a constant divided by a tensor and lopsided
    pads have no catalog layer: they are read as torch calls (generic Op nodes), and the
    re-exported model computes what the file computes."""
    import onnxruntime as ort

    from engine.interop import export_onnx

    f = TensorProto.FLOAT
    N = helper.make_node
    i64 = lambda name, v: onnx.numpy_helper.from_array(np.asarray(v, dtype=np.int64), name)  # noqa: E731
    nodes = [
        N("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1], name="rotate"),
        N("Slice", ["t", "s", "e", "a"], ["sl"], name="two_axes"),
        N("Div", ["c", "sl"], ["d"], name="reciprocal"),
        N("Conv", ["d", "w"], ["y"], pads=[0, 0, 1, 1], name="lopsided"),
    ]
    rng = np.random.default_rng(0)
    inits = [i64("s", [0, 1]), i64("e", [2, 3]), i64("a", [1, 2]),
             onnx.numpy_helper.from_array(np.ones((), np.float32), "c"),
             onnx.numpy_helper.from_array(rng.normal(size=(2, 2, 2, 2)).astype(np.float32), "w")]
    model = _model(nodes, [helper.make_tensor_value_info("x", f, ["N", 2, 4, 4])],
                   [helper.make_tensor_value_info("y", f, ["N", 2, None, None])], inits)
    onnx.save(model, str(tmp_path / "odd.onnx"))
    imp = import_onnx(tmp_path / "odd.onnx")
    types = [n.type for n in imp.project.graph.nodes.values()]
    assert "Op" in types and "Conv2d" in types
    from engine.interop import save_imported
    from engine.project import load_project

    again = export_onnx(load_project(save_imported(imp, tmp_path / "odd.lflow")), tmp_path / "again.onnx")
    x = (rng.uniform(0.5, 1.5, (3, 2, 4, 4))).astype(np.float32)
    want = ort.InferenceSession(str(tmp_path / "odd.onnx")).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(again)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_embedded_diagram_is_taken_only_when_it_computes_what_the_file_computes(exported, tmp_path):
    """A Layerflow export carries its diagram, taken back with the file's weights (changed
    weights are the file's weights); a file whose operators were edited by another tool
    (ReLU made Tanh) no longer agrees with it, so the file is read as torch calls; a
    diagram that names code (a Custom layer) is never taken from a file, nor its code imported."""
    import sys

    project, _, path = exported["mlp"]
    model = onnx.load(str(path))
    w = next(i for i in model.graph.initializer if i.name == "fc2.weight")
    w.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(w) * 2.0, "fc2.weight"))
    onnx.save(model, str(tmp_path / "new_weights.onnx"))
    imp = import_onnx(tmp_path / "new_weights.onnx")
    assert imp.project.graph.to_dict() == project.graph.to_dict()
    torch.testing.assert_close(imp.state["fc2.weight"], torch.from_numpy(np.array(onnx.numpy_helper.to_array(w))))

    next(n for n in model.graph.node if n.op_type == "Relu").op_type = "Tanh"
    onnx.save(model, str(tmp_path / "edited.onnx"))
    imp = import_onnx(tmp_path / "edited.onnx")
    assert "Layerflow export" not in imp.project.description
    types = [n.type for n in imp.project.graph.nodes.values()]
    assert "Tanh" in types and "ReLU" not in types
    x = sample(project.graph, 3, seed=2)
    gm = compile_graph(imp.project.graph).build()
    gm.load_state_dict(imp.state)
    np.testing.assert_allclose(forward(gm.eval(), x), run_ort(tmp_path / "edited.onnx", x), **TOL)

    diagram = json.loads(next(p.value for p in model.metadata_props if p.key == "layerflow.diagram"))
    diagram["nodes"].insert(1, {"id": "evil", "type": "Custom", "params": {"path": "layerflow_never_imported:Net"}})
    next(p for p in model.metadata_props if p.key == "layerflow.diagram").value = json.dumps(diagram)
    onnx.save(model, str(tmp_path / "custom.onnx"))
    imp = import_onnx(tmp_path / "custom.onnx")
    assert "evil" not in imp.project.graph.nodes and "layerflow_never_imported" not in sys.modules
    assert all(n.type != "Custom" for n in imp.project.graph.nodes.values())


def test_a_product_the_file_also_returns_keeps_no_bias():
    """MatMul then Add of a bias is one Linear, unless the file returns the product too."""
    import tempfile
    from pathlib import Path

    f = TensorProto.FLOAT
    rng = np.random.default_rng(3)
    w = onnx.numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array(rng.normal(size=3).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"),
             helper.make_node("Add", ["xw", "b"], ["y"], name="bias")]
    model = _model(nodes, [helper.make_tensor_value_info("x", f, ["N", 4])],
                   [helper.make_tensor_value_info("xw", f, ["N", 3]), helper.make_tensor_value_info("y", f, ["N", 3])],
                   [w, b])
    path = Path(tempfile.mkdtemp()) / "two.onnx"
    onnx.save(model, str(path))
    imp = import_onnx(path)
    gm = compile_graph(imp.project.graph).build()
    gm.load_state_dict(imp.state)
    x = rng.normal(size=(2, 4)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = gm.eval()(torch.from_numpy(x))
    for g_, w_ in zip(got, want):
        np.testing.assert_allclose(g_.detach().numpy(), w_, **TOL)
