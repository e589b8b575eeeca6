"""The trust gate on the entry points that opened more than they asked about (issue 45):
`screenshot PROJECT` (it builds the editor's window, which runs what it shows) and
`train --resume RUN_DIR` (a run folder's run.json and project.lflow name the code its
ranks build). The canary is a Custom node whose module, in tmp_path, writes a marker
file when it is imported and when its layer is built."""
from __future__ import annotations

import shutil
import sys
import uuid

import pytest

from app.cli import main
from engine.diagram.graph import Graph
from engine.project import Project, Training, save_project


def _canary(tmp_path, monkeypatch) -> tuple[str, object]:
    """A module of a name never imported before (so its code runs again if it is
    imported again), on sys.path; returns its 'module:Class' path and the marker."""
    name = f"lf_canary_{uuid.uuid4().hex[:10]}"
    marker = tmp_path / f"{name}.ran"
    (tmp_path / "mods").mkdir(exist_ok=True)
    (tmp_path / "mods" / f"{name}.py").write_text(
        "from pathlib import Path\n"
        "from torch import nn\n"
        f"Path({str(marker)!r}).write_text('imported')\n"
        "class Boom(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        f"        Path({str(marker)!r}).write_text('built')\n"
        "    def forward(self, x):\n"
        "        return x\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    return f"{name}:Boom", marker


def _project(folder, path: str, steps: int = 30):
    g = Graph()
    g.add_node("Input", {"shape": [32]}, pos=(0, 0), id="x")
    g.add_node("Custom", {"path": path}, pos=(240, 0), id="boom")
    g.add_node("Linear", {"out_features": 4}, pos=(480, 0), id="fc")
    g.add_node("Output", {"loss": "cross_entropy"}, pos=(720, 0), id="y")
    for a, b in [("x", "boom"), ("boom", "fc"), ("fc", "y")]:
        g.connect(a, "out", b, "in")
    tr = Training.model_validate({"dataset": {"kind": "synthetic_classification", "n_samples": 256},
                                  "batch_size": 32, "steps": steps, "eval_interval": 10, "checkpoint_interval": 10,
                                  "log_interval": 1})
    folder.mkdir(parents=True, exist_ok=True)
    return save_project(Project(g, name="canary", training=tr), folder / "canary.lflow")


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.gui
def test_a_screenshot_runs_a_projects_code_only_with_consent(qtbot, tmp_path, monkeypatch, capsys):
    path, marker = _canary(tmp_path, monkeypatch)
    p = _project(tmp_path / "shared", path)
    out = tmp_path / "shot.png"
    assert main(["screenshot", str(p), "-o", str(out)]) == 2
    line = _error_line(capsys)
    assert path in line and f"python main.py trust {p}" in line and "--trust" in line
    assert not marker.exists() and not out.exists()
    assert path.split(":")[0] not in sys.modules

    assert main(["screenshot", str(p), "-o", str(out), "--trust"]) == 0
    assert out.is_file() and marker.exists()  # consented: the window built it


@pytest.mark.gui
def test_a_screenshot_of_a_trusted_project_needs_no_flag(qtbot, tmp_path, monkeypatch, capsys):
    path, marker = _canary(tmp_path, monkeypatch)
    p = _project(tmp_path / "shared", path)
    assert main(["trust", str(p)]) == 0
    assert not marker.exists()  # trusting runs nothing
    assert main(["screenshot", str(p), "-o", str(tmp_path / "shot.png")]) == 0


def _stopped_run(tmp_path, path: str):
    """A real run of the canary project (made with consent), stopped at step 15."""
    from engine import trust
    from engine.project import load_project
    from engine.runs.build import prepare_run
    from engine.runtime.train import run

    p = _project(tmp_path / "proj", path)
    with trust.allowing([path]):
        rd = prepare_run(load_project(p), tmp_path / "run")

    def stop_at_15(step, total, rec):
        if step == 15:
            raise KeyboardInterrupt

    assert run(rd, progress=stop_at_15).state == "cancelled"
    assert (rd / "checkpoints" / "latest").read_text().strip() == "step_15"
    return rd


def _forget(path: str, marker) -> None:
    """As if in a new process: the canary's module not imported, its marker gone."""
    sys.modules.pop(path.split(":")[0], None)
    marker.unlink(missing_ok=True)


def test_resuming_a_run_folder_runs_its_code_only_with_consent(tmp_path, monkeypatch, capsys):
    path, marker = _canary(tmp_path, monkeypatch)
    rd = _stopped_run(tmp_path, path)
    shared = tmp_path / "shared_run"  # the same folder, as a colleague would send it
    shutil.copytree(rd, shared)
    _forget(path, marker)

    assert main(["train", "--resume", str(rd)]) == 2
    line = _error_line(capsys)
    assert path in line and f"python main.py trust {rd}" in line and "--trust" in line
    assert not marker.exists()

    assert main(["train", "--resume", str(rd), "--trust"]) == 0  # consent given with the command
    assert marker.exists()
    assert '"state": "succeeded"' in (rd / "status.json").read_text()

    # `trust RUN_DIR` remembers it for that folder; a copy elsewhere asks on its own
    _forget(path, marker)
    other = tmp_path / "other_copy"
    shutil.copytree(shared, other)
    assert main(["trust", str(shared)]) == 0
    assert path in capsys.readouterr().out and not marker.exists()
    assert main(["train", "--resume", str(other)]) == 2 and not marker.exists()
    capsys.readouterr()
    assert main(["train", "--resume", str(shared)]) == 0 and marker.exists()


def test_the_projects_own_consent_covers_its_run_folder(tmp_path, monkeypatch, capsys):
    """`train PROJECT --resume RUN_DIR` of a trusted project: the same imports, no second question."""
    path, marker = _canary(tmp_path, monkeypatch)
    rd = _stopped_run(tmp_path, path)
    _forget(path, marker)
    project = tmp_path / "proj" / "canary.lflow"
    assert main(["train", str(project), "--resume", str(rd)]) == 2 and not marker.exists()
    capsys.readouterr()
    assert main(["trust", str(project)]) == 0
    assert main(["train", str(project), "--resume", str(rd)]) == 0 and marker.exists()
