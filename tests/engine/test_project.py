"""Project files: round trip, validation messages with field paths, a loader that
only ever raises ProjectError (fuzzed), and saves that survive interruption."""
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.project import ProjectError, load_project, loads_project, save_project

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "resources" / "examples").glob("*.lflow"))
VALID = EXAMPLES[0].read_text()


def test_examples_roundtrip_byte_for_byte(tmp_path):
    for ex in EXAMPLES:
        p = load_project(ex)
        out = save_project(p, tmp_path / ex.name)
        assert out.read_text() == ex.read_text()  # stable key order: files diff well


def test_grad_accumulation_is_saved_when_set(tmp_path):
    p = load_project(EXAMPLES[0])
    assert p.training.grad_accumulation == 1 and "grad_accumulation" not in EXAMPLES[0].read_text()
    p.training.grad_accumulation = 2
    save_project(p, tmp_path / "p.lflow")
    assert load_project(tmp_path / "p.lflow").training.grad_accumulation == 2


def test_collapsed_blocks_are_saved_with_the_diagram(tmp_path):
    p = load_project(EXAMPLES[0])
    ids = list(p.graph.nodes)[1:3]
    for n in ids:
        p.graph.set_group(n, "block")
    p.graph.collapsed = {"block", "gone"}  # a name that is no block is not written
    save_project(p, tmp_path / "p.lflow")
    assert json.loads((tmp_path / "p.lflow").read_text())["diagram"]["collapsed"] == ["block"]
    back = load_project(tmp_path / "p.lflow")
    assert back.graph.collapsed == {"block"} and [back.graph.nodes[n].group for n in ids] == ["block", "block"]
    back.graph.collapsed.clear()
    save_project(back, tmp_path / "p.lflow")
    assert "collapsed" not in (tmp_path / "p.lflow").read_text()


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["training"]["optimizer"].update(lr=-1), "training.optimizer.lr: must be greater than 0"),
    (lambda d: d["training"].update(batch_size="big"), "training.batch_size: must be a valid integer"),
    (lambda d: d["training"]["dataset"].update(kind="imagenet"), "training.dataset: "),
    (lambda d: d["diagram"]["nodes"][1].update(pos="here"), "diagram.nodes[1].pos: "),
    (lambda d: d["placement"].update(schedule="zigzag"), "placement.schedule: "),
    (lambda d: d.update(extra_field=1), "extra_field: extra inputs are not permitted"),
    (lambda d: d.update(format_version=99), "format_version 99 is newer than this Layerflow reads"),
    (lambda d: d.pop("format_version"), "format_version is missing"),
    (lambda d: d["training"].update(steps=None, epochs=None), "set either steps or epochs"),
    (lambda d: d["training"].update(batch_size=64, grad_accumulation=3),
     "training: training.batch_size 64 is not divisible by training.grad_accumulation 3"),
    (lambda d: d["training"].update(grad_accumulation=0), "training.grad_accumulation: must be greater than or equal to 1"),
    (lambda d: d["diagram"]["edges"].append({"src": "ghost", "dst": "x"}), "names unknown node 'ghost'"),
])
def test_validation_names_the_field(mutate, expected):
    d = json.loads(VALID)
    mutate(d)
    with pytest.raises(ProjectError) as ei:
        loads_project(json.dumps(d), "p.lflow")
    assert expected in str(ei.value)
    assert str(ei.value).startswith("p.lflow")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2000))
def test_fuzz_random_bytes_only_raise_project_error(data):
    try:
        loads_project(data)
    except ProjectError:
        pass


def _mutations():
    leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                     st.text(max_size=8), st.just([]), st.just({}), st.lists(st.integers(), max_size=3))
    return st.lists(st.tuples(st.integers(0, 10**6), leaf), min_size=1, max_size=6)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutations())
def test_fuzz_mutated_valid_files_only_raise_project_error(mutations):
    d = json.loads(VALID)
    for pick, value in mutations:
        paths = [p for p in _paths(d) if p]
        path = paths[pick % len(paths)]
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1]] = value
    try:
        p = loads_project(json.dumps(d))
    except ProjectError:
        return
    p.dumps()  # a loaded project can always be written back


def test_interrupted_save_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "p.lflow"
    path.write_text(VALID)
    p = loads_project(VALID)
    p.name = "changed"

    def boom(fd):
        raise KeyboardInterrupt  # the user or the OS stops us mid-write

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(KeyboardInterrupt):
        save_project(p, path)
    assert path.read_text() == VALID
    assert [f.name for f in tmp_path.iterdir()] == ["p.lflow"]  # no temp file left behind


def test_killed_writer_process_keeps_the_old_file(tmp_path):
    """A real process killed (SIGKILL) while saving leaves the old file whole."""
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "p.lflow"
    path.write_text(VALID)
    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys, os, time; sys.path.insert(0, %r)\n"
        "from engine import project as P\n"
        "real = os.fsync\n"
        "def slow(fd):\n"
        "    print('writing', flush=True); time.sleep(60)\n"
        "os.fsync = slow\n"
        "p = P.loads_project(open(%r).read()); p.description = 'x' * 100000\n"
        "P.save_project(p, %r)\n" % (str(root), str(path), str(path))
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(0.05)
    assert path.read_text() == VALID
    load_project(path)


def test_unreadable_file(tmp_path):
    with pytest.raises(ProjectError, match="cannot read"):
        load_project(tmp_path / "missing.lflow")
