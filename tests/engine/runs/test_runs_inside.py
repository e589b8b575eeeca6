"""Run folders stay inside the project's folder unless the user chose another (issue 45,
item 5): a `runs` link that leads out of the folder is refused where every run is
prepared (engine.runs.history.check_runs_inside from layerflow.prepare.prepare_training), so the
Python API and the editor (its Run: new_run_dir, then prepare_training) are refused as
the CLI is, while the runs panel still lists what is there; an out= folder the user chose is written, a link inside is followed.
Real files, real links, a real one-step run."""
import json
from pathlib import Path

import pytest

import layerflow
from engine.errors import LayerflowError
from engine.project import load_project
from engine.runs.build import new_run_dir
from engine.runs.history import list_runs, runs_dir
from layerflow.prepare import prepare_training

ROOT = Path(__file__).resolve().parents[3]
MLP = ROOT / "resources" / "examples" / "mlp_digits.lflow"


@pytest.fixture
def proj(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / "config"))
    (tmp_path / "proj").mkdir()
    path = tmp_path / "proj" / "p.lflow"
    path.write_text(MLP.read_text())
    return path


def test_a_runs_link_out_of_the_project_is_refused_by_the_api_and_the_editors_path(proj, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (proj.parent / "runs").symlink_to(outside)
    p = layerflow.Project.load(proj)
    with pytest.raises(LayerflowError, match="outside the project's folder") as exc:
        p.train(steps=1)
    assert "runs: is a link to" in str(exc.value) and "out=" in str(exc.value) and "\n" not in str(exc.value)
    project = load_project(proj)
    with pytest.raises(LayerflowError, match="outside the project's folder"):  # the editor's Run (run_controller)
        prepare_training(project.copy(), out=new_run_dir(project))
    from remote.launch.ssh_torchrun import DeployError, prepare

    with pytest.raises(DeployError, match="outside the project's folder"):  # a deploy's local run folder too
        prepare(project.copy())
    assert list(outside.iterdir()) == []
    assert list_runs(runs_dir(proj.parent)) == []  # listing (the runs panel, the window opening) is not refused
    # a dangling link out of the folder is refused the same way (it would be created there)
    (proj.parent / "runs").unlink()
    (proj.parent / "runs").symlink_to(tmp_path / "not-yet")
    with pytest.raises(LayerflowError, match="outside the project's folder"):
        p.train(steps=1)
    assert not (tmp_path / "not-yet").exists()


def test_a_folder_the_user_chose_and_a_link_inside_the_project_are_written(proj, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (proj.parent / "runs").symlink_to(outside)
    p = layerflow.Project.load(proj)
    run = p.train(steps=1, out=outside / "mine")  # the user's choice: allowed
    assert run.wait(timeout=180).state == "succeeded", run.logs()
    assert json.loads((outside / "mine" / "run.json").read_text())
    (proj.parent / "runs").unlink()
    (proj.parent / "kept").mkdir()
    (proj.parent / "runs").symlink_to(proj.parent / "kept")  # a link inside the folder: followed
    run = p.train(steps=1)
    assert run.wait(timeout=180).state == "succeeded", run.logs()
    assert [d.name for d in (proj.parent / "kept").iterdir()] == [run.dir.name]
