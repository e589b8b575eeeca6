"""Nothing in a run folder runs when it is resumed (issue 45, item 2).

Run folders travel: fetched from a cluster, shared by a colleague. A checkpoint is read
by engine/runtime/dist_checkpoint.py `load` alone, and it unpickles tensors and plain
values only: extra.pt and the older state.pt with weights_only, DCP's .metadata through
an unpickler that knows DCP's own records, the values DCP keeps as bytes with
weights_only. Each probe is a canary: a pickle whose __reduce__ would create a marker
file when unpickled, put where a real checkpoint of a real short run has its file.
"""
from __future__ import annotations

import inspect
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch

from app.cli import main
from engine.runs.build import prepare_run
from engine.runtime import dist_checkpoint
from engine.runtime.train import run
from engine.runs.tail import read_metrics
from tests.engine.runtime.test_train import dropout_project, losses


class Canary:
    """Unpickled, it opens (creates) its marker file: what `os.system` would do, harmlessly."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A real run of 40 steps stopped at step 25 (checkpoints at 10, 20 and 25), and the
    losses of the same run left to finish."""
    base = tmp_path_factory.mktemp("ckpt")
    ref = prepare_run(dropout_project(), base / "ref")
    run(ref)
    rd = prepare_run(dropout_project(), base / "stopped")

    def stop_at_25(step, total, rec):
        if step == 25:
            raise KeyboardInterrupt

    assert run(rd, progress=stop_at_25).state == "cancelled"
    return rd, losses(ref)


def _copy(stopped, tmp_path) -> tuple[Path, Path]:
    rd = tmp_path / "run"
    shutil.copytree(stopped[0], rd)
    ckpt = rd / "checkpoints" / (rd / "checkpoints" / "latest").read_text().strip()
    assert ckpt.name == "step_25" and (ckpt / ".metadata").is_file() and (ckpt / "extra.pt").is_file()
    return rd, ckpt


def _one_line_refusal(capsys, file: Path) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(file) in lines[0] and "not trusted" in lines[0] and "not loaded" in lines[0], err
    return lines[0]


def _trainer_reads_state_pt_itself() -> bool:
    """engine/runtime/train.py's Trainer.load_checkpoint still reads an older run's
    state.pt with torch.load of its own (until it hands every read to dist_checkpoint.load)."""
    from engine.runtime.trainer import Trainer

    return "weights_only=False" in inspect.getsource(Trainer.load_checkpoint)


def _plant(ckpt: Path, where: str, marker: Path) -> Path:
    """The canary in the checkpoint's file `where`; returns that file."""
    if where.startswith("extra.pt"):
        torch.save({"step": 25, "rng": Canary(marker)}, ckpt / "extra.pt")
        file = ckpt / "extra.pt"
    elif where == ".metadata":
        (ckpt / ".metadata").write_bytes(pickle.dumps(Canary(marker)))
        file = ckpt / ".metadata"
    elif where == ".metadata inside real metadata":  # DCP's own records, one field swapped
        md = pickle.loads((ckpt / ".metadata").read_bytes())  # written by this test's own run: trusted
        md.planner_data = {"x": Canary(marker)}
        (ckpt / ".metadata").write_bytes(pickle.dumps(md))
        file = ckpt / ".metadata"
    else:  # an older run's single file, as Layerflow wrote it before DCP
        for f in ckpt.iterdir():
            f.unlink()
        torch.save({"model": {}, "optimizer": Canary(marker)}, ckpt / "state.pt")
        file = ckpt / "state.pt"
    return file


@pytest.mark.parametrize("where", ["extra.pt", "extra.pt --nproc 2", ".metadata", ".metadata inside real metadata",
                                   "state.pt"])
def test_a_canary_in_a_checkpoint_never_runs_on_resume(stopped, tmp_path, capsys, where):
    """`train --resume`: refused in one line before any process starts, on 1 process or 2."""
    rd, ckpt = _copy(stopped, tmp_path)
    marker = tmp_path / "ran"
    file = _plant(ckpt, where, marker)
    flags = where.split()[1:] if " --" in where else []
    assert main(["train", "--resume", str(rd), *flags]) == 2
    assert not marker.exists()
    line = _one_line_refusal(capsys, file)
    assert "io.open" in line or "builtins.open" in line  # what it would have run, named


@pytest.mark.parametrize("where", [
    "extra.pt",
    ".metadata",
    pytest.param("state.pt", marks=pytest.mark.xfail(
        _trainer_reads_state_pt_itself(), strict=True,
        reason="Trainer.load_checkpoint (train.py) reads state.pt itself; it is to delegate to dist_checkpoint.load")),
])
def test_the_runtime_refuses_a_canary_too(stopped, tmp_path, where):
    """The runtime's own resume (`python -m engine.runtime.train RUN --resume`, a torchrun
    restart) reads through dist_checkpoint.load as well."""
    rd, ckpt = _copy(stopped, tmp_path)
    marker = tmp_path / "ran"
    file = _plant(ckpt, where, marker)
    with pytest.raises(dist_checkpoint.UnsafeCheckpoint, match=re.escape(str(file))):
        run(rd, resume=True)
    assert not marker.exists()


def test_a_canary_among_dcps_byte_values_never_runs(tmp_path):
    """DCP keeps non-tensor values (an optimizer's lr, betas) as pickled bytes in the
    .distcp files, and torch's planner loads them with weights_only=False; ours does not."""
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    extra = {"step": 1, "rng": {"numpy": __import__("numpy").random.get_state(), "python": (3, (1, 2), None)}}
    dist_checkpoint.save(tmp_path / "ck", model, opt, extra, write_extra=True)
    msd, osd = get_state_dict(model, opt)
    marker = tmp_path / "ran"
    osd["param_groups"][0]["lr"] = Canary(marker)
    with dist_checkpoint._alone():
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    fresh = nn.Linear(4, 2)
    with pytest.raises(dist_checkpoint.UnsafeCheckpoint, match="lr"):
        dist_checkpoint.load(tmp_path / "ck", fresh, torch.optim.Adam(fresh.parameters(), lr=0.5))
    assert not marker.exists()


def test_the_one_loader_reads_an_older_state_pt_safely(tmp_path):
    """dist_checkpoint.load reads state.pt (a run before DCP) with weights_only: its numpy
    RNG state (an ndarray) loads; a canary beside it does not run."""
    import numpy as np
    from torch import nn

    model = nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 7,
             "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": __import__("random").getstate()}}
    (tmp_path / "ok").mkdir()
    torch.save(state, tmp_path / "ok" / "state.pt")
    fresh = nn.Linear(4, 2)
    got = dist_checkpoint.load(tmp_path / "ok", fresh, torch.optim.Adam(fresh.parameters(), lr=0.1))
    assert got["step"] == 7 and torch.equal(fresh.weight, model.weight)
    np.testing.assert_array_equal(got["rng"]["numpy"][1], state["rng"]["numpy"][1])

    marker = tmp_path / "ran"
    (tmp_path / "bad").mkdir()
    torch.save({**state, "scheduler": Canary(marker)}, tmp_path / "bad" / "state.pt")
    with pytest.raises(dist_checkpoint.UnsafeCheckpoint, match=r"state\.pt: not loaded: .*open"):
        dist_checkpoint.load(tmp_path / "bad", fresh, torch.optim.Adam(fresh.parameters(), lr=0.1))
    (tmp_path / "bad" / "state.pt").write_bytes(pickle.dumps(Canary(marker)))  # not even torch's format
    with pytest.raises(dist_checkpoint.UnsafeCheckpoint):
        dist_checkpoint.load(tmp_path / "bad", fresh, torch.optim.Adam(fresh.parameters(), lr=0.1))
    assert not marker.exists()


def test_metadata_may_name_only_data_files_inside_its_folder(stopped, tmp_path):
    _, ckpt = _copy(stopped, tmp_path)
    md = pickle.loads((ckpt / ".metadata").read_bytes())
    for info in md.storage_data.values():
        info.relative_path = "../../../../etc/passwd"
    (ckpt / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(dist_checkpoint.UnsafeCheckpoint, match="outside its folder"):
        dist_checkpoint.read_metadata(ckpt / ".metadata")


def test_a_resume_still_goes_on_where_it_stopped(stopped, tmp_path, capsys):
    """The safe reads change nothing for a run's own checkpoints: resumed through the CLI,
    the losses are those of the run that was never stopped; extra.pt as Layerflow wrote
    it before (numpy's RNG state as an ndarray) resumes the same."""
    rd, ckpt = _copy(stopped, tmp_path)
    assert main(["train", "--resume", str(rd)]) == 0
    assert losses(rd) == stopped[1]
    assert [r["step"] for r in read_metrics(rd / "metrics.jsonl") if "loss" in r] == list(range(1, 41))

    old, ckpt = _copy(stopped, tmp_path / "old")
    extra = dist_checkpoint._decoded(torch.load(ckpt / "extra.pt", weights_only=True))
    assert isinstance(extra["rng"]["numpy"][1], __import__("numpy").ndarray)
    torch.save(extra, ckpt / "extra.pt")  # as an older Layerflow wrote it
    assert main(["train", "--resume", str(old)]) == 0
    assert losses(old) == stopped[1]
