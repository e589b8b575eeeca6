"""Failures of the system under a command end in one line, never a traceback (issue 45,
items 4 and 5): a full disk wherever a file is written, a name over 255 bytes, a NUL
byte in a path, a symlink loop, a lone surrogate in a project's name, params nested
900 deep, a device where a file should be written. Real processes, real files: the full
disk is a real one (a 1 MB tmpfs in a user+mount namespace of the test's own, filled),
or, where no namespace can be made, a file size limit (RLIMIT_FSIZE, EFBIG)."""
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "resources" / "examples" / "mlp_digits.lflow"


def cli(*args, cwd=None, env=None, timeout=240):
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), *map(str, args)], cwd=cwd or ROOT,
                       capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return r


def one_line(r, *needles, code=2) -> str:
    """The command failed with exactly one line on stderr, `error: ...`, holding every needle."""
    err = r.stderr.strip()
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == code, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for n in needles:
        assert n in err, (n, err)
    return err


def project_file(tmp_path: Path, name="p.lflow", **change) -> Path:
    d = json.loads(MLP.read_text())
    for k, v in change.items():
        if k == "dataset":
            d["training"]["dataset"] = v
        else:
            d[k] = v
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return path


# ----- a full disk ------------------------------------------------------------------------
FULL_DISK = r"""
set -e
mount -t tmpfs -o size=1m tmpfs "$DISK"
mkdir -p "$DISK/config"
head -c 4000000 /dev/zero > "$DISK/fill" 2>/dev/null || true
set +e
"$PY" "$MAIN" "$@"
rc=$?
echo "LEFT: $(find "$DISK" -mindepth 1 -printf "%P ")"
exit $rc
"""


def _can_unshare(tmp_path: Path) -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run([unshare, "-rm", "sh", "-c", f"mount -t tmpfs tmpfs {tmp_path}"], capture_output=True)
    return probe.returncode == 0


@pytest.fixture
def full_disk(tmp_path):
    """run(*args) -> (CompletedProcess, expected reason): the CLI with DISK (its folder and
    LAYERFLOW_CONFIG_DIR=DISK/config) on a full file system."""
    disk = tmp_path / "disk"
    disk.mkdir()
    env = {**os.environ, "DISK": str(disk), "PY": sys.executable, "MAIN": str(ROOT / "main.py"),
           "LAYERFLOW_CONFIG_DIR": str(disk / "config"), "OMP_NUM_THREADS": "1"}
    if _can_unshare(tmp_path / "disk"):
        def run(*args, leaves=()):
            r = subprocess.run(["unshare", "-rm", "bash", "-c", FULL_DISK, "bash", *map(str, args)], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=240)
            left = next(line for line in r.stdout.splitlines() if line.startswith("LEFT: "))
            left = {f for f in left.split()[1:] if not f.endswith(".lock")}  # (a lock file stays, empty)
            assert left <= {"config", "fill", *leaves}, left  # no temp file left behind
            return r, "No space left on device (the disk is full"
        return run

    import resource
    import signal

    (disk / "config").mkdir()

    def limit():  # every file this process writes is "too large" (EFBIG), as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    def run(*args, leaves=()):
        r = subprocess.run([sys.executable, str(ROOT / "main.py"), *map(str, args)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=240, preexec_fn=limit)
        assert {p.name for p in disk.iterdir()} <= {"config", *leaves}
        return r, "File too large"
    return run


def trusted_project(tmp_path: Path) -> Path:
    d = json.loads(MLP.read_text())
    act = next(n for n in d["diagram"]["nodes"] if n["id"] == "act1")
    act.update(type="Custom", params={"path": "collections:OrderedDict", "kwargs": {}})  # code to consent to
    path = tmp_path / "custom.lflow"
    path.write_text(json.dumps(d))
    return path


@pytest.mark.parametrize("command", ["layout", "place", "export", "import", "trust", "cluster add", "screenshot",
                                     "merge"])
def test_a_full_disk_is_one_line_naming_the_file(full_disk, tmp_path, command):
    project = project_file(tmp_path)
    disk = tmp_path / "disk"
    args = {
        "layout": lambda: ["layout", project, "-o", disk / "laid.lflow"],
        "place": lambda: ["place", project, "fc1", "--stage", "0", "-o", disk / "placed.lflow"],
        "export": lambda: ["export", project, "--onnx", disk / "m.onnx"],
        "import": lambda: ["import", tiny_onnx(tmp_path), "-o", disk / "imported.lflow"],
        "trust": lambda: ["trust", trusted_project(tmp_path)],
        "cluster add": lambda: ["cluster", "add", "lab", "--host", "me@127.0.0.1"],
        "screenshot": lambda: ["screenshot", project, "-o", disk / "shot.png"],
        "merge": lambda: ["merge", project, project, project, "-o", disk / "merged.lflow"],
    }[command]()
    r, reason = full_disk(*args)
    written = {"layout": "laid.lflow", "place": "placed.lflow", "export": "m.onnx", "import": "imported.weights.pt",
               "trust": "config", "cluster add": "config", "screenshot": "shot.png", "merge": "merged.lflow"}[command]
    if command == "screenshot":  # (Qt's offscreen platform says this of every window it shows)
        r.stderr = "".join(line for line in r.stderr.splitlines(True) if "propagateSizeHints" not in line)
    one_line(r, written, reason)


def tiny_onnx(tmp_path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


# ----- names and paths the system refuses ---------------------------------------------------
LONG = "n" * 300


@pytest.mark.parametrize("command", ["layout", "export", "import"])
def test_a_name_over_255_bytes_is_one_line(tmp_path, command):
    project = project_file(tmp_path)
    args = {"layout": lambda: ["layout", project, "-o", f"{LONG}.lflow"],
            "export": lambda: ["export", project, "--onnx", f"{LONG}.onnx"],
            "import": lambda: ["import", tiny_onnx(tmp_path), "-o", f"{LONG}.lflow"]}[command]()
    one_line(cli(*args, cwd=tmp_path), "255 bytes")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["p.lflow"] + (["tiny.onnx"] if command == "import"
                                                                              else []))


def test_a_project_name_over_255_bytes_trains_or_says_so_in_one_line(tmp_path):
    d = json.loads(MLP.read_text())
    d["name"] = LONG  # the run folder is named after the project
    project = tmp_path / "p.lflow"
    project.write_text(json.dumps(d))
    r = cli("train", project, "--steps", "1", cwd=tmp_path)
    if r.returncode != 0:
        one_line(r, "255 bytes")


def test_a_nul_byte_in_a_path_is_one_line(tmp_path):
    for field, change in (("weights", {"weights": "w\0.pt"}),
                          ("dataset", {"dataset": {"kind": "npz", "path": "d\0.npz"}})):
        project = project_file(tmp_path, f"{field}.lflow", **change)
        for command in (["validate"], ["summary"], ["plan"], ["train", "--steps", "1"], ["trust"]):
            r = cli(command[0], project, *command[1:], cwd=tmp_path)
            one_line(r, f"{field}.lflow", "NUL", code=r.returncode if r.returncode in (1, 2) else 2)


def test_a_symlink_loop_is_one_line(tmp_path):
    project = project_file(tmp_path)
    (tmp_path / "loop").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop")
    msg = "Too many levels of symbolic links"
    one_line(cli("validate", tmp_path / "loop"), "loop", msg)
    one_line(cli("trust", tmp_path / "loop"), "loop", msg)
    one_line(cli("import", tmp_path / "loop", "-o", tmp_path / "x.lflow"), "loop", msg)
    one_line(cli("layout", project, "-o", tmp_path / "loop"), "loop", msg, "leads back to itself")
    one_line(cli("export", project, "--onnx", tmp_path / "loop" / "m.onnx"), "loop", msg)
    assert (tmp_path / "loop").is_symlink() and (tmp_path / "loop2").is_symlink()


def test_a_device_or_fifo_is_never_replaced_by_a_save(tmp_path):
    project = project_file(tmp_path)
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    one_line(cli("layout", project, "-o", fifo), "out.fifo", "not a file")
    one_line(cli("export", project, "--onnx", fifo), "out.fifo", "not a file")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


# ----- text and nesting ------------------------------------------------------------------
def test_a_lone_surrogate_in_the_name_is_one_line(tmp_path):
    project = tmp_path / "p.lflow"
    project.write_text(MLP.read_text().replace('"name": "mlp_digits"', '"name": "bad\\udc80name"'))
    assert "\\udc80" in project.read_text()
    for command in (["validate"], ["summary"], ["plan"], ["train", "--steps", "1"]):  # refused at load, by field
        one_line(cli(command[0], project, *command[1:], cwd=tmp_path), "p.lflow: name: holds a lone surrogate")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", [["validate"], ["summary"], ["plan"], ["train", "--steps", "1"]])
def test_params_nested_900_deep_are_one_line(tmp_path, command):
    d = json.loads(MLP.read_text())
    v = 1
    for _ in range(900):
        v = [v]
    next(n for n in d["diagram"]["nodes"] if n["id"] == "fc1")["params"]["out_features"] = v
    project = tmp_path / "deep.lflow"
    project.write_text(json.dumps(d))
    r = cli(command[0], project, *command[1:], cwd=tmp_path)
    err = one_line(r, "deep.lflow", code=r.returncode if r.returncode in (1, 2) else 2)
    assert "nested" in err


def test_a_full_disk_in_train_is_one_line(full_disk, tmp_path):
    project = tmp_path / "disk" / "p.lflow"
    # (build_run removes the run folder it began: no half-made run is left for the runs list)
    r, reason = full_disk("train", project_file(tmp_path), "--steps", "1", "--out", project.parent / "run")
    one_line(r, "disk/run", "cannot prepare the run folder", reason)
    assert not (project.parent / "run").exists()


# ----- the minor items (issue 45, item 5) ----------------------------------------------------
def test_a_boolean_is_no_number_in_settings(tmp_path):
    for field, value, shown in (("lr", True, "lr must be a number, not true"),
                                ("betas", [True, 0.9], "betas must be numbers, not [true, 0.9]")):
        d = json.loads(MLP.read_text())
        d["training"]["optimizer"][field] = value
        project = tmp_path / f"{field}.lflow"
        project.write_text(json.dumps(d))
        one_line(cli("validate", project, cwd=tmp_path), f"{field}.lflow: training.optimizer: {shown}")
    d = json.loads(MLP.read_text())
    d["training"]["batch_size"] = False
    (tmp_path / "b.lflow").write_text(json.dumps(d))
    one_line(cli("train", tmp_path / "b.lflow", "--steps", "1", cwd=tmp_path),
             "b.lflow: training: batch_size must be a number, not false")
    from engine.project import Placement

    with pytest.raises(ValueError, match="placement.dp: dp must be a number, not true"):
        Placement().dp = True


def test_an_absurd_weight_decay_is_a_warning(tmp_path):
    d = json.loads(MLP.read_text())
    d["training"]["optimizer"]["weight_decay"] = 1e30
    project = tmp_path / "wd.lflow"
    project.write_text(json.dumps(d))
    for r in (cli("validate", project, cwd=tmp_path), cli("train", project, "--steps", "1", cwd=tmp_path)):
        assert r.returncode == 0, r.stderr[-2000:]
        warned = [line for line in r.stderr.splitlines() if line.startswith("warning: training.optimizer.weight_decay")]
        assert len(warned) == 1 and "1e+30 is far above the usual 0 to 0.1" in warned[0], r.stderr


def test_a_runs_link_out_of_the_project_is_refused_unless_chosen(tmp_path):
    project = project_file(tmp_path / "proj" if (tmp_path / "proj").mkdir() is None else tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (project.parent / "runs").symlink_to(outside)
    one_line(cli("train", project, "--steps", "1", cwd=tmp_path), "runs: is a link to", "outside the project's folder",
             "--out")
    assert list(outside.iterdir()) == []
    r = cli("train", project, "--steps", "1", "--out", outside / "mine", cwd=tmp_path)  # the user's choice
    assert r.returncode == 0 and (outside / "mine" / "run.json").is_file(), r.stderr[-2000:]
    (project.parent / "runs").unlink()
    (project.parent / "kept").mkdir()
    (project.parent / "runs").symlink_to(project.parent / "kept")  # a link inside the folder: followed
    assert cli("train", project, "--steps", "1", cwd=tmp_path).returncode == 0
    assert len(list((project.parent / "kept").iterdir())) == 1


# ----- issue 61: what the run spec refuses, the project refuses first ---------------------------
@pytest.mark.parametrize("where, value, commands", [
    ("optimizer.weight_decay", "Infinity", ("validate", "summary", "plan", "train")),
    ("grad_clip", "Infinity", ("validate", "summary", "plan", "train")),
    ("grad_clip", "NaN", ("validate", "train")),
    ("optimizer.lr", "NaN", ("validate",)),
    ("optimizer.momentum", "-Infinity", ("validate",)),
    ("schedule.gamma", "NaN", ("validate",)),
    ("schedule.min_lr_ratio", "Infinity", ("validate",)),
    ("dataset.val_fraction", "NaN", ("validate",)),
])
def test_a_number_that_is_not_finite_is_one_line_naming_its_field(tmp_path, where, value, commands):
    """JSON's Infinity and NaN (json.dumps writes them, json.loads reads them) pass a bound like
    `ge=0` or fail it with a misleading message; the run spec (runtime/spec.py) refuses them at
    train with a traceback. The project refuses them on load, naming the field."""
    d = json.loads(MLP.read_text())
    *parents, leaf = where.split(".")
    at = d["training"]
    for p in parents:
        at = at[p]
    at[leaf] = float(value.replace("Infinity", "inf"))
    project = tmp_path / "p.lflow"
    project.write_text(json.dumps(d))
    assert value in project.read_text()
    for command in commands:
        extra = ["--steps", "1", "--out", tmp_path / "run"] if command == "train" else []
        r = cli(command, project, *extra, cwd=tmp_path)
        one_line(r, f"p.lflow: training.{where}: must be a finite number", code=r.returncode if r.returncode in (1, 2) else 2)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("what", ["weights", "npz", "csv"])
def test_a_symlink_loop_where_a_projects_file_should_be_is_one_line(tmp_path, what):
    """proj.weights.pt, d.npz or d.csv a link to a link back to itself: Path.resolve raises
    RuntimeError ("Symlink loop from ...") and Path.exists says False; every command names the
    file and the loop instead (validate, summary and plan read neither file: they pass)."""
    name = {"weights": "proj.weights.pt", "npz": "d.npz", "csv": "d.csv"}[what]
    change = {"weights": {"weights": name}, "npz": {"dataset": {"kind": "npz", "path": name}},
              "csv": {"dataset": {"kind": "csv", "path": name}}}[what]
    project = project_file(tmp_path, "proj.lflow", **change)
    (tmp_path / name).symlink_to(tmp_path / f"{name}.2")
    (tmp_path / f"{name}.2").symlink_to(tmp_path / name)
    field = "weights" if what == "weights" else "training.dataset.path"
    for command in ("validate", "summary", "plan"):
        r = cli(command, project, cwd=tmp_path)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (command, r.stderr[-3000:])
    one_line(cli("train", project, "--steps", "1", "--out", tmp_path / "run", cwd=tmp_path),
             f"{field}: cannot read", name, "Too many levels of symbolic links", "leads back to itself")
    assert not (tmp_path / "run").exists()
    if what != "weights":
        one_line(cli("data", "inspect", tmp_path / name, cwd=tmp_path), name, "leads back to itself")
        one_line(cli("data", "use", project, tmp_path / name, cwd=tmp_path), name, "leads back to itself")
    assert (tmp_path / name).is_symlink() and (tmp_path / f"{name}.2").is_symlink()


class _Payload:
    """What a hostile weights file holds: os.system on unpickling (never run: refused)."""

    def __init__(self, mark: Path):
        self.mark = str(mark)

    def __reduce__(self):
        return (os.system, (f"touch {self.mark}",))


def test_pickled_weights_are_refused_in_one_line_naming_the_file(tmp_path):
    """Weights that torch.load(weights_only=True) refuses (a raw pickle, a torch.save of an
    object that calls os.system): `export`, `train` and `train --resume RUN_DIR` (the run's
    weights.pt, its checkpoint) name the file, what it holds and what to do, in one line."""
    import pickle

    import torch

    pwned = tmp_path / "pwned"
    (tmp_path / "raw.pt").write_bytes(pickle.dumps(_Payload(pwned)))
    torch.save({"fc1.weight": _Payload(pwned)}, tmp_path / "saved.pt")
    said = ("not loaded: it holds pickled Python objects (posix.system)", "re-save it as a state_dict of tensors")
    for name in ("raw.pt", "saved.pt"):
        project = project_file(tmp_path, f"{name}.lflow", weights=name)
        for fmt, out in (("--onnx", "m.onnx"), ("--script", "m.py")):  # the file named once, not twice
            err = one_line(cli("export", project, fmt, tmp_path / out, cwd=tmp_path), f"weights: {tmp_path / name}: ",
                           *said)
            assert err.count(str(tmp_path / name)) == 1, err
        assert not list(tmp_path.glob("m.*")), list(tmp_path.glob("m.*"))  # nor the script's data or weights
        one_line(cli("train", project, "--steps", "1", "--out", tmp_path / "run", cwd=tmp_path), f"weights: {tmp_path / name}",
                 *said)
        assert not (tmp_path / "run").exists() and not (tmp_path / "m.onnx").exists()
    from engine.diagram.compile import compile_graph
    from engine.project import load_project

    module = compile_graph(load_project(MLP).graph).build(device="cpu", seed=0)
    torch.save(module.state_dict(), tmp_path / "good.pt")  # a run that starts from weights of its own
    project = project_file(tmp_path, weights="good.pt")
    r = cli("train", project, "--steps", "2", "--out", tmp_path / "r1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    r = cli("export", project, "--script", tmp_path / "good.py", cwd=tmp_path)  # through the same reader
    assert r.returncode == 0, r.stderr[-2000:]
    from engine.runtime.model import read_weights

    assert read_weights(tmp_path / "good.weights.pt").keys() == module.state_dict().keys()
    run = tmp_path / "r1"
    assert json.loads((run / "run.json").read_text())["weights"] == "weights.pt"
    assert cli("train", project, "--resume", run, "--steps", "3", cwd=tmp_path).returncode == 0
    shutil.copyfile(tmp_path / "saved.pt", run / "weights.pt")
    one_line(cli("train", project, "--resume", run, "--steps", "4", cwd=tmp_path), "resume:", "weights.pt", *said)
    shutil.copyfile(tmp_path / "raw.pt", run / "weights.pt")
    one_line(cli("train", project, "--resume", run, "--steps", "4", cwd=tmp_path), "resume:", "weights.pt", *said)
    assert not pwned.exists()


def test_microbatches_without_a_pipeline_are_a_warning(tmp_path):
    """placement.microbatches 65536 with pp=1 was ignored without a word: validate and plan
    say so, once, naming the field and what to set instead (and the run still trains)."""
    d = json.loads(MLP.read_text())
    d["placement"]["microbatches"] = 65536
    project = tmp_path / "mb.lflow"
    project.write_text(json.dumps(d))
    said = "placement.microbatches 65536 is ignored: micro-batches cut a pipeline's batch, and placement.pp is 1"
    for r in (cli("validate", project, cwd=tmp_path), cli("plan", project, cwd=tmp_path),
              cli("train", project, "--steps", "1", "--out", tmp_path / "run", cwd=tmp_path)):
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert (r.stderr + r.stdout).count(said) == 1, r.stderr + r.stdout
        assert "training.grad_accumulation" in r.stderr + r.stdout
    d["placement"]["microbatches"] = None
    project.write_text(json.dumps(d))
    r = cli("validate", project, cwd=tmp_path)
    assert r.returncode == 0 and "microbatches" not in r.stderr, r.stderr
