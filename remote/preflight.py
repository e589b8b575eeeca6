"""Preflight: check every host, in parallel and with timeouts, before launching anything.

Per host: reachable (host key verified), Python and torch versions, GPUs (nvidia-smi
CSV, parsed defensively: no GPUs -> CPU processes), CPU count, free disk under the
work directory; then the rendezvous port: the first node listens on it and every
other node must connect to it. Any failure stops the deploy with the host and the
reason; `PreflightReport.table()` is what the CLI prints and the GUI shows.
"""
from __future__ import annotations

import csv
import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Iterable

from remote.cluster import Cluster
from remote.ssh import Connection, SSHError, UnknownHostKey, quote

# the PCI bus id first: nvidia-smi numbers GPUs in PCI bus order, CUDA by default fastest first;
# the runtime sets CUDA_DEVICE_ORDER=PCI_BUS_ID (engine/runtime/distributed/mesh.py), so a rank's
# cuda:LOCAL_RANK is the LOCAL_RANK-th GPU by bus id (of CUDA_VISIBLE_DEVICES, where set)
NVIDIA_QUERY = ("nvidia-smi --query-gpu=index,pci.bus_id,uuid,name,memory.total,memory.used,utilization.gpu "
                "--format=csv,noheader,nounits")
MIN_FREE_GB = 1.0


@dataclass
class GPU:
    index: int
    name: str
    memory_total_mb: float | None
    memory_used_mb: float | None
    utilization: float | None
    pci_bus_id: str | None = None  # "00000000:18:00.0" (older captures: None)
    uuid: str | None = None  # "GPU-5c8b..." (what CUDA_VISIBLE_DEVICES may name)

    @property
    def memory_free_mb(self) -> float | None:
        if self.memory_total_mb is None or self.memory_used_mb is None:
            return None
        return self.memory_total_mb - self.memory_used_mb


def _num(s: str) -> float | None:
    s = s.strip().rstrip("%").replace("MiB", "").strip()
    try:
        return float(s)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]", "[Unknown Error]"


_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")


def parse_nvidia_smi(text: str) -> tuple[list[GPU], list[str]]:
    """GPUs from NVIDIA_QUERY's output (`index,pci.bus_id,uuid,name,memory.total,memory.used,
    utilization.gpu --format=csv,noheader,nounits`; the older query without bus id and uuid
    is read too), and warnings for lines that could not be read.
    Driver errors ("NVIDIA-SMI has failed ...") and an empty output mean no GPUs."""
    gpus, warnings = [], []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        row = [c.strip() for c in next(csv.reader([line], skipinitialspace=True))]
        bus = uuid = None
        if len(row) >= 7 and _BUS_ID.match(row[1]):
            bus, uuid = row[1], row[2]
            row = [row[0], *row[3:]]
        if len(row) > 5:  # a comma inside the name: the name is everything between index and the last 3
            row = [row[0], ", ".join(row[1:-3])] + row[-3:]
        if len(row) != 5 or not row[0].isdigit():
            warnings.append(f"nvidia-smi line {lineno} not understood: {line[:120]}")
            continue
        gpus.append(GPU(int(row[0]), row[1], _num(row[2]), _num(row[3]), _num(row[4]), bus, uuid))
    return gpus, warnings


def cuda_order(gpus: list[GPU]) -> list[GPU]:
    """The GPUs as CUDA numbers them under CUDA_DEVICE_ORDER=PCI_BUS_ID (the runtime's): by
    PCI bus id (nvidia-smi's own index order too; the index where no bus id was captured)."""
    return sorted(gpus, key=lambda g: (g.pci_bus_id.lower().split(":", 1)[-1] if g.pci_bus_id else "", g.index))


def rank_gpus(gpus: list[GPU], nproc_per_node: int, visible: str | None = None) -> tuple[list[GPU], str | None]:
    """The GPUs local ranks 0..nproc_per_node-1 take (cuda:LOCAL_RANK), in rank order, and a
    problem, or None: CUDA_VISIBLE_DEVICES (`visible`, as the node's shell has it: indices
    in PCI order, GPU-/MIG- uuids or their prefixes) picks and orders them, else all GPUs
    in CUDA's order (cuda_order)."""
    ordered = cuda_order(gpus)
    if visible is not None and visible.strip() != "":
        chosen = []
        for item in (v.strip() for v in visible.split(",")):
            if item.isdigit():
                g = ordered[int(item)] if int(item) < len(ordered) else None
            else:
                g = next((x for x in ordered if x.uuid and x.uuid.lower().startswith(item.lower())), None)
            if g is None:  # CUDA stops at the first entry it cannot use
                break
            chosen.append(g)
        ordered = chosen
        if len(ordered) < nproc_per_node:
            return ordered, (f"CUDA_VISIBLE_DEVICES={visible} leaves {len(ordered)} GPU(s) for {nproc_per_node} "
                             f"processes per node")
    elif visible is not None:
        return [], f"CUDA_VISIBLE_DEVICES is empty: no GPU for the {nproc_per_node} processes per node"
    return ordered[:nproc_per_node], None


# Optional packages a run uses on a node when they are there (each run says so in its log
# when one is missing, and trains on): reported, never a failure.
OPTIONAL = {"tensorboard": "TensorBoard event files in the run folder",
            "nvidia-ml-py": "GPU utilisation in the system metrics (NVML)"}

# One command per host; each section is labelled so a missing tool only blanks its section.
PROBE = r"""
echo "@@python"; {py} -c 'import json, os, platform
from importlib import metadata
# the version from the package metadata: importing torch takes seconds on a busy node
try:
    t = {{"torch": metadata.version("torch")}}
except Exception as e:
    t = {{"torch": None, "torch_error": "%s: %s" % (type(e).__name__, e)}}
t.update(python=platform.python_version(), cpus=os.cpu_count(), hostname=platform.node(),
         mem_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
         cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
opt = {{}}
for name in {optional}:
    try:
        opt[name] = metadata.version(name)
    except Exception:
        opt[name] = None
t["optional"] = opt
print(json.dumps(t))' 2>&1
echo "@@nvidia"; if command -v nvidia-smi >/dev/null 2>&1; then {nvq} 2>&1; fi
echo "@@disk"; mkdir -p {wd} && df -Pk {wd} | tail -n 1
echo "@@network"; {network}
"""


def _network_probe() -> str:
    """A python program for the probe: the interface of this node that reaches argv[1]:argv[2]
    (the rendezvous address) and the node's interface names, as JSON. The runtime's own
    function (engine/runtime/distributed/mesh.py socket_ifname), so preflight says what the
    ranks will set."""
    import inspect

    from engine.runtime.distributed.mesh import socket_ifname

    return ("from __future__ import annotations\nimport json, socket, sys\n" + inspect.getsource(socket_ifname)
            + "\nprint(json.dumps({'ifname': socket_ifname(sys.argv[1], int(sys.argv[2])), "
              "'interfaces': [n for _, n in socket.if_nameindex()]}))\n")


@dataclass
class HostReport:
    host: str
    ok: bool = False
    error: str | None = None
    python: str | None = None
    torch: str | None = None
    cuda: str | None = None
    hostname: str | None = None
    cpus: int | None = None
    mem_bytes: int | None = None
    gpus: list[GPU] = field(default_factory=list)
    free_disk_gb: float | None = None
    rdzv_ok: bool | None = None
    warnings: list[str] = field(default_factory=list)
    optional: dict[str, str | None] = field(default_factory=dict)  # OPTIONAL's packages: version, or None when missing
    unknown_key: str | None = None  # the fingerprint to show the user when the host key is not known yet
    unknown_key_type: str | None = None
    cuda_visible_devices: str | None = None  # as the node's shell sets it (None: not set)
    socket_ifname: str | None = None  # the interface that reaches the rendezvous address (GLOO/NCCL_SOCKET_IFNAME)
    interfaces: list[str] = field(default_factory=list)  # the node's network interface names

    def optional_text(self) -> str:
        """The optional packages as the table shows them: "tensorboard 2.21.0" or "no tensorboard"
        (NVML's only on a host with GPUs)."""
        shown = [(k, v) for k, v in self.optional.items() if k != "nvidia-ml-py" or self.gpus]
        return ", ".join(f"{k} {v}" if v else f"no {k}" for k, v in shown) or "-"

    def fail(self, why: str) -> "HostReport":
        self.ok, self.error = False, self.error or why
        return self


@dataclass
class PreflightReport:
    hosts: list[HostReport]
    notes: list[str] = field(default_factory=list)  # e.g. the Slurm partition the login node reported

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    @property
    def failures(self) -> list[str]:
        return [f"{h.host}: {h.error}" for h in self.hosts if not h.ok]

    def to_dict(self) -> dict:
        return {"ok": self.ok, "hosts": [asdict(h) for h in self.hosts], "notes": list(self.notes)}

    def table(self) -> str:
        head = ["host", "ok", "python", "torch", "optional", "cpus", "gpus", "free disk", "rendezvous", "problem"]
        rows = []
        for h in self.hosts:
            gpus = ", ".join(f"{g.index}:{g.name} {g.memory_total_mb or 0:.0f}MiB" for g in h.gpus) or "-"
            rows.append([h.host, "yes" if h.ok else "NO", h.python or "-", h.torch or "-", h.optional_text(),
                         str(h.cpus or "-"), gpus,
                         f"{h.free_disk_gb:.1f} GB" if h.free_disk_gb is not None else "-",
                         {True: "ok", False: "FAILED", None: "-"}[h.rdzv_ok], h.error or ""])
        w = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
        fmt = "  ".join(f"{{:<{x}}}" for x in w)
        return "\n".join([*(fmt.format(*r).rstrip() for r in [head] + rows), *self.notes])


def sections(text: str) -> dict[str, list[str]]:
    """A probe's output cut at its "@@name" lines: {name: lines}."""
    out: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        if line.startswith("@@"):
            cur = line[2:]
            out[cur] = []
        elif cur:
            out[cur].append(line)
    return out


def probe_host(conn: Connection, cluster: Cluster, timeout: float) -> HostReport:
    rep = HostReport(conn.label)
    try:
        wd = conn.abspath(cluster.workdir)
        network = (f"{quote(cluster.python)} -c {quote(_network_probe())} {quote(rdzv_address(cluster))} "
                   f"{int(cluster.rdzv_port)} 2>&1")
        res = conn.run(PROBE.format(py=quote(cluster.python), nvq=NVIDIA_QUERY, wd=quote(wd),
                                    optional=repr(tuple(OPTIONAL)).replace("'", '"'), network=network),
                       timeout=timeout, check=False)
    except UnknownHostKey as exc:
        rep.unknown_key, rep.unknown_key_type = exc.fingerprint, exc.key_type
        return rep.fail(exc.reason)
    except SSHError as exc:
        return rep.fail(exc.reason)
    parts = sections(res.stdout)
    py = "\n".join(parts.get("python", []))
    try:
        info = json.loads(py.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return rep.fail(f"python {cluster.python!r} does not run: {py.strip()[-300:] or res.stderr.strip()[-300:]}"
                        f" (set the cluster's python to an interpreter that has torch)")
    rep.python, rep.torch, rep.cuda = info.get("python"), info.get("torch"), info.get("cuda")
    rep.cpus, rep.hostname, rep.mem_bytes = info.get("cpus"), info.get("hostname"), info.get("mem_bytes")
    cvd = info.get("cuda_visible_devices")
    rep.cuda_visible_devices = cvd if isinstance(cvd, str) else None
    if isinstance(info.get("optional"), dict):
        rep.optional = {k: v if isinstance(v, str) else None for k, v in info["optional"].items() if k in OPTIONAL}
    if not rep.torch:
        return rep.fail(f"torch is not importable by {cluster.python} ({info.get('torch_error')})")
    rep.gpus, rep.warnings = parse_nvidia_smi("\n".join(parts.get("nvidia", [])))
    try:
        net = json.loads((parts.get("network") or [""])[-1])
        rep.socket_ifname, rep.interfaces = net.get("ifname"), [str(n) for n in net.get("interfaces") or []]
    except (ValueError, AttributeError):
        pass  # (an interpreter too old for the probe: the runtime still sets them itself)
    disk = " ".join(parts.get("disk", [])).split()
    try:
        rep.free_disk_gb = int(disk[3]) / 1024 ** 2
    except (IndexError, ValueError):
        return rep.fail(f"cannot create or measure {wd}: {res.stderr.strip()[-300:]}")
    if rep.free_disk_gb < MIN_FREE_GB:
        return rep.fail(f"only {rep.free_disk_gb:.2f} GB free under {wd} (need {MIN_FREE_GB} GB)")
    rep.ok = True
    return rep


LISTEN = ("import socket, sys, time\n"
          "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64); s.settimeout(float(sys.argv[4]))\n"
          "print('listening', flush=True)\n"
          "n = 0\n"
          "try:\n"
          "    while n < int(sys.argv[3]):\n"
          "        s.accept()[0].close(); n += 1\n"
          "except OSError:\n"
          "    pass\n"
          "print('accepted', n)\n")



def rdzv_address(cluster: Cluster) -> str:
    h = cluster.hosts[0]
    return h.rdzv_address or h.address


def check_rendezvous(conns: list[Connection], cluster: Cluster, reports: list[HostReport], timeout: float) -> None:
    """The first node listens on the rendezvous port; every other node must reach it."""
    addr, port = rdzv_address(cluster), cluster.rdzv_port
    others = list(range(1, len(conns)))
    listen_res: dict = {}
    ready = threading.Event()

    def listen():
        try:
            cmd = (f"{quote(cluster.python)} -c {quote(LISTEN)} {quote(addr)} {port} {len(others)} {timeout:g}"
                   if others else
                   f"{quote(cluster.python)} -c {quote(LISTEN)} {quote(addr)} {port} 0 1")
            listen_res["r"] = conns[0].run(cmd, timeout=timeout + 10, check=False)
        except SSHError as exc:
            listen_res["e"] = exc
        ready.set()

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    if not others:
        t.join()
        r = listen_res.get("r")
        reports[0].rdzv_ok = bool(r and "listening" in r.stdout)
        if not reports[0].rdzv_ok:
            reports[0].fail(f"cannot listen on rendezvous port {addr}:{port} (in use? set the cluster's rdzv_port)"
                            + (f": {r.stderr.strip()[-200:]}" if r else ""))
        return
    # give the listener a moment to bind: dialers retry until it is up or time runs out
    dial = ("import socket, sys, time\nend = time.time() + float(sys.argv[3])\n"
            "while True:\n    try:\n        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()"
            "; print('connected'); break\n    except OSError as e:\n        if time.time() > end: print(e); sys.exit(1)\n"
            "        time.sleep(0.1)\n")

    def dialer(i):
        try:
            r = conns[i].run(f"{quote(cluster.python)} -c {quote(dial)} {quote(addr)} {port} {timeout:g}",
                             timeout=timeout + 10, check=False)
            ok = "connected" in r.stdout
            reports[i].rdzv_ok = ok
            if not ok:
                reports[i].fail(f"cannot reach the rendezvous {addr}:{port} on the first node: "
                                f"{(r.stdout + r.stderr).strip()[-200:]} (open the port or set rdzv_address)")
        except SSHError as exc:
            reports[i].fail(exc.reason)

    with ThreadPoolExecutor(len(others)) as ex:
        list(ex.map(dialer, others))
    t.join(timeout + 15)
    r = listen_res.get("r")
    reports[0].rdzv_ok = bool(r and "listening" in r.stdout)
    if not reports[0].rdzv_ok:
        why = listen_res.get("e") or (r.stderr.strip()[-200:] if r else "no answer")
        reports[0].fail(f"cannot listen on rendezvous port {addr}:{port} ({why}); is it in use? set rdzv_port")


def preflight(cluster: Cluster, *, accept: Iterable[str] = (), timeout: float | None = None,
              connections: list[Connection] | None = None, rendezvous: bool = True) -> PreflightReport:
    """Check every host of `cluster` in parallel; never raises for a host problem."""
    timeout = timeout or max(cluster.command_timeout, 60.0)  # importing torch on a busy node is slow
    own = connections is None
    conns = connections or [Connection.to(cluster, h, accept) for h in cluster.hosts]
    try:
        with ThreadPoolExecutor(len(conns)) as ex:
            reports = list(ex.map(lambda c: probe_host(c, cluster, timeout), conns))
        if rendezvous and all(r.ok for r in reports):
            check_rendezvous(conns, cluster, reports, timeout)
        return PreflightReport(reports, network_notes(cluster, reports))
    finally:
        if own:
            for c in conns:
                c.close()


SOCKET_ENVS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def network_notes(cluster: Cluster, reports: list[HostReport]) -> list[str]:
    """Several nodes: the network interface gloo and NCCL will bind on each (the profile's
    env, else the one that reaches the rendezvous address, which the runtime sets:
    engine/runtime/distributed/mesh.py set_socket_ifname), and a warning where the profile
    names an interface a node does not have."""
    if len(reports) < 2:
        return []
    env = {k: v for k, v in (getattr(cluster, "env", None) or {}).items() if k in SOCKET_ENVS}
    addr = f"{rdzv_address(cluster)}:{cluster.rdzv_port}"
    notes = []
    if len(env) == len(SOCKET_ENVS):
        notes.append("network: " + ", ".join(f"{k}={v}" for k, v in env.items()) + " (the profile's env)")
    else:
        per_host = ", ".join(f"{r.host} {r.socket_ifname or '?'}" for r in reports)
        notes.append(f"network: GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME set by the runtime to the interface that "
                     f"reaches the rendezvous address {addr}: {per_host}"
                     + (f"; the profile's env keeps {', '.join(f'{k}={v}' for k, v in env.items())}" if env else ""))
    gloo = env.get("GLOO_SOCKET_IFNAME")
    for r in reports:
        if gloo and r.interfaces and gloo not in r.interfaces:
            notes.append(f"WARNING {r.host}: GLOO_SOCKET_IFNAME={gloo} but the node's interfaces are "
                         f"{', '.join(r.interfaces)}: gloo will not start; fix the profile's env")
        elif not env and r.ok and r.socket_ifname is None:
            notes.append(f"WARNING {r.host}: no interface found that reaches {addr}: set GLOO_SOCKET_IFNAME and "
                         f"NCCL_SOCKET_IFNAME in the profile's env")
    return notes


def check_devices(report: PreflightReport, world_size: int, nproc_per_node: int,
                  peak_bytes: int | None = None) -> list[str]:
    """The plan against the real devices: enough GPUs on every node (or CPU processes),
    and, when the planner predicted a peak per rank, enough free memory on each GPU used."""
    errs = []
    nnodes = len(report.hosts)
    if nproc_per_node * nnodes != world_size:
        errs.append(f"the plan needs {world_size} processes but {nnodes} node(s) x {nproc_per_node} per node = "
                    f"{nnodes * nproc_per_node}; change placement (pp x dp x tp) or the cluster's nproc_per_node")
    for h in report.hosts:
        if h.gpus and len(h.gpus) < nproc_per_node:
            errs.append(f"{h.host}: {nproc_per_node} processes per node but only {len(h.gpus)} GPU(s)")
            continue
        if not h.gpus:
            continue
        # the GPUs the ranks will take: local rank r uses cuda:r, the r-th GPU in CUDA's order
        # (CUDA_DEVICE_ORDER=PCI_BUS_ID, which the runtime sets), of CUDA_VISIBLE_DEVICES where set
        used, problem = rank_gpus(h.gpus, nproc_per_node, h.cuda_visible_devices)
        if problem:
            errs.append(f"{h.host}: {problem}")
        if peak_bytes:
            need_mb = peak_bytes / 2 ** 20
            for r, g in enumerate(used):
                if g.memory_free_mb is not None and g.memory_free_mb < need_mb:
                    errs.append(f"{h.host}: GPU {g.index} ({g.name}), local rank {r}'s, has {g.memory_free_mb:.0f} "
                                f"MiB free but the plan needs {need_mb:.0f} MiB per rank; raise pp or tp, lower "
                                f"batch_size, or free the GPU")
                    break
    kinds = {bool(h.gpus) for h in report.hosts}
    if len(kinds) > 1:
        errs.append("some nodes have GPUs and some do not; use nodes of one kind")
    return errs


def device_spec(report: PreflightReport, nproc_per_node: int = 1):
    """An engine.planning.cost.DeviceSpec for the planner from the real devices: the smallest GPU
    (free memory) of the cluster, or one CPU process's share of the smallest node's RAM.
    What the devices panel shows and `engine.planning.planner.make_plan(..., device=)` takes."""
    from engine.planning.cost import GPUS, DeviceSpec

    gpus = [g for h in report.hosts for g in h.gpus]
    if gpus:
        g = min(gpus, key=lambda g: g.memory_free_mb if g.memory_free_mb is not None else (g.memory_total_mb or 0))
        free_mb = g.memory_free_mb if g.memory_free_mb is not None else (g.memory_total_mb or 0)
        name = g.name.lower().replace(" ", "")
        # engine/planning/cost.py's table by model ("a100", "h100", "h200", "rtx4090"); unknown: a modest guess
        known = next((spec for key, spec in GPUS.items() if key.split("-")[0] in name), None)
        flops = known.flops_per_s if known else 0.4 * 100e12
        link = known.link_bytes_per_s if known else 25e9
        return DeviceSpec(g.name, int(free_mb * 2 ** 20), flops, link, 10e-6,
                          update_bytes_per_s=known.update_bytes_per_s if known else None,
                          precision_flops=known.precision_flops if known else ())
    mems = [h.mem_bytes for h in report.hosts if h.mem_bytes]
    mem = min(mems) // max(1, nproc_per_node) if mems else 8 * 2 ** 30
    return DeviceSpec("cpu", int(mem), flops_per_s=1.5e10, link_bytes_per_s=1e9, latency_s=50e-6)
