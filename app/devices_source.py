"""Where the plan runs: this machine, or a cluster profile's real devices.

Choosing a cluster in the devices panel runs its preflight (remote/preflight.py) on a
worker thread, so the GUI never waits on SSH; the result lists each host's devices in
the panel and hands (nproc, DeviceSpec) to the editor controller, whose plan then checks
memory per device against the real capacity and takes the real device count as its
world size. Failures (unreachable host, unknown host key) become an error line.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal

from remote.cluster import Cluster, ClusterError, ClusterStore
from remote.preflight import PreflightReport, device_spec, preflight


def procs_per_node(cluster: Cluster, report: PreflightReport) -> list[int]:
    """Processes each host runs: the profile's nproc_per_node, else one per GPU (one on a CPU node)."""
    return [cluster.nproc_per_node or len(h.gpus) or 1 for h in report.hosts]


def device_lines(cluster: Cluster, report: PreflightReport) -> list[str]:
    """One line per device (GPUs) or per host (CPU processes), as the panel lists them."""
    lines = []
    for h, n in zip(report.hosts, procs_per_node(cluster, report)):
        if not h.ok:
            continue
        for g in h.gpus:
            mem = f"{g.memory_total_mb:.0f} MiB" if g.memory_total_mb is not None else "memory unknown"
            free = f", {g.memory_free_mb:.0f} MiB free" if g.memory_free_mb is not None else ""
            lines.append(f"{h.host}  GPU {g.index}: {g.name}  {mem}{free}")
        if not h.gpus:
            ram = f", {h.mem_bytes / 2 ** 30:.1f} GiB RAM" if h.mem_bytes else ""
            lines.append(f"{h.host}  CPU: {n} process(es) ({h.cpus or '?'} cores{ram})")
    return lines


def _failure(report: PreflightReport) -> str:
    why = []
    for h in report.hosts:
        if h.ok:
            continue
        if h.unknown_key:
            why.append(f"{h.host}: unknown host key {h.unknown_key_type or ''} {h.unknown_key}; trust it in "
                       f"Clusters… (Test connection) first")
        else:
            why.append(f"{h.host}: {h.error}")
    return "\n".join(why)


class _Signals(QObject):
    done = Signal(int, object)  # generation, (Cluster, PreflightReport) or the exception


class _PreflightJob(QRunnable):
    def __init__(self, cluster: Cluster, gen: int, signals: _Signals):
        super().__init__()
        self.cluster, self.gen, self.signals = cluster, gen, signals

    def run(self) -> None:
        try:
            # devices only: the rendezvous check belongs to a deploy, and it takes a port
            out = (self.cluster, preflight(self.cluster, rendezvous=False))
        except Exception as exc:  # noqa: BLE001 - shown in the panel, never a crash
            out = exc
        self.signals.done.emit(self.gen, out)


class DevicesSource(QObject):
    """The devices panel's source choice; `changed` when lines/error/devices change."""
    changed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.cluster_name: str | None = None
        self.busy = False
        self.lines: list[str] = []
        self.error: str | None = None
        self.devices = None  # (nproc, DeviceSpec) or None: this machine
        self.report: PreflightReport | None = None
        self._gen = 0  # a newer choice makes an older preflight's answer stale
        self._pool = QThreadPool(self)
        self._signals = _Signals(self)
        self._signals.done.connect(self._done)

    def names(self) -> list[str]:
        try:
            return ClusterStore().names()
        except ClusterError:
            return []

    def choose(self, name: str | None) -> None:
        self._gen += 1
        self.cluster_name, self.report, self.devices, self.error, self.lines = name, None, None, None, []
        if name is None:
            self.busy = False
            self.changed.emit()
            return
        try:
            cluster = ClusterStore().get(name)
        except ClusterError as exc:
            self.busy, self.error = False, str(exc)
            self.changed.emit()
            return
        self.busy = True
        self.lines = [f"checking {len(cluster.hosts)} host(s) of {name}…"]
        self.changed.emit()
        self._pool.start(_PreflightJob(cluster, self._gen, self._signals))

    def _done(self, gen: int, out) -> None:
        if gen != self._gen:
            return
        self.busy = False
        if isinstance(out, BaseException):
            self.lines, self.error = [], f"{self.cluster_name}: preflight failed: {out}"
        else:
            cluster, report = out
            self.report = report
            self.lines = device_lines(cluster, report)
            if report.ok:
                per = procs_per_node(cluster, report)
                self.devices = (sum(per), device_spec(report, max(per)))
            else:
                self.error = _failure(report)
        self.changed.emit()

    def wait(self, ms: int = -1) -> bool:
        return self._pool.waitForDone(ms)


def attach(window) -> DevicesSource:
    """Wire the source choice of window.devices (the panel) to window.controller's plan."""
    src = DevicesSource(window)
    panel, controller = window.devices, window.controller
    panel.plan_of = lambda: controller.plan  # the stage lanes show what the plan puts on each stage
    panel.graph_of = lambda: window.project.graph

    def changed():
        panel.set_devices(src.lines, src.error)
        controller.set_devices(src.devices)

    def chosen(name: str | None) -> None:
        """The user's choice is the project's (saved with it, by name only)."""
        src.choose(name)
        if window.project.cluster != name:
            window.project.cluster = name
            window._mark_modified()

    def from_project() -> None:
        """A project remembers its cluster: choose it again, or say it is unknown here."""
        name = window.project.cluster
        if name is not None and name not in src.names():
            src.choose(None)
            src.error = (f"the project's cluster '{name}' has no profile on this machine; add it (Clusters…) "
                         f"or choose another source")
            src.changed.emit()
        elif name != src.cluster_name:
            src.choose(name)
        panel.set_sources(src.names(), src.cluster_name)

    panel.sources_wanted.connect(lambda: panel.set_sources(src.names(), src.cluster_name))
    panel.source_chosen.connect(chosen)
    src.changed.connect(changed)
    window.project_changed.connect(from_project)
    from_project()
    return src
