"""`python main.py plan PROJECT [--nproc N] [--auto] [--json]`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from app.cli import main
from engine.project import load_project

EXAMPLES = Path(__file__).resolve().parents[3] / "resources" / "examples"


def test_plan_json_for_the_projects_placement(capsys):
    assert main(["plan", str(EXAMPLES / "resnet_synthetic.lflow"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["world"] == 1 and doc["errors"] == [] and doc["bubble_fraction"] == 0


def test_plan_text_reports_errors_with_exit_1(capsys):
    assert main(["plan", str(EXAMPLES / "mlp_digits.lflow"), "--nproc", "3"]) == 1
    out = capsys.readouterr().out
    assert "error: placement pp=1 x dp=1 x tp=1 = 1 processes, but 3 are available" in out


def test_plan_auto_explains_and_accepts(tmp_path, capsys):
    proj = tmp_path / "t.lflow"
    shutil.copy(EXAMPLES / "transformer_synthetic.lflow", proj)
    assert main(["plan", str(proj), "--nproc", "2", "--auto", "--memory-gb", "0.0012"]) == 0
    out = capsys.readouterr().out
    assert "why: chose pp=" in out and "ruled out" in out or "ms/step" in out
    assert main(["plan", str(proj), "--nproc", "2", "--auto", "--memory-gb", "0.0012", "--accept", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    p = load_project(proj)
    assert (p.placement.pp, p.placement.dp, p.placement.tp) == (doc["pp"], doc["dp"], doc["tp"])
    assert main(["plan", str(proj)]) == 0  # the accepted placement plans cleanly


def test_plan_bad_device_is_a_clear_error(capsys):
    assert main(["plan", str(EXAMPLES / "mlp_digits.lflow"), "--device", "tpu9"]) == 2
    assert "unknown device 'tpu9'" in capsys.readouterr().err


import pytest  # noqa: E402

EDGES = [("pp", 1), ("pp", 7), ("pp", 65_536), ("dp", 65_536), ("tp", 65_536), ("tp", 7), ("microbatches", 1),
         ("microbatches", 65_536), ("schedule", "gpipe"), ("schedule", "interleaved1f1b"), ("data_parallel", "fsdp"),
         ("reshard_after_forward", False), ("mixed_precision", "bf16"), ("sync_batchnorm", True)]


@pytest.mark.parametrize("example", ["mlp_digits", "transformer_synthetic"])
@pytest.mark.parametrize("field,value", EDGES)
def test_validate_and_plan_answer_every_placement_edge_value_without_a_traceback(tmp_path, capsys, example, field,
                                                                                  value):
    """`validate` and `plan` run the same check: both valid, or both errors naming the setting."""
    from engine.project import Placement, save_project

    if value == 65_536 and example != "mlp_digits":
        value = 1024  # the largest on the small example only: 65,536 ranks of a transformer take 20 s
    p = load_project(EXAMPLES / f"{example}.lflow")
    p.placement = Placement.model_validate({**p.placement.model_dump(), field: value})
    path = save_project(p, tmp_path / "p.lflow")
    rc_validate = main(["validate", str(path)])
    err = capsys.readouterr().err
    rc_plan = main(["plan", str(path)])
    out = capsys.readouterr()
    assert "Traceback" not in err + out.out + out.err
    assert rc_validate in (0, 1) and rc_plan in (0, 1)
    assert (rc_validate == 0) == (rc_plan == 0), (err, out.out)
    if rc_validate:
        assert "error: " in err


def test_plan_takes_the_placement_flags_train_takes(capsys):
    path = str(EXAMPLES / "mlp_digits.lflow")
    assert main(["plan", path, "--pp", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["pp"] == 2 and len(doc["stages"]) == 2 and doc["microbatches"] >= 2
    assert main(["plan", path, "--tp", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tp_auto"] == ["fc1", "fc2"]
    assert main(["plan", path, "--pp", "2", "--microbatches", "1", "--schedule", "1f1b"]) == 1
    assert "needs placement.microbatches >= stages" in capsys.readouterr().out
    assert main(["plan", path, "--pp", "0"]) == 2
    assert "--pp must be at least 1" in capsys.readouterr().err
    assert main(["plan", path, "--dp", "70000"]) == 2
    assert "--dp" in capsys.readouterr().err
