"""A run's data on a cluster (issue 41, item 4), against the real loopback sshd: data
already on the "cluster" (another folder) is checked by fingerprint and sends no data
bytes; data here goes up once into the cluster's content-addressed cache and the next
deploy sends none; a copy that differs, or is missing, or a node without the package its
format needs, is refused in one line before anything starts. Data generated here (numpy
token files, Pillow images); the runs really train."""
from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from sshd_helpers import free_port, relayed_cluster

from engine.diagram.graph import Graph
from engine.project import Project, Training
from engine.runs.tail import read_metrics
from remote.cluster import parse_cluster
from remote.node_data import MARKER, DataProblem, mapped_path, plan_data, sent_line
from remote.jobs import JobDB
from remote.launch.ssh_torchrun import DeployError, deploy, prepare, run_spec
from remote.tracker import Tracker

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("remote-deploy")]


def make_tokens(root: Path, vocab: int = 32, n: int = 6000) -> Path:
    """train.bin, val.bin (uint16) and meta.json: each token mostly says the next (3t+1 mod vocab)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for name, count in (("train.bin", n), ("val.bin", n // 5)):
        t = np.empty(count, np.int64)
        t[0] = 1
        noise = rng.random(count) < 0.1
        draws = rng.integers(vocab, size=count)
        for i in range(1, count):
            t[i] = draws[i] if noise[i] else (3 * t[i - 1] + 1) % vocab
        t.astype(np.uint16).tofile(root / name)
    (root / "meta.json").write_text(json.dumps({"vocab_size": vocab, "dtype": "uint16"}))
    return root


def token_project(root: Path, steps: int = 40, vocab: int = 32) -> Project:
    g = Graph()
    chain = [("Input", {"shape": [16], "dtype": "int64"}, "tokens"),
             ("Embedding", {"num_embeddings": vocab, "embedding_dim": 16}, "embed"),
             ("Linear", {"out_features": 32}, "hidden"), ("GELU", {}, "act"),
             ("Linear", {"out_features": vocab}, "lm_head"), ("Output", {"loss": "cross_entropy"}, "out")]
    prev = None
    for kind, params, nid in chain:
        g.add_node(kind, params, id=nid)
        if prev:
            g.connect(prev, "out", nid, "in")
        prev = nid
    tr = Training.model_validate({"dataset": {"kind": "token_file", "path": str(root), "seq_len": 16},
                                  "optimizer": {"name": "adam", "lr": 0.01}, "batch_size": 16, "steps": steps,
                                  "eval_interval": steps, "log_interval": 1, "checkpoint_interval": steps})
    return Project(g, name="lm", training=tr)


def one_node(sshd_pair, tmp_path: Path, **kw):
    return parse_cluster(sshd_pair.cluster("one", tmp_path / "work", n_hosts=1, rdzv_port=free_port("127.0.0.2"),
                                           **kw))


def follow(job):
    with Tracker(job.id) as tr:
        job = tr.follow(interval=0.3)
    assert job.state == "succeeded", job.error
    return job


def losses(job) -> list[float]:
    rd = Path(job.nodes[0].jobdir) / "run"
    return [r["loss"] for r in read_metrics(rd / "metrics.jsonl") if "loss" in r]


def bundle_names(job) -> list[str]:
    from remote.cluster import config_dir

    tar = next((config_dir() / "bundles").glob(f"{job.extra['bundle'][:32]}.tar"))
    with tarfile.open(tar) as t:
        return t.getnames()


def node_run_json(job) -> dict:
    return json.loads((Path(job.nodes[0].jobdir) / "run" / "run.json").read_text())


def test_data_on_the_cluster_is_read_there_and_sends_no_data_bytes(sshd_pair, tmp_path, config_dir):
    """The profile maps the local data folder to the cluster's; the local copy is gone by the
    time of the deploy: the node reads its own, checked by fingerprint, and trains."""
    here = make_tokens(tmp_path / "here" / "tokens")
    there = tmp_path / "cluster-data"
    shutil.copytree(tmp_path / "here", there)  # the cluster's copy, another folder on loopback
    run_dir = prepare(token_project(here), tmp_path / "run", steps=40)
    local_json = (run_dir / "run.json").read_bytes()
    shutil.move(tmp_path / "here", tmp_path / "moved-away")  # nothing here is read or sent
    cluster = one_node(sshd_pair, tmp_path, data_paths={str(tmp_path / "here"): str(there)})
    assert mapped_path(cluster, str(here)) == str(there / "tokens")
    job = deploy(cluster, run_dir)
    print(sent_line(job))
    assert job.extra["sent"]["data"] == 0 and job.extra["sent"]["bundle"] > 0
    assert job.extra["data"]["mode"] == "cluster" and "0 B of data" in sent_line(job)
    assert not [n for n in bundle_names(job) if n.endswith((".bin", "meta.json", ".npz"))]  # never data
    assert node_run_json(job)["data"]["source"]["path"] == str(there / "tokens")
    assert (run_dir / "run.json").read_bytes() == local_json  # the local run.json stays as it was
    assert not (tmp_path / "work" / "data").exists()  # no cache: nothing was uploaded
    job = follow(job)
    loss = losses(job)
    assert len(loss) == 40 and np.mean(loss[-5:]) < np.mean(loss[:5]) - 0.5
    out = tmp_path / "fetched"
    with Tracker(job.id) as tr:
        tr.fetch(out)
    assert json.loads((out / "run.json").read_text())["data"]["source"]["path"] == str(here)  # resumes here


def test_local_data_is_uploaded_once_and_reused(sshd_pair, tmp_path, config_dir):
    toks = make_tokens(tmp_path / "tokens")
    (toks / "spare.bin").write_bytes(os.urandom(3 << 19))  # a file big enough to go up by SFTP, not in a tar batch
    size = sum(f.stat().st_size for f in toks.iterdir())
    cluster = one_node(sshd_pair, tmp_path)
    project = token_project(toks, steps=30)
    run_dir = prepare(project, tmp_path / "run1", steps=30)
    key = run_spec(run_dir).data.fingerprint["digest"][:32]
    cache = tmp_path / "work" / "data"
    cache.mkdir(parents=True)
    (cache / f"{key}.part-dead").mkdir()  # an upload that was cut: never taken for the data set
    (cache / f"{key}.part-dead" / "train.bin").write_bytes(b"\0" * 10)
    (cache / f"{key}.part-young").mkdir()  # another upload, perhaps still going on: left alone
    old = os.stat(cache).st_mtime - 2 * 86400
    os.utime(cache / f"{key}.part-dead", (old, old))  # cut two days ago: cleared away
    seen = []
    job = deploy(cluster, run_dir, progress=lambda h, d, t: seen.append((h, d, t)))
    print(sent_line(job))
    assert job.extra["sent"]["data"] == size and f"{size / 1e6:.1f} MB of data" in sent_line(job)
    assert seen[-1][0].endswith(" data") and seen[-1][1] == seen[-1][2] == size
    assert sorted(p.name for p in (cache / key).iterdir()) == sorted([MARKER, "meta.json", "spare.bin", "train.bin",
                                                                          "val.bin"])
    for name in ("train.bin", "spare.bin"):
        assert (cache / key / name).read_bytes() == (toks / name).read_bytes()
    assert node_run_json(job)["data"]["source"]["path"] == str(cache / key)
    assert not [n for n in bundle_names(job) if n.endswith((".bin", "meta.json", ".npz"))]
    loss = losses(follow(job))
    assert len(loss) == 30 and np.mean(loss[-5:]) < np.mean(loss[:5])

    job2 = deploy(cluster, prepare(project, tmp_path / "run2", steps=30))  # a later run: the cache is there
    assert job2.extra["sent"] == {"bundle": job2.extra["sent"]["bundle"], "data": 0}
    print(sent_line(job2))
    assert "0 B of data (cached on the cluster" in sent_line(job2)
    assert [p.name for p in cache.iterdir() if ".part-" in p.name] == [f"{key}.part-young"]
    follow(job2)


def test_a_different_or_missing_copy_is_refused_in_one_line_before_anything_starts(sshd_pair, tmp_path, config_dir):
    toks = make_tokens(tmp_path / "tokens")
    other = tmp_path / "cluster copy"
    shutil.copytree(toks, other)
    t = np.fromfile(other / "val.bin", np.uint16)
    t[-1] = (t[-1] + 1) % 32  # one token, same size: only the content differs
    t.tofile(other / "val.bin")
    cluster = one_node(sshd_pair, tmp_path)
    run_dir = prepare(token_project(toks), tmp_path / "run", steps=5)
    host = cluster.hosts[0].label
    with pytest.raises(DeployError) as ei:
        deploy(cluster, run_dir, remote_data=str(other))
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(f"{host}: {other}: not the same data as {toks} here")
    assert "nothing was launched" in msg
    with pytest.raises(DeployError) as ei:
        deploy(cluster, run_dir, remote_data=str(tmp_path / "nowhere"))
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(f"{host}: {tmp_path / 'nowhere'}: nothing found at this path")
    assert JobDB().list() == [] and not list((tmp_path / "work" / "jobs").glob("*"))
    assert not (tmp_path / "work" / "data").exists()


def test_a_node_without_the_package_its_format_needs_is_named(sshd_pair, tmp_path, config_dir):
    """An image folder on a node whose Python cannot import Pillow: the deploy names the node
    and the package, and starts nothing."""
    Image = pytest.importorskip("PIL.Image")
    root = tmp_path / "images"
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for k in range(6):
            Image.fromarray(np.full((12, 12, 3), 40 + 150 * c, np.uint8)).save(root / f"c{c}" / f"{k}.png")
    g, prev = Graph(), None
    for kind, params, nid in [("Input", {"shape": [3, 8, 8]}, "x"), ("Flatten", {}, "flat"),
                              ("Linear", {"out_features": 2}, "head"), ("Output", {"loss": "cross_entropy"}, "out")]:
        g.add_node(kind, params, id=nid)
        if prev:
            g.connect(prev, "out", nid, "in")
        prev = nid
    tr = Training.model_validate({"dataset": {"kind": "image_folder", "path": str(root), "image_size": 8,
                                              "val_fraction": 0.25}, "batch_size": 4, "steps": 3})
    run_dir = prepare(Project(g, name="img", training=tr), tmp_path / "run", steps=3)
    blocker = tmp_path / "no-pillow"
    (blocker / "PIL").mkdir(parents=True)
    (blocker / "PIL" / "__init__.py").write_text("raise ImportError('no Pillow on this node')\n")
    py = tmp_path / "python-without-pillow"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={blocker} exec {sys.executable} \"$@\"\n")
    os.chmod(py, 0o755)
    cluster = one_node(sshd_pair, tmp_path, python=str(py))
    with pytest.raises(DeployError) as ei:
        deploy(cluster, run_dir, remote_data=str(root))
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(f"{cluster.hosts[0].label}: image_folder data needs Pillow, which "
                                              f"{py} there cannot import"), msg
    assert JobDB().list() == []


def test_plan_without_a_cluster(tmp_path):
    """Where the nodes would read the data, decided here: mapping, cache path, .npz by hash."""
    toks = make_tokens(tmp_path / "d" / "tokens", n=400)
    run_dir = prepare(token_project(toks), tmp_path / "run", steps=2)
    spec = run_spec(run_dir)
    c = parse_cluster({"name": "c", "hosts": [{"address": "h"}], "workdir": "lf",
                       "data_paths": {str(tmp_path / "d"): "/scratch/d", str(tmp_path): "/x"}})
    p = plan_data(spec, run_dir, c)
    assert (p.mode, p.path, p.origin) == ("cluster", "/scratch/d/tokens", "data_paths")  # the longest match
    p = plan_data(spec, run_dir, c.model_copy(update={"data_paths": {}}))
    key = spec.data.fingerprint["digest"][:32]
    assert (p.mode, p.path, p.size) == ("cache", f"~/lf/data/{key}", sum(f.stat().st_size for f in toks.iterdir()))
    assert json.loads(p.replace(run_dir)["run.json"])["data"]["source"]["path"] == f"~/lf/data/{key}"
    with pytest.raises(DataProblem, match="remote data 'tokens': give its path on the cluster from /"):
        plan_data(spec, run_dir, c, "tokens")
    assert plan_data(spec, run_dir, c, Path("/x/t")).path == "/x/t"
    with pytest.raises(Exception, match="must be an absolute path"):
        parse_cluster({"name": "c", "hosts": [{"address": "h"}], "data_paths": {"rel": "/x"}})


def test_an_upload_cut_midway_is_never_taken_for_the_data_set(sshd_pair, tmp_path, config_dir, relay_factory):
    """The link goes through a relay, stopped while the data goes up: the deploy fails and
    starts nothing, the cache has no complete folder; the next deploy sends the data whole
    and the run trains on it."""
    s = sshd_pair.servers[0]
    relay = relay_factory((s.addr, s.port))
    data = relayed_cluster(sshd_pair, tmp_path, relay)
    cluster = parse_cluster(data)
    toks = make_tokens(tmp_path / "tokens", n=3000)
    (toks / "spare.bin").write_bytes(os.urandom(6 << 20))
    size = sum(f.stat().st_size for f in toks.iterdir())
    project = token_project(toks, steps=10)

    def cut(host, done, total):
        if host.endswith(" data") and 0 < done < total:
            relay.stop()

    with pytest.raises(DeployError, match="nothing was launched"):
        deploy(cluster, prepare(project, tmp_path / "run1", steps=10), progress=cut)
    cache = tmp_path / "work" / "data"
    assert [p.name for p in cache.iterdir() if ".part-" not in p.name] == [] and JobDB().list() == []
    relay.start()
    job = deploy(cluster, prepare(project, tmp_path / "run2", steps=10))
    assert job.extra["sent"]["data"] == size
    key = job.extra["data"]["key"]
    assert (cache / key / "spare.bin").read_bytes() == (toks / "spare.bin").read_bytes()
    assert len(losses(follow(job))) == 10
