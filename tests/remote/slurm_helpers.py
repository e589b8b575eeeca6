"""A real Slurm cluster for the tests: munged, slurmctld and two slurmd "nodes".

Each node is a network namespace of its own (`ip netns`, a veth pair on a bridge in
the root namespace, addresses in 198.18.0.0/15, the range set aside for network
tests), so the two slurmd listen on their own addresses and torchrun's rendezvous
and gloo go between them as between two machines; the file system is shared, as a
cluster's is. slurmd is entered into its namespace with `nsenter --net` (not `ip netns
exec`, which remounts /sys and hides the cgroup file system slurmd reads). Where
namespaces cannot be made (no CAP_NET_ADMIN), the cluster has one node on 127.0.0.1.

Everything lives under one temporary folder (munge key and socket, slurm.conf, state,
spool, logs); the login node is a real sshd (sshd_helpers.Sshd) whose sessions get
SLURM_CONF, as a login node's users get /etc/slurm/slurm.conf. stop() cancels every
job, stops the daemons, kills what is left in the namespaces and removes them.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "scancel", "srun")
IFNAME = "lfnet"  # the interface name inside every node's namespace (GLOO_SOCKET_IFNAME)


def missing_slurm() -> str | None:
    """Why a real Slurm cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "the Slurm tests start munged, slurmctld and slurmd, which needs root"
    gone = [b for b in SLURM_BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if gone:
        return (f"Slurm is not installed (no {', '.join(gone)}): install it with "
                f"`sudo apt-get install slurm-wlm munge` (the CI script does)")
    return None


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_port(addr: str = "0.0.0.0") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _run(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, **kw)


class SlurmCluster:
    def __init__(self, root: Path, nodes: int = 2):
        self.root = root
        self.tag = f"{os.getpid() % 100000}"
        self.want_nodes = nodes
        self.netns: list[str] = []
        self.bridge: str | None = None
        self.veths: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.node_names: list[str] = []
        self.node_addrs: list[str] = []
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # ----- network -------------------------------------------------------------------
    def _make_network(self) -> bool:
        octet = 18 if os.getpid() % 2 == 0 else 19
        third = os.getpid() % 250 + 1
        net = f"198.{octet}.{third}"
        bridge = f"lfbr{self.tag}"[:15]
        if _run("ip", "link", "add", bridge, "type", "bridge", check=False).returncode != 0:
            return False
        self.bridge = bridge
        try:
            _run("ip", "addr", "add", f"{net}.1/24", "dev", bridge)
            _run("ip", "link", "set", bridge, "up")
            for i in range(1, self.want_nodes + 1):
                ns, veth = f"lfslurm{self.tag}n{i}", f"lfv{self.tag}n{i}"[:15]
                _run("ip", "netns", "add", ns)
                self.netns.append(ns)
                _run("ip", "link", "add", veth, "type", "veth", "peer", "name", IFNAME, "netns", ns)
                self.veths.append(veth)
                _run("ip", "link", "set", veth, "master", bridge, "up")
                _run("ip", "-n", ns, "addr", "add", f"{net}.{i + 1}/24", "dev", IFNAME)
                _run("ip", "-n", ns, "link", "set", IFNAME, "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                self.node_names.append(f"lfn{i}")
                self.node_addrs.append(f"{net}.{i + 1}")
        except subprocess.CalledProcessError:
            self._remove_network()
            return False
        self.ctl_addr = f"{net}.1"
        return True

    def _remove_network(self) -> None:
        for ns in self.netns:
            pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
            for p in pids:  # whatever a job left in this node
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
            _run("ip", "netns", "del", ns, check=False)
        for v in self.veths:
            _run("ip", "link", "del", v, check=False)
        if self.bridge:
            _run("ip", "link", "del", self.bridge, check=False)
        self.netns, self.veths, self.bridge = [], [], None
        self.node_names, self.node_addrs = [], []

    @property
    def multi_node(self) -> bool:
        return bool(self.netns)

    # ----- daemons -------------------------------------------------------------------
    def start(self) -> "SlurmCluster":
        r = self.root
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        (r / "munge").chmod(0o755)
        self.munge_socket = r / "munge" / "munge.socket"
        _run(_which("munged"), "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
             f"--pid-file={r / 'munge' / 'munged.pid'}", f"--log-file={r / 'log' / 'munged.log'}",
             f"--seed-file={r / 'munge' / 'munged.seed'}")
        # LAYERFLOW_TEST_SLURM_NODES=1: the one-node cluster of a machine without namespaces
        one = os.environ.get("LAYERFLOW_TEST_SLURM_NODES") == "1"
        if one or not self._make_network():
            self.ctl_addr = "127.0.0.1"
            self.node_names, self.node_addrs = [socket.gethostname().split(".")[0]], ["127.0.0.1"]
        self.ctl_port = _free_port()
        self.slurmd_port = _free_port()
        self.write_conf()
        self.procs.append(subprocess.Popen([_which("slurmctld"), "-D", "-f", str(self.conf)], env=self.env,
                                           stdout=open(r / "log" / "slurmctld.out", "ab"), stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL))
        self._wait(lambda: _run("scontrol", "ping", env=self.env, check=False).stdout.count("UP") >= 1,
                   "slurmctld answers")
        for i, name in enumerate(self.node_names):
            cmd = [_which("slurmd"), "-D", "-N", name, "-f", str(self.conf)]
            if self.netns:
                cmd = ["nsenter", f"--net=/run/netns/{self.netns[i]}", *cmd]
            self.procs.append(subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL,
                                               stdout=open(r / "log" / f"slurmd-{name}.out", "ab"),
                                               stderr=subprocess.STDOUT))
        self._wait(lambda: self.idle_nodes() == len(self.node_names), "every slurmd registered (nodes idle)")
        return self

    def write_conf(self, extra: str = "") -> None:
        r = self.root
        host = socket.gethostname().split(".")[0]
        nodes = "\n".join(f"NodeName={n} NodeAddr={a} CPUs=2 RealMemory=1000 State=UNKNOWN"
                          for n, a in zip(self.node_names, self.node_addrs))
        names = ",".join(self.node_names)
        self.conf.write_text(f"""ClusterName=lftest
SlurmctldHost={host}({self.ctl_addr})
SlurmctldPort={self.ctl_port}
SlurmdPort={self.slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}/%n
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'spool'}/slurmd-%n.pid
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log'}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={r / 'jobcomp.txt'}
MpiDefault=none
EnforcePartLimits=ALL
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
MinJobAge=600
{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=30 State=UP
PartitionName=capped Nodes={names} MaxNodes=1 MaxTime=30 State=UP
{extra}""")

    def _wait(self, pred, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a Slurm daemon exited ({p.args}): see {self.root / 'log'}")
            time.sleep(0.2)
        raise RuntimeError(f"Slurm: not reached in {timeout:g} s: {what} (logs in {self.root / 'log'})")

    def idle_nodes(self) -> int:
        out = _run("sinfo", "-h", "-N", "-p", "debug", "-o", "%T", env=self.env, check=False).stdout.split()
        return sum(1 for s in out if s == "idle")

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster (sbatch, squeue, scontrol, ...)."""
        return _run(*args, env=self.env, check=check)

    def jobs(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()

    def steps(self) -> list[str]:
        return self.run("squeue", "-h", "-s", "-o", "%i", check=False).stdout.split()

    def stop(self) -> None:
        if self.procs:
            self.run("scancel", "--full", "--user=root", check=False)
            deadline = time.monotonic() + 30
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.3)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        self.procs = []
        self._remove_network()
        pid = self.root / "munge" / "munged.pid"
        if pid.exists():
            try:
                os.kill(int(pid.read_text().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
