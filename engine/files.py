"""Writing files so that a crash never leaves half of one, and the error that names a
project file or field. Below engine/project.py and engine/trust.py, which both use them
(no Qt, no pydantic: cheap to import anywhere)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from engine.errors import LayerflowError


class ProjectError(LayerflowError, ValueError):
    """A project file that cannot be used; the message names the file and field."""


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename over `path`:
    a crash leaves either the old file or the new one, never half of one."""
    path = Path(os.path.realpath(path))  # through a symlink: update its target, keep the link
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = os.stat(path).st_mode & 0o7777  # keep the file's mode
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask  # a new file gets what open() would give it
    _remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def _remove_stale_temps(path: Path, older_than_s: float = 60.0) -> None:
    """Temp files that interrupted saves of `path` left behind (a kill mid-save)."""
    import glob
    import time

    now = time.time()
    for t in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        try:
            if now - t.lstat().st_mtime > older_than_s and t.is_file():
                t.unlink()
        except OSError:
            pass
