"""Import of PyTorch modules through torch.fx: structure, weights, counts, refusals."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.diagram.compile import compile_graph
from engine.interop import InteropError, import_module, save_imported
from engine.interop.module.importer import from_module
from engine.project import load_project
from engine.runtime.model import load_weights


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + x)  # skip connection


class ResNetish(nn.Module):
    def __init__(self, width=8, classes=5):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.layer1 = nn.Sequential(Block(width), Block(width))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        x = self.pool(self.layer1(self.stem(x)))
        return self.fc(x.view(x.size(0), -1))


class TinyEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 16)
        self.enc = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, tokens):
        h = self.enc(self.emb(tokens))
        return self.head(torch.cat([h.mean(dim=1), h.mean(dim=1)], dim=1)[:, :16])


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: fx cannot trace it
            return self.fc(x)
        return x


def _randomize_bn(m: nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.2)
            mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)


def test_resnet_module_with_weights(tmp_path):
    torch.manual_seed(0)
    m = ResNetish().eval()
    _randomize_bn(m)
    imp = from_module(m, [[3, 8, 8]])
    ids = list(imp.project.graph.nodes)
    assert "layer1_0_conv1" in ids and "fc" in ids and ids[0] == "x"
    types = [n.type for n in imp.project.graph.nodes.values()]
    assert types.count("Add") == 2 and types.count("BatchNorm2d") == 4 and "Reshape" in types
    result = compile_graph(imp.project.graph)
    assert result.total_params == sum(p.numel() for p in m.parameters())  # exactly
    path = save_imported(imp, tmp_path / "res.lflow")
    project = load_project(path)
    gm = compile_graph(project.graph).build()
    load_weights(gm, str(tmp_path / project.weights))
    x = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(gm.eval()(x), m(x), rtol=1e-5, atol=1e-5)


def test_transformer_module_with_a_slice_imports():
    imp = from_module(TinyEncoder(), [[6]], ["int64"])  # the outputs are checked against the module's
    node = next(n for n in imp.project.graph.nodes.values() if n.type == "Slice")
    assert node.params == {"dim": 1, "start": 0, "end": 16, "step": 1}  # [:, :16]


class Parts(nn.Module):
    """Attention written with functions, non-square kernels, RMSNorm and constants."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, (3, 5), stride=(1, 2), padding=(1, 2))
        self.pool = nn.MaxPool2d((2, 1))
        self.norm = nn.RMSNorm(4)
        self.q = nn.Linear(4, 4)

    def forward(self, x):
        h = self.pool(self.conv(x)).flatten(2).transpose(1, 2)  # (B, T, 4)
        h = self.norm(h)
        s = torch.matmul(self.q(h), h.transpose(-1, -2)) / 2.0
        return (1.0 - s.softmax(-1) @ h)[:, 1::2] * 3


def test_function_calls_map_to_matmul_transpose_slice_and_scale():
    torch.manual_seed(0)
    m = Parts().eval()
    imp = from_module(m, [[2, 6, 8]])  # the outputs are checked against the module's
    nodes = imp.project.graph.nodes.values()
    assert [n.type for n in nodes if n.type not in ("Input", "Output")] == [
        "Conv2d", "MaxPool2d", "Flatten", "Transpose", "RMSNorm", "Linear", "Transpose", "MatMul", "Scale",
        "Softmax", "MatMul", "Scale", "Slice", "Scale"]
    conv = next(n for n in nodes if n.type == "Conv2d")
    assert (conv.params["kernel_size"], conv.params["stride"], conv.params["padding"]) == ([3, 5], [1, 2], [1, 2])
    assert [n.params for n in nodes if n.type == "Scale"] == [
        {"scale": 0.5, "shift": 0.0, "shape": []}, {"scale": -1.0, "shift": 1.0, "shape": []},
        {"scale": 3.0, "shift": 0.0, "shape": []}]
    assert next(n for n in nodes if n.type == "Slice").params == {"dim": 1, "start": 1, "end": None, "step": 2}
    # fancy indexing has no catalog layer: it comes in as a generic Op node (checked
    # against the module's output inside from_module)
    picks = from_module(_Picks(), [[4, 3]]).project.graph.nodes
    assert [n.type for n in picks.values()] == ["Input", "Op", "Output"]
    assert [c[1] for c in picks["index"].params["code"]][-1] == "aten.index.Tensor"


class _Picks(nn.Module):
    def forward(self, x):
        return x[:, [0, 2]]


def test_transformer_module_by_import_path_and_kwargs():
    imp = import_module("torch.nn:TransformerEncoderLayer",
                        {"d_model": 16, "nhead": 2, "dim_feedforward": 24, "batch_first": True, "norm_first": True},
                        [[5, 16]])
    node = next(n for n in imp.project.graph.nodes.values() if n.type == "TransformerEncoderLayer")
    assert node.params["nhead"] == 2 and node.params["norm_first"] is True
    assert compile_graph(imp.project.graph).total_params == sum(
        p.numel() for p in nn.TransformerEncoderLayer(16, 2, 24, batch_first=True).parameters())


def test_untraceable_module_is_reported_with_the_reason():
    with pytest.raises(InteropError) as e:
        from_module(Branchy(), [[4]])
    msg = str(e.value)
    assert "cannot be exported by torch.export" in msg and "control flow" in msg


def test_unsupported_layers_are_listed(tmp_path):
    from app.cli import main

    rc = main(["import", "module:torch.nn:LSTM", "-o", str(tmp_path / "l.lflow"),
               "--kwargs", '{"input_size": 4, "hidden_size": 3}', "--input-shape", "5,4"])
    assert rc == 2 and not any(tmp_path.iterdir())
    with pytest.raises(InteropError, match=r"output 1 has shape \(1, 5, 3\): a diagram.s outputs are tensors with the batch first"):
        import_module("torch.nn:LSTM", {"input_size": 4, "hidden_size": 3}, [[5, 4]])
    with pytest.raises(InteropError, match="--input-shape"):
        import_module("torch.nn:Linear", {"in_features": 4, "out_features": 2}, None)
    with pytest.raises(InteropError, match="cannot import"):
        import_module("torch.nn:NoSuchLayer", {}, [[4]])


def test_cli_module_import(tmp_path):
    from app.cli import main

    rc = main(["import", "module:torch.nn:Linear", "-o", str(tmp_path / "lin.lflow"),
               "--kwargs", '{"in_features": 6, "out_features": 2}', "--input-shape", "6"])
    assert rc == 0
    project = load_project(tmp_path / "lin.lflow")
    assert [n.type for n in project.graph.nodes.values()] == ["Input", "Linear", "Output"]
    assert (tmp_path / "lin.weights.pt").exists()


def test_layers_written_out_by_hand_come_in_as_catalog_layers():
    """GELU in its erf form, x * sigmoid(x), an RMSNorm written as reference code writes
    it, F.layer_norm and F.embedding with the module's own weights, a global average
    pool as a mean and a permute that swaps two dims: each is one catalog layer, with
    the weights it read, and the diagram computes what the module computes."""

    class RMS(nn.Module):  # as in the Llama reference code
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.eps, self.weight = eps, nn.Parameter(torch.rand(dim) + 0.5)

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(torch.randn(11, 8))
            self.ln_w, self.ln_b = nn.Parameter(torch.rand(8) + 0.5), nn.Parameter(torch.randn(8) * 0.1)
            self.norm = RMS(8)
            self.conv = nn.Conv2d(1, 4, 3, padding=1)
            self.fc = nn.Linear(8 + 4, 5)

        def forward(self, tokens):
            h = F.embedding(tokens, self.table)                      # (B, T, 8)
            h = F.layer_norm(h, (8,), self.ln_w, self.ln_b, 1e-5)
            h = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))      # GELU, written out
            h = h * torch.sigmoid(h)                                 # SiLU, written out
            h = self.norm(h)
            img = self.conv(h.permute(0, 2, 1)[:, None])             # (B, 4, T, 8)
            pooled = img.mean(dim=(2, 3), keepdim=True).flatten(1)  # global average pooling
            return self.fc(torch.cat([h.mean(1), pooled], dim=1))

    import math

    torch.manual_seed(0)
    m = Net().eval()
    imp = from_module(m, [[6]], ["int64"])
    nodes = imp.project.graph.nodes
    types = [n.type for n in nodes.values()]
    for t in ("Embedding", "LayerNorm", "GELU", "SiLU", "RMSNorm", "Transpose", "AdaptiveAvgPool2d"):
        assert t in types, (t, types)
    assert "Op" not in [n.type for n in nodes.values() if n.type in ("Embedding", "LayerNorm", "RMSNorm")]
    rms = next(n for n in nodes.values() if n.type == "RMSNorm")
    assert rms.params == {"normalized_shape": 8, "eps": 1e-6, "elementwise_affine": True} and rms.scope == [["norm", "RMS"]]
    emb = next(nid for nid, n in nodes.items() if n.type == "Embedding")
    torch.testing.assert_close(imp.state[f"{emb}.weight"], m.table.detach())
    assert compile_graph(imp.project.graph).total_params == sum(p.numel() for p in m.parameters())
    gm = compile_graph(imp.project.graph).build()
    gm.load_state_dict(imp.state)
    x = torch.randint(0, 11, (4, 6))
    torch.testing.assert_close(gm.eval()(x), m(x), rtol=1e-5, atol=1e-5)
