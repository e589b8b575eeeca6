"""The command line as a user runs it: real processes, exit codes, messages."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.project import load_project, save_project

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "resources" / "examples"


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_validate_ok_and_errors(tmp_path):
    r = cli("validate", EX / "cnn_digits.lflow")
    assert r.returncode == 0 and "valid" in r.stdout
    p = load_project(EX / "mlp_digits.lflow")
    p.graph.set_param("fc2", "in_features", 7)
    p.graph.set_param("head", "out_features", "ten")
    save_project(p, tmp_path / "bad.lflow")
    r = cli("validate", tmp_path / "bad.lflow")
    assert r.returncode == 1
    assert "node 'fc2' (Linear): input has last dim 128 but in_features is 7" in r.stderr
    assert "node 'head' (Linear): out_features must be an integer, not 'ten'" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_files_give_one_line_errors(tmp_path):
    (tmp_path / "junk.lflow").write_bytes(b"\x00\xffnot json")
    r = cli("validate", tmp_path / "junk.lflow")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    r = cli("summary", tmp_path / "missing.lflow")
    assert r.returncode == 2 and "cannot read" in r.stderr


def test_summary_json_and_table():
    r = cli("summary", EX / "mlp_digits.lflow", "--json")
    data = json.loads(r.stdout)
    assert data["total_params"] == 64 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10
    assert [n["node"] for n in data["nodes"]][:2] == ["x", "fc1"]
    t = cli("summary", EX / "mlp_digits.lflow").stdout
    assert "(B, 128)" in t and "17,226" in t


@pytest.mark.slow
def test_train_and_resume_from_cli(tmp_path):
    out = tmp_path / "run"
    r = cli("train", EX / "transformer_synthetic.lflow", "--steps", "6", "--out", out, "--seed", "3")
    assert r.returncode == 0, r.stderr
    assert "succeeded: 6/6 steps" in r.stdout
    r = cli("train", EX / "transformer_synthetic.lflow", "--resume", out, "--steps", "9")
    assert r.returncode == 0, r.stderr
    steps = [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(l)]
    assert steps == sorted(set(steps)) and 6 in steps and steps[-1] == 9  # resumed at 6: no step twice


def test_train_refuses_data_that_does_not_fit(tmp_path):
    p = load_project(EX / "mlp_digits.lflow")
    p.graph.set_param("head", "out_features", 7)
    save_project(p, tmp_path / "p.lflow")
    r = cli("train", tmp_path / "p.lflow", "--steps", "2")
    assert r.returncode == 2
    assert "node 'head' (Linear): outputs 7 values per sample but the data set has 10 classes" in r.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
