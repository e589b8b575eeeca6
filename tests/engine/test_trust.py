"""A project file never runs code on validate, summary, plan or open without consent.

The probes are the ones that worked before: a Custom node whose path is shutil:rmtree
(deletes a folder), os:_exit (validate exited 0 silently). Consent is given once per
project and exact set of import paths, kept in the user's config folder.
"""
from __future__ import annotations

import json

import pytest

from app.cli import main
from engine.graph import Graph
from engine.project import Project, save_project


def _project(tmp_path, custom: dict[str, dict], name="shared.lflow"):
    g = Graph()
    g.add_node("Input", {"shape": [4]}, id="x")
    prev = "x"
    for nid, params in custom.items():
        g.add_node("Custom", params, id=nid)
        g.connect(prev, "out", nid, "in")
        prev = nid
    g.add_node("Output", {"loss": "mse"}, id="out")
    g.connect(prev, "out", "out", "in")
    return save_project(Project(g, name="shared"), tmp_path / name)


@pytest.fixture(autouse=True)
def config(tmp_path, monkeypatch):
    from engine import trust

    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / "config"))
    trust.allow_in_process(())  # nothing a GUI test allowed in this worker process
    yield
    trust.allow_in_process(())


@pytest.mark.parametrize("command", [["validate"], ["summary"], ["plan"], ["export", "--onnx", "m.onnx"]])
def test_hostile_paths_run_nothing(tmp_path, capsys, command):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    p = _project(tmp_path, {"wipe": {"path": "shutil:rmtree", "kwargs": {"path": str(victim)}},
                            "leave": {"path": "os:_exit", "kwargs": {"status": 0}}})
    args = [command[0], str(p), *[str(tmp_path / a) if a.endswith(".onnx") else a for a in command[1:]]]
    rc = main(args)
    assert rc != 0  # not a silent "valid" (os:_exit would have ended the process with 0)
    err = capsys.readouterr().err
    assert "node 'wipe' (Custom): not checked: its code ('shutil:rmtree') runs only once you trust" in err
    assert (victim / "keep.txt").read_text() == "precious"
    assert not (tmp_path / "config" / "trust.json").exists()


def test_consent_is_per_project_and_per_set_of_paths(tmp_path, capsys):
    p = _project(tmp_path, {"act": {"path": "tests.engine.interop_models:Swish"}})
    assert main(["validate", str(p)]) == 1
    assert main(["trust", str(p)]) == 0
    assert "tests.engine.interop_models:Swish" in capsys.readouterr().out
    assert main(["validate", str(p)]) == 0
    stored = json.loads((tmp_path / "config" / "trust.json").read_text())
    assert list(stored) == [str(p.resolve())]  # the consent lives outside the project
    assert "trust" not in p.read_text()

    # the file changes to name more code: consent is asked again
    changed = _project(tmp_path, {"act": {"path": "tests.engine.interop_models:Swish"}, "more": {"path": "tests.engine.interop_models:Swish2"}})
    assert changed == p
    assert main(["validate", str(p)]) == 1
    assert "node 'more' (Custom): not checked" in capsys.readouterr().err
    # another copy of the first project elsewhere is not trusted either
    other = _project(tmp_path, {"act": {"path": "tests.engine.interop_models:Swish"}}, name="copy.lflow")
    assert main(["validate", str(other)]) == 1
    assert main(["validate", str(other), "--trust"]) == 0  # consent given with the command


def test_torch_layers_need_no_consent(tmp_path):
    p = _project(tmp_path, {"hs": {"path": "torch.nn:Hardswish"}})
    assert main(["validate", str(p)]) == 0
    hub = _project(tmp_path, {"hub": {"path": "torch.hub:load", "kwargs": {"repo_or_dir": str(tmp_path)}}}, "hub.lflow")
    assert main(["validate", str(hub)]) == 1  # torch, but not a torch.nn layer class
