"""clusters.json changed by two processes at once (the CLI's `cluster add` while the
GUI saves a profile): the read-modify-write holds a file lock, so no save is lost."""
from __future__ import annotations

import json
import multiprocessing

from remote.cluster import ClusterStore, parse_cluster

N = 20


def _save_many(path: str, prefix: str, barrier) -> None:
    store = ClusterStore(path)
    barrier.wait()  # both start together
    for i in range(N):
        store.save(parse_cluster({"name": f"{prefix}-{i}", "hosts": [{"address": f"{prefix}{i}.example"}]}))


def test_two_processes_saving_at_once_keep_every_profile(tmp_path):
    path = tmp_path / "config" / "clusters.json"
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads of the test process forked
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_save_many, args=(str(path), prefix, barrier)) for prefix in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    want = sorted(f"{prefix}-{i}" for prefix in ("a", "b") for i in range(N))
    store = ClusterStore(path)
    assert store.names() == want
    assert sorted(json.loads(path.read_text())) == want
    assert store.get("b-7").hosts[0].address == "b7.example"
    store.remove("a-0")  # remove takes the same lock
    assert len(store.names()) == 2 * N - 1 and "a-0" not in store.names()
