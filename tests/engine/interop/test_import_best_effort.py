"""What an import does on the side (the note on parameters it leaves out, pruning dead
calls, merging Scale chains, the block layout, a synthetic data set) can never fail it, and
never changes the module it reads (issue 55, item 1). The first test is the regression
itself, on a module as it stands: the note's training-mode run used to write BatchNorm's
statistics back with copy_, which a buffer that is a broadcast view refuses."""
from __future__ import annotations

import pytest
import torch

import engine.interop.module.importer as mi
from engine.diagram.compile import compile_graph
from engine.interop.module.importer import from_module

from reference_models import GoogLeNet
from real_models import ResNet


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _equal_to_source(imp, model, shape):
    result = compile_graph(imp.project.graph)
    assert result.ok, result.errors
    gm = result.build(seed=0)
    gm.load_state_dict(imp.state)
    x = torch.randn(4, *shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(gm.eval()(x), model(x), rtol=1e-4, atol=1e-5)


def test_the_training_only_note_leaves_the_module_as_it_was_even_with_broadcast_buffers():
    torch.manual_seed(0)
    model = GoogLeNet().eval()
    bn = model.conv1.bn
    bn.running_var = torch.full((1,), 1.5).expand(16)  # one value read 16 times: copy_ into it raises
    with torch.no_grad():
        bn.running_mean.uniform_(-0.2, 0.2)
    before = _state(model)
    imp = from_module(model, [[3, 16, 16]])  # used to end in "more than one element ... single memory location"
    assert any("'aux1', 'aux2' run only in training mode" in n for n in imp.notes), imp.notes
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # running statistics, counters: untouched
    assert after["conv1.bn.running_var"].data_ptr() == bn.running_var.data_ptr()  # the same view, not replaced
    assert not any(m.training for m in model.modules())  # eval, as it came, every submodule
    _equal_to_source(imp, model, (3, 16, 16))


def _raises(after=None):
    def step(*args, **kwargs):
        if after is not None:
            after(*args)  # part of the work done, then it fails
        raise RuntimeError("boom: a side step failed")
    return step


def _drop_first(graph, *_):
    graph.remove_node(next(n for n in graph.nodes if graph.nodes[n].type not in ("Input", "Output")))


@pytest.mark.parametrize("step,what,after", [
    ("left_out_notes", "naming what the diagram leaves out of the module", None),
    ("drop_dead", "removing calls whose results reach no output", _drop_first),
    ("_merge_scales", "merging chains of scalar Scale nodes", _drop_first),
    ("blocks_from_scopes", "laying the diagram out in blocks of its module tree", None),
    ("synthetic_training", "choosing a synthetic data set of the input's shape", None),
])
def test_a_side_step_that_fails_is_a_line_in_the_notes_not_a_failed_import(monkeypatch, step, what, after):
    monkeypatch.setattr(mi, step, _raises(after))
    torch.manual_seed(0)
    model = ResNet().eval()
    imp = from_module(model, [[3, 16, 16]])
    lines = [n for n in imp.notes if n.startswith(what)]
    assert len(lines) == 1 and "\n" not in lines[0] and "RuntimeError: boom: a side step failed" in lines[0], imp.notes
    assert compile_graph(imp.project.graph).total_params == sum(p.numel() for p in model.parameters())
    _equal_to_source(imp, model, (3, 16, 16))  # a step that failed halfway left nothing half done


def test_a_cancelled_import_stays_cancelled_inside_a_side_step(monkeypatch):
    from engine.interop.progress import Cancelled

    def cancel(*_):
        raise Cancelled("cancelled by the user")
    monkeypatch.setattr(mi, "blocks_from_scopes", cancel)
    with pytest.raises(Cancelled):
        from_module(ResNet().eval(), [[3, 16, 16]])


def test_an_import_past_a_limit_stops_inside_a_side_step_too(monkeypatch):
    from engine.interop.onnx.limits import LimitError

    def too_long(*_):
        raise LimitError("model.onnx: the import took more than 240 s")
    monkeypatch.setattr(mi, "blocks_from_scopes", too_long)
    with pytest.raises(LimitError, match="more than 240 s"):
        from_module(ResNet().eval(), [[3, 16, 16]])
