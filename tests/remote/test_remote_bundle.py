"""Bundles: deterministic content hash, upload only when missing, parallel ranged upload."""
from __future__ import annotations

import hashlib
import os
import tarfile

from remote.bundle import make_bundle, upload, extract
from remote.cluster import parse_cluster
from remote.ssh import Connection


def fake_run(d, payload: bytes = b"x" * 1000):
    d.mkdir(parents=True)
    (d / "run.json").write_text('{"total_steps": 1}')
    (d / "data.npz").write_bytes(payload)
    (d / "metrics.jsonl").write_text('{"step": 1}\n')  # output of an earlier run: left out
    (d / "logs").mkdir()
    (d / "logs" / "rank0.log").write_text("old\n")
    return d


def test_bundle_is_deterministic_and_complete(tmp_path):
    a = make_bundle(fake_run(tmp_path / "a"), tmp_path / "cache")
    b = make_bundle(fake_run(tmp_path / "b"), tmp_path / "cache2")
    assert a.sha256 == b.sha256 and a.path.read_bytes() == b.path.read_bytes()
    c = make_bundle(fake_run(tmp_path / "c", b"y" * 1000), tmp_path / "cache")
    assert c.sha256 != a.sha256 and c.path.name != a.path.name
    with tarfile.open(a.path) as t:
        names = t.getnames()
    assert "run/run.json" in names and "run/data.npz" in names and "layerflow_jobctl.py" in names
    assert "engine/__init__.py" in names and "engine/runtime/train.py" in names
    assert not any(n.startswith(("run/metrics", "run/logs")) or "__pycache__" in n for n in names)
    assert hashlib.sha256(a.path.read_bytes()).hexdigest() == a.sha256
    lean = make_bundle(tmp_path / "a", tmp_path / "cache", exclude=["data.npz"])  # data already on the cluster
    with tarfile.open(lean.path) as t:
        assert "run/data.npz" not in t.getnames() and "run/run.json" in t.getnames()


def test_upload_once_and_in_parallel_ranges(sshd_pair, tmp_path):
    c = parse_cluster(sshd_pair.cluster("t", tmp_path / "w", n_hosts=1))
    big = make_bundle(fake_run(tmp_path / "big", os.urandom(40 << 20)), tmp_path / "cache")
    remote_dir = str(tmp_path / "remote dir")
    seen = []
    with Connection.to(c, c.hosts[0]) as conn:
        path, sent = upload(conn, big, remote_dir, lambda d, t: seen.append((d, t)), streams=2)
        assert sent and seen[-1] == (big.size, big.size)
        assert hashlib.sha256(open(path, "rb").read()).hexdigest() == big.sha256
        assert [n for n in os.listdir(remote_dir) if ".part" in n] == []
        assert upload(conn, big, remote_dir) == (path, False)  # the hash is there: nothing sent
        # a half-finished earlier upload (.part) is not mistaken for the bundle
        small = make_bundle(fake_run(tmp_path / "small"), tmp_path / "cache")
        part = os.path.join(remote_dir, small.name + ".part")
        open(part, "wb").write(b"junk")
        path2, sent = upload(conn, small, remote_dir)
        assert sent and open(path2, "rb").read() == small.path.read_bytes()
        extract(conn, path2, str(tmp_path / "job 'x'"))
    assert (tmp_path / "job 'x'" / "run" / "run.json").is_file()
