"""The editor's background analysis and its problems list: the diagram compiled and planned
after each edit (debounced; on a worker thread once compiling is slow), the data set
described against it (never on the GUI thread), and what the Problems dock and the Run
button read from both (`problems`, `run_blocker`). EditorController (controller.py) is an
Analysis: it owns the edits, this the results they lead to.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

from PySide6.QtCore import QObject, QRunnable, QThreadPool, QTimer, Signal

from engine.diagram.compile import CompileError, compile_graph
from engine.diagram.graph import Edge
from engine.project import Project

COMPILE_DELAY_MS = 60
SLOW_S = 0.15  # compiles slower than this move to a worker thread
BIG_DIAGRAM = 300  # nodes: a diagram this big is compiled on the worker from the start
SYNTHETIC_CHECKED = 64 << 20  # bytes: a generated set up to this size is made whole to check it, as the run does
SYNTHETIC_SAMPLE = 4096  # samples made of a bigger one (its split sizes are computed)


def plan_notes(plan, graph=None) -> tuple[dict[Edge, str], list[tuple[str, int, str]], list[str]]:
    """(edge labels, device memory rows, text lines) from an engine.planning.planner.Plan.

    Edges show what the plan inserts on them: a tensor-parallel piece's layout
    (tp Shard(d)), send/recv where they cross a stage cut, and each collective on
    the inputs or outputs it moves (the plan's `side`), with bytes per step."""
    notes: dict[Edge, list[str]] = {}
    rows: list[tuple[str, int, str]] = []
    if plan is None:
        return {}, rows, []
    from widgets.style import human_bytes

    edges = list(graph.edges) if graph is not None else []

    def add(e: Edge, text: str) -> None:
        if text not in notes.setdefault(e, []):
            notes[e].append(text)

    per_replica = plan.batch.per_replica if plan.batch else 1
    for rec in plan.layouts:
        if rec.tp.is_shard:  # a tensor-parallel piece, not the whole tensor
            for e in edges:
                if (e.src, e.dst) == (rec.src, rec.dst):
                    add(e, f"tp {rec.tp}")
        if rec.crosses:
            nbytes = 2 * rec.bytes_per_sample * per_replica  # forward value + its gradient
            for e in edges:
                if (e.src, e.dst) == (rec.src, rec.dst):
                    add(e, f"send/recv {human_bytes(nbytes)}/step")
    for c in plan.communication:
        node = c.node
        if node is None:
            continue
        side = c.side or ("in" if c.why.startswith("backward") else "out")
        text = f"{c.op} {human_bytes(c.bytes_per_step)}/step"
        for e in edges:
            if (e.dst if side == "in" else e.src) == node:
                add(e, text)
    for dv in plan.devices:
        rows.append((f"rank {dv.rank} (dp {dv.dp_rank}, tp {dv.tp_rank})", dv.memory.total_bytes, f"stage {dv.stage}"))
    try:
        from engine.planning.planner import format_plan

        lines = format_plan(plan).splitlines()
    except Exception:  # noqa: BLE001 - a plan we cannot format is shown by its errors
        lines = [f"error: {e}" for e in getattr(plan, "errors", [])]
    return {e: ", ".join(v) for e, v in notes.items()}, rows, lines


def _plan(project: Project, result, devices=None):
    """(plan, error) of engine/planning/planner.py; (None, None) while the diagram does not compile.
    devices: (nproc, engine.planning.cost.DeviceSpec) of real devices (a cluster's), or None
    for this machine."""
    from engine.planning.planner import make_plan

    if not result.ok:
        return None, None
    try:  # a planner failure is shown as an error, never replaced by a plan for other devices
        if devices is not None:
            plan = make_plan(project, devices[0], devices[1], compiled=result)
        else:
            plan = make_plan(project, compiled=result)  # reuse this compile
        from engine.runs import calibration

        calibration.apply(plan, project)  # corrected by what the newest run of this layout measured
        return plan, None
    except Exception as exc:  # noqa: BLE001 - shown to the user, never a crash
        return None, f"{type(exc).__name__}: {exc}"


def analyse(project: Project, devices=None):
    """Compile and plan: (result, plan, plan_error, plan_info, seconds). No Qt
    objects are touched, so it runs on a worker thread too."""
    t0 = time.perf_counter()
    result = compile_graph(project.graph)
    plan, error = _plan(project, result, devices)
    info = plan_notes(plan, project.graph)
    if error:
        info = (info[0], info[1], [f"plan: {error}"])
    return result, plan, error, info, time.perf_counter() - t0


_NODE_MSG = re.compile(r"^node '([^']+)' \(([^)]*)\):? (.*)$", re.DOTALL)
_BACK_MSG = re.compile(r"^edge (\S+) -> (\S+) goes from stage (\d+) back to stage (\d+);")


def user_block(graph, nid: str, message: str) -> str | None:
    """The block a placement problem of node `nid` is the user's problem of, when it is about
    what the user assigned (the node's stage, for a stage problem; its TP style, for a tp
    one): the outermost block around it whose members all have that assignment (a block
    assigned as one), else the card that shows it (its outermost collapsed block). None for
    problems of what nobody assigned (BatchNorm under dp, say): those stay the node's."""
    from engine.diagram.graph import block_path

    node = graph.nodes.get(nid)
    if node is None or not node.group:
        return None
    about = [k for k, word in (("stage", r"\bstages?\b"), ("tp", r"\btp\b")) if getattr(node, k) is not None
             and re.search(word, message)]
    if not about:
        return None
    key = about[0]
    same = next((b for b in block_path(node.group)
                 if all(getattr(graph.nodes[m], key) == getattr(node, key) for m in graph.block_members(b))), None)
    return same or graph.outermost_collapsed(nid)


@dataclass(frozen=True)
class BlockProblem(CompileError):
    """A placement problem told in the user's terms: `block` (what they assigned, or the
    card they see), `inner` the node the engine found it on (it keeps the badge)."""
    block: str | None = None
    inner: str | None = None


def in_user_terms(graph, problems: list) -> list:
    """Placement problems on nodes inside blocks, said of the block: "block 'head': ...
    (inside: fc3 (Linear), act2 (ReLU))". Each node keeps its own problem (its badge);
    those of one block that say the same thing share one text (one row in Problems)."""
    from engine.diagram.graph import block_name

    keyed: list[tuple[object, str | None, str, str]] = []  # (problem, block, headline, detail)
    for p in problems:
        b = user_block(graph, p.node, p.message) if p.node else None
        if b is None:
            keyed.append((p, None, p.message, ""))
            continue
        name = block_name(b)
        m, back = _NODE_MSG.match(p.message), _BACK_MSG.match(p.message)
        if back:
            src, dst, was, now = back.groups()
            src_block = user_block(graph, src, p.message)
            frm = f"block '{block_name(src_block)}' on " if src_block and src_block != b else ""
            head = (f"block '{name}' is on stage {now} but takes its input from {frm}stage {was}; stages must follow "
                    f"the data flow: set '{name}' to stage {was} or later")
            keyed.append((p, b, head, f"edge {src} -> {dst}"))
        elif m:
            keyed.append((p, b, f"block '{name}': {m.group(3)}", f"{m.group(1)} ({m.group(2)})"))
        else:
            keyed.append((p, b, f"block '{name}': {p.message}", p.node))
    details: dict[tuple, list[str]] = {}
    for p, b, head, detail in keyed:
        if b is not None and detail not in details.setdefault((b, head, p.severity), []):
            details[(b, head, p.severity)].append(detail)
    out = []
    for p, b, head, _ in keyed:
        if b is None:
            out.append(p)
            continue
        inside = details[(b, head, p.severity)]
        shown = ", ".join(inside[:6]) + (f", ... ({len(inside) - 6} more)" if len(inside) > 6 else "")
        out.append(BlockProblem(f"{head} (inside: {shown})", p.node, p.field, p.severity, block=b, inner=p.node))
    return out


class _JobSignals(QObject):
    done = Signal(int, object)  # version, analyse() tuple or the exception


class _AnalyseJob(QRunnable):
    def __init__(self, project: Project, version: int, signals: _JobSignals, devices=None):
        super().__init__()
        self.project, self.version, self.signals, self.devices = project, version, signals, devices

    def run(self) -> None:
        try:
            out = analyse(self.project, self.devices)
        except Exception as exc:  # noqa: BLE001 - reported on the GUI thread
            out = exc
        self.signals.done.emit(self.version, out)


class _DataSignals(QObject):
    done = Signal(str, object)  # settings key, DataInfo or the exception


class _DescribeJob(QRunnable):
    """A data set described off the GUI thread: engine.data.describe.describe_source for a set read
    in place (it lists the set's files, a folder of a million images takes a while, and
    reads one sample); `load` for one made whole (a generated set, digits, the user's .npz
    or .csv: made or read here, as the run does)."""

    def __init__(self, key: str, settings: dict | None, signals: _DataSignals, load=None):
        super().__init__()
        self.key, self.settings, self.signals, self.load = key, settings, signals, load

    def run(self) -> None:
        from engine.data.describe import describe_source

        try:
            out = self.load() if self.load is not None else describe_source(self.settings, with_fingerprint=False)
        except Exception as exc:  # noqa: BLE001 - shown as a problem
            out = exc
        self.signals.done.emit(self.key, out)


def made_source(project: Project):
    """(cache key, loader) of a data set the run describes with engine.data.describe.describe
    beyond describe_source (generated, digits, a .csv made whole; an .npz scanned in place):
    the loader returns the engine.data.describe.DataInfo the run would check, without arrays (the
    cache keeps no copy of the data). The file's consent and existence are checked here, at
    once (ProjectError names the field); the key holds the file's size and time, so a file
    written again is read again."""
    from engine import trust
    from engine.data.describe import describe, synthetic_bytes
    from engine.project import ProjectError

    d = project.training.dataset
    settings = d.model_dump(mode="json")
    if "path" in settings:
        field = "training.dataset.path"
        path = project.resolve_path(d.path)
        trust.check_file(project, path, field)  # here: the consent given in this window (the worker checks none)
        if not path.exists():
            raise ProjectError(f"{field}: {path} does not exist")
        st = path.stat()
        settings.update(path=str(path.resolve()), stamp=[st.st_size, st.st_mtime_ns])
        d = d.model_copy(update={"path": settings["path"]})
    n = getattr(d, "n_samples", None)
    big = (synthetic_bytes(d) or 0) > SYNTHETIC_CHECKED
    if big:  # a big generated set: a few thousand samples tell its shapes, classes and tokens
        d = d.model_copy(update={"n_samples": SYNTHETIC_SAMPLE})
    made = Project(training=project.training.model_copy(update={"dataset": d}))  # no file: nothing more to consent

    def load():
        info = describe(made)  # what build_run checks the diagram against
        info.arrays = None
        if big:  # the split of all n samples (engine/runtime/datasets/base.py seeded_split)
            info.n_val = max(1, round(n * d.val_fraction))
            info.n_train = n - info.n_val
        return info
    return data_key({"made": settings}), load


def data_key(settings: dict) -> str:
    """The cache key of a data set's settings (its path absolute)."""
    return json.dumps(settings, sort_keys=True)


def data_problems(result, info, batch_size: int | None = None) -> list:
    """engine.runs.build.check_data's lines (and build_run's batch against the training set) as
    problems on the nodes they name (field 'training.dataset'); a data set that cannot be
    read is one problem of its own, on the Input node it would feed."""
    from engine.diagram.compile import CompileError
    from engine.planning.planner import _NODE_RE

    if isinstance(info, BaseException):
        inputs = (result.spec or {}).get("inputs") or [None]
        return [CompileError(str(info), inputs[0] if len(inputs) == 1 else None, "training.dataset")]
    from engine.runs.build import check_data

    out = []
    for msg in check_data(result, info):
        m = _NODE_RE.search(msg)
        out.append(CompileError(msg, m.group(1) if m else None, "training.dataset"))
    if batch_size is not None and info.n_train < batch_size:
        out.append(CompileError(f"training.batch_size {batch_size} is larger than the training set "
                                f"({info.n_train} samples)", None, "training.batch_size"))
    return out


class Analysis:
    """The results of the current state (result, plan, problems) and the machinery that keeps
    them current; mixed into EditorController, whose signals (compiled, plan_changed, status)
    it emits and whose project, graph, scene and _version it reads."""

    def _init_analysis(self) -> None:
        self.result = None
        self.plan = None
        self.plan_error: str | None = None
        self.plan_info = ({}, [], [])
        self.placement_errors: list = []  # the plan's problems (engine.planning.planner.plan_problems)
        self.placement_warnings: list = []
        self.devices = None  # (nproc, DeviceSpec) of a cluster's real devices; None: this machine
        self._timer = QTimer(self, singleShot=True, interval=COMPILE_DELAY_MS, timeout=self._recompile)
        self._version = 0  # bumped by every edit
        self._applied = -1  # the version whose results the views show
        self._busy = False  # a worker is compiling
        self._slow = False  # the last compile took longer than SLOW_S: use the worker
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(1)
        self._signals = _JobSignals(self)
        self._signals.done.connect(self._job_done)
        # the data set, described once per settings (never on the GUI thread): its problems
        self.data_errors: list = []
        self._data_cache: dict[str, object] = {}  # data_key -> DataInfo or the exception
        self._data_running: set[str] = set()
        self._data_pool = QThreadPool(self)  # not the compile pool: compile_now waits for that one
        self._data_pool.setMaxThreadCount(1)
        self._data_signals = _DataSignals(self)
        self._data_signals.done.connect(self._data_done)

    def _recompile(self) -> None:
        """After edits (debounced): here if compiling is quick, else on a worker
        thread so the GUI never waits (a 1,000-node diagram takes about a second)."""
        if not self._slow:
            self.compile_now()
            return
        if self._busy:
            return  # the running job sees it is stale when it ends and starts again
        self._busy = True
        snapshot = Project(self.graph.copy(), name=self.project.name, training=self.project.training,
                           placement=self.project.placement, path=self.project.path)
        self._pool.start(_AnalyseJob(snapshot, self._version, self._signals, self.devices))

    def _job_done(self, version: int, out) -> None:
        self._busy = False
        if version <= self._applied:
            return  # a synchronous compile already showed this state or a newer one
        if version != self._version:
            self._timer.start()  # edited meanwhile: once more with the latest
            return
        if isinstance(out, BaseException):
            self.status.emit(f"checking the diagram failed: {out}")
            return
        self._apply(version, *out)

    def compile_now(self) -> None:
        """Compile (and plan) now, on this thread; shows the result at once."""
        self._timer.stop()
        self._pool.waitForDone()  # one compile at a time: the compile cache is shared
        self._busy = False
        t0 = time.perf_counter()
        try:
            out = analyse(self.project, self.devices)
        except Exception as exc:  # noqa: BLE001 - a compiler bug must not take the editor down
            self.status.emit(f"checking the diagram failed: {exc}")
            return
        self._slow = time.perf_counter() - t0 > SLOW_S
        self._apply(self._version, *out)

    def _apply(self, version: int, result, plan, plan_error, plan_info, seconds: float = 0.0) -> None:
        self._applied = version
        if seconds:
            self._slow = seconds > SLOW_S
        self.result, self.plan, self.plan_error, self.plan_info = result, plan, plan_error, plan_info
        self.placement_errors, self.placement_warnings = self._placement_problems()
        self.data_errors = self._data_problems()
        self.scene.set_result(result, plan_info[0], self.placement_errors + self.placement_warnings + self.data_errors)
        self.compiled.emit(result)
        self.plan_changed.emit(plan_info)

    # ----- the data set against the diagram -------------------------------------
    def data_settings(self) -> dict | None:
        """training.dataset as the runtime reads it (path absolute), for a set read in
        place; None for generated sets. A ProjectError (no such path) is raised."""
        from engine.data.describe import source_settings

        return source_settings(self.project)

    def data_info(self, settings: dict | None = None):
        """The cached DataInfo (or the exception describing it raised) of these settings
        (default: the project's); None while it is being described or not yet asked."""
        if settings is None:
            try:
                settings = self.data_settings()
            except Exception:  # noqa: BLE001
                return None
        return None if settings is None else self._data_cache.get(data_key(settings))

    def remember_data(self, settings: dict, info) -> None:
        """A description made elsewhere (the data panel's worker): cached, and the
        problems follow if these are the project's settings."""
        self._data_cache[data_key(settings)] = info
        self._data_current_changed(data_key(settings))

    def _data_problems(self) -> list:
        """What the run would refuse about the data set (engine/runs/build.py build_run), from its
        cached description; an undescribed set is described on the worker first (problems
        follow when it is done)."""
        if self.result is None or not self.result.ok or self.result.spec is None:
            return []  # the compiler's errors first
        from engine.data.sources import IN_PLACE_KINDS
        from engine.project import ProjectError

        batch = self.project.training.batch_size
        load = None
        try:
            if self.project.training.dataset.kind in IN_PLACE_KINDS:
                settings = self.data_settings()
                key = data_key(settings)
            else:
                settings = None
                key, load = made_source(self.project)
        except (ProjectError, OSError) as exc:
            return data_problems(self.result, exc)
        if key in self._data_cache:
            return data_problems(self.result, self._data_cache[key], batch)
        if key not in self._data_running:
            self._data_running.add(key)
            self._data_pool.start(_DescribeJob(key, settings, self._data_signals, load))
        return []  # until it is described

    def recheck_data(self) -> None:
        """Look at the data set again (its file may have appeared since): debounced, like an edit."""
        self._version += 1
        self._timer.start()

    def _data_key(self) -> str | None:
        """The cache key of the project's data set now (None: it cannot be read)."""
        from engine.data.sources import IN_PLACE_KINDS

        try:
            if self.project.training.dataset.kind in IN_PLACE_KINDS:
                return data_key(self.data_settings())
            return made_source(self.project)[0]
        except Exception:  # noqa: BLE001
            return None

    def _data_done(self, key: str, info) -> None:
        self._data_running.discard(key)
        self._data_cache.setdefault(key, info)  # (a fresher one from the data panel stays)
        self._data_current_changed(key)

    def _data_current_changed(self, key: str) -> None:
        """Show the data problems again if `key` is the project's data set now."""
        if self.result is None or self._data_key() != key:
            return
        self.data_errors = self._data_problems()
        self.scene.set_result(self.result, self.plan_info[0],
                              self.placement_errors + self.placement_warnings + self.data_errors)
        self.compiled.emit(self.result)

    def wait_for_data(self, ms: int = 30000) -> bool:
        """Wait for the describing worker (tests, screenshots)."""
        return self._data_pool.waitForDone(ms)

    def _placement_problems(self):
        if self.result is None or not self.result.ok:
            return [], []  # no plan of a diagram that does not compile: its errors come first
        from engine.planning.checks import stage_warnings
        from engine.planning.planner import plan_problems

        errors, warnings = plan_problems(self.plan, self.plan_error)
        said = {w.message for w in warnings}  # (the plan carries them too, when there is one)
        warnings += [CompileError(w, n, "placement", severity="warning")
                     for n, w in stage_warnings(self.graph, self.project.placement) if w not in said]
        return in_user_terms(self.graph, errors), in_user_terms(self.graph, warnings)

    def problems(self) -> tuple[list, list]:
        """(errors, warnings) of the diagram and of its placement, as the Problems list shows them."""
        if self.result is None:
            return [], []
        return (list(self.result.errors) + self.placement_errors + self.data_errors,
                list(self.result.warnings) + self.placement_warnings)

    def run_blocker(self) -> str | None:
        """Why Run cannot start now (the first error), or None."""
        errors = self.problems()[0]
        if not errors:
            return None
        e = errors[0]
        n = len({x.message for x in errors if getattr(x, "block", None)}) + sum(
            1 for x in errors if not getattr(x, "block", None))  # a block's problem once, as Problems counts it
        more = f" (and {n - 1} more in Problems)" if n > 1 else ""
        return f"{e.message}{more}"

    def set_devices(self, devices) -> None:
        """Plan for these real devices ((nproc, DeviceSpec)) or, with None, this machine."""
        self.devices = devices
        self._version += 1  # a result for the old devices is stale
        self.compile_now()
