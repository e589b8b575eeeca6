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
