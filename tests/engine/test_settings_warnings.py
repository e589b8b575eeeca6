"""An absurd weight decay is a warning, not an error, and every check says it (issue 45,
item 5): `python main.py validate` prints it on stderr and exits 0, layerflow's
Project.validate() returns it among its warnings. A real CLI process, the real API."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import layerflow

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "resources" / "examples" / "mlp_digits.lflow"
FIELD = "training.optimizer.weight_decay"


def project(tmp_path: Path, weight_decay: float, lr: float = 0.003) -> Path:
    d = json.loads(MLP.read_text())
    d["training"]["optimizer"].update(weight_decay=weight_decay, lr=lr)
    path = tmp_path / f"wd{weight_decay:g}.lflow"
    path.write_text(json.dumps(d))
    return path


@pytest.fixture(autouse=True)
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / "config"))


def test_validate_on_the_command_line_warns_once_and_passes(tmp_path):
    for wd, lr, words in ((1e30, 0.003, "1e+30 is far above the usual 0 to 0.1"),
                          (50.0, 0.1, "more than all of it: the weights diverge or vanish")):
        r = subprocess.run([sys.executable, str(ROOT / "main.py"), "validate", project(tmp_path, wd, lr)],
                           cwd=tmp_path, env=os.environ.copy(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "valid" in r.stdout and "error" not in r.stderr, (r.stdout, r.stderr)
        warned = [ln for ln in r.stderr.splitlines() if ln.startswith(f"warning: {FIELD}")]
        assert len(warned) == 1 and words in warned[0] and "lower it" in warned[0], r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), "validate", project(tmp_path, 0.01)],
                       cwd=tmp_path, env=os.environ.copy(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and FIELD not in r.stderr, r.stderr  # a usual weight decay: no word


def test_validate_in_python_returns_the_warning(tmp_path):
    warnings = layerflow.Project.load(project(tmp_path, 1e30)).validate()  # returns: a warning, not CheckFailed
    mine = [w for w in warnings if w.startswith(FIELD)]
    assert len(mine) == 1 and "1e+30 is far above the usual 0 to 0.1" in mine[0], warnings
    assert not [w for w in layerflow.Project.load(project(tmp_path, 0.01)).validate() if FIELD in w]
    p = layerflow.Project.load(project(tmp_path, 0.01))
    p.training.optimizer.weight_decay = 20.0  # changed in Python, then checked: said too
    assert [w for w in p.validate() if w.startswith(FIELD)], p.validate()
    p.training.optimizer.weight_decay, p.training.optimizer.lr = 0.6, 2.0  # a usual decay, but lr x decay >= 1
    mine = [w for w in p.validate() if w.startswith(FIELD)]
    assert len(mine) == 1 and "0.6 is too much at lr 2" in mine[0] and "diverge or vanish" in mine[0], mine
