"""Bundles: a run folder + the engine runtime, as one tar named by its content hash.

    run/                    the run folder (engine/runs/build.py), minus outputs of earlier runs
    engine/__init__.py      the runtime package, which imports only torch, numpy, stdlib
    engine/runtime/*.py
    layerflow_jobctl.py     the node-side status/cancel helper (remote/jobctl.py)

A deploy's bundle never holds data: it leaves data.npz out and ships a run.json that
names where the data set is on the cluster (remote/node_data.py: there already, or uploaded
once into the cluster's cache).

The tar is deterministic (sorted names, zero mtimes and owners), so equal content
gives an equal SHA-256 and a host that already holds `bundles/<hash>.tar` is not
sent it again. Uploads go to `<hash>.tar.part-<random>` with pipelined SFTP writes and are
renamed when complete and verified by size, so an interrupted upload never passes
for a finished one.
"""
from __future__ import annotations

import hashlib
import io
import os
import tarfile
import secrets
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from remote.ssh import Connection, quote

ROOT = Path(__file__).resolve().parents[1]
# outputs a finished or running run leaves in its folder; a new job starts without them
RUN_OUTPUTS = {"metrics.jsonl", "status.json", "logs", "checkpoints", "model.pt"}

Progress = Callable[[int, int], None]


@dataclass
class Bundle:
    path: Path
    sha256: str
    size: int

    @property
    def name(self) -> str:
        return f"{self.sha256[:32]}.tar"


def bundle_files(run_dir: Path, exclude: Iterable[str] = ()) -> Iterator[tuple[str, Path]]:
    """(name inside the bundle, local file), sorted. `exclude`: run-folder files left out
    (data.npz when the data set is already on the cluster)."""
    items = []
    skip = RUN_OUTPUTS | set(exclude)
    for p in sorted(run_dir.rglob("*")):
        rel = p.relative_to(run_dir)
        if rel.parts[0] in skip or not p.is_file():
            continue
        items.append(("run/" + rel.as_posix(), p))
    items.append(("engine/__init__.py", ROOT / "engine" / "__init__.py"))
    for p in sorted((ROOT / "engine" / "runtime").rglob("*.py")):
        if "__pycache__" not in p.parts:
            items.append(("engine/" + p.relative_to(ROOT / "engine").as_posix(), p))
    items.append(("layerflow_jobctl.py", ROOT / "remote" / "jobctl.py"))
    return iter(sorted(items))


class _HashingWriter(io.RawIOBase):
    def __init__(self, f):
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.h.update(b)
        self.n += len(b)
        return self.f.write(b)


def make_bundle(run_dir: str | os.PathLike, cache_dir: str | os.PathLike, exclude: Iterable[str] = (),
                replace: dict[str, bytes] | None = None) -> Bundle:
    """Write the bundle of `run_dir` into `cache_dir` (named by its hash) and return it.
    `replace`: run-folder files shipped with other content (run.json naming the data set's
    path on the cluster; the local file stays as it is)."""
    replace = {f"run/{k}": v for k, v in (replace or {}).items()}
    run_dir, cache_dir = Path(run_dir), Path(cache_dir)
    if not (run_dir / "run.json").is_file():
        raise ValueError(f"{run_dir} is not a run folder (no run.json); prepare it with engine.runs.build.prepare_run")
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".bundle-", suffix=".tar", dir=cache_dir)
    try:
        with os.fdopen(fd, "wb") as raw:
            w = _HashingWriter(raw)
            with tarfile.open(fileobj=w, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for name, path in bundle_files(run_dir, exclude):
                    info = tarfile.TarInfo(name)
                    info.mode = 0o644
                    info.mtime = 0
                    if name in replace:
                        info.size = len(replace[name])
                        tar.addfile(info, io.BytesIO(replace[name]))
                        continue
                    info.size = path.stat().st_size
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
        b = Bundle(cache_dir / "x", w.h.hexdigest(), w.n)
        b.path = cache_dir / b.name
        os.replace(tmp, b.path)
        return b
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def upload(conn: Connection, bundle: Bundle, remote_dir: str, progress: Progress | None = None,
           streams: int = 2) -> tuple[str, bool]:
    """Make sure `remote_dir/<hash>.tar` exists on the host; returns (path, uploaded?).

    Large bundles go up over `streams` SSH connections at once, each writing its own
    byte range of the same remote file: paramiko's per-packet work is Python, and one
    connection uses one core; two keep pace with OpenSSH's scp (bench/deploy.py)."""
    conn.run(f"mkdir -p {quote(remote_dir)}")
    dest = f"{remote_dir}/{bundle.name}"
    if conn.stat_size(dest) == bundle.size:
        if progress:
            progress(bundle.size, bundle.size)
        return dest, False
    # a name of our own: nodes that share a file system (NFS homes) may upload at once
    part = f"{dest}.part-{secrets.token_hex(4)}"
    put_file(conn, bundle.path, bundle.size, part, progress, streams)
    if conn.stat_size(part) != bundle.size:
        raise OSError(f"{conn.label}: upload of {bundle.name} is incomplete")
    conn.run(f"mv -f {quote(part)} {quote(dest)}")
    return dest, True


def put_file(conn: Connection, local: Path, size: int, remote: str, progress: Progress | None = None,
             streams: int = 2) -> None:
    """Upload one file: pipelined SFTP, over `streams` connections when it is large."""
    if streams <= 1 or size < (32 << 20):
        conn.put(local, remote, progress)
    else:
        _parallel_put(conn, local, size, remote, progress, streams)


def _parallel_put(conn: Connection, local: Path, size: int, part: str, progress: Progress | None,
                  streams: int) -> None:
    conn.write_bytes(part, b"")
    conns = [conn] + [conn.clone() for _ in range(streams - 1)]
    step = -(-size // streams)
    done, lock = [0], threading.Lock()

    def tick(n: int) -> None:
        with lock:
            done[0] += n
            if progress:
                progress(done[0], size)

    def one(i: int) -> None:
        off = i * step
        conns[i].put_range(local, part, off, max(0, min(step, size - off)), tick)

    try:
        with ThreadPoolExecutor(streams) as ex:
            list(ex.map(one, range(streams)))
    finally:
        for c in conns[1:]:
            c.close()


def extract(conn: Connection, remote_tar: str, dest_dir: str) -> None:
    conn.run(f"mkdir -p {quote(dest_dir)} && tar -xf {quote(remote_tar)} -C {quote(dest_dir)}")
