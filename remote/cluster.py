"""Cluster profiles: which machines, how to reach them, where to work, which Python.

Profiles live in the user's config directory (platformdirs; LAYERFLOW_CONFIG_DIR
overrides it, which the tests use), never inside project files: a project names a
cluster, the profile says how to get there. Secrets are never stored: keys come
from identity files or the ssh-agent. Hosts can be imported from ~/.ssh/config.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Literal, Optional

from filelock import FileLock, Timeout
from pydantic import Field, ValidationError, field_validator, model_validator

from engine.errors import LayerflowError
from engine.schema import Strict
from engine.project import atomic_write

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ClusterError(LayerflowError, ValueError):
    """A bad or missing cluster profile; the message names the cluster and field."""


def config_dir() -> Path:
    """Layerflow's own config folder (profiles, job database, pinned host keys)."""
    env = os.environ.get("LAYERFLOW_CONFIG_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_config_dir("layerflow", appauthor=False))


_HOST_RE = re.compile(r"[A-Za-z0-9_.:%-]+")


class Host(Strict):
    address: str = Field(min_length=1)  # host name or IP that ssh connects to
    port: int = Field(22, ge=1, le=65535)
    user: Optional[str] = None  # None: the local user name
    identity_file: Optional[str] = None  # None: the ssh-agent (and default keys)
    jump: Optional["Host"] = None  # ProxyJump: reach `address` through this host
    rdzv_address: Optional[str] = None  # how the other nodes reach this one (default: address)

    @field_validator("address", "rdzv_address")
    @classmethod
    def _host_name(cls, v: str | None) -> str | None:
        """A host name or an IP address (v4, v6 with an optional %zone), checked before any
        lookup: shell metacharacters, spaces and a leading '-' are refused."""
        if v is None:
            return v
        if v.startswith("-") or not _HOST_RE.fullmatch(v) or len(v) > 253:
            raise ValueError(f"not a host name or IP address: {v!r}")
        return v

    @property
    def label(self) -> str:
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port != 22 else ""
        return f"{user}{self.address}{port}"


class Cluster(Strict):
    name: str
    hosts: list[Host] = Field(min_length=1)
    workdir: str = "~/layerflow"  # remote folder for bundles and jobs (~ = the remote home)
    python: str = "python3"  # interpreter (or venv's bin/python) on every host
    env: dict[str, str] = Field(default_factory=dict)  # extra environment for every rank
    backend: Literal["ssh", "slurm"] = "ssh"
    nproc_per_node: Optional[int] = Field(None, ge=1)  # None: one per GPU, else one per node... see launch
    rdzv_port: int = Field(29400, ge=1, le=65535)
    # restarts of a job's workers after a rank or node fails (torchrun --max-restarts); None: the
    # run's own training.restarts.max_restarts
    max_restarts: Optional[int] = Field(None, ge=0, le=100)
    # elastic bounds (torchrun --nnodes MIN:MAX): a job goes on with at least min_nodes of its
    # nodes when others are lost (the data axis shrinks, the global batch stays), and takes a
    # node back up to max_nodes. None: min, the fewest nodes the plan can run on; max, all it was
    # deployed on. min_nodes equal to the node count: the job needs every node (not elastic).
    min_nodes: Optional[int] = Field(None, ge=1)
    max_nodes: Optional[int] = Field(None, ge=1)
    known_hosts: Optional[str] = None  # None: Layerflow's own file + ~/.ssh/known_hosts (read only)
    # a folder every user of the cluster can write (group permissions): each job registers
    # itself in <shared_dir>/jobs/ and keeps its record current, so `jobs --all` sees everyone's
    shared_dir: Optional[str] = None
    # data sets already on the cluster: {a folder here: the same folder there}; a run whose
    # data set lies under a folder here reads it there (remote/node_data.py), checked by fingerprint
    data_paths: dict[str, str] = Field(default_factory=dict)
    connect_timeout: float = Field(10.0, gt=0)
    command_timeout: float = Field(60.0, gt=0)
    # Slurm only
    partition: Optional[str] = None
    time_limit: Optional[str] = None  # e.g. "02:00:00"
    gpus_per_node: Optional[int] = Field(None, ge=0)
    # seconds of warning Slurm gives before a preemption or the time limit (sbatch
    # --signal=B:USR1@N): the run checkpoints and stops within them, and the job is requeued
    # to go on; 0: no warning (Slurm's own SIGTERM at a preemption still checkpoints, within KillWait)
    preempt_grace_s: int = Field(60, ge=0, le=3600)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("use letters, digits, '_', '.', '-' (at most 64, not starting with a symbol)")
        return v

    @field_validator("data_paths")
    @classmethod
    def _data_paths(cls, v: dict[str, str]) -> dict[str, str]:
        for here, there in v.items():
            if not os.path.isabs(os.path.expanduser(here)):
                raise ValueError(f"{here!r}: the folder here must be an absolute path")
            if not there.startswith(("/", "~")):
                raise ValueError(f"{there!r}: the folder on the cluster must be absolute or start with ~")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not ENV_RE.match(k):
                raise ValueError(f"not an environment variable name: {k!r}")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> "Cluster":
        if self.min_nodes is not None and self.max_nodes is not None and self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) is above max_nodes ({self.max_nodes})")
        return self

    def with_settings(self, where: str, **settings) -> "Cluster":
        """This profile with some settings of one job's (those not None), checked as a
        profile is: e.g. deploy --min-nodes; the stored profile is unchanged."""
        given = {k: v for k, v in settings.items() if v is not None}
        if not given:
            return self
        return parse_cluster({**self.model_dump(mode="json"), **given}, where)

    def known_hosts_files(self) -> tuple[Path, list[Path]]:
        """(the file new keys are pinned in, files read only)."""
        if self.known_hosts:
            return Path(os.path.expanduser(self.known_hosts)), []
        return config_dir() / "known_hosts", [Path.home() / ".ssh" / "known_hosts"]


def _errors(exc: ValidationError, where: str) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e["loc"])
        parts.append(f"{loc}: {e['msg']}" if loc else e["msg"])
    return f"{where}: " + "; ".join(parts)


def parse_cluster(data: dict, where: str = "cluster") -> Cluster:
    try:
        return Cluster.model_validate(data)
    except ValidationError as exc:
        raise ClusterError(_errors(exc, where)) from None


def parse_host(spec: str, port: int | None = None, user: str | None = None,
               identity_file: str | None = None) -> Host:
    """'user@host:port' (as on a command line) -> Host."""
    u, _, rest = spec.rpartition("@")
    addr, p = rest, port
    m = re.match(r"^\[(.+)\]:(\d+)$", rest) or re.match(r"^([^:]+):(\d+)$", rest)
    if m:
        addr, p = m.group(1), int(m.group(2))
    try:
        return Host(address=addr, port=p or 22, user=u or user, identity_file=identity_file)
    except ValidationError as exc:
        raise ClusterError(_errors(exc, f"host {spec!r}")) from None


class ClusterStore:
    """clusters.json in the config dir: {name: profile}. Written atomically; a change
    (read, modify, write) holds clusters.json.lock (filelock) so that the CLI and the
    GUI saving at once both keep their profile. Reads need no lock."""

    LOCK_TIMEOUT_S = 30.0

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else config_dir() / "clusters.json"

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    @contextlib.contextmanager
    def _changing(self):
        """The profiles as they are now, for a change to write back before the lock goes."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(self.lock_path, timeout=self.LOCK_TIMEOUT_S):
                yield self._read()
        except Timeout:
            raise ClusterError(f"{self.path}: another Layerflow process has held {self.lock_path.name} "
                               f"for over {self.LOCK_TIMEOUT_S:.0f} s; try again") from None

    def _write(self, data: dict) -> None:
        atomic_write(self.path, json.dumps(data, indent=2, sort_keys=True).encode())

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise ClusterError(f"{self.path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ClusterError(f"{self.path}: expected an object of cluster profiles")
        return data

    def names(self) -> list[str]:
        return sorted(self._read())

    def all(self) -> list[Cluster]:
        return [self.get(n) for n in self.names()]

    def get(self, name: str) -> Cluster:
        data = self._read()
        if name not in data:
            known = ", ".join(sorted(data)) or "none yet; add one with `cluster add`"
            raise ClusterError(f"no cluster named {name!r} (known: {known})")
        return parse_cluster(data[name], f"cluster {name!r} in {self.path}")

    def save(self, cluster: Cluster) -> None:
        with self._changing() as data:
            data[cluster.name] = cluster.model_dump(mode="json", exclude_none=True)
            self._write(data)

    def remove(self, name: str) -> None:
        with self._changing() as data:
            if name not in data:
                raise ClusterError(f"no cluster named {name!r}")
            del data[name]
            self._write(data)


def hosts_from_ssh_config(path: str | os.PathLike | None = None,
                          names: list[str] | None = None) -> dict[str, Host]:
    """Host entries of an OpenSSH config (HostName, User, Port, IdentityFile, ProxyJump).

    `names`: the aliases to import; default every concrete (wildcard-free) Host line.
    ProxyJump may name another alias or user@host:port; only its first hop is used
    per level (chains become nested jump hosts).
    """
    import paramiko

    path = Path(path) if path else Path.home() / ".ssh" / "config"
    try:
        cfg = paramiko.SSHConfig.from_path(str(path))
    except FileNotFoundError:
        raise ClusterError(f"{path}: no such ssh config file") from None
    declared = sorted(h for h in cfg.get_hostnames() if not any(c in h for c in "*?!"))
    missing = [n for n in names or [] if n not in declared]
    if missing:
        raise ClusterError(f"{path}: no Host {', '.join(missing)} (declared: {', '.join(declared) or 'none'})")
    aliases = names or declared

    def resolve(alias: str, depth: int = 0) -> Host:
        if depth > 8:
            raise ClusterError(f"{path}: ProxyJump chain through {alias!r} is longer than 8 hops (a loop?)")
        o = cfg.lookup(alias)
        jump = None
        pj = o.get("proxyjump")
        if pj and pj.lower() != "none":
            hops = [h.strip() for h in pj.split(",") if h.strip()]
            # ProxyJump a,b: reach b through a, then the target through b.
            for hop in hops:
                h = resolve_spec(hop, depth + 1)
                jump = h.model_copy(update={"jump": jump}) if jump else h
        idf = o.get("identityfile")
        try:
            return Host(address=o.get("hostname", alias), port=int(o.get("port", 22)), user=o.get("user"),
                        identity_file=os.path.expanduser(idf[0]) if idf else None, jump=jump)
        except (ValidationError, ValueError) as exc:
            raise ClusterError(f"{path}: Host {alias}: {exc}") from None

    def resolve_spec(spec: str, depth: int) -> Host:
        user, _, rest = spec.rpartition("@")
        name, _, port = rest.partition(":")
        h = resolve(name, depth)
        upd = {}
        if user:
            upd["user"] = user
        if port:
            upd["port"] = int(port)
        return h.model_copy(update=upd)

    return {a: resolve(a) for a in aliases}
