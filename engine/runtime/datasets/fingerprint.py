"""A data set's fingerprint: which files, how big, and a digest of their content that a
copy on another machine shares (preflight compares the cluster's copy with the user's).

The digest covers sorted (relative path, size, sha256 of the first and last 64 KiB): it
does not read whole files, so 10 GB of token files cost a few reads, and it ignores
modification times, which a copy changes. The times are summarised apart (mtime_digest,
newest_mtime) for cheap local change detection. A folder of a million small images is
read whole, since each file is within 128 KiB: that is the price of content.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .base import DataError, resolve
from .images import IMAGE_EXTS
from .shards import expand_braces

EDGE = 64 << 10
EXTS = {"image_folder": IMAGE_EXTS, "token_file": (".bin", "meta.json"), "parquet": (".parquet", ".arrow"),
        "array": (".npy", ".npz"), "npz": (".npz",), "shards": (".tar",)}


def data_files(source: dict, base_dir: Path | None) -> tuple[Path, list[Path]]:
    """(the root, the data files of every split of a source), sorted."""
    kind, path = source.get("kind"), str(source["path"])
    exts = EXTS.get(kind)
    if exts is None:
        raise DataError(f"fingerprint: unknown data kind {kind!r}")
    if kind == "shards" and "{" in path:
        files = []
        for n in expand_braces(path):
            p = Path(os.path.expanduser(n))
            p = p if p.is_absolute() or base_dir is None else Path(base_dir) / p
            if not p.is_file():
                raise DataError(f"{p}: missing shard")
            files.append(p)
        return files[0].parent, sorted(files)
    root = resolve(path, base_dir)
    if root.is_file():
        files = [root]
        if kind == "token_file" and (root.parent / "meta.json").is_file():
            files.append(root.parent / "meta.json")
        return root.parent, sorted(files)
    files = []
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        files += [Path(dirpath) / n for n in names if not n.startswith(".") and n.lower().endswith(exts)]
    return root, sorted(files)


def _edges(p: Path, size: int) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        h.update(f.read(EDGE))
        if size > EDGE:
            f.seek(max(EDGE, size - EDGE))
            h.update(f.read(EDGE))
    return h.hexdigest()


def fingerprint(source: dict, base_dir: Path | None = None) -> dict:
    """{"kind", "files", "bytes", "digest", "mtime_digest", "newest_mtime"}; digest is the
    same for a copy of the files anywhere, mtime_digest changes when any file is touched."""
    root, files = data_files(source, base_dir)
    if not files:
        raise DataError(f"{root}: nothing found at this path")
    digest, times = hashlib.sha256(), hashlib.sha256()
    total, newest = 0, 0.0
    for p in files:
        st = p.stat()
        rel = p.relative_to(root).as_posix()
        digest.update(f"{rel}\0{st.st_size}\0{_edges(p, st.st_size)}\n".encode())
        times.update(f"{rel}\0{st.st_mtime_ns}\n".encode())
        total += st.st_size
        newest = max(newest, st.st_mtime)
    return {"kind": source.get("kind"), "files": len(files), "bytes": total, "digest": digest.hexdigest(),
            "mtime_digest": times.hexdigest(), "newest_mtime": newest}


# What a format needs on a node beyond torch and numpy: (module to import, package to install).
NEEDS = {"image_folder": (("PIL.Image", "Pillow"),), "parquet": (("pyarrow.parquet", "pyarrow"),)}


def needs(source: dict, base_dir: Path | None = None) -> list[tuple[str, str]]:
    """The imports reading `source` takes on top of torch and numpy; shards need Pillow
    only when they hold images (their first shard's members say)."""
    kind = source.get("kind")
    if kind != "shards":
        return list(NEEDS.get(kind, ()))
    import tarfile

    from .shards import X_EXTS

    _, files = data_files(source, base_dir)
    try:
        with tarfile.open(files[0], mode="r:") as tf:
            for m in tf:
                ext = m.name.rpartition("/")[2].partition(".")[2].lower()
                if ext in X_EXTS:
                    return [("PIL.Image", "Pillow")] if ext != "npy" else []
    except (tarfile.TarError, OSError, IndexError):
        pass
    return []


def node_check(source: dict, with_fingerprint: bool = True) -> dict:
    """What a deploy asks a cluster node about a data set (remote/node_data.py): its
    fingerprint there (or the error that stops one) and the packages its format needs
    that this node's Python cannot import."""
    import importlib

    out: dict = {"fingerprint": None, "error": None, "missing": []}
    try:
        if with_fingerprint:
            out["fingerprint"] = fingerprint(source)
        for module, package in needs(source):
            try:
                importlib.import_module(module)
            except ImportError:
                out["missing"].append(package)
    except (DataError, OSError) as e:
        out["error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
    return out


def main(argv: list[str] | None = None) -> int:
    """python -m engine.runtime.datasets.fingerprint SOURCE_JSON [--no-fingerprint]: one
    JSON line, node_check's answer (run on a node from the deploy's bundle)."""
    import json
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    with_fp = "--no-fingerprint" not in args
    args = [a for a in args if a != "--no-fingerprint"]
    if len(args) != 1:
        print("usage: python -m engine.runtime.datasets.fingerprint SOURCE_JSON [--no-fingerprint]", file=sys.stderr)
        return 2
    print(json.dumps(node_check(json.loads(args[0]), with_fp)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
