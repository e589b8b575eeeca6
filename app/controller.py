"""The editor controller: turns gestures and menu actions into undo commands on
the project's graph, recompiles after edits (debounced) and hands the results to
the views. Every action here is a plain method, so tests and the CLI call the
same code the buttons do.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

from PySide6.QtCore import QMimeData, QObject, QPointF, QRunnable, QThreadPool, QTimer, Signal
from PySide6.QtGui import QUndoStack
from PySide6.QtWidgets import QApplication

from app import undo_commands as C
from engine.diagram.compile import CompileError, compile_graph
from engine.diagram.editing import EditError, plan_group, plan_paste, plan_repeat, plan_ungroup
from engine.diagram.graph import Edge, GraphError
from engine.diagram.catalog import get_layer
from engine.diagram.layout import lay_out, layered_layout, view_layout
from engine.project import Project
from widgets.node_scene import NodeScene

CLIP_MIME = "application/x-layerflow-nodes"
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


class EditorController(QObject):
    compiled = Signal(object)  # CompileResult
    status = Signal(str)
    placement_changed = Signal()
    training_changed = Signal()
    plan_changed = Signal(object)  # (notes, rows, lines)

    def __init__(self, project: Project | None = None, parent=None):
        super().__init__(parent)
        self.stack = QUndoStack(self)
        self.scene = NodeScene(parent=self)
        self.scene.connect_requested.connect(self.connect_ports)
        self.scene.nodes_moved.connect(self.move_nodes)
        self.scene.rewire_requested.connect(self.rewire)
        self.scene.toggle_handler = self.toggle_block
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
        self.project: Project | None = None
        self.set_project(project or Project())

    # ----- project ------------------------------------------------------------
    def set_project(self, project: Project) -> None:
        if self.project is not None:
            self.project.graph.unsubscribe(self._on_graph_event)
            self.project.unsubscribe(self._on_project_event)
        self.project = project
        self._version += 1
        self.stack.clear()
        self.scene.set_graph(project.graph)
        project.graph.subscribe(self._on_graph_event)
        project.subscribe(self._on_project_event)
        if len(project.graph.nodes) >= BIG_DIAGRAM:  # its first compile would hold up the first paint
            self.result = self.plan = self.plan_error = None
            self.plan_info = ({}, [], [])
            self.placement_errors, self.placement_warnings = [], []
            self._slow = True
            self._timer.start()
        else:
            self.compile_now()

    @property
    def graph(self):
        return self.project.graph

    def _on_graph_event(self, ev) -> None:
        if ev.kind == "collapsed_changed":
            return  # how the editor shows blocks: nothing to compile or plan again
        self._version += 1
        self._timer.start()

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

    def flush(self) -> None:
        """Show the current state's compile now (before saving, screenshots, tests)."""
        if self._timer.isActive() or self._busy or self._applied != self._version:
            self.compile_now()

    def push(self, cmd) -> bool:
        """Push a command; a refused edit becomes a status message, not a crash."""
        try:
            self.stack.push(cmd)
        except GraphError as exc:
            self.status.emit(str(exc))
            # the failed redo left the command on the stack: drop it
            if self.stack.count() and self.stack.command(self.stack.count() - 1) is cmd:
                self.stack.undo()
            return False
        return True

    # ----- nodes and edges ----------------------------------------------------
    def add_node(self, node_type: str, pos: QPointF | tuple = (0.0, 0.0), params: dict | None = None) -> str | None:
        if get_layer(node_type) is None:
            self.status.emit(f"unknown layer type '{node_type}'")
            return None
        if isinstance(pos, QPointF):
            pos = (pos.x(), pos.y())
        pos = (round(pos[0] / 20) * 20.0, round(pos[1] / 20) * 20.0) if self.scene.snap else pos
        if node_type == "Input" and params is None and not any(n.type == "Input" for n in self.graph.nodes.values()):
            from engine.data.describe import sample_shape

            fits = sample_shape(self.project.training.dataset)  # the first Input takes the data set's sample
            if fits:
                params = {"shape": fits[0], "dtype": fits[1]}
        cmd = C.AddNode(self.graph, node_type, pos, params)
        self.push(cmd)
        self.scene.select_nodes([cmd.node.id])
        return cmd.node.id

    def connect_ports(self, src: str, src_port: str, dst: str, dst_port: str) -> bool:
        why = self.graph.check_connect(src, src_port, dst, dst_port)
        if why:
            self.status.emit(f"Cannot connect: {why}")
            return False
        ok = self.push(C.Connect(self.graph, Edge(src, src_port, dst, dst_port)))
        if ok:
            self.status.emit(f"Connected {src}.{src_port} → {dst}.{dst_port}")
        return ok

    def rewire(self, old: Edge, new_end) -> bool:
        """A wire dragged off its input: to another input (one step), or dropped
        on empty canvas (removed). A refused target leaves the wire where it was."""
        if new_end is None:
            self.push(C.Disconnect(self.graph, [old]))
            return True
        dst, port = new_end
        # the old wire ends elsewhere and cannot be on a path back to its source,
        # so the usual check applies unchanged
        why = self.graph.check_connect(old.src, old.src_port, dst, port)
        if why:
            self.status.emit(f"Cannot connect: {why}")
            return False
        self.stack.beginMacro(f"Reconnect {old.src}.{old.src_port} → {dst}.{port}")
        self.push(C.Disconnect(self.graph, [old]))
        self.push(C.Connect(self.graph, Edge(old.src, old.src_port, dst, port)))
        self.stack.endMacro()
        return True

    def move_nodes(self, moves: dict) -> None:
        self.push(C.MoveNodes(self.graph, moves))

    def set_param(self, node_id: str, key: str, value) -> None:
        if self.graph.nodes[node_id].params.get(key) != value:
            self.push(C.SetParam(self.graph, node_id, key, value))

    def rename(self, old: str, new: str) -> bool:
        from engine.diagram.editing import check_rename

        try:
            check_rename(self.graph, old, new)  # the model's one id rule (keywords refused too)
        except EditError as exc:
            self.status.emit(str(exc)[0].upper() + str(exc)[1:])
            return False
        ok = self.push(C.Rename(self.graph, old, new))
        if ok:
            self.scene.select_nodes([new])
        return ok

    def set_placement(self, node_ids: list[str], key: str, value) -> None:
        ids = [n for n in node_ids if getattr(self.graph.nodes[n], key) != value]
        if ids:
            self.push(C.SetPlacement(self.graph, ids, key, value))

    def set_tp(self, node_ids: list[str], style: str | None) -> str:
        """A tensor-parallel style for these nodes (a block's: what it holds), one undo
        step; what could not take it, said in one line (empty when all did)."""
        from engine.planning.autoplace import PAIRS, block_tp

        self.flush()
        if self.result is None or not self.result.ok:
            return "the diagram does not compile: fix its errors before choosing TP styles"
        styles, skipped = block_tp(self.result, node_ids, style, self.project.placement.tp)
        changed = {n: v for n, v in styles.items() if self.graph.nodes[n].tp != v}
        if changed:
            self.stack.beginMacro(f"Set TP style of {len(node_ids)} nodes" if len(node_ids) > 1 else
                                  f"Set TP style of {node_ids[0]}")
            for value in dict.fromkeys(changed.values()):
                self.set_placement([n for n, v in changed.items() if v == value], "tp", value)
            self.stack.endMacro()
        if style == PAIRS and not styles:
            return "no Linear -> Linear pair (nor attention) in the selection whose sizes tensor parallelism divides"
        if skipped:
            n = sum(len(v) for v in skipped.values())
            kinds = ", ".join(f"{t} ×{len(v)}" if len(v) > 1 else f"{t} {v[0]}" for t, v in sorted(skipped.items()))
            return f"TP style '{style}' does not apply to {n} node{'s' if n > 1 else ''}: {kinds}"
        return ""

    def set_mesh(self, key: str, value) -> None:
        if getattr(self.project.placement, key) != value:
            self.push(C.SetProjectPlacement(self.project, key, value))

    def _placement_changed(self) -> None:
        self._version += 1
        self.placement_changed.emit()
        self._timer.start()

    def choose_dataset(self, dataset, info=None, settings: dict | None = None) -> bool:
        """Use this data set (an engine.project Dataset model), one undo step; with its
        description (engine.data.describe.DataInfo), the Input node(s) take the data's shape
        and dtype in the same step. Returns whether anything changed."""
        training = self.project.training.model_copy(update={"dataset": dataset})
        fits = self.input_fixes(info) if info is not None and not isinstance(info, BaseException) else {}
        if settings is not None and info is not None:
            self._data_cache[data_key(settings)] = info
        if training == self.project.training and not fits:
            return False
        name = getattr(dataset, "path", dataset.kind)
        self.stack.beginMacro(f"Use data set {name}")
        if training != self.project.training:
            self.push(C.SetTraining(self.project, training, "dataset (chosen)"))
        self._fit_inputs(fits)
        self.stack.endMacro()
        return True

    def input_fixes(self, info) -> dict[str, dict]:
        """{Input node: {param: value}} that make the diagram's Input nodes take the data
        set's samples (shape and dtype); several named inputs feed the Inputs of their names."""
        inputs = [n for n in self.graph.nodes.values() if n.type == "Input"]
        if info.inputs:
            feeds = {n.id: info.inputs[n.id] for n in inputs if n.id in info.inputs}
        elif len(inputs) == 1:
            feeds = {inputs[0].id: (info.sample_shape, info.x_dtype)}
        else:
            return {}
        out = {}
        for nid, (shape, dtype) in feeds.items():
            params = self.graph.nodes[nid].params
            want = {"shape": [int(s) for s in shape],
                    "dtype": "int64" if str(dtype).startswith(("int", "uint")) else "float32"}
            if str(params.get("dtype", "float32")).startswith(want["dtype"][:3]):
                del want["dtype"]  # an int32 Input takes int64 data too: check_data accepts it
            if list(params.get("shape", [])) == want.get("shape"):
                del want["shape"]
            if want:
                out[nid] = want
        return out

    def fit_inputs(self, info) -> bool:
        """The Input node(s) take the data set's shape and dtype: one undo step."""
        fits = self.input_fixes(info)
        if not fits:
            return False
        self.stack.beginMacro("Input follows the data set")
        self._fit_inputs(fits)
        self.stack.endMacro()
        return True

    def _fit_inputs(self, fits: dict) -> None:
        for nid, params in fits.items():
            for key, value in params.items():
                self.push(C.SetParam(self.graph, nid, key, value))

    def set_training(self, training, what: str = "training") -> None:
        """Replace the training settings (a validated engine.project.Training): one undo step."""
        if training != self.project.training:
            self.push(C.SetTraining(self.project, training, what))

    def resolve_conflict(self, index: int, side: str) -> bool:
        """Take `side` ('ours' / 'theirs') for merge conflict `index`: one undo step; a
        resolution that would not make a valid project is a status message."""
        from engine.project import ProjectError

        try:
            cmd = C.ResolveConflict(self.project, index, side)
        except ProjectError as exc:
            self.status.emit(str(exc))
            return False
        return self.push(cmd)

    def _on_project_event(self, ev) -> None:
        """training or placement replaced (an undo command, a merge resolution, a script)."""
        if ev.what == "placement":
            self._placement_changed()
        else:
            self._training_changed()

    def _training_changed(self) -> None:  # batch size, ...: the plan and the summary follow
        self._version += 1
        self.training_changed.emit()
        self._timer.start()

    def delete_selected(self) -> None:
        ids, edges = self.scene.selected_ids(), self.scene.selected_edges()
        if ids or edges:
            self.push(C.RemoveItems(self.graph, ids, edges))

    def select_all(self) -> None:
        self.scene.select_nodes(self.graph.nodes)

    # ----- clipboard ----------------------------------------------------------
    def copy(self) -> bool:
        ids = self.scene.selected_ids()
        if not ids:
            self.status.emit("Nothing selected to copy")
            return False
        data = json.dumps(self.graph.subgraph_dict(ids))
        m = QMimeData()
        m.setData(CLIP_MIME, data.encode())
        m.setText(data)
        QApplication.clipboard().setMimeData(m)
        self.status.emit(f"Copied {len(ids)} node(s)")
        return True

    def cut(self) -> None:
        if self.copy():
            self.stack.beginMacro("Cut")
            self.delete_selected()
            self.stack.endMacro()

    def paste(self, at: QPointF | None = None) -> list[str]:
        m = QApplication.clipboard().mimeData()
        if m is None or not m.hasFormat(CLIP_MIME):
            self.status.emit("The clipboard holds no Layerflow nodes")
            return []
        try:
            sub = json.loads(bytes(m.data(CLIP_MIME)).decode())
        except (ValueError, UnicodeDecodeError):
            self.status.emit("The clipboard's Layerflow data is damaged")
            return []
        return self.insert_subgraph(sub, at, "Paste")

    def duplicate(self) -> list[str]:
        ids = self.scene.selected_ids()
        return self.insert_subgraph(self.graph.subgraph_dict(ids), None, "Duplicate") if ids else []

    def insert_subgraph(self, sub: dict, at: QPointF | None, text: str, offset=(40.0, 40.0)) -> list[str]:
        """Insert copies with fresh names (engine/diagram/editing.py plans them); one undo step."""
        try:
            paste = plan_paste(self.graph, sub, offset=offset, at=(at.x(), at.y()) if at is not None else None)
        except EditError as exc:
            self.status.emit(str(exc))
            return []
        return self._insert(paste, text)

    def _insert(self, paste, text: str) -> list[str]:
        if not paste.nodes:
            return []
        self.push(C.AddSubgraph(self.graph, {"nodes": paste.nodes, "edges": paste.edges}, text))
        if paste.collapsed:  # a copy of a collapsed block arrives collapsed, like the original
            self.scene.collapsed = self.scene.collapsed | paste.collapsed  # (a new set: set_collapsed sees the change)
            self.scene.apply_collapse()
        self.scene.select_nodes(paste.ids)
        return paste.ids

    # ----- groups -------------------------------------------------------------
    def group_selected(self, name: str | None = None) -> str | None:
        try:
            g = plan_group(self.graph, self.scene.selected_ids(), name)
        except EditError as exc:
            self.status.emit(str(exc)[0].upper() + str(exc)[1:])
            return None
        self.push(C.SetGroup(self.graph, list(g.groups), None, g.text, groups=g.groups, moved=g.moved,
                             scene=self.scene))
        return g.block

    def ungroup_selected(self) -> None:
        """Take the selected blocks away: what they held moves up one level."""
        blocks = self.scene.selected_groups()
        if not blocks:
            return
        g = plan_ungroup(self.graph, blocks)
        if g.groups:
            self.push(C.SetGroup(self.graph, list(g.groups), None, g.text, groups=g.groups, moved=g.moved,
                                 scene=self.scene))

    def members(self, group: str) -> list[str]:
        return self.graph.block_members(group)

    def repeat_block(self, group: str, times: int) -> bool:
        """Stack `times` copies of a block in a chain (engine.diagram.editing.plan_repeat), one undo step."""
        if times < 2 or not self.members(group):
            return False
        try:
            rep = plan_repeat(self.graph, group, times, width=None)
        except EditError as exc:
            self.status.emit(str(exc)[0].upper() + str(exc)[1:])
            return False
        self.stack.beginMacro(rep.text)
        if rep.disconnect:
            self.push(C.Disconnect(self.graph, rep.disconnect))
        for paste, edges in zip(rep.copies, rep.connect):
            self._insert(paste, "Repeat")
            for e in edges:
                self.push(C.Connect(self.graph, e))
        for e in rep.reconnect:
            self.push(C.Connect(self.graph, e))
        self.auto_layout()
        self.stack.endMacro()
        return True

    # ----- layout -------------------------------------------------------------
    def toggle_block(self, name: str) -> None:
        """Collapse or expand a block as one undo step (laid out again for imported models);
        on the card of a folded run of repeats, show its blocks one by one instead."""
        if name not in self.graph.blocks():
            return
        run = self.scene.folded_run(name)
        if run is not None:
            self.push(C.ToggleFold(self.scene, run[0], True, view_layout))
            return
        self.push(C.ToggleBlock(self.scene, name, name not in self.graph.collapsed, view_layout))

    def toggle_fold(self, name: str) -> bool:
        """Fold the run of repeats a block belongs to into one card, or unfold it."""
        from engine.diagram.layout import repeated_runs

        run = repeated_runs(self.graph).get(name)
        if run is None:
            return False
        self.push(C.ToggleFold(self.scene, run[0], run[0] not in self.graph.unfolded, view_layout))
        return True

    def reveal(self, target: str) -> None:
        """Open what hides a node or block (collapsed blocks around it, a folded run of
        repeats it is in), outside in, so the canvas shows it: one undo step."""
        from engine.diagram.graph import block_path

        def hiding():
            if target in self.graph.nodes:
                card = self.scene._collapsed_group(target)
                return card.name if card is not None else None
            run = self.scene.folded_run(target)
            if run is not None and run[0] != target:
                return run[0]  # inside a folded run: unfold it
            closed = next((b for b in block_path(target)[:-1] if b in self.graph.collapsed), None)
            if closed is None:
                return None  # it shows (as a card or a frame)
            members = self.graph.block_members(closed)
            card = self.scene._collapsed_group(members[0]) if members else None
            return card.name if card is not None else closed

        if hiding() is None:
            return
        self.stack.beginMacro(f"Reveal {target.rpartition('/')[2]}")
        for _ in range(4 * (target.count("/") + 8)):  # each step opens one level
            name = hiding()
            if name is None:
                break
            self.toggle_block(name)
        self.stack.endMacro()

    def set_direction(self, direction: str) -> None:
        """Data flows left to right ("LR") or top down ("TB"): the diagram laid out again
        that way, one undo step."""
        if direction != self.graph.direction:
            self.push(C.SetDirection(self.scene, direction, lay_out))

    def auto_layout(self, selection_only: bool = False) -> None:
        ids = self.scene.selected_ids() if selection_only else None
        if selection_only and len(ids) < 2:
            ids = None
        if ids is None:  # the whole diagram (blocks laid out as units, inside out)
            pos = lay_out(self.graph)
        else:
            pos = layered_layout(self.graph, ids)
        moves = {n: (self.graph.nodes[n].pos, p) for n, p in pos.items() if self.graph.nodes[n].pos != p}
        if moves:
            self.push(C.MoveNodes(self.graph, moves, "Auto-layout"))
