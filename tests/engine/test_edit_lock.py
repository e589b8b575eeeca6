"""Edits of one project file are never lost (issue 45, item 2): a read-modify-write under
engine.project.editing takes turns with the others, and save_project refuses to write over
a file that changed since it was read, with one line saying so. Real processes, started
together; no mocks."""
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine.project import ProjectError, load_project, save_project

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "resources" / "examples" / "mlp_digits.lflow"
CHANGED = "changed on disk since it was read"


def project(tmp_path: Path, **placement) -> Path:
    d = json.loads(MLP.read_text())
    d["placement"].update(placement)
    path = tmp_path / "p.lflow"
    path.write_text(json.dumps(d))
    return path


def python(code: str, *args, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


@pytest.fixture
def config(tmp_path, monkeypatch):
    env = {"LAYERFLOW_CONFIG_DIR": str(tmp_path / "config")}
    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", env["LAYERFLOW_CONFIG_DIR"])
    return env


EDITOR = """
import sys, time
from pathlib import Path
from engine.project import editing, load_project, save_project
path, tag, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
while not go.exists():
    time.sleep(0.005)
with editing(path):
    p = load_project(path)
    time.sleep(0.1)  # a slow edit: every other process is waiting at the lock by now
    p.description += f"[{tag}]"
    save_project(p)
"""


def test_read_modify_writes_under_the_lock_take_turns_and_keep_every_edit(tmp_path, config):
    path = project(tmp_path)
    go = tmp_path / "go"
    procs = [python(EDITOR, path, f"e{i}", go, env=config) for i in range(6)]
    time.sleep(2.0)  # all started and waiting for the signal
    go.touch()
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    text = load_project(path).description
    assert sorted(re.findall(r"\[(e\d)\]", text)) == [f"e{i}" for i in range(6)], text


STALE = """
import sys, time
from pathlib import Path
from engine.project import ProjectError, load_project, save_project
path, tag, loaded, go = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
p = load_project(path)
loaded.touch()
while not go.exists():
    time.sleep(0.005)
p.description += f"[{tag}]"
try:
    save_project(p)
except ProjectError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
"""


def test_a_write_over_a_file_changed_since_it_was_read_is_refused(tmp_path, config):
    """Two processes read the file, then both write (the first, then the second): the second
    is refused in one line, and the first one's edit is what the file holds."""
    path = project(tmp_path)
    first = python(STALE, path, "first", tmp_path / "l1", tmp_path / "g1", env=config)
    second = python(STALE, path, "second", tmp_path / "l2", tmp_path / "g2", env=config)
    deadline = time.time() + 60
    while not ((tmp_path / "l1").exists() and (tmp_path / "l2").exists()) and time.time() < deadline:
        time.sleep(0.01)
    (tmp_path / "g1").touch()
    assert first.wait(timeout=60) == 0, first.stderr.read()
    (tmp_path / "g2").touch()
    _, err = second.communicate(timeout=60)
    assert second.returncode == 2
    assert len(err.strip().splitlines()) == 1 and CHANGED in err and "p.lflow" in err, err
    assert load_project(path).description.endswith("[first]")


def test_the_file_written_by_this_process_may_be_written_again(tmp_path, config):
    path = project(tmp_path)
    p = load_project(path)
    for i in range(3):
        p.description = f"v{i}"
        save_project(p)  # its own last write is what it read
    other = load_project(path)
    other.description = "theirs"
    save_project(other)
    p.description = "mine"
    with pytest.raises(ProjectError, match=CHANGED):
        save_project(p)
    save_project(p, tmp_path / "mine.lflow")  # save as: another file, written
    assert load_project(path).description == "theirs"
    assert load_project(tmp_path / "mine.lflow").description == "mine"


def test_concurrent_place_commands_never_lose_an_edit_silently(tmp_path, config):
    """The probe's case: two `place` commands on one file at once. Each either succeeds and
    its edit is in the file, or says in one line that the file changed since it read it."""
    path = project(tmp_path, pp=2)
    main = [sys.executable, str(ROOT / "main.py")]
    env = {**os.environ, **config}
    lost = 0
    for trial in range(4):
        a = subprocess.Popen([*main, "place", str(path), "fc1", "--stage", str(trial % 2)], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        b = subprocess.Popen([*main, "place", str(path), "fc2", "--stage", str(trial % 2)], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        results = {n: (p.wait(timeout=120), p.stderr.read()) for n, p in (("fc1", a), ("fc2", b))}
        nodes = load_project(path).graph.nodes
        for n, (rc, err) in results.items():
            if rc == 0:
                lost += nodes[n].stage != trial % 2
            else:
                assert rc == 2 and CHANGED in err and len(err.strip().splitlines()) == 1, err
    assert lost == 0
