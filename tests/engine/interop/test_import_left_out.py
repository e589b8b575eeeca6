"""What an import leaves out is said where a user looks (issue 55, item 3): a model whose
training forward differs from its eval forward (GoogLeNet's auxiliary classifiers,
EfficientNet's stochastic depth) comes in with one line per kind of difference in the
import's notes, in the line `import` prints, and under the total of `summary`, which
reads it from the project file (models: tests/models/reference_models.py, real_models.py)."""
from __future__ import annotations

import json

import torch

from engine.interop import save_imported
from engine.interop.module.importer import from_module
from engine.project import load_project

from reference_models import GoogLeNet
from real_models import EfficientNet, ResNet


def test_auxiliary_classifiers_are_named_in_the_summary_of_the_saved_project(tmp_path, capsys):
    from app.cli import main

    torch.manual_seed(0)
    model = GoogLeNet().eval()
    aux = sum(p.numel() for m in (model.aux1, model.aux2) for p in m.parameters())
    total = sum(p.numel() for p in model.parameters())
    path = tmp_path / "googlenet.lflow"
    assert main(["import", "module:reference_models:GoogLeNet", "-o", str(path), "--input-shape", "3,16,16"]) == 0
    out, err = capsys.readouterr()
    assert f"{total - aux:,} parameters; not all of the source's: see the note on what is left out" in out
    line = f"{aux} of the module's {total} parameters are not in the diagram: 'aux1', 'aux2' run only in training mode"
    assert sum(line in n for n in err.splitlines()) == 1

    assert main(["summary", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    total_row = next(i for i, r in enumerate(out) if r.startswith("total"))
    assert f"{total - aux:,}" in out[total_row]  # the diagram's count, and right under it why it is short
    assert len(out) == total_row + 2 and out[-1].startswith("left out at import: ") and line in out[-1]
    assert main(["summary", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["left_out"] == [out[-1].removeprefix("left out at import: ")]


def test_stochastic_depth_is_named_as_computed_only_in_training(tmp_path):
    torch.manual_seed(0)
    model = EfficientNet().eval()
    imp = from_module(model, [[3, 16, 16]])
    assert imp.project.left_out == [
        "'features.1.stochastic_depth', 'features.2.stochastic_depth' (StochasticDepth) compute only in training "
        "mode, so the diagram (an eval-mode recording) trains without them; to keep them, write them as layers the "
        "diagram has (a Dropout) or call them in eval mode too"]
    assert imp.project.left_out[0] in imp.notes
    assert load_project(save_imported(imp, tmp_path / "e.lflow")).left_out == imp.project.left_out
    # its classifier's nn.Dropout is a Dropout node: recorded, trained as in the source, nothing to say
    assert [n.params["p"] for n in imp.project.graph.nodes.values() if n.type == "Dropout"] == [0.2]
    # without stochastic depth nothing is said
    for block in model.features[1:]:
        block.stochastic_depth.p = 0.0
    assert from_module(model, [[3, 16, 16]]).project.left_out == []


def test_a_model_with_nothing_left_out_saves_no_such_field(tmp_path):
    torch.manual_seed(0)
    imp = from_module(ResNet().eval(), [[3, 16, 16]])
    assert imp.project.left_out == []
    saved = json.loads(save_imported(imp, tmp_path / "r.lflow").read_text())
    assert "left_out" not in saved  # files without it stay as they were
