"""Two people branch a project, edit it in parallel and merge with real git, through the
diff and merge drivers that `layerflow git-setup` installs."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "resources" / "examples" / "mlp_digits.lflow"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def cli(*args, cwd):
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)


def git(*args, cwd, check=True):
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org", "HOME": str(cwd)}
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120, check=False)
    if check and r.returncode:
        raise AssertionError(f"git {' '.join(args)}: {r.stdout}{r.stderr}")
    return r


def edit(path: Path, fn):
    """An edit as the editor saves it: load, change, save (sorted keys, atomic)."""
    from engine.project import load_project, save_project

    p = load_project(path)
    fn(p)
    save_project(p, path)


@pytest.fixture
def repo(tmp_path):
    git("init", "-q", "-b", "main", cwd=tmp_path)
    shutil.copy(EXAMPLE, tmp_path / "model.lflow")
    r = cli("git-setup", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / ".gitattributes").read_text() == "*.lflow diff=layerflow merge=layerflow\n"
    git("add", ".", cwd=tmp_path)
    git("commit", "-qm", "base", cwd=tmp_path)
    return tmp_path


def branch(repo, name, fn, base="main"):
    git("checkout", "-q", base, cwd=repo)
    git("checkout", "-qb", name, cwd=repo)
    edit(repo / "model.lflow", fn)
    git("commit", "-qam", name, cwd=repo)


def insert_dropout(p, name, after, rate):
    e = next(e for e in p.graph.edges if e.src == after)
    p.graph.disconnect(e)
    p.graph.add_node("Dropout", {"p": rate}, id=name)
    p.graph.connect(after, "out", name, "in")
    p.graph.connect(name, "out", e.dst, e.dst_port)


def alice(p):  # renames fc2, widens fc1, adds a dropout after act1
    p.graph.rename_node("fc2", "hidden")
    p.graph.set_param("fc1", "out_features", 256)
    insert_dropout(p, "drop1", "act1", 0.1)


def bob(p):  # changes the node alice renamed, the training, adds a dropout after act2
    p.graph.set_param("fc2", "out_features", 32)
    p.training.optimizer.lr = 0.01
    insert_dropout(p, "drop2", "act2", 0.2)


def test_parallel_edits_merge_cleanly_where_a_text_merge_conflicts(repo):
    branch(repo, "alice", alice)
    branch(repo, "bob", bob)
    # without the driver git's line merge gives up on these two edits
    plain = repo.parent / (repo.name + "-plain")
    shutil.copytree(repo, plain)
    (plain / ".gitattributes").unlink()
    git("checkout", "-q", "alice", cwd=plain)
    assert git("merge", "-q", "bob", cwd=plain, check=False).returncode != 0
    assert "<<<<<<<" in (plain / "model.lflow").read_text()

    git("checkout", "-q", "alice", cwd=repo)
    r = git("merge", "--no-edit", "bob", cwd=repo, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    from engine.project import load_project

    p = load_project(repo / "model.lflow")
    assert "fc2" not in p.graph.nodes and p.graph.nodes["hidden"].params["out_features"] == 32
    assert p.graph.nodes["fc1"].params["out_features"] == 256 and p.training.optimizer.lr == 0.01
    assert p.graph.topo_order() == ["x", "fc1", "act1", "drop1", "hidden", "act2", "drop2", "head", "out"]
    assert cli("validate", "model.lflow", cwd=repo).returncode == 0
    # what changed since the common ancestor, by meaning: `layerflow diff` against a revision
    r = cli("diff", "model.lflow", "--rev", "main", cwd=repo)
    assert r.returncode == 1  # there are changes (as diff(1): 0 none, 1 some)
    lines = r.stdout.splitlines()
    for want in ("~ fc2 renamed to hidden", "~ fc1.out_features 128 -> 256", "~ hidden.out_features 64 -> 32",
                 "~ training.optimizer.lr 0.003 -> 0.01", "+ drop1 (Dropout)", "+ drop2 (Dropout)",
                 "~ hidden.in: input from act1 -> drop1", "~ head.in: input from act2 -> drop2"):
        assert want in lines, r.stdout
    assert any(line.startswith("parameters 17,226 -> ") for line in lines)
    # and `git diff` speaks the same language through the diff driver
    r = git("diff", "main", "--", "model.lflow", cwd=repo)
    assert "~ fc2 renamed to hidden" in r.stdout and "\"out_features\"" not in r.stdout


def test_a_real_conflict_leaves_a_valid_project_to_resolve(repo):
    branch(repo, "alice", lambda p: setattr(p.training.optimizer, "lr", 0.1))
    branch(repo, "bob", lambda p: (setattr(p.training.optimizer, "lr", 0.2), p.graph.set_param("head", "bias", False)))
    git("checkout", "-q", "alice", cwd=repo)
    r = git("merge", "--no-edit", "bob", cwd=repo, check=False)
    assert r.returncode != 0 and "model.lflow" in r.stdout + r.stderr
    text = (repo / "model.lflow").read_text()
    assert "<<<<<<<" not in text
    data = json.loads(text)
    assert data["conflicts"][0]["where"] == "setting:training.optimizer.lr"
    v = cli("validate", "model.lflow", cwd=repo)
    assert v.returncode == 1 and "merge conflict 1. training.optimizer.lr changed on both sides" in v.stderr
    assert "ours 0.1, theirs 0.2" in v.stderr
    t = cli("train", "model.lflow", "--steps", "1", cwd=repo)
    assert t.returncode == 2 and "merge conflict" in t.stderr
    r = cli("resolve", "model.lflow", cwd=repo)
    assert r.returncode == 1 and r.stdout.startswith("1. training.optimizer.lr")
    r = cli("resolve", "model.lflow", "1", "--theirs", cwd=repo)
    assert r.returncode == 0, r.stderr
    assert cli("validate", "model.lflow", cwd=repo).returncode == 0
    from engine.project import load_project

    p = load_project(repo / "model.lflow")
    assert p.training.optimizer.lr == 0.2 and p.graph.nodes["head"].params["bias"] is False
    git("add", "model.lflow", cwd=repo)
    git("commit", "-qm", "merged", cwd=repo)
    assert "conflicts" not in (repo / "model.lflow").read_text()


def test_diff_of_two_files_and_errors(tmp_path):
    a, b = tmp_path / "a.lflow", tmp_path / "b.lflow"
    shutil.copy(EXAMPLE, a)
    shutil.copy(EXAMPLE, b)
    r = cli("diff", a, b, cwd=tmp_path)
    assert r.returncode == 0 and "no changes" in r.stdout
    edit(b, lambda p: p.placement.__setattr__("dp", 2))
    r = cli("diff", a, b, "--json", cwd=tmp_path)
    assert r.returncode == 1
    assert {"kind": "setting", "where": "placement.dp", "old": 1, "new": 2} in json.loads(r.stdout)["changes"]
    r = cli("diff", a, cwd=tmp_path)  # not in a git repository: one line, no traceback
    assert r.returncode == 2 and r.stderr.startswith("error: git rev-parse") and "Traceback" not in r.stderr, r.stderr
    b.write_text("{")
    r = cli("diff", a, b, cwd=tmp_path)
    assert r.returncode == 2 and "b.lflow: not valid JSON" in r.stderr
