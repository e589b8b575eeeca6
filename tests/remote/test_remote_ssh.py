"""Profiles, ssh config import, and SSH against a real sshd: host keys, commands, SFTP."""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from remote.cluster import ClusterError, ClusterStore, hosts_from_ssh_config, parse_cluster, parse_host
from remote.ssh import (AuthFailed, CommandFailed, CommandTimeout, Connection, ConnectionLost, HostKeyChanged,
                        UnknownHostKey, Unreachable)

from sshd_helpers import Relay, keygen


def conn(env, i=0, known_hosts=None, accept=(), **kw):
    c = parse_cluster(env.cluster("t", env.root / "w", known_hosts=str(known_hosts or env.known_hosts)))
    return Connection.to(c, c.hosts[i].model_copy(update=kw), accept=accept)


def test_store_roundtrip_and_errors(config_dir, ssh_env):
    store = ClusterStore()
    assert store.names() == []
    c = parse_cluster(ssh_env.cluster("gpu-box", ssh_env.root / "w"))
    store.save(c)
    assert (config_dir / "clusters.json").is_file()
    assert store.get("gpu-box") == c
    with pytest.raises(ClusterError, match="no cluster named 'nope'.*gpu-box"):
        store.get("nope")
    store.remove("gpu-box")
    assert store.names() == []
    with pytest.raises(ClusterError, match=r"hosts.0.port"):
        parse_cluster({"name": "x", "hosts": [{"address": "h", "port": 0}]})
    with pytest.raises(ClusterError, match="name"):
        parse_cluster({"name": "bad name; rm -rf", "hosts": [{"address": "h"}]})
    h = parse_host("alice@[::1]:2222")
    assert (h.user, h.address, h.port) == ("alice", "::1", 2222)


def test_import_ssh_config(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text("""
Host bastion
    HostName bastion.example.org
    User jump
    Port 2200
Host gpu1
    HostName 10.0.0.5
    User alice
    IdentityFile ~/.ssh/id_gpu
    ProxyJump bastion
Host gpu2
    HostName 10.0.0.6
    ProxyJump carol@bastion:2201
Host *
    ServerAliveInterval 30
""")
    hosts = hosts_from_ssh_config(cfg)
    assert sorted(hosts) == ["bastion", "gpu1", "gpu2"]
    g1 = hosts["gpu1"]
    assert (g1.address, g1.user, g1.port) == ("10.0.0.5", "alice", 22)
    assert g1.identity_file.endswith("/.ssh/id_gpu") and not g1.identity_file.startswith("~")
    assert (g1.jump.address, g1.jump.user, g1.jump.port) == ("bastion.example.org", "jump", 2200)
    assert (hosts["gpu2"].jump.user, hosts["gpu2"].jump.port) == ("carol", 2201)
    assert hosts["bastion"].jump is None


def test_run_drains_both_streams_and_quotes(sshd_pair):
    with conn(sshd_pair) as c:
        # 3 MB on each stream at once: a reader that drains only one side would deadlock.
        r = c.run("head -c 3000000 /dev/zero | tr '\\0' a; head -c 3000000 /dev/zero | tr '\\0' b >&2; exit 3",
                  check=False)
        assert r.exit_status == 3 and len(r.stdout) == 3_000_000 and len(r.stderr) == 3_000_000
        hostile = "a b; echo PWNED $(id) `id` 'q' \"d\" \\"
        assert c.run("printf %s " + shlex.quote(hostile)).stdout == hostile
        with pytest.raises(CommandFailed, match="exited with 7"):
            c.run("echo boom >&2; exit 7")
        with pytest.raises(CommandTimeout):
            c.run("sleep 5", timeout=0.5)
        assert c.alive()  # reconnects after the timeout dropped the link


def test_sftp_ranges(sshd_pair, tmp_path):
    p = tmp_path / "f.txt"
    with conn(sshd_pair) as c:
        c.write_bytes(str(p), b"line1\nline2\npart")
        assert c.read_range(str(p), 6) == b"line2\npart"
        assert c.read_range(str(tmp_path / "missing"), 0) == b""
        assert c.stat_size(str(p)) == 16 and c.stat_size(str(tmp_path / "missing")) is None
        assert c.abspath("~/x") == str(Path.home() / "x")


def test_unknown_host_key_needs_its_fingerprint(sshd_pair, tmp_path):
    kh = tmp_path / "kh"  # empty: the host is unknown
    with pytest.raises(UnknownHostKey) as ei:
        conn(sshd_pair, known_hosts=kh).run("true")
    fp = ei.value.fingerprint
    # the same fingerprint ssh-keygen prints for the server's public key
    out = subprocess.run(["ssh-keygen", "-lf", str(sshd_pair.servers[0].host_key) + ".pub"],
                         capture_output=True, text=True, check=True).stdout
    assert fp.startswith("SHA256:") and fp in out and fp in str(ei.value)
    assert not kh.exists()  # nothing pinned without consent
    with pytest.raises(UnknownHostKey):
        conn(sshd_pair, known_hosts=kh, accept=["SHA256:somethingelse"]).run("true")
    with conn(sshd_pair, known_hosts=kh, accept=[fp]) as c:
        assert c.run("echo ok").stdout == "ok\n"
    assert f"[{sshd_pair.servers[0].addr}]:{sshd_pair.servers[0].port}" in kh.read_text()
    with conn(sshd_pair, known_hosts=kh) as c:  # pinned: no acceptance needed any more
        assert c.alive()


def test_changed_host_key_is_refused(sshd_pair, tmp_path):
    other = keygen(tmp_path / "other")
    kind, b64 = (tmp_path / "other.pub").read_text().split()[:2]
    s = sshd_pair.servers[0]
    kh = tmp_path / "kh"
    kh.write_text(f"[{s.addr}]:{s.port} {kind} {b64}\n")
    before = kh.read_text()
    with pytest.raises(HostKeyChanged, match="HOST KEY CHANGED") as ei:
        conn(sshd_pair, known_hosts=kh, accept=["anything"]).run("true")
    # even passing the new fingerprint as "accepted" does not override a changed key
    with pytest.raises(HostKeyChanged):
        conn(sshd_pair, known_hosts=kh, accept=[ei.value.fingerprint]).run("true")
    assert kh.read_text() == before


def test_unreachable_and_bad_key(sshd_pair, tmp_path):
    port = Relay(("127.0.0.1", 9)).port  # a free port nobody listens on
    with pytest.raises(Unreachable, match="cannot connect"):
        conn(sshd_pair, port=port).run("true")
    with pytest.raises(AuthFailed, match="authentication failed"):
        conn(sshd_pair, identity_file=str(keygen(tmp_path / "stranger"))).run("true")
    locked = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(locked)], check=True)
    with pytest.raises(AuthFailed, match="passphrase.*ssh-add"):
        conn(sshd_pair, identity_file=str(locked)).run("true")


def test_jump_host(sshd_pair):
    """127.0.0.3 reached through 127.0.0.2 (direct-tcpip channel), both keys verified."""
    jump = parse_cluster(sshd_pair.cluster("t", sshd_pair.root)).hosts[0]
    with conn(sshd_pair, i=1, jump=jump) as c:
        assert c.run("echo $SSH_CONNECTION").stdout.split()[2] == "127.0.0.3"
        assert c._jump is not None and c._jump.connected  # the tunnel runs through the jump host
    bad = parse_cluster(sshd_pair.cluster("t", sshd_pair.root)).hosts[0].model_copy(update={"port": 1})
    with pytest.raises(Unreachable, match="cannot connect"):
        conn(sshd_pair, i=1, jump=bad).run("true")


def test_silent_dead_link_times_out_instead_of_hanging(sshd_pair, tmp_path, relay_factory):
    """paramiko's keepalive never notices a link that just goes quiet; every call here has
    a timeout, and after one the connection is dropped and the next call reconnects."""
    s = sshd_pair.servers[0]
    relay = relay_factory((s.addr, s.port))
    kh = tmp_path / "kh"
    kh.write_text(s.public_key_line().replace(f"[{s.addr}]:{s.port}", f"[127.0.0.1]:{relay.port}") + "\n")
    c = parse_cluster(sshd_pair.cluster("t", tmp_path, n_hosts=1, known_hosts=str(kh), command_timeout=2,
                                        connect_timeout=2))
    with Connection.to(c, c.hosts[0].model_copy(update={"address": "127.0.0.1", "port": relay.port})) as conn:
        assert conn.run("echo hi").stdout == "hi\n"
        (tmp_path / "f").write_bytes(b"a\nb\n")
        relay.frozen.set()
        with pytest.raises(CommandTimeout):
            conn.run("echo hi", timeout=1.5)
        assert not conn.connected
        assert not conn.alive(timeout=1.5)
        relay.frozen.clear()
        assert conn.alive()  # a fresh connection
        relay.frozen.set()
        with pytest.raises(ConnectionLost):
            conn.read_range(str(tmp_path / "f"), 0)  # SFTP calls time out too
        relay.frozen.clear()
        assert conn.read_range(str(tmp_path / "f"), 2) == b"b\n"
