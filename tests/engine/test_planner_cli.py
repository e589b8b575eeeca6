"""`python main.py plan PROJECT [--nproc N] [--auto] [--json]`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from app.cli import main
from engine.project import load_project

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"


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
