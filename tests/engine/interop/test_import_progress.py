"""The importers tell their phases to progress.reporting's callback (the GUI's progress
bar), and a callback that raises stops the import there (the GUI's Cancel)."""
from __future__ import annotations

import pytest
import torch

from engine.interop import export_onnx, import_module, import_onnx, progress
from engine.interop.module.importer import from_module


class Tiny(torch.nn.Module):
    def __init__(self, hidden=5):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(4, hidden), torch.nn.Linear(hidden, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_module_import_tells_its_phases_in_order():
    seen = []
    with progress.reporting(lambda name, detail: seen.append(name)):
        import_module(f"{__name__}:Tiny", {"hidden": 3}, [[4]])
    order = [p for i, p in enumerate(seen) if i == 0 or seen[i - 1] != p]
    assert order == ["loading", "tracing", "converting", "laying out", "checking"]
    assert all(p in progress.PHASES for p in seen)
    import_module(f"{__name__}:Tiny", {}, [[4]])  # outside reporting: no callback, no error


def test_onnx_import_tells_its_phases(tmp_path):
    project = from_module(Tiny(), [[4]]).project
    path = export_onnx(project, tmp_path / "tiny.onnx")
    seen = []
    with progress.reporting(lambda name, detail: seen.append(name)):
        assert import_onnx(path).drawn  # a Layerflow export: its own diagram, checked
    assert seen[0] == "loading" and seen[-1] == "checking"
    import onnx

    model = onnx.load(str(path))
    del model.metadata_props[:]  # a foreign file: read as torch calls
    onnx.save(model, str(tmp_path / "foreign.onnx"))
    seen.clear()
    with progress.reporting(lambda name, detail: seen.append(name)):
        assert not import_onnx(tmp_path / "foreign.onnx").drawn
    assert seen[0] == "loading" and {"tracing", "converting", "checking"} <= set(seen)


def test_a_callback_that_raises_stops_the_import():
    seen = []

    def stop_at_tracing(name, detail):
        seen.append(name)
        if name == "tracing":
            raise progress.Cancelled()

    with progress.reporting(stop_at_tracing), pytest.raises(progress.Cancelled):
        import_module(f"{__name__}:Tiny", {}, [[4]])
    assert seen[-1] == "tracing" and "converting" not in seen
