"""Helpers for the remote tests (imported by conftest.py and the tests). Real OpenSSH for the remote tests: two sshd "hosts" on 127.0.0.2 and 127.0.0.3.

Each sshd has generated host keys, its own config and log; the client key and the
known_hosts file are generated too (the user's ~/.ssh is never read: profiles set
`known_hosts` and `identity_file`). Servers are session-scoped (one pair per xdist
worker, on free ports); a test that kills one restarts it. `Relay` is a tiny TCP
forwarder a test puts in front of sshd and stops to cut a connection mid-run.
"""
from __future__ import annotations

import getpass
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

SSHD = os.environ.get("LAYERFLOW_TEST_SSHD", "/usr/sbin/sshd")  # another path: the newcomer test
REMOTE_PYTHON = sys.executable  # the "cluster" runs the interpreter running this (tests, bench/deploy.py)
ADDRS = ("127.0.0.2", "127.0.0.3")
USER = getpass.getuser()  # sshd logs in the user running the tests (root here)


def free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def keygen(path: Path, kind: str = "ed25519") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "layerflow-test", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)
    return path


def wait_port(addr: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {addr}:{port} after {timeout} s")


class Sshd:
    """One OpenSSH server on addr:port with its own host key."""

    def __init__(self, root: Path, addr: str, authorized_keys: Path, extra: tuple[str, ...] = ()):
        self.root, self.addr = root, addr
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port(addr)
        self.host_key = keygen(root / "host_ed25519")
        self.config = root / "sshd_config"
        self.log = root / "sshd.log"
        self.pidfile = root / "sshd.pid"
        self.config.write_text("\n".join([
            f"Port {self.port}", f"ListenAddress {addr}", f"HostKey {self.host_key}", f"PidFile {self.pidfile}",
            f"AuthorizedKeysFile {authorized_keys}", "UsePAM no", "StrictModes no", "PermitRootLogin yes",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "Subsystem sftp internal-sftp",
            "AllowTcpForwarding yes", "MaxStartups 100:30:200", "MaxSessions 100", "LogLevel ERROR", *extra, ""]))
        self.proc: subprocess.Popen | None = None

    def public_key_line(self) -> str:
        kind, b64 = Path(str(self.host_key) + ".pub").read_text().split()[:2]
        return f"[{self.addr}]:{self.port} {kind} {b64}"

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return  # (running: a second daemon would fail to bind, and the first be left behind)
        try:
            Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation dir (needed as root)
        except PermissionError:
            pass  # not root: sshd runs without privilege separation
        # -D: stay in the foreground so we own the process; -e off, -E: log to our file.
        self.proc = subprocess.Popen([SSHD, "-D", "-f", str(self.config), "-E", str(self.log)],
                                     stdin=subprocess.DEVNULL)
        wait_port(self.addr, self.port)

    def stop(self) -> None:
        """The daemon stops listening; the sessions it serves go on (as OpenSSH's do)."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def lose(self) -> None:
        """The host is gone: the daemon and every session it serves end at once."""
        sessions = _descendants(self.proc.pid) if self.proc else []
        self.stop()
        for pid in sessions:
            try:
                os.kill(pid, 9)
            except OSError:
                pass


def _descendants(pid: int) -> list[int]:
    """Every process below pid (from /proc's parent links)."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
                parent[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


class Relay:
    """A threaded TCP relay listen_addr:port -> target; stop() cuts every connection."""

    def __init__(self, target: tuple[str, int], addr: str = "127.0.0.1"):
        self.target, self.addr = target, addr
        self.port = free_port(addr)
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._server: socket.socket | None = None
        self.frozen = threading.Event()  # set: bytes stop flowing, sockets stay open (a silent dead link)

    def start(self) -> "Relay":
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((self.addr, self.port))
        srv.listen(64)
        self._server = srv
        threading.Thread(target=self._accept, args=(srv,), daemon=True).start()
        return self

    def _accept(self, srv: socket.socket) -> None:
        while True:
            try:
                a, _ = srv.accept()
            except OSError:
                return
            try:
                b = socket.create_connection(self.target, timeout=5)
            except OSError:
                a.close()
                continue
            with self._lock:
                self._socks += [a, b]
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(x, y), daemon=True).start()

    def _pump(self, x: socket.socket, y: socket.socket) -> None:
        try:
            while True:
                data = x.recv(65536)
                if not data:
                    break
                while self.frozen.is_set():  # hold the bytes: the peer sees silence, not a reset
                    time.sleep(0.05)
                y.sendall(data)
        except OSError:
            pass
        for s in (x, y):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        """Cut: stop listening and reset every relayed connection."""
        if self._server:
            try:  # wakes the thread blocked in accept(); close() alone would keep the port bound
                self._server.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._server.close()
            self._server = None
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


class SshEnv:
    def __init__(self, root: Path):
        self.root = root
        self.client_key = keygen(root / "client_ed25519")
        self.authorized = root / "authorized_keys"
        self.authorized.write_text(Path(str(self.client_key) + ".pub").read_text())
        self.servers = [Sshd(root / f"sshd-{a}", a, self.authorized) for a in ADDRS]
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text("".join(s.public_key_line() + "\n" for s in self.servers))

    def host(self, i: int = 0, **kw) -> dict:
        s = self.servers[i]
        return {"address": s.addr, "port": s.port, "user": USER, "identity_file": str(self.client_key), **kw}

    def cluster(self, name: str, workdir: Path, n_hosts: int = 2, **kw) -> dict:
        data = {"name": name, "hosts": [self.host(i) for i in range(n_hosts)], "workdir": str(workdir),
                "python": REMOTE_PYTHON, "known_hosts": str(self.known_hosts), "connect_timeout": 5,
                "command_timeout": 30, "env": {"OMP_NUM_THREADS": "1"}}
        data.update(kw)
        return data

    def ensure_running(self) -> None:
        for s in self.servers:
            if s.proc is None or s.proc.poll() is not None:
                s.start()


def cwd_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def lose_host(job, node, server: Sshd) -> None:
    """The host of `node` (a deployed job's) is gone: every process of the job there killed
    (the hosts share this machine: those whose folder is the node's), then its sshd and every
    session it serves (Sshd.lose). test_elastic.py and bench/recovery_cost.py."""
    from remote.jobctl import job_pids

    pid = int(Path(node.jobdir, f"node{node.index}.pid").read_text())
    for p in [q for q in job_pids(job.token, pid) + [pid] if cwd_of(q).startswith(node.jobdir)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    server.lose()


def relayed_cluster(sshd_pair, tmp_path: Path, relay) -> dict:
    """A one-host cluster profile whose SSH goes through `relay` (a conftest Relay to the
    pair's first server): its host key known under the relay's port; torchrun's
    rendezvous on 127.0.0.2."""
    s = sshd_pair.servers[0]
    kh = tmp_path / "kh"
    kh.write_text(sshd_pair.known_hosts.read_text() + s.public_key_line().replace(
        f"[{s.addr}]:{s.port}", f"[127.0.0.1]:{relay.port}") + "\n")
    data = sshd_pair.cluster("relayed", tmp_path / "work", n_hosts=1, rdzv_port=free_port("127.0.0.2"),
                             known_hosts=str(kh), command_timeout=15)
    data["hosts"][0].update(address="127.0.0.1", port=relay.port, rdzv_address="127.0.0.2")
    return data
