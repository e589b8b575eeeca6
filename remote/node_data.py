"""A run's data on a cluster: read where it already is, or uploaded once into a
content-addressed cache that later runs reuse. Data never travels inside the bundle.

    plan = plan_data(spec, run_dir, cluster, remote_data)    # here: where the nodes read it
    bundle = make_bundle(run_dir, ..., exclude=["data.npz"], replace=plan.replace(run_dir))
    sent = stage_data(conn, plan, cluster, jobdir)            # each node, bundle extracted in jobdir

Where a data set read in place (run.json data.source) is found, in this order:
  1. `remote_data` (deploy --remote-data PATH; Project.deploy(remote_data=...)): its path
     on every node;
  2. the cluster profile's `data_paths` ({local folder: the same folder on the cluster}):
     the longest local folder that holds the data set;
  3. else its files are uploaded into WORKDIR/data/<digest>/ of each node: under a name of
     their own (`<digest>.part-<random>`), checked there against the fingerprint, then
     renamed, so an interrupted upload is never taken for a complete one; a later run (any
     run of the same files) finds the folder and sends nothing.
In 1 and 2 every node computes the data set's fingerprint (engine/runtime/datasets/
fingerprint.py, run from the extracted bundle), which must equal the one the run recorded
here. The nodes are asked for the packages the format needs (Pillow, pyarrow) too. The run
folder's run.json stays as it is; the bundle's names the path on the cluster.

A generated set (data.npz in the run folder) goes into the same cache, keyed by its
SHA-256, and the node links run/data.npz to it; with `remote_data` it links to that path
(a .npz already on the cluster).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import LayerflowError
from remote.bundle import put_file
from remote.cluster import Cluster
from remote.ssh import Connection, SSHError, quote

MARKER = ".layerflow-data.json"  # written into a cache folder before it is renamed complete
SMALL = 1 << 20  # files below this go up in tar batches: one round trip per batch, not per file
BATCH = 32 << 20
FORMAT_PACKAGES = ("image_folder", "parquet", "shards")  # formats that may need more than torch and numpy

Progress = Callable[[int, int], None]


class DataProblem(LayerflowError, RuntimeError):
    """The data set is not usable on a node: one line naming the host and the path."""


@dataclass
class DataPlan:
    mode: str = "none"  # "none", "cluster" (there already), "cache" (uploaded once), "link" (a .npz at remote_data)
    path: str | None = None  # what the run reads on the cluster (source path, or data.npz's target)
    origin: str = ""  # why there: "remote_data", "data_paths", "cache"
    source: dict | None = None  # the local source settings (run.json data.source)
    fingerprint: dict | None = None  # the local files' (what a node's copy must equal)
    key: str | None = None  # cache folder name
    root: str | None = None  # cache: the folder under WORKDIR/data
    files: list[tuple[str, Path, int]] = field(default_factory=list)  # cache: (name in the folder, file here, size)

    @property
    def npz(self) -> bool:
        return self.source is None

    @property
    def size(self) -> int:
        return sum(f[2] for f in self.files)

    def replace(self, run_dir: Path) -> dict[str, bytes]:
        """The run-folder files the bundle ships changed: run.json with the cluster's path."""
        if self.source is None or self.mode not in ("cluster", "cache"):
            return {}
        d = json.loads((Path(run_dir) / "run.json").read_text())
        d["data"]["source"]["path"] = self.path
        return {"run.json": json.dumps(d, indent=1).encode()}

    def record(self) -> dict:
        """What the job remembers (job.extra["data"])."""
        return {"mode": self.mode, "path": self.path, "origin": self.origin, "key": self.key,
                "local_path": (self.source or {}).get("path"), "bytes": self.size or (self.fingerprint or {}).get("bytes")}


def portable(workdir: str) -> str:
    """The work folder as every node can read it: '~/...' expands to each node's own home
    (the runtime's paths expand ~), an absolute path stays."""
    w = workdir.rstrip("/") or "/"
    return w if w.startswith(("/", "~")) else f"~/{w}"


def mapped_path(cluster: Cluster, local: str) -> str | None:
    """The cluster's path of `local` through the profile's data_paths, longest match first."""
    for here, there in sorted(cluster.data_paths.items(), key=lambda kv: -len(kv[0])):
        h = os.path.expanduser(here).rstrip("/") or "/"
        if local == h or local.startswith(h.rstrip("/") + "/"):
            return there.rstrip("/") + local[len(h.rstrip("/")):]
    return None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def plan_data(spec, run_dir: Path, cluster: Cluster, remote_data: str | None = None) -> DataPlan:
    """Where the nodes will read the run's data (nothing is contacted)."""
    from engine.runtime.datasets import DataError, data_files, fingerprint

    src = spec.data.source
    cache = f"{portable(cluster.workdir)}/data"
    remote_data = str(remote_data) if remote_data else None
    if remote_data is not None and not remote_data.startswith(("/", "~")):
        raise DataProblem(f"remote data {remote_data!r}: give its path on the cluster from / (or from ~, the "
                          f"home folder there)")
    if src is not None:
        local = str(src["path"])
        try:
            fp = spec.data.fingerprint or fingerprint(src)
            there = remote_data or mapped_path(cluster, local)
            if there:
                return DataPlan("cluster", there, "remote_data" if remote_data else "data_paths", src, fp)
            root, files = data_files(src, None)
        except DataError as e:
            raise DataProblem(str(e)) from None
        key = fp["digest"][:32]
        rel = os.path.relpath(local, root)
        base = f"{cache}/{key}"
        return DataPlan("cache", base if rel == "." else f"{base}/{rel}", "cache", src, fp, key, base,
                        [(p.relative_to(root).as_posix(), p, p.stat().st_size) for p in files])
    npz = Path(run_dir) / "data.npz"
    if remote_data:
        return DataPlan("link", remote_data, "remote_data")
    if not npz.is_file():
        return DataPlan()
    digest, size = sha256_file(npz), npz.stat().st_size
    key = digest[:32]
    return DataPlan("cache", f"{cache}/{key}/data.npz", "cache", None, {"sha256": digest, "files": 1, "bytes": size},
                    key, f"{cache}/{key}", [("data.npz", npz, size)])


# ----- on a node ------------------------------------------------------------------------
def _ask(conn: Connection, cluster: Cluster, jobdir: str, source: dict, with_fingerprint: bool = True) -> dict:
    """engine.runtime.datasets.fingerprint run on the node from the extracted bundle."""
    cmd = (f"cd {quote(jobdir)} && {quote(cluster.python)} -W ignore -m engine.runtime.datasets.fingerprint "
           f"{quote(json.dumps(source))}" + ("" if with_fingerprint else " --no-fingerprint"))
    res = conn.run(cmd, timeout=max(cluster.command_timeout, 600.0), check=False)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        why = (res.stderr.strip() or res.stdout.strip()).splitlines()
        return {"error": f"the fingerprint could not be computed there ({why[-1][:200] if why else 'no output'})"}


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _differs(there: dict, here: dict) -> str:
    a = f"{there.get('files')} files, {_size(there.get('bytes'))}"
    b = f"{here.get('files')} files, {_size(here.get('bytes'))}"
    return f"{a} there, {b} here" if a != b else f"{a} on both, but other content"


def _missing(conn: Connection, cluster: Cluster, ans: dict, kind: str) -> None:
    if ans.get("missing"):
        pkgs = " and ".join(ans["missing"])
        raise DataProblem(f"{conn.label}: {kind} data needs {pkgs}, which {cluster.python} there cannot import; "
                          f"install it on the node (pip install {' '.join(p.lower() for p in ans['missing'])})")


def check_there(conn: Connection, plan: DataPlan, cluster: Cluster, jobdir: str) -> None:
    """Data said to be on the cluster: there, the same files, and readable by the node's Python."""
    if plan.mode == "link":
        if conn.run(f"test -r {_sh_path(plan.path)}", check=False).exit_status != 0:
            raise DataProblem(f"{conn.label}: {plan.path} is not readable there (--remote-data)")
        return
    src = {**plan.source, "path": plan.path}
    why = "--remote-data" if plan.origin == "remote_data" else f"cluster {cluster.name}'s data_paths"
    ans = _ask(conn, cluster, jobdir, src)
    if ans.get("error"):
        raise DataProblem(f"{conn.label}: {plan.path}: {ans['error'].removeprefix(plan.path + ': ')} ({why})")
    fp = ans.get("fingerprint") or {}
    if fp.get("digest") != plan.fingerprint.get("digest"):
        raise DataProblem(f"{conn.label}: {plan.path}: not the same data as {plan.source['path']} here "
                          f"({_differs(fp, plan.fingerprint)})")
    _missing(conn, cluster, ans, plan.source.get("kind"))


def _sh_path(path: str) -> str:
    """A path for the shell, its leading ~ expanded by the shell (quote() would stop it)."""
    return f'"$HOME"/{quote(path[2:])}' if path.startswith("~/") else quote(path)


def _put_files(conn: Connection, files: list[tuple[str, Path, int]], part: str, cluster: Cluster,
               progress: Progress | None) -> int:
    total, done = sum(f[2] for f in files), [0]

    def tick(n: int) -> None:
        done[0] += n
        if progress:
            progress(done[0], total)

    timeout = max(cluster.command_timeout, 600.0)
    big = [f for f in files if f[2] >= SMALL]
    dirs = sorted({os.path.dirname(name) for name, _, _ in big} - {""})
    conn.run(" ".join(["mkdir", "-p", quote(part)] + [quote(f"{part}/{d}") for d in dirs]), timeout=timeout)

    def send(members: list[tuple[str, Path, int]]) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, local, _ in members:
                tar.add(str(local), arcname=name, recursive=False)
        conn.run(f"tar -xf - -C {quote(part)}", stdin=buf.getvalue(), timeout=timeout)
        tick(sum(m[2] for m in members))

    batch, size = [], 0
    for f in files:
        if f[2] < SMALL:
            batch.append(f)
            size += f[2]
            if size >= BATCH:
                send(batch)
                batch, size = [], 0
    if batch:
        send(batch)
    for name, local, n in big:
        base = done[0]
        put_file(conn, local, n, f"{part}/{name}",
                 (lambda d, t, base=base: (progress(base + d, total) if progress else None)))
        done[0] = base + n
    return total


def upload_to_cache(conn: Connection, plan: DataPlan, cluster: Cluster, jobdir: str,
                    progress: Progress | None = None) -> int:
    """The plan's files in WORKDIR/data/<key>/ on this node; returns the bytes sent (0: it
    was there). Written under a temporary name, checked, then renamed."""
    dest = conn.abspath(plan.root)
    expect = plan.fingerprint.get("digest") or plan.fingerprint.get("sha256")
    try:
        mark = json.loads(conn.read_text(f"{dest}/{MARKER}") or "null")
    except ValueError:
        mark = None
    sent = 0
    if not (isinstance(mark, dict) and mark.get("digest") == expect):
        part = f"{dest}.part-{secrets.token_hex(4)}"
        parent, name = dest.rsplit("/", 1)
        # uploads cut a day ago or more are not coming back (a running one is younger)
        conn.run(f"find {quote(parent)} -maxdepth 1 -name {quote(name + '.part-*')} -mmin +1440 "
                 f"-exec rm -rf {{}} + 2>/dev/null", check=False)
        try:
            sent = _put_files(conn, plan.files, part, cluster, progress)
            rel = plan.path[len(plan.root):]
            if plan.npz:
                py = ("import hashlib, sys\nh = hashlib.sha256()\nwith open(sys.argv[1], 'rb') as f:\n"
                      "    for b in iter(lambda: f.read(1 << 20), b''):\n        h.update(b)\nprint(h.hexdigest())")
                res = conn.run(f"{quote(cluster.python)} -c {quote(py)} {quote(part + rel)}", check=False,
                               timeout=max(cluster.command_timeout, 600.0))
                got = res.stdout.strip()
            else:
                ans = _ask(conn, cluster, jobdir, {**plan.source, "path": part + rel}, with_fingerprint=True)
                got = (ans.get("fingerprint") or {}).get("digest")
                _missing(conn, cluster, ans, plan.source.get("kind"))
            if got != expect:
                local = plan.source["path"] if plan.source else plan.files[0][1]
                raise DataProblem(f"{conn.label}: {dest}: the uploaded copy of {local} does not match its "
                                  f"fingerprint (did it change since the run was prepared? prepare it again)")
            conn.write_bytes(f"{part}/{MARKER}", json.dumps({"digest": expect, **{
                k: plan.fingerprint.get(k) for k in ("kind", "files", "bytes")}}).encode())
            # another node on the same file system may have finished first: keep its copy
            res = conn.run(f"mv -T {quote(part)} {quote(dest)} 2>/dev/null || "
                           f"{{ test -f {quote(dest + '/' + MARKER)} && rm -rf {quote(part)}; }}", check=False)
            if res.exit_status != 0:
                raise DataProblem(f"{conn.label}: {dest}: cannot move the uploaded data set into place "
                                  f"({res.stderr.strip()[-200:]})")
        except BaseException:
            try:
                conn.run(f"rm -rf {quote(part)}", check=False, timeout=60)
            except SSHError:
                pass  # the link is gone: the part stays, under a name no run takes for the data
            raise
        return sent
    if plan.source is not None and plan.source.get("kind") in FORMAT_PACKAGES:
        _missing(conn, cluster, _ask(conn, cluster, jobdir, {**plan.source, "path": plan.path}, False),
                 plan.source.get("kind"))
    return 0


def stage_data(conn: Connection, plan: DataPlan, cluster: Cluster, jobdir: str,
               progress: Progress | None = None) -> int:
    """Make the run's data ready on this node (the bundle is extracted in jobdir); returns
    the data bytes sent. DataProblem names the host and the path."""
    if plan.mode in ("cluster", "link"):
        check_there(conn, plan, cluster, jobdir)
        return 0
    if plan.mode == "cache":
        return upload_to_cache(conn, plan, cluster, jobdir, progress)
    return 0


# ----- the job's side ---------------------------------------------------------------------
def link_line(job) -> str:
    """The node script's line that points run/data.npz at a .npz on the cluster."""
    path = job.extra.get("remote_data") or job.extra.get("data_link")
    return f"ln -sfn {_sh_path(path)} run/data.npz\n" if path else ""


def sent_line(job) -> str:
    """'sent 41.2 kB of bundle and 0 B of data (...)': what a deploy printed."""
    sent = job.extra.get("sent") or {}
    d = job.extra.get("data") or {}
    where = {"cluster": f"read at {d.get('path')} on the cluster",
             "link": f"read at {d.get('path')} on the cluster",
             "cache": (f"cached on the cluster at {d.get('path')}" if not sent.get("data")
                       else f"uploaded once into {d.get('path')}")}.get(d.get("mode"), "no data set to send")
    return f"sent {_size(sent.get('bundle', 0))} of bundle and {_size(sent.get('data', 0))} of data ({where})"


def restore_run_json(path: Path, job) -> None:
    """A run.json fetched from the cluster names the data where the node read it: put the
    user's own path back, so the fetched folder resumes here."""
    d = job.extra.get("data") or {}
    if not d.get("local_path") or d.get("mode") not in ("cluster", "cache"):
        return
    try:
        spec = json.loads(Path(path).read_text())
        spec["data"]["source"]["path"] = d["local_path"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    from engine.files import atomic_write

    atomic_write(Path(path), json.dumps(spec, indent=1).encode())


__all__ = ["DataPlan", "DataProblem", "link_line", "plan_data", "restore_run_json", "sent_line", "stage_data"]
