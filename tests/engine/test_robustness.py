"""Hostile or broken input gets one clear error, bounded in size and time; saves keep
links and modes; a run folder has one writer; workers never outlive the CLI."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from engine.diagram.compile import compile_graph
from engine.diagram.graph import Graph
from engine.project import ProjectError, atomic_write, load_project, loads_project, save_project

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "resources" / "examples" / "mlp_digits.lflow"


def _file(**diagram) -> str:
    base = {"format_version": 1, "diagram": {"nodes": [], "edges": []}}
    base["diagram"].update(diagram)
    return json.dumps(base)


@pytest.mark.parametrize("bad_id", ["class", "None", "lambda", "fc1\n", "x" * 300, "fc-1", "1fc", ""])
def test_one_id_rule_on_load(bad_id):
    text = _file(nodes=[{"id": bad_id, "type": "ReLU"}])
    with pytest.raises(ProjectError, match="is not a valid node name"):
        loads_project(text, "p.lflow")


def test_positions_edges_and_ports_are_checked_on_load():
    with pytest.raises(ProjectError, match=r"node 'a': position \[nan, 0.0\] is not a finite point"):
        loads_project(_file(nodes=[{"id": "a", "type": "ReLU", "pos": [float("nan"), 0]}]))
    two = _file(nodes=[{"id": "a", "type": "Input"}, {"id": "b", "type": "Input"}, {"id": "c", "type": "ReLU"}],
                edges=[{"src": "a", "dst": "c"}, {"src": "b", "dst": "c"}])
    with pytest.raises(ProjectError, match=r"input c.in has two edges \(from a and b\)"):
        loads_project(two)
    g = Graph()
    g.add_node("Input", {"shape": [4]}, id="x")
    g.add_node("ReLU", {}, id="r")
    g.add_node("Output", {}, id="out")
    from engine.diagram.graph import Edge

    g.add_edge_unchecked(Edge("x", "nope", "r", "in"))
    g.connect("r", "out", "out", "in")
    errs = [str(e) for e in compile_graph(g).errors]
    assert any("'x'" in e and "output port 'nope'" in e for e in errs), errs


def test_a_huge_cycle_is_one_short_message(tmp_path, capsys):
    g = Graph()
    n = 10_000
    g.add_node("Input", {"shape": [4]}, id="x")
    for i in range(n):
        g.add_node("ReLU", {}, id=f"r{i}")
    g.connect("x", "out", "r0", "in")
    from engine.diagram.graph import Edge

    for i in range(1, n):
        g.add_edge_unchecked(Edge(f"r{i - 1}", "out", f"r{i}", "in"))
    g.nodes["r0"].type = "Add"  # two inputs: x and the back edge
    g.edges = [e if e.dst != "r0" else Edge("x", "out", "r0", "a") for e in g.edges]
    g.add_edge_unchecked(Edge(f"r{n - 1}", "out", "r0", "b"))
    g.add_node("Output", {}, id="out")
    g.connect(f"r{n - 1}", "out", "out", "in")
    from engine.project import Project

    path = save_project(Project(g), tmp_path / "ring.lflow")
    t = time.perf_counter()
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert time.perf_counter() - t < 60
    assert "cycle of 10000 node(s)" in err and "... 9993 more ..." in err
    assert len(err) < 20_000


def test_sizes_that_would_exhaust_memory_are_refused(tmp_path, capsys):
    p = load_project(MLP)
    d = p.to_dict()
    d["placement"]["dp"] = 10 ** 30
    with pytest.raises(ProjectError, match="placement.dp"):
        loads_project(json.dumps(d))
    d["placement"].update(dp=256, tp=256, pp=2)
    with pytest.raises(ProjectError, match=r"pp x dp x tp = 131,072 processes; at most 65,536"):
        loads_project(json.dumps(d))
    g = Graph()
    g.add_node("Input", {"shape": [2 ** 63]}, id="x")
    g.add_node("Output", {}, id="out")
    g.connect("x", "out", "out", "in")
    errs = compile_graph(g).errors
    assert errs and errs[0].node == "x" and errs[0].field == "shape" and "values per sample" in str(errs[0])


def test_saves_keep_links_modes_and_leave_no_temp_files(tmp_path):
    real = tmp_path / "real.lflow"
    atomic_write(real, b"one")
    os.chmod(real, 0o644)
    link = tmp_path / "link.lflow"
    link.symlink_to(real)
    stale = tmp_path / ".real.lflow.abc123.tmp"  # a save killed half-way, long ago
    stale.write_bytes(b"half")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    atomic_write(link, b"two")
    assert link.is_symlink() and real.read_bytes() == b"two"
    assert stat.S_IMODE(real.stat().st_mode) == 0o644
    assert not stale.exists()
    fresh = tmp_path / "new.lflow"
    atomic_write(fresh, b"x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask


KILLED_MID_SAVE = r"""
import os, signal, sys
from engine.files import atomic_write
what = sys.argv[2]
def fsync(fd):  # the temp file is written whole: now the writer dies (kill -9) or waits
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    print("writing", flush=True)
    sys.stdin.readline()
    os.fsync = real_fsync  # (the folder's fsync after the rename is a real one)
real_fsync, os.fsync = os.fsync, fsync
atomic_write(sys.argv[1], b"from the child")
"""


def _temps(folder: Path) -> list[Path]:
    return sorted(folder.glob(".p.lflow.*.tmp"))


def test_a_temp_file_outlives_no_writer(tmp_path):
    """A save SIGKILLed after its temp file is written leaves .p.lflow.<host>-<pid>.*.tmp;
    the next open (load_project, the CLI's validate) or save clears it, as its pid is dead;
    a writer still running keeps its own, and its save lands whole."""
    project = tmp_path / "p.lflow"
    project.write_text(MLP.read_text())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def killed_save() -> Path:
        r = subprocess.run([sys.executable, "-c", KILLED_MID_SAVE, str(project), "kill"], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == -signal.SIGKILL, r.stderr
        (left,) = _temps(tmp_path)
        assert left.read_bytes() == b"from the child" and project.read_text() == MLP.read_text()
        return left

    left = killed_save()
    load_project(project)  # an open clears it
    assert not left.exists()
    left = killed_save()
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), "validate", str(project)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and not left.exists(), r.stderr
    left = killed_save()
    save_project(load_project(project))  # and so does a save (of this file, beside it)
    assert _temps(tmp_path) == []

    old = tmp_path / ".p.lflow.abc123.tmp"  # an older Layerflow's name, whose writer is unknown: by its age
    old.write_bytes(b"half")
    load_project(project)
    assert old.exists()
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    load_project(project)
    assert not old.exists()

    live = subprocess.Popen([sys.executable, "-c", KILLED_MID_SAVE, str(project), "wait"], env=env, cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout.readline().strip() == "writing"
        (mine,) = _temps(tmp_path)
        assert f"-{live.pid}." in mine.name
        save_project(load_project(project))  # open and save while it writes: its temp file is kept
        assert mine.exists()
        live.stdin.write("\n")
        live.stdin.flush()
        assert live.wait(timeout=60) == 0
    finally:
        live.kill()
    assert project.read_bytes() == b"from the child" and _temps(tmp_path) == []


def test_a_run_folder_has_one_writer(tmp_path, capsys):
    from engine.runs.build import prepare_run
    from engine.runtime.folder import RunLock

    rd = prepare_run(load_project(MLP), tmp_path / "run", steps=2)
    with RunLock(rd):  # a run still writing it (an orphaned worker, another terminal)
        assert main(["train", str(MLP), "--resume", str(rd)]) == 2
        assert f"is being written by a run still going (pid {os.getpid()})" in capsys.readouterr().err
    assert main(["train", str(MLP), "--out", str(tmp_path / "run2"), "--steps", "2"]) == 0


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_workers_end_when_the_cli_is_killed(tmp_path):
    from remote.launch.procs import alive, descendants

    env = dict(os.environ, OMP_NUM_THREADS="1")
    cli = subprocess.Popen([sys.executable, str(ROOT / "main.py"), "train", str(MLP), "--nproc", "2",
                            "--steps", "100000", "--out", str(tmp_path / "run")], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size > 0):
        time.sleep(0.5)
    assert metrics.exists(), "training did not start"
    workers = descendants(cli.pid)
    assert len(workers) >= 3  # torchrun and its two workers
    cli.send_signal(signal.SIGKILL)
    cli.wait()
    deadline = time.time() + 60
    while time.time() < deadline and any(alive(p) for p in workers):
        time.sleep(0.5)
    left = [p for p in workers if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"{len(left)} process(es) outlived the CLI"
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "cancelled"  # they stopped as after Ctrl-C: checkpointed, not killed


def test_weights_and_data_are_read_only_from_regular_files_that_fit(tmp_path, capsys):
    import pickle

    import torch

    from engine.data.sources import NpzFile
    from engine.runs.build import RunError, prepare_run

    def run_with(**change):
        p = load_project(MLP)
        p.path = tmp_path / "p.lflow"
        for k, v in change.items():
            setattr(p, k, v) if k == "weights" else setattr(p.training, k, v)
        return prepare_run(p, tmp_path / f"run{len(list(tmp_path.iterdir()))}", steps=1)

    from engine import trust

    with pytest.raises(ProjectError, match="weights: /dev/zero is outside the project's folder"):
        run_with(weights="/dev/zero")
    with trust.allowing(["file:/dev/zero"]), pytest.raises((RunError, ProjectError), match="/dev/zero is not a regular file"):
        run_with(weights="/dev/zero")  # consented, and still never read
    fifo = tmp_path / "data.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ProjectError, match="training.dataset.path: .*data.fifo is not a regular file"):
        run_with(dataset=NpzFile(kind="npz", path=str(fifo)))
    big = tmp_path / "big.pt"  # (a data set is read in place, in chunks: the limit is for files read whole)
    big.write_bytes(b"\0" * (3 * 2 ** 20))
    os.environ["LAYERFLOW_MAX_INPUT_MB"] = "2"
    try:
        with pytest.raises(ProjectError, match="more than the limit of 2 MB .*LAYERFLOW_MAX_INPUT_MB"):
            run_with(weights=str(big))
    finally:
        del os.environ["LAYERFLOW_MAX_INPUT_MB"]
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"\0" * 1000)
    with pytest.raises(ProjectError, match="training.dataset.path: cannot read .*junk.npz: File is not a zip file"):
        run_with(dataset=NpzFile(kind="npz", path=str(junk)))
    wrong = tmp_path / "wrong.pt"
    torch.save({"fc1.weight": torch.zeros(3, 3)}, wrong)
    with pytest.raises(RunError, match=r"'fc1.weight' in .* has shape \[3, 3\] but node 'fc1' needs"):
        run_with(weights=str(wrong))

    class Payload:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps(Payload()))
    with pytest.raises(RunError, match=r"weights: .*evil.pt: not loaded: it holds pickled Python objects \(posix.system\)"):
        run_with(weights=str(evil))
    assert not (tmp_path / "pwned").exists()


def test_output_into_a_closed_pipe_is_no_traceback(tmp_path):
    from engine.project import Project

    g = Graph()  # 3,000 summary lines: far more than a pipe holds once `head` has gone
    g.add_node("Input", {"shape": [4]}, id="x")
    prev = "x"
    for i in range(3000):
        g.add_node("ReLU", {}, id=f"relu_number_{i}")
        g.connect(prev, "out", f"relu_number_{i}", "in")
        prev = f"relu_number_{i}"
    g.add_node("Output", {}, id="out")
    g.connect(prev, "out", "out", "in")
    path = save_project(Project(g), tmp_path / "long.lflow")
    r = subprocess.run(f"{sys.executable} {ROOT / 'main.py'} summary {path} | head -1", shell=True, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr


@pytest.mark.parametrize("placement, message", [
    ({"pp": 8, "microbatches": 8}, "placement.pp=8 asks for 8 pipeline stages but the model has only 5 layer(s)"),
    ({"pp": 5, "microbatches": 2}, "placement.schedule 1f1b needs placement.microbatches >= stages"),
])
def test_validate_checks_the_placement_too(tmp_path, capsys, placement, message):
    p = load_project(MLP)
    p.placement = p.placement.derive(**placement)
    path = save_project(p, tmp_path / "p.lflow")
    assert main(["validate", str(path)]) == 1
    assert message in capsys.readouterr().err
    assert main(["plan", str(path)]) == 1  # the same finding, no traceback
    out = capsys.readouterr()
    assert message in out.out and "Traceback" not in out.err


def test_a_run_that_cannot_fit_this_machine_is_refused_before_it_starts(tmp_path, capsys):
    p = load_project(MLP)
    p.graph.set_param("fc1", "out_features", 30_000_000)  # validates as a diagram; ~70 GiB to train
    path = save_project(p, tmp_path / "huge.lflow")
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "rank 0 (stage 0) needs" in err and "GiB" in err and "device has" in err
    assert main(["train", str(path), "--out", str(tmp_path / "run"), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "needs" in err and "lower training.batch_size" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("arrays, message", [
    ({"x": np.array(["a", "b"] * 8).reshape(8, 2), "y": np.zeros(8, np.int64)}, "x_train holds <U1 values"),
    ({"x": np.ones((8, 2), np.complex64), "y": np.zeros(8, np.int64)}, "holds complex64 values"),
    ({"x": np.ones((8, 2), np.float32), "y": -np.ones(8, np.int64)}, "class labels must be 0 or more, but the smallest is -1"),
    ({"x": np.ones((8, 2), np.float32), "y": np.zeros(7, np.int64)}, "x has 8 rows but y has 7"),
    ({"x_train": np.float32(1), "y_train": np.int64(0), "x_val": np.float32(1), "y_val": np.int64(0)},
     "x_train is a single value"),
    ({"x": np.full((8, 2), np.nan, np.float32), "y": np.zeros(8, np.int64)}, "NaN or infinite"),
])
def test_bad_data_files_are_named(tmp_path, arrays, message):
    from engine.data.describe import load_arrays
    from engine.data.sources import NpzFile

    np.savez(tmp_path / "d.npz", **arrays)
    p = load_project(MLP)
    p.path = tmp_path / "p.lflow"
    p.training.dataset = NpzFile(kind="npz", path="d.npz")
    with pytest.raises(ProjectError, match=message):
        load_arrays(p)


def test_settings_out_of_range_name_their_field():
    d = load_project(MLP).to_dict()
    for field, value, where in (("seed", -1, "training.seed"), ("seed", 10 ** 30, "training.seed")):
        bad = json.loads(json.dumps(d))
        bad["training"][field] = value
        with pytest.raises(ProjectError, match=where):
            loads_project(json.dumps(bad))
    bad = json.loads(json.dumps(d))
    bad["training"]["optimizer"]["betas"] = [float("nan"), 0.9]
    with pytest.raises(ProjectError, match=r"training.optimizer.betas.0"):
        loads_project(json.dumps(bad))


def test_token_ids_beyond_the_vocabulary_are_named(tmp_path):
    from engine.runs.build import RunError, prepare_run

    p = load_project(ROOT / "resources" / "examples" / "transformer_synthetic.lflow")
    emb = next(n for n in p.graph.nodes.values() if n.type == "Embedding")
    p.graph.set_param(emb.id, "num_embeddings", 8)  # the synthetic sequences use 32 tokens
    with pytest.raises(RunError, match=rf"node '{emb.id}' \(Embedding\): the data set's token ids go up to \d+ but "
                                       r"num_embeddings is 8"):
        prepare_run(p, tmp_path / "run", steps=1)


def _unshare_or_skip(tmp_path) -> str:
    """util-linux's unshare, where it can mount a tmpfs in a user+mount namespace of our own."""
    import shutil

    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs util-linux's unshare to make a small filesystem of the test's own")
    probe = subprocess.run([unshare, "-rm", "sh", "-c", f"mount -t tmpfs tmpfs {tmp_path}"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user+mount namespace here: {probe.stderr.decode().strip()}")
    return unshare


def _in_small_fs(unshare: str, tmp_path, prep, script: str) -> subprocess.CompletedProcess:
    (tmp_path / "small").mkdir()
    (tmp_path / "out").mkdir()
    env = {**os.environ, "PREP": str(prep), "SMALL": str(tmp_path / "small"), "OUT": str(tmp_path / "out"),
           "PY": sys.executable, "OMP_NUM_THREADS": "1"}
    return subprocess.run([unshare, "-rm", "bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


DISK_FULL_SCRIPT = r"""
set -e
mount -t tmpfs -o size=1600k tmpfs "$SMALL"
cp -r "$PREP" "$SMALL/run"
set +e
"$PY" -m engine.runtime.train "$SMALL/run" > "$OUT/first.txt" 2>&1
echo $? > "$OUT/first.rc"
set -e
cp -r "$SMALL/run" "$OUT/failed"
mount -o remount,size=64m "$SMALL"
"$PY" -m engine.runtime.train "$SMALL/run" --resume > "$OUT/second.txt" 2>&1
cp -r "$SMALL/run" "$OUT/resumed"
"""


def test_a_full_disk_ends_the_run_as_failed_with_the_reason_and_a_resumable_checkpoint(tmp_path):
    """A real full disk: the run folder on a 1.6 MB tmpfs in a mount namespace of the test's
    own. The run ends 'failed' with the reason in status.json (not 'running', no half
    checkpoint named latest), and resumes once there is room."""
    from engine.project import Training
    from engine.runs.build import prepare_run

    unshare = _unshare_or_skip(tmp_path)
    p = load_project(MLP)
    p.path = tmp_path / "p.lflow"
    p.graph.nodes["fc1"].params["out_features"] = 512  # ~0.45 MB a checkpoint with Adam's state
    p.training = Training.model_validate({**p.training.model_dump(), "steps": 60, "checkpoint_interval": 5,
                                          "eval_interval": 1000, "log_interval": 1})  # every step recorded
    prep = prepare_run(p, tmp_path / "prep")
    r = _in_small_fs(unshare, tmp_path, prep, DISK_FULL_SCRIPT)
    out = tmp_path / "out"
    assert r.returncode == 0, r.stderr
    assert (out / "first.rc").read_text().strip() == "1"
    status = json.loads((out / "failed" / "status.json").read_text())
    assert status["state"] == "failed", status
    assert status["error"].startswith("disk full: No space left on device"), status["error"]
    assert "--resume" in status["error"] and 5 <= status["step"] < 60
    latest = (out / "failed" / "checkpoints" / "latest").read_text().strip()
    assert f"latest whole checkpoint is {latest}" in status["error"]
    import torch

    ckpts = out / "failed" / "checkpoints"
    state = torch.load(ckpts / latest / "extra.pt", weights_only=False)  # whole (DCP, as every layout writes)
    assert state["step"] == int(latest.removeprefix("step_")) and (ckpts / latest / ".metadata").exists()
    kept = [d for d in ckpts.iterdir() if d.is_dir()]
    assert kept and all((d / ".metadata").exists() and torch.load(d / "extra.pt", weights_only=False)["step"]
                        for d in kept)  # no half checkpoint
    assert "Traceback" not in status["error"]

    resumed = json.loads((out / "resumed" / "status.json").read_text())
    assert resumed["state"] == "succeeded" and resumed["step"] == 60, (out / "second.txt").read_text()
    steps = [json.loads(line)["step"] for line in (out / "resumed" / "metrics.jsonl").read_text().splitlines()
             if '"loss"' in line]
    assert steps == list(range(1, 61))  # every step once: the lines after the checkpoint were cut off


DISK_FULL_DP2_SCRIPT = r"""
set -e
mount -t tmpfs -o size=2400k tmpfs "$SMALL"
cp -r "$PREP" "$SMALL/run"
set +e
"$PY" -m torch.distributed.run --standalone --nproc-per-node 2 -m engine.runtime.train "$SMALL/run" \
    > "$OUT/first.txt" 2>&1
echo $? > "$OUT/first.rc"
set -e
cp -r "$SMALL/run" "$OUT/failed"
mount -o remount,size=64m "$SMALL"
"$PY" -m torch.distributed.run --standalone --nproc-per-node 2 -m engine.runtime.train "$SMALL/run" --resume \
    > "$OUT/second.txt" 2>&1
cp -r "$SMALL/run" "$OUT/resumed"
"""


@pytest.mark.slow
def test_a_full_disk_under_two_ranks_is_named_too_and_resumes(tmp_path):
    """The same with dp=2: DCP gathers the ranks' failures into one CheckpointException
    (one rank's ENOSPC, the other's opaque "unexpected pos"); the run still ends as
    "disk full" with its latest whole checkpoint named, not with a traceback."""
    from engine.project import Training
    from remote.launch.ssh_torchrun import prepare

    unshare = _unshare_or_skip(tmp_path)
    p = load_project(MLP)
    p.path = tmp_path / "p.lflow"
    p.graph.nodes["fc1"].params["out_features"] = 512
    p.training = Training.model_validate({**p.training.model_dump(), "steps": 40, "checkpoint_interval": 5,
                                          "eval_interval": 1000, "log_interval": 1})
    prep = prepare(p, tmp_path / "prep", placement={"dp": 2})
    r = _in_small_fs(unshare, tmp_path, prep, DISK_FULL_DP2_SCRIPT)
    out = tmp_path / "out"
    assert r.returncode == 0, r.stderr
    assert (out / "first.rc").read_text().strip() != "0"
    status = json.loads((out / "failed" / "status.json").read_text())
    assert status["state"] == "failed", status
    assert status["error"].startswith("disk full: No space left on device"), status["error"][:400]
    latest = (out / "failed" / "checkpoints" / "latest").read_text().strip()
    assert f"latest whole checkpoint is {latest}" in status["error"] and "Traceback" not in status["error"]
    kept = sorted(d.name for d in (out / "failed" / "checkpoints").iterdir() if d.is_dir())
    assert latest in kept and all((out / "failed" / "checkpoints" / d / ".metadata").exists() for d in kept)
    resumed = json.loads((out / "resumed" / "status.json").read_text())
    assert resumed["state"] == "succeeded" and resumed["step"] == 40, (out / "second.txt").read_text()[-2000:]


@pytest.mark.parametrize("where", ["runs", "new", "empty", "with a file"])
def test_a_full_disk_in_build_run_leaves_nothing_it_made(tmp_path, monkeypatch, where):
    """The disk fills while build_run writes the run folder (after data.npz, at the project
    snapshot): a RunError naming the reason, and everything it made is gone: the run folder,
    and the runs/ folder it made for it; a folder the user gave is left as it was."""
    import errno

    from engine.runs import build
    from engine.runs.build import RunError, build_run

    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(build, "atomic_write", full)
    p = load_project(MLP)
    p.path = tmp_path / "p.lflow"
    out = {"runs": None, "new": tmp_path / "deep" / "er" / "run", "empty": tmp_path / "empty",
           "with a file": tmp_path / "mine"}[where]
    if where == "empty":
        out.mkdir()
    if where == "with a file":
        out.mkdir()
        (out / "notes.txt").write_text("the user's")
    before = sorted(str(f.relative_to(tmp_path)) for f in tmp_path.rglob("*"))
    with pytest.raises(RunError, match="cannot prepare the run folder: No space left on device .the disk is full"):
        build_run(p, out, steps=1)
    assert sorted(str(f.relative_to(tmp_path)) for f in tmp_path.rglob("*")) == before
