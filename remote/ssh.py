"""One SSH connection to one host (paramiko), opened lazily, used as a context manager.

Safety first: the server's host key must be in known_hosts. An unknown key raises
UnknownHostKey carrying its SHA256 fingerprint (as `ssh-keygen -l` prints it); it
is pinned only when the caller passes that exact fingerprint back (the user said
yes in the dialog, or `--accept-host-key FP` on the command line). A changed key
raises HostKeyChanged and is never pinned. There is no AutoAddPolicy anywhere.

paramiko facts that shape this file (see DESIGN.md): its keepalive never declares a
dead peer, so every blocking call has a timeout and `alive()` is our own check;
stdout and stderr are drained together before the exit status is read (else large
output deadlocks); an SFTPClient is never shared across threads (one Connection =
one thread); a remote command outlives a closed channel, so long-running work is
started detached by the launcher, never held by a channel.
"""
from __future__ import annotations

import os
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import paramiko

from engine.errors import LayerflowError
from remote.cluster import Cluster, Host

quote = shlex.quote


class SSHError(LayerflowError):
    """Anything that went wrong talking to a host; `host` names it."""

    def __init__(self, host: str, message: str):
        super().__init__(f"{host}: {message}")
        self.host = host
        self.reason = message


class Unreachable(SSHError):
    """TCP connect, handshake or auth did not complete."""


class AuthFailed(SSHError):
    pass


class ConnectionLost(SSHError):
    """The link died (or stopped answering) in the middle of a call."""


class CommandTimeout(ConnectionLost):
    pass


class UnknownHostKey(SSHError):
    """The host's key is not in known_hosts; accept it by passing `fingerprint` back."""

    def __init__(self, host: str, key: paramiko.PKey):
        self.key_type = key.get_name()
        self.fingerprint = key.fingerprint  # "SHA256:..." like OpenSSH
        super().__init__(host, f"unknown host key {self.key_type} {self.fingerprint}; verify it "
                               f"(ssh-keygen -lf on the host's key) and accept it with "
                               f"--accept-host-key {self.fingerprint}")


class HostKeyChanged(SSHError):
    def __init__(self, host: str, expected: paramiko.PKey, got: paramiko.PKey, known_hosts: str):
        self.expected = expected.fingerprint
        self.fingerprint = got.fingerprint
        super().__init__(host, f"HOST KEY CHANGED: known_hosts says {expected.get_name()} {self.expected}, "
                               f"the host now presents {got.get_name()} {self.fingerprint}. This may be an "
                               f"attack (or the host was reinstalled). Refusing to connect; if the change is "
                               f"expected, remove the old entry from {known_hosts}.")


class CommandFailed(SSHError):
    def __init__(self, host: str, command: str, result: "Result"):
        self.result = result
        tail = (result.stderr or result.stdout).strip()[-2000:]
        super().__init__(host, f"command exited with {result.exit_status}: {command[:200]}\n{tail}")


@dataclass
class Result:
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class _PinPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown key: pin it if its fingerprint was accepted, else refuse with the fingerprint."""

    def __init__(self, label: str, accept: set[str], pin_file: Path):
        self.label, self.accept, self.pin_file = label, accept, pin_file

    def missing_host_key(self, client, hostname, key):
        if key.fingerprint not in self.accept:
            raise UnknownHostKey(self.label, key)
        pin_host_key(self.pin_file, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)


_pin_lock = threading.Lock()


def pin_host_key(path: Path, hostname: str, key: paramiko.PKey) -> None:
    """Append `hostname keytype base64` to a known_hosts file (0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _pin_lock:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def _transport(sock, **kw) -> paramiko.Transport:
    """Prefer AES-GCM: one pass for cipher and MAC, measurably faster uploads in paramiko."""
    t = paramiko.Transport(sock, **kw)
    opts = t.get_security_options()
    fast = [c for c in ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com") if c in opts.ciphers]
    opts.ciphers = tuple(fast + [c for c in opts.ciphers if c not in fast])
    return t


def known_name(host: Host) -> str:
    return host.address if host.port == 22 else f"[{host.address}]:{host.port}"


class Connection:
    """A lazily opened SSH connection to `host`. Not thread-safe: one per thread."""

    def __init__(self, host: Host, *, known_hosts: Path, read_only_known_hosts: Iterable[Path] = (),
                 accept: Iterable[str] = (), connect_timeout: float = 10.0, command_timeout: float = 60.0):
        self.host = host
        self.label = host.label
        self.known_hosts = Path(known_hosts)
        self.read_only_known_hosts = [Path(p) for p in read_only_known_hosts]
        self.accept = set(accept)
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._jump: Connection | None = None

    @classmethod
    def to(cls, cluster: Cluster, host: Host, accept: Iterable[str] = ()) -> "Connection":
        pin, ro = cluster.known_hosts_files()
        return cls(host, known_hosts=pin, read_only_known_hosts=ro, accept=accept,
                   connect_timeout=cluster.connect_timeout, command_timeout=cluster.command_timeout)

    def clone(self) -> "Connection":
        """Another connection to the same host (one per thread: parallel uploads)."""
        return Connection(self.host, known_hosts=self.known_hosts, read_only_known_hosts=self.read_only_known_hosts,
                          accept=self.accept, connect_timeout=self.connect_timeout,
                          command_timeout=self.command_timeout)

    # ----- lifecycle ---------------------------------------------------------
    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def client(self) -> paramiko.SSHClient:
        if self._client is None or not self._client.get_transport() or not self._client.get_transport().is_active():
            self.close()
            self._client = self._connect()
        return self._client

    @property
    def connected(self) -> bool:
        t = self._client.get_transport() if self._client else None
        return bool(t and t.is_active())

    def _connect(self) -> paramiko.SSHClient:
        h = self.host
        client = paramiko.SSHClient()
        for p in self.read_only_known_hosts:
            if p.is_file():
                try:
                    client.load_system_host_keys(str(p))
                except (OSError, paramiko.SSHException):
                    pass  # an unreadable user file must not open the door: the key is just unknown
        if self.known_hosts.is_file():
            client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(_PinPolicy(self.label, self.accept, self.known_hosts))
        sock = None
        if h.jump is not None:
            self._jump = Connection(h.jump, known_hosts=self.known_hosts, read_only_known_hosts=self.read_only_known_hosts,
                                    accept=self.accept, connect_timeout=self.connect_timeout,
                                    command_timeout=self.command_timeout)
            try:
                sock = self._jump.client.get_transport().open_channel(
                    "direct-tcpip", (h.address, h.port), ("127.0.0.1", 0), timeout=self.connect_timeout)
            except SSHError:
                raise
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise Unreachable(self.label, f"jump host {h.jump.label} could not open a tunnel: {exc}") from None
        try:
            client.connect(h.address, port=h.port, username=h.user, key_filename=h.identity_file,
                           allow_agent=True, look_for_keys=h.identity_file is None, sock=sock,
                           timeout=self.connect_timeout, banner_timeout=self.connect_timeout,
                           auth_timeout=self.connect_timeout, channel_timeout=self.connect_timeout,
                           transport_factory=_transport)
        except SSHError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyChanged(self.label, exc.expected_key, exc.key, str(self.known_hosts)) from None
        except paramiko.PasswordRequiredException:
            client.close()
            raise AuthFailed(self.label, f"key {h.identity_file} is protected by a passphrase; Layerflow never "
                                         f"stores one: add the key to your ssh-agent (ssh-add {h.identity_file})"
                             ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            how = f"key {h.identity_file}" if h.identity_file else "the ssh-agent and default keys"
            raise AuthFailed(self.label, f"authentication failed with {how} ({exc})") from None
        except (socket.timeout, TimeoutError) as exc:
            client.close()
            raise Unreachable(self.label, f"no answer within {self.connect_timeout:g} s ({exc or 'timeout'})") from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            client.close()
            raise Unreachable(self.label, f"cannot connect: {exc}") from None
        return client

    def close(self) -> None:
        for obj in (self._sftp, self._client, self._jump):
            if obj is not None:
                try:
                    obj.close()
                except Exception:  # closing a dead link may raise anything; it is gone either way
                    pass
        self._sftp = self._client = self._jump = None

    def _lost(self, exc: BaseException, what: str) -> ConnectionLost:
        self.close()  # a half-dead transport must not be reused: the next call reconnects
        timed_out = isinstance(exc, (socket.timeout, TimeoutError)) or "timeout" in str(exc).lower()
        cls = CommandTimeout if timed_out else ConnectionLost
        return cls(self.label, f"{what}: {exc or type(exc).__name__}")

    # ----- commands ----------------------------------------------------------
    def run(self, command: str, *, timeout: float | None = None, check: bool = True,
            stdin: bytes | None = None) -> Result:
        """Run a shell command; drain stdout and stderr together; time out (and drop the
        connection) after `timeout` seconds, so a dead peer cannot hang the caller."""
        timeout = timeout or self.command_timeout
        deadline = time.monotonic() + timeout
        transport = self.client.get_transport()
        try:
            chan = transport.open_session(timeout=min(timeout, self.connect_timeout))
            chan.settimeout(timeout)
            chan.exec_command(command)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            nap = 0.001
            quiet_since: float | None = None  # exit status in, no data since
            while True:
                got = False
                while chan.recv_ready():
                    out += chan.recv(1 << 16)
                    got = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(1 << 16)
                    got = True
                # sshd can send exit-status before the last stderr data (it reads the two pipes
                # separately); the channel's EOF comes after all of both streams. So: exit
                # status in, EOF in (or 2 s without data from a server that sends none), and
                # both buffers empty, then nothing more is coming.
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    if chan.eof_received or (quiet_since is not None and time.monotonic() - quiet_since > 2.0):
                        break
                    quiet_since = quiet_since if quiet_since is not None and not got else time.monotonic()
                if time.monotonic() > deadline:
                    chan.close()
                    raise socket.timeout(f"no exit within {timeout:g} s")
                if not transport.is_active():
                    raise EOFError("connection closed")
                if got:
                    nap = 0.001
                else:
                    time.sleep(nap)
                    nap = min(nap * 2, 0.02)
            status = chan.recv_exit_status()
            chan.close()
        except SSHError:
            raise
        except (socket.timeout, TimeoutError, OSError, EOFError, paramiko.SSHException) as exc:
            raise self._lost(exc, f"running {command[:80]!r}") from None
        res = Result(status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
        if check and not res.ok:
            raise CommandFailed(self.label, command, res)
        return res

    def alive(self, timeout: float = 5.0) -> bool:
        """Our own liveness check: a round trip must complete within `timeout`."""
        try:
            return self.run("true", timeout=timeout, check=False).ok
        except SSHError:
            return False

    # ----- files (SFTP) ------------------------------------------------------
    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None or self._sftp.get_channel().closed:
            client = self.client
            try:
                self._sftp = client.open_sftp()
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise self._lost(exc, "opening SFTP") from None
            self._sftp.get_channel().settimeout(self.command_timeout)
        return self._sftp

    def _sftp_call(self, what: str, fn: Callable):
        sftp = self.sftp
        try:
            return fn(sftp)
        except FileNotFoundError:
            raise
        except PermissionError as exc:
            raise SSHError(self.label, f"{what}: permission denied ({exc})") from None
        except (socket.timeout, TimeoutError, OSError, EOFError, paramiko.SSHException) as exc:
            if isinstance(exc, OSError) and not isinstance(exc, (socket.timeout, TimeoutError)) \
                    and self.connected and not self._sftp.get_channel().closed:
                raise SSHError(self.label, f"{what}: {exc}") from None
            raise self._lost(exc, what) from None

    def home(self) -> str:
        return self._sftp_call("home folder", lambda s: s.normalize("."))

    def abspath(self, path: str) -> str:
        """Expand a leading ~ to the remote home (SFTP does not, and quoting stops the shell)."""
        if path == "~" or path.startswith("~/"):
            return self.home() + path[1:]
        return path

    def stat_size(self, path: str) -> int | None:
        try:
            return self._sftp_call(f"stat {path}", lambda s: s.stat(path).st_size)
        except FileNotFoundError:
            return None

    def read_range(self, path: str, offset: int, max_bytes: int = 4 << 20) -> bytes:
        """Bytes of `path` from `offset` (b'' when the file is missing or not longer)."""
        def go(s):
            with s.open(path, "rb") as f:
                f.seek(offset)
                return f.read(max_bytes)
        try:
            return self._sftp_call(f"read {path}", go)
        except FileNotFoundError:
            return b""

    def read_text(self, path: str) -> str | None:
        def go(s):
            with s.open(path, "rb") as f:
                return f.read()
        try:
            return self._sftp_call(f"read {path}", go).decode("utf-8", "replace")
        except FileNotFoundError:
            return None

    def write_bytes(self, path: str, data: bytes, mode: int | None = None) -> None:
        def go(s):
            with s.open(path, "wb") as f:
                f.set_pipelined(True)
                f.write(data)
            if mode is not None:
                s.chmod(path, mode)
        self._sftp_call(f"write {path}", go)

    def put(self, local: str | os.PathLike, remote: str, progress: Callable[[int, int], None] | None = None) -> None:
        """Upload with pipelined writes (paramiko's put: ~200x faster than unpipelined)."""
        self._sftp_call(f"upload {remote}", lambda s: s.put(str(local), remote, callback=progress, confirm=True))

    def put_range(self, local: str | os.PathLike, remote: str, offset: int, length: int,
                  progress: Callable[[int], None] | None = None, chunk: int = 1 << 18) -> None:
        """Write bytes [offset, offset+length) of a local file into an existing remote file
        at the same offset, with pipelined writes (replies are checked at close)."""
        def go(s):
            with open(local, "rb") as src, s.open(remote, "r+b") as out:
                out.set_pipelined(True)
                src.seek(offset)
                out.seek(offset)
                left = length
                while left:
                    data = src.read(min(chunk, left))
                    if not data:
                        raise OSError(f"{local} is shorter than expected")
                    out.write(data)
                    left -= len(data)
                    if progress:
                        progress(len(data))
        self._sftp_call(f"upload {remote}", go)

    def get(self, remote: str, local: str | os.PathLike, progress: Callable[[int, int], None] | None = None) -> None:
        self._sftp_call(f"download {remote}", lambda s: s.get(remote, str(local), callback=progress))

    def listdir(self, path: str) -> list[paramiko.SFTPAttributes]:
        return self._sftp_call(f"list {path}", lambda s: s.listdir_attr(path))
