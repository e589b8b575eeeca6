"""A project file never runs code on validate, summary, plan or open without consent.

The probes are the ones that worked before: a Custom node whose path is shutil:rmtree
(deletes a folder), os:_exit (validate exited 0 silently). Consent is given once per
project and exact set of import paths, kept in the user's config folder.
"""
from __future__ import annotations

import json

import pytest

from app.cli import main
from engine.diagram.graph import Graph
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
    trust.reset_process()  # nothing a GUI test allowed in this worker process
    yield
    trust.reset_process()


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
    p = _project(tmp_path, {"act": {"path": "tests.models.interop_models:Swish"}})
    assert main(["validate", str(p)]) == 1
    assert main(["trust", str(p)]) == 0
    assert "tests.models.interop_models:Swish" in capsys.readouterr().out
    assert main(["validate", str(p)]) == 0
    stored = json.loads((tmp_path / "config" / "trust.json").read_text())
    assert list(stored) == [str(p.resolve())]  # the consent lives outside the project
    assert "trust" not in p.read_text()

    # the file changes to name more code: consent is asked again
    changed = _project(tmp_path, {"act": {"path": "tests.models.interop_models:Swish"}, "more": {"path": "tests.models.interop_models:Swish2"}})
    assert changed == p
    assert main(["validate", str(p)]) == 1
    assert "node 'more' (Custom): not checked" in capsys.readouterr().err
    # another copy of the first project elsewhere is not trusted either
    other = _project(tmp_path, {"act": {"path": "tests.models.interop_models:Swish"}}, name="copy.lflow")
    assert main(["validate", str(other)]) == 1
    assert main(["validate", str(other), "--trust"]) == 0  # consent given with the command


def test_torch_layers_need_no_consent(tmp_path):
    p = _project(tmp_path, {"hs": {"path": "torch.nn:Hardswish"}})
    assert main(["validate", str(p)]) == 0
    hub = _project(tmp_path, {"hub": {"path": "torch.hub:load", "kwargs": {"repo_or_dir": str(tmp_path)}}}, "hub.lflow")
    assert main(["validate", str(hub)]) == 1  # torch, but not a torch.nn layer class


def _data_project(folder, data_path: str, name="p.lflow"):
    from engine.project import Training

    g = Graph()
    g.add_node("Input", {"shape": [4]}, id="x")
    g.add_node("Linear", {"out_features": 2}, id="fc")
    g.add_node("Output", {"loss": "cross_entropy"}, id="y")
    g.connect("x", "out", "fc", "in")
    g.connect("fc", "out", "y", "in")
    p = Project(g, name="data")
    p.training = Training.model_validate({"dataset": {"kind": "npz", "path": data_path}, "batch_size": 4, "steps": 1})
    folder.mkdir(parents=True, exist_ok=True)
    return save_project(p, folder / name)


def _npz(path):
    import numpy as np

    rng = np.random.default_rng(0)
    np.savez(path, x=rng.normal(size=(16, 4)).astype("float32"), y=rng.integers(0, 2, 16))
    return path


@pytest.mark.parametrize("how", ["absolute", "relative", "symlink"])
def test_a_data_file_outside_the_project_folder_is_read_only_with_consent(tmp_path, capsys, how):
    """A shared project naming ../../secret.npz (or a link to it) reads nothing until trusted;
    the consent is the same one that covers its code, tied to the resolved path."""
    from engine.data.describe import load_arrays
    from engine.project import ProjectError, load_project

    (tmp_path / "elsewhere").mkdir()
    secret = _npz(tmp_path / "elsewhere" / "secret.npz")
    folder = tmp_path / "shared"
    folder.mkdir()
    if how == "symlink":
        (folder / "data.npz").symlink_to(secret)
        named = "data.npz"
    else:
        named = str(secret) if how == "absolute" else "../elsewhere/secret.npz"
    p = _data_project(folder, named)
    with pytest.raises(ProjectError, match=r"training.dataset.path: .*secret.npz is outside the project's folder"):
        load_arrays(load_project(p))
    assert main(["train", str(p), "--out", str(tmp_path / "run1")]) == 2
    assert "outside the project's folder" in capsys.readouterr().err and not (tmp_path / "run1" / "run.json").exists()

    assert main(["trust", str(p)]) == 0
    out = capsys.readouterr().out
    assert str(secret.resolve()) in out and "file:" not in out  # printed as a plain path
    from engine import trust

    with trust.as_consented(load_project(p)):
        assert len(load_arrays(load_project(p)).x_train) > 0
    assert main(["train", str(p), "--out", str(tmp_path / "run2")]) == 0
    # inside the folder needs nothing
    inside = _data_project(tmp_path / "mine", "d.npz")
    _npz(tmp_path / "mine" / "d.npz")
    assert trust.needs_consent(load_project(inside)) == []
    assert main(["train", str(inside), "--out", str(tmp_path / "run3")]) == 0


def test_weights_outside_the_project_folder_need_consent(tmp_path):
    import torch

    from engine.project import ProjectError, load_project
    from engine.runs.build import prepare_run

    p = _data_project(tmp_path / "shared", "d.npz")
    _npz(tmp_path / "shared" / "d.npz")
    torch.save({"fc.weight": torch.zeros(2, 4), "fc.bias": torch.zeros(2)}, tmp_path / "w.pt")
    proj = load_project(p)
    proj.weights = "../w.pt"
    save_project(proj, p)
    with pytest.raises(ProjectError, match=r"weights: .*w.pt is outside the project's folder"):
        prepare_run(load_project(p), tmp_path / "run")
    assert main(["train", str(p), "--trust", "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "weights.pt").is_file()


def test_the_apps_runs_carry_its_consent_and_no_more(tmp_path):
    """The GUI prepares its runs in its own process (layerflow/prepare.py, as the CLI and
    the API do): what the user drew may run (the window's interactive consent,
    remembered nowhere); what they refused on open may not; a CLI process, nothing
    without consent."""
    from engine import trust
    from engine.errors import LayerflowError
    from engine.project import load_project
    from layerflow.prepare import prepare_training

    mine = _project(tmp_path, {"act": {"path": "tests.models.interop_models:Swish"}}, "mine.lflow")
    p = load_project(mine)
    p.training = p.training.model_validate({**p.training.model_dump(), "dataset": {
        "kind": "synthetic_regression", "n_samples": 256, "n_features": 4, "n_targets": 4}})
    save_project(p, mine)  # data that fits the diagram: only consent stands in the way
    with pytest.raises(LayerflowError, match="node 'act' \\(Custom\\)"):
        prepare_training(load_project(mine), steps=1, out=tmp_path / "r0")
    trust.interactive()
    prep = prepare_training(load_project(mine), steps=1, out=tmp_path / "r1")
    assert (prep.run_dir / "run.json").is_file()
    trust.refuse(["tests.models.interop_models:Swish"])
    with pytest.raises(LayerflowError, match="node 'act' \\(Custom\\)"):
        prepare_training(load_project(mine), steps=1, out=tmp_path / "r2")
    assert main(["validate", str(mine), "--trust-once"]) == 0
    assert not (tmp_path / "config" / "trust.json").exists()  # once: not remembered


def _run_folder(folder, *paths, snapshot_paths=()):
    """A run folder as far as the gate reads it: run.json's model and a project.lflow."""
    folder.mkdir(parents=True, exist_ok=True)
    nodes = [{"id": "x", "type": "Input", "params": {"shape": [4]}}]
    nodes += [{"id": f"c{i}", "type": "Custom", "params": {"path": p}, "args": ["x"]} for i, p in enumerate(paths)]
    (folder / "run.json").write_text(json.dumps({"model": {"nodes": nodes}}))
    if snapshot_paths:
        _project(folder, {f"s{i}": {"path": p} for i, p in enumerate(snapshot_paths)}, name="project.lflow")
    return folder


def test_a_run_folders_code_runs_only_with_consent(tmp_path):
    """check_run_folder: the gate before a resume builds what run.json (the ranks' model)
    and project.lflow (what a new placement compiles) name; torch layers need nothing."""
    from engine import trust

    rd = _run_folder(tmp_path / "run", "evil.mod:Boom", "torch.nn:ReLU", snapshot_paths=["other.mod:Thing"])
    assert trust.run_folder_paths(rd) == ["evil.mod:Boom", "other.mod:Thing"]
    with pytest.raises(trust.NotTrusted, match=r"run folder .*run imports code of its own \(evil.mod:Boom, "
                                               r"other.mod:Thing\).*`python main.py trust .*run`, or --trust"):
        trust.check_run_folder(rd)
    assert trust.check_run_folder(rd, once=True) == ["evil.mod:Boom", "other.mod:Thing"]  # remembered nowhere
    with pytest.raises(trust.NotTrusted):
        trust.check_run_folder(rd)
    with trust.allowing(["evil.mod:Boom", "other.mod:Thing"]):  # the project's own consent, for this command
        trust.check_run_folder(rd)
    trust.check_run_folder(rd, given=True)  # --trust: remembered for this folder
    assert trust.check_run_folder(rd) == ["evil.mod:Boom", "other.mod:Thing"]
    # the folder changes to name more code: asked again
    _run_folder(rd, "evil.mod:Boom", "evil.mod:More")
    with pytest.raises(trust.NotTrusted, match="evil.mod:More"):
        trust.check_run_folder(rd)
    # a run of torch layers only asks nothing
    assert trust.check_run_folder(_run_folder(tmp_path / "plain", "torch.nn:GELU")) == []


def test_the_editors_consent_covers_a_run_folder_but_not_what_it_refused(tmp_path):
    from engine import trust

    rd = _run_folder(tmp_path / "run", "mine.mod:Layer")
    trust.interactive()  # the GUI: what the user drew is theirs
    assert trust.check_run_folder(rd) == ["mine.mod:Layer"]
    trust.refuse(["mine.mod:Layer"])  # ... unless they refused it when the project opened
    with pytest.raises(trust.NotTrusted):
        trust.check_run_folder(rd)


def test_a_hostile_run_json_is_one_line(tmp_path):
    from engine import trust
    from engine.files import ProjectError

    rd = tmp_path / "run"
    rd.mkdir()
    (rd / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ProjectError, match="run.json: cannot read"):
        trust.check_run_folder(rd)
    (rd / "run.json").write_text(json.dumps({"model": {"nodes": "x"}, "deep": [[[{"type": "Custom", "params": {"path": "a:B"}}]]]}))
    assert trust.run_folder_paths(rd) == ["a:B"]  # found wherever it sits


def test_a_screenshot_asks_as_every_command_does(tmp_path):
    """require_consent counts the consent given for the command only: not the editor's
    interactive mode, which the screenshot's window would turn on."""
    from engine import trust
    from engine.project import load_project

    p = load_project(_project(tmp_path, {"act": {"path": "tests.models.interop_models:Swish"}}))
    trust.interactive()
    with pytest.raises(trust.NotTrusted, match=r"imports code of its own \(tests.models.interop_models:Swish\); "
                                               r"a screenshot runs it only once you trust the project"):
        trust.require_consent(p, "a screenshot")
    with trust.allowing(trust.needs_consent(p)):
        trust.require_consent(p, "a screenshot")
