"""Fixtures: a session-scoped pair of real sshd servers (see sshd_helpers.py)."""
import pytest

from sshd_helpers import Relay, SshEnv


MISSING_SSHD = ("openssh-server is not installed (no {sshd}): the remote tests start a real sshd on loopback; "
                "install it with `sudo apt-get install openssh-server openssh-client` (the CI script does)")


@pytest.fixture(scope="session")
def ssh_env(tmp_path_factory):
    import os
    import shutil

    from sshd_helpers import SSHD

    if not os.access(SSHD, os.X_OK) or shutil.which("ssh-keygen") is None:
        pytest.skip(MISSING_SSHD.format(sshd=SSHD))  # one line in the summary, not a traceback per test
    env = SshEnv(tmp_path_factory.mktemp("ssh"))
    for s in env.servers:
        s.start()
    yield env
    for s in env.servers:
        s.stop()


@pytest.fixture
def sshd_pair(ssh_env):
    ssh_env.ensure_running()
    return ssh_env


@pytest.fixture
def config_dir(tmp_path, monkeypatch):
    d = tmp_path / "config"
    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(d))
    return d


@pytest.fixture
def relay_factory():
    relays: list[Relay] = []

    def make(target: tuple[str, int]) -> Relay:
        r = Relay(target).start()
        relays.append(r)
        return r

    yield make
    for r in relays:
        r.stop()


class SlurmEnv:
    """A running Slurm cluster (slurm_helpers.SlurmCluster) and its login node, a real sshd
    on 127.0.0.4 whose sessions see the cluster's SLURM_CONF."""

    def __init__(self, cluster, login, ssh_env, known_hosts):
        self.cluster, self.login, self.ssh_env, self.known_hosts = cluster, login, ssh_env, known_hosts

    def profile(self, name: str, workdir, **kw) -> dict:
        from sshd_helpers import REMOTE_PYTHON, USER, free_port

        env = {"OMP_NUM_THREADS": "1"}
        if self.cluster.multi_node:  # the nodes' own interface, as NCCL/GLOO_SOCKET_IFNAME on a real cluster
            from slurm_helpers import IFNAME
            env["GLOO_SOCKET_IFNAME"] = IFNAME
        data = {"name": name, "backend": "slurm", "workdir": str(workdir), "python": REMOTE_PYTHON,
                "hosts": [{"address": self.login.addr, "port": self.login.port, "user": USER,
                           "identity_file": str(self.ssh_env.client_key)}],
                "known_hosts": str(self.known_hosts), "connect_timeout": 5, "command_timeout": 60,
                "partition": "debug", "env": env, "rdzv_port": free_port("127.0.0.1"),
                "nproc_per_node": 1 if self.cluster.multi_node else 2}
        data.update(kw)
        return data


@pytest.fixture(scope="session")
def slurm_env(ssh_env, tmp_path_factory):
    """One real Slurm cluster per test session (the Slurm tests share an xdist group)."""
    from slurm_helpers import SlurmCluster, missing_slurm
    from sshd_helpers import Sshd

    why = missing_slurm()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("slurm")
    cluster = SlurmCluster(root / "cluster")
    try:
        cluster.start()
        login = Sshd(root / "login", "127.0.0.4", ssh_env.authorized, extra=(f"SetEnv SLURM_CONF={cluster.conf}",))
        login.start()
    except BaseException:
        cluster.stop()
        raise
    known = root / "known_hosts"
    known.write_text(login.public_key_line() + "\n")
    yield SlurmEnv(cluster, login, ssh_env, known)
    login.stop()
    cluster.stop()
