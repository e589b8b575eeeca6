"""Writing files so that a crash never leaves half of one, and the error that names a
project file or field. Below engine/project.py and engine/trust.py, which both use them
(no Qt, no pydantic: cheap to import anywhere)."""
from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
from pathlib import Path

from engine.errors import LayerflowError

NAME_MAX = 255  # bytes in one file name (ext4, xfs, btrfs, tmpfs, APFS all say 255)


class ProjectError(LayerflowError, ValueError):
    """A project file that cannot be used; the message names the file and field."""


class WriteError(LayerflowError, OSError):
    """A file that cannot be written (a full disk, a name too long, a symlink loop, a
    device where a file should be): one line naming the file, the reason and what to do.
    An OSError too, with the errno of the failure, so `except OSError` still sees it."""

    def __init__(self, path: str | os.PathLike, exc: OSError | None = None, why: str | None = None):
        code = exc.errno if exc is not None else errno.EINVAL
        super().__init__(code, (exc.strerror if exc is not None else None) or why or "", str(path))
        self.message = f"{path}: cannot write: {why or os_error_text(exc)}"

    def __str__(self) -> str:
        return self.message


# What to do about the errors a write or read meets, in the user's words.
_HINTS = {
    errno.ENOSPC: "the disk is full; free some space there, or write somewhere else",
    errno.EDQUOT: "your disk quota is used up; free some space, or write somewhere else",
    errno.EFBIG: "the file is larger than this process may write (see `ulimit -f`)",
    errno.ENAMETOOLONG: f"a file name holds at most {NAME_MAX} bytes; choose a shorter name",
    errno.ELOOP: "a symbolic link in the path leads back to itself; remove the link or use another path",
    errno.EACCES: "you may not write there; choose a folder of yours",
    errno.EPERM: "you may not write there; choose a folder of yours",
    errno.EROFS: "the file system is read-only; write somewhere else",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "a part of the path is a file, not a folder",
    errno.EISDIR: "it is a folder; give a file name",
}


def os_error_text(exc: OSError | None) -> str:
    """'No space left on device (the disk is full; free some space ...)' for an OSError."""
    if exc is None:
        return "unknown error"
    text = exc.strerror or str(exc)
    hint = _HINTS.get(exc.errno)
    return f"{text} ({hint})" if hint else text


def real_path(path: str | os.PathLike) -> Path:
    """`path` with every link followed, as Path.resolve() gives it, but never raising: a
    symlink loop (where Path.resolve raises RuntimeError) is left as it is, so the read or
    write that follows names the file in one line (ELOOP, os_error_text)."""
    return Path(os.path.realpath(path))


def stat_input(path: str | os.PathLike, field: str) -> os.stat_result:
    """os.stat of a file or folder a project names (`field`: "weights",
    "training.dataset.path"), following links; ProjectError naming the field and the path
    when it is missing or cannot be reached (a symlink loop, a folder one may not enter)."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise ProjectError(f"{field}: {path} does not exist") from None
    except (OSError, ValueError) as exc:  # ELOOP, EACCES, ENOTDIR, ENAMETOOLONG; ValueError: a NUL byte
        text = os_error_text(exc) if isinstance(exc, OSError) else str(exc)
        raise ProjectError(f"{field}: cannot read {path}: {text}") from None


def check_path_text(path: str | os.PathLike, what: str = "path") -> None:
    """A path the operating system can take at all: no NUL byte, no name over NAME_MAX
    bytes, text that encodes. Raises WriteError naming the path."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    shown = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\0", "\\0")
    if "\0" in text:
        raise WriteError(shown, why=f"the {what} holds a NUL byte (\\0), which no file name may hold")
    try:
        parts = [os.fsencode(p) for p in Path(text).parts]
    except UnicodeError:
        raise WriteError(shown, why=f"the {what} is not valid text (a lone surrogate); rename it") from None
    long = next((p for p in parts if len(p) > NAME_MAX), None)
    if long is not None:
        raise WriteError(shown[:80] + ("..." if len(shown) > 80 else ""),
                         why=f"a file name of {len(long)} bytes; a name holds at most {NAME_MAX} bytes: "
                             "choose a shorter one")


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename over `path`:
    a crash leaves either the old file or the new one, never half of one.

    Only regular files are written this way: a device, FIFO or folder at `path` (/dev/null,
    a symlink to one) is refused, never replaced. Every failure (a full disk, a name too
    long, a symlink loop) is a WriteError naming the file; nothing is left behind."""
    check_path_text(path)
    given = path
    path = Path(os.path.realpath(path))  # through a symlink: update its target, keep the link
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:  # ELOOP (a link to itself), EACCES, ENOTDIR, ...
        raise WriteError(given, exc) from None
    if st is None and os.path.islink(path):  # realpath stops at a link it cannot follow: a loop
        raise WriteError(given, OSError(errno.ELOOP, os.strerror(errno.ELOOP)))
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a device, FIFO or socket"
        raise WriteError(given, why=f"{path} is {kind}, not a file; a file is written whole and renamed into "
                                    "place, so give a file path")
    if st is not None:
        mode = st.st_mode & 0o7777  # keep the file's mode
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask  # a new file gets what open() would give it
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clear_stale_temps(path)
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path) + _writer_tag(), suffix=".tmp", dir=path.parent)
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise WriteError(given, exc) from None
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


# The temp file beside NAME is .NAME.<host>-<pid>.<random>.tmp: its writer is known, so a
# later save or open of NAME clears the temp files of writers that are gone (a SIGKILL
# mid-save leaves one) and keeps those of writers still running. <host> is a digest of this
# machine's name: on a folder shared by several machines (NFS) a pid is only ours to check
# when the host is ours; another host's temp file goes by its age alone.
_TEMP_SUFFIX_BYTES = 40  # ".<host 8>-<pid up to 10>." + mkstemp's 8 random + ".tmp", with room
_TEMP_MAX_AGE_S = 24 * 3600.0  # a temp file older than this: its writer is gone (another machine's, a reused pid)
_TEMP_UNNAMED_S = 60.0  # a temp file of an older Layerflow (no writer in its name), older than this


def _temp_prefix(path: Path) -> str:
    """'.NAME.' for the temp file beside NAME; a name too long to carry a temp suffix
    within NAME_MAX bytes goes by a digest of itself."""
    name = path.name
    if len(os.fsencode(name)) > NAME_MAX - _TEMP_SUFFIX_BYTES:
        name = "long-" + hashlib.sha256(os.fsencode(name)).hexdigest()[:24]
    return f".{name}."


def _host_tag() -> str:
    import socket

    return hashlib.sha256(socket.gethostname().encode("utf-8", "surrogateescape")).hexdigest()[:8]


def _writer_tag() -> str:
    """'<host>-<pid>.': who writes this temp file (mkstemp's random part follows)."""
    return f"{_host_tag()}-{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    """Whether a process of that id runs on this machine (a zombie does not). The same rule
    as engine/runtime/records.py pid_alive, which this room sits below (import-linter)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except (OSError, OverflowError):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def clear_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Remove the temp files that saves of `path` left behind when their writer died (a
    kill mid-save): those naming a process of this machine that no longer runs, another
    machine's after a day, an older Layerflow's unnamed ones after a minute. A live
    writer's temp file is kept. Never raises (a folder we may not list: nothing cleared).
    Returns what it removed."""
    import glob
    import re
    import time

    path = Path(path)
    prefix = _temp_prefix(path)
    host = _host_tag()
    named = re.compile(re.escape(prefix) + r"([0-9a-f]{8})-(\d{1,10})\.[^/]*\.tmp\Z")
    removed = []
    try:
        candidates = list(path.parent.glob(f"{glob.escape(prefix)}*.tmp"))
    except OSError:
        return removed
    now = time.time()
    for t in candidates:
        try:
            st = t.lstat()
            if not stat.S_ISREG(st.st_mode):
                continue  # (a link or a folder of that name is not ours to remove)
            m = named.match(t.name)
            if m is None:
                stale = now - st.st_mtime > _TEMP_UNNAMED_S
            elif m.group(1) != host:
                stale = now - st.st_mtime > _TEMP_MAX_AGE_S
            else:
                pid = int(m.group(2))  # (a day old, its pid may be another process's by now)
                stale = now - st.st_mtime > _TEMP_MAX_AGE_S or (pid != os.getpid() and not _pid_alive(pid))
            if stale:
                t.unlink()
                removed.append(t)
        except OSError:
            pass
    return removed
