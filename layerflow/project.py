"""`lf.Project`: build or load a diagram, check it, place it, train or deploy it, export it.

A thin, documented layer over the engine the command line and the editor use: the same
compile, planner, run folders, launchers and errors (every one a LayerflowError whose
message names the node, field or host at fault)."""
from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine import project as core
from engine.errors import CheckFailed, LayerflowError
from engine.diagram.graph import GraphError, ports_of
from layerflow.runs import Job, Run

Source = str  # "node" (its only output) or "node.port"


@dataclass
class Summary:
    """Per node: type, output shape, parameters and FLOPs per sample; and the totals.
    `str(summary)` is the table `layerflow summary` prints."""

    rows: list[dict]
    total_params: int
    total_flops: int
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # what the import left out of the diagram (not in the total)

    def to_dict(self) -> dict:
        return {"nodes": self.rows, "total_params": self.total_params, "total_flops": self.total_flops,
                "errors": self.errors, "warnings": self.warnings, "left_out": self.left_out}

    def __getitem__(self, node: str) -> dict:
        for r in self.rows:
            if r["node"] == node:
                return r
        raise KeyError(node)

    def __str__(self) -> str:
        from engine.units import human

        headers = ("node", "type", "output shape", "params", "FLOPs/sample")
        table = [(r["node"], r["type"], r["output_shape"], f"{r['params']:,}", human(r["flops"])) for r in self.rows]
        table.append(("total", "", "", f"{self.total_params:,}", human(self.total_flops)))
        widths = [max(len(str(x[i])) for x in [headers, *table]) for i in range(len(headers))]

        def line(cells) -> str:
            return "  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

        rule = "  ".join("-" * w for w in widths)
        left = [f"left out at import: {n}" for n in self.left_out]  # the total is the diagram's, not the source's
        return "\n".join([line(headers), rule, *map(line, table[:-1]), rule, line(table[-1]), *left])


def _settings_error(where: str, exc: ValidationError) -> core.ProjectError:
    return core.ProjectError(core._format_validation(where, exc))


class Project:
    """A Layerflow project: a diagram (nodes and edges) with its training and placement.

        p = lf.Project.new("mlp", dataset={"kind": "digits"}, steps=100)
        x = p.add("Input", shape=[64])
        h = p.add("ReLU", p.add("Linear", x, out_features=128))
        p.add("Output", p.add("Linear", h, out_features=10), loss="cross_entropy")

    `training` and `placement` are the file's settings (pydantic models): change their
    fields directly (`p.training.batch_size = 32`); they are checked again before use."""

    def __init__(self, project: core.Project | None = None):
        self._p = project or core.Project()
        self._weights = None  # an imported model's tensors, written beside the file at save()
        self._laid_out = True  # False once a node was added without a position: save() lays them out

    # ----- making one -----------------------------------------------------------------
    @classmethod
    def new(cls, name: str = "untitled", *, dataset: dict | None = None, description: str = "",
            **training: Any) -> Project:
        """An empty diagram; `dataset` and the other keywords are training settings
        (`steps=`, `batch_size=`, `optimizer={"name": "sgd", "lr": 0.1}`, ...)."""
        values = dict(training)
        if dataset is not None:
            values["dataset"] = dataset
        try:
            tr = core.Training.model_validate(values)
        except ValidationError as exc:
            raise _settings_error("training", exc) from None
        return cls(core.Project(name=name, description=description, training=tr))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Project:
        """Open a .lflow file (checked; ProjectError names the file and field)."""
        return cls(core.load_project(path))

    @classmethod
    def from_module(cls, module, input_shape: Iterable[int] | list[Iterable[int]], *,
                    input_dtype: str | list[str] | None = None, name: str | None = None) -> Project:
        """The diagram of an nn.Module instance, with its weights (input shapes without the
        batch; a list of shapes for several inputs). Checked to compute what the module does."""
        from engine.interop.module.importer import from_module

        shapes = [list(input_shape)] if all(isinstance(d, int) for d in input_shape) else [list(s) for s in input_shape]
        dtypes = [input_dtype] if isinstance(input_dtype, str) else input_dtype
        imported = from_module(module, shapes, dtypes, name=name)
        p = cls(imported.project)
        p._weights = imported
        return p

    @classmethod
    def from_onnx(cls, path: str | os.PathLike, *, name: str | None = None) -> Project:
        """The diagram of an ONNX model, with its weights."""
        from engine.interop import import_onnx

        imported = import_onnx(path, name=name)
        p = cls(imported.project)
        p._weights = imported
        return p

    # ----- what it is -----------------------------------------------------------------
    @property
    def core(self) -> core.Project:
        """The engine's project (engine/project.py), for what this layer does not cover."""
        return self._p

    @property
    def name(self) -> str:
        return self._p.name

    @name.setter
    def name(self, value: str) -> None:
        self._p.name = value

    @property
    def path(self) -> Path | None:
        return self._p.path

    @property
    def graph(self):
        return self._p.graph

    @property
    def training(self) -> core.Training:
        return self._p.training

    @property
    def placement(self) -> core.Placement:
        return self._p.placement

    @property
    def nodes(self) -> list[str]:
        return list(self._p.graph.nodes)

    def __repr__(self) -> str:
        where = f", {str(self.path)!r}" if self.path else ""
        return f"Project({self.name!r}, {len(self._p.graph.nodes)} nodes{where})"

    # ----- editing ----------------------------------------------------------------------
    def add(self, type: str, *inputs: Source, id: str | None = None, pos: tuple[float, float] | None = None,
            **params: Any) -> str:
        """Add a layer and wire `inputs` to its input ports in order (Add's a and b, ...);
        returns its id (default: the type in lower case, numbered). An input is a node id
        (its only output) or "node.port"."""
        from engine.diagram.catalog import CATALOG, unknown_type

        if type not in CATALOG:
            raise GraphError(unknown_type(type))
        spec = CATALOG[type]
        _check_params(spec, params, type)
        ins = ports_of(type, {**spec.defaults(), **params})[0]
        if len(inputs) > len(ins):
            raise GraphError(f"{type} takes {len(ins)} input(s) ({', '.join(ins) or 'none'}), not {len(inputs)}")
        for src in inputs:  # every source exists before anything is added
            self._source(src)
        g = self._p.graph
        nid = id or g.unique_id(type.lower())
        g.add_node(type, params, pos=pos or (0.0, 0.0), id=nid)
        try:
            for src, port in zip(inputs, ins):
                s, sp = self._source(src)
                g.connect(s, sp, nid, port)
        except GraphError:
            g.remove_node(nid)
            raise
        if pos is None:
            self._laid_out = False
        return nid

    def _source(self, src: Source) -> tuple[str, str]:
        g = self._p.graph
        node, _, port = str(src).partition(".")
        if node not in g.nodes:
            raise GraphError(f"no node named '{node}'")
        outs = ports_of(g.nodes[node].type, g.nodes[node].params)[1]
        if not port:
            if len(outs) != 1:
                raise GraphError(f"node '{node}' ({g.nodes[node].type}) has outputs {', '.join(outs)}: "
                                 f"say which, e.g. '{node}.{outs[0] if outs else 'out'}'")
            port = outs[0]
        return node, port

    def connect(self, src: Source, dst: str, port: str | None = None) -> None:
        """Wire src to `port` of dst (default: its first free input)."""
        g = self._p.graph
        s, sp = self._source(src)
        node, _, p = dst.partition(".")
        if node not in g.nodes:
            raise GraphError(f"no node named '{node}'")
        port = port or p
        if not port:
            taken = g.incoming(node)
            free = [q for q in ports_of(g.nodes[node].type, g.nodes[node].params)[0] if q not in taken]
            if not free:
                raise GraphError(f"every input of node '{node}' is already connected")
            port = free[0]
        g.connect(s, sp, node, port)

    def set(self, node: str, **params: Any) -> None:
        """Change a node's parameters (None: back to the default)."""
        g = self._p.graph
        n = g.node(node)
        from engine.diagram.catalog import CATALOG

        _check_params(CATALOG[n.type], {k: v for k, v in params.items() if v is not None}, f"node '{node}' ({n.type})")
        for k, v in params.items():
            g.set_param(node, k, v)

    def remove(self, node: str) -> None:
        self._p.graph.remove_node(node)

    # ----- editing more than one node (engine/diagram/editing.py: the editor's own operations) ----
    def rename(self, node: str, new: str) -> None:
        """Rename a node (the model's id rule; edges and ties follow)."""
        from engine.diagram.editing import check_rename

        check_rename(self._p.graph, node, new)
        self._p.graph.rename_node(node, new)

    def duplicate(self, nodes: Iterable[str], *, offset: tuple[float, float] = (40.0, 40.0)) -> list[str]:
        """Copies of nodes and the edges among them, with fresh ids (relu -> relu_2); a
        whole block copied becomes a new block. Returns the copies' ids, in order."""
        from engine.diagram.editing import apply, plan_paste

        nodes = list(nodes)
        missing = [n for n in nodes if n not in self._p.graph.nodes]
        if missing:
            raise GraphError(f"no node {', '.join(map(repr, missing))} to duplicate")
        paste = plan_paste(self._p.graph, self._p.graph.subgraph_dict(nodes), offset=offset)
        apply(self._p.graph, paste)
        return paste.ids

    def group(self, nodes: Iterable[str], name: str | None = None) -> str:
        """Put nodes into a block (inside the innermost block holding all of them);
        returns the block's path ("encoder/layer")."""
        from engine.diagram.editing import apply, plan_group

        nodes = list(nodes)
        missing = [n for n in nodes if n not in self._p.graph.nodes]
        if missing:
            raise GraphError(f"no node {', '.join(map(repr, missing))} to group")
        g = plan_group(self._p.graph, list(nodes), name)
        apply(self._p.graph, g)
        return g.block

    def ungroup(self, *blocks: str) -> None:
        """Take blocks away; what they held moves up one level."""
        from engine.diagram.editing import apply, plan_ungroup

        apply(self._p.graph, plan_ungroup(self._p.graph, set(blocks)))

    def repeat(self, block: str, times: int) -> list[str]:
        """`times` copies of a block in a chain, as stacked layers: the block must take one
        value in and give one out; what used its output uses the last copy's. Returns
        the new nodes' ids."""
        from engine.diagram.editing import apply, plan_repeat

        rep = plan_repeat(self._p.graph, block, times)
        apply(self._p.graph, rep)
        self._laid_out = False  # the copies sit in a row; save() lays the diagram out
        return [i for p in rep.copies for i in p.ids]

    # ----- data -------------------------------------------------------------------------
    def use_data(self, path: str | os.PathLike, kind: str | None = None, *, fit: bool = False, **settings: Any):
        """Train on the data set at `path` (kind guessed from its file names: image_folder,
        token_file, parquet, array, shards): sets training.dataset, keeping the settings
        of the same kind it had unless `settings` change them (image_size=, seq_len=,
        inputs=, target=, ...). An image set's image_size and channels, and a token file's
        seq_len, follow the Input node when not given. With fit=True the Input node takes
        the data's shape and dtype. Returns a layerflow.data.DataUse: `.mismatches` lists,
        one line each naming the node, where the data and the diagram still disagree
        (the classifier's outputs against the classes, ...). lf.DataError when the data
        cannot be read. Not saved: call save()."""
        from layerflow.data import use_data

        return use_data(self._p, path, kind, fit=fit, **settings)

    # ----- checking ---------------------------------------------------------------------
    def _settings(self) -> None:
        """Fields changed on p.training / p.placement are checked as the file's are."""
        try:
            self._p.training = core.Training.model_validate(self._p.training.model_dump())
        except ValidationError as exc:
            raise _settings_error("training", exc) from None
        try:
            self._p.placement = core.Placement.model_validate(self._p.placement.model_dump())
        except ValidationError as exc:
            raise _settings_error("placement", exc) from None

    def summary(self) -> Summary:
        """Shapes, parameters and FLOPs of every node (errors listed, not raised)."""
        from engine.diagram.compile import compile_graph

        r = compile_graph(self._p.graph)
        return Summary(r.summary_rows(), r.total_params, r.total_flops,
                       [e.message for e in r.errors], [w.message for w in r.warnings], list(self._p.left_out))

    def validate(self) -> list[str]:
        """Check the diagram and that it can run as placed (memory included); returns the
        warnings (settings that are valid but almost surely a mistake, such as an absurd
        weight decay, among them), raises CheckFailed listing every error."""
        from engine.diagram.compile import compile_graph
        from engine.planning.planner import grouped, make_plan

        name = str(self.path or self.name)
        self._settings()
        if self._p.conflicts:
            from engine.diff import conflict_lines

            raise CheckFailed(f"{name}: merge conflicts left: settle them in the editor or with "
                              f"`layerflow resolve {name} N --ours|--theirs`",
                              [f"merge conflict {line}" for line in conflict_lines(self._p)])
        result = compile_graph(self._p.graph)
        warnings = [str(w) for w in result.warnings] + self._p.training.warnings()
        if result.errors:
            raise CheckFailed(name, result.errors, warnings)
        pl = self._p.placement
        plan = make_plan(self._p, pl.pp * pl.dp * pl.tp, compiled=result)
        warnings += [w for w, _ in grouped(plan.warnings)]
        if plan.errors:
            raise CheckFailed(f"{name}: the diagram compiles but cannot run as placed", plan.errors, warnings)
        return warnings

    # ----- placing ----------------------------------------------------------------------
    def plan(self, nproc: int | None = None, *, device: str = "cpu", memory_gb: float | None = None, **placement):
        """The distributed plan (engine.planning.planner.Plan: mesh, stages, TP layouts,
        communication, memory and time per device) for the placement with `placement`'s
        fields changed; its errors are listed in `plan.errors`, not raised."""
        from engine.runs import calibration
        from engine.planning.planner import make_plan
        from layerflow.prepare import checked_placement

        compiled = self._compiled()
        pl = checked_placement(self._p.placement, placement)
        trial = self._with_placement(pl)
        nproc = nproc or pl.pp * pl.dp * pl.tp
        plan = make_plan(trial, nproc, _device(device, nproc, memory_gb), compiled)
        calibration.apply(plan, trial)  # the newest run of this layout says how fast this machine really is
        return plan

    def _with_placement(self, pl: core.Placement) -> core.Project:
        p = core.Project(self._p.graph, name=self._p.name, training=self._p.training, placement=pl,
                         weights=self._p.weights, path=self._p.path)
        return p

    def place(self, *, pp: int | None = None, dp: int | None = None, tp: int | None = None,
              schedule: str | None = None, microbatches: int | None = None, data_parallel: str | None = None,
              device: str = "cpu", memory_gb: float | None = None):
        """Set the placement (pipeline stages x data-parallel replicas x tensor-parallel
        degree) and return its plan; CheckFailed, with the placement left as it was,
        when it cannot run."""
        fields = {"pp": pp, "dp": dp, "tp": tp, "schedule": schedule, "microbatches": microbatches,
                  "data_parallel": data_parallel}
        plan = self.plan(device=device, memory_gb=memory_gb, **fields)
        if plan.errors:
            raise CheckFailed("the placement cannot run", plan.errors, plan.warnings)
        from layerflow.prepare import checked_placement

        self._p.placement = checked_placement(self._p.placement, fields)
        return plan

    def autoplace(self, devices: int, *, device: str = "cpu", memory_gb: float | None = None):
        """Choose pp/dp/tp, the stage cuts and TP styles for `devices` devices, write them
        into the diagram and the placement, and return the plan (`plan.reasons` says why)."""
        from engine.runs import calibration
        from engine.planning.autoplace import apply_to_project, auto_place

        compiled = self._compiled()
        try:
            auto = auto_place(self._p, devices, _device(device, devices, memory_gb), compiled)
        except ValueError as exc:
            raise LayerflowError(str(exc)) from None
        apply_to_project(self._p, auto)
        auto.plan.reasons = list(auto.reasons)
        calibration.apply(auto.plan, self._p)
        return auto.plan

    def _compiled(self):
        """The compiled diagram (settings checked first); CheckFailed when it has errors."""
        from engine.diagram.compile import compile_graph

        self._settings()
        compiled = compile_graph(self._p.graph)
        if not compiled.ok:
            raise CheckFailed(f"{self.path or self.name}: the diagram has errors", compiled.errors)
        return compiled

    # ----- running ------------------------------------------------------------------------
    def _runnable(self) -> core.Project:
        self._settings()
        if self._weights is not None and self._p.weights is None:
            raise LayerflowError(f"{self.name}: save the project first (p.save('{self.name}.lflow')): its imported "
                                 "weights are written beside the file, and the run starts from them")
        return self._p

    def train(self, nproc: int | None = None, *, steps: int | None = None, seed: int | None = None,
              out: str | os.PathLike | None = None, restarts: int | None = None, **placement) -> Run:
        """Start training on this machine: one process, or `nproc` (default: the
        placement's pp*dp*tp; nproc alone on a 1-process placement means data parallel).
        Returns at once with the Run; `placement` fields (pp=, dp=, tp=, schedule=,
        microbatches=) change this run's layout only. The run folder is `out`, else
        <project folder>/runs/<name>-<time> (the current folder's runs/ before a save).
        `restarts`: how often a run of several processes starts again by itself after a
        rank fails or hangs (training.restarts.max_restarts; 0: never)."""
        from layerflow.prepare import prepare_training
        from layerflow.runs import start

        prep = prepare_training(self._runnable(), nproc=nproc, steps=steps, seed=seed, out=out, restarts=restarts,
                                placement=placement)
        return start(prep)

    def sweep(self, sweep, *, parallel: int | None = None, cluster: str | None = None,
              runs_dir: str | os.PathLike | None = None, on_event=None) -> list[dict]:
        """Run a sweep (a dict, or a sweep file's path; the format is engine/runs/sweep.py's, as
        `layerflow sweep` reads it): every point is checked first (a SweepError naming the
        key), then the queue runs, `parallel` at once on this machine (default: as the cores
        allow) or one job per run on `cluster`, and stops runs early by its rules. Blocks
        until the queue ends; returns its runs as runs-table rows (settings, final and best
        metrics, throughput, peak memory, predicted and measured step time), in queue order.
        on_event(kind, run) follows it ("started", "progress", "finished")."""
        from engine.runs.history import runs_table
        from engine.runs.sweep import load_sweep
        from remote.sweep_queue import SweepRunner

        runner = SweepRunner(self._runnable(), load_sweep(sweep), parallel=parallel, cluster=cluster,
                             runs_dir=runs_dir)
        runner.run(on_event)
        return runs_table(runner.runs_dir, sweep=runner.id)

    def deploy(self, cluster: str, *, steps: int | None = None, name: str | None = None,
               out: str | os.PathLike | None = None, accept_host_key: Iterable[str] = (),
               remote_data: str | None = None, progress=None, on_preflight=None, on_prepared=None,
               min_nodes: int | None = None, max_nodes: int | None = None, max_restarts: int | None = None) -> Job:
        """Run on a cluster profile (`layerflow cluster add`): preflight, upload, torchrun on
        every node; returns the Job at once. An unknown host key stops with its
        fingerprint; pass it in accept_host_key once checked. progress(host, done, total)
        follows the upload (the data's as "<host> data"), on_preflight(report) gets the nodes'
        check, on_prepared(run_dir) the local run folder. The data set: remote_data is its path
        on the cluster (checked on every node by fingerprint, nothing sent); else the
        profile's data_paths may map its folder there; else it is uploaded once into the
        cluster's cache and reused (remote/node_data.py). min_nodes/max_nodes: this job's
        elastic bounds (it goes on with at least min_nodes when nodes are lost, takes nodes
        back up to max_nodes), max_restarts its restarts; None: the profile's (then the run's)."""
        from remote.cluster import ClusterStore
        from remote.launch import deploy
        from remote.launch.ssh_torchrun import prepare

        profile = ClusterStore().get(cluster).with_settings(
            f"deploy to {cluster!r}", min_nodes=min_nodes, max_nodes=max_nodes, max_restarts=max_restarts)
        run_dir = prepare(self._runnable(), out, steps=steps)
        if on_prepared:
            on_prepared(run_dir)
        job = deploy(profile, run_dir, name=name, accept=list(accept_host_key), progress=progress,
                     on_preflight=on_preflight, remote_data=remote_data)
        return Job(job.id)

    # ----- files --------------------------------------------------------------------------
    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the .lflow file (atomically); an imported model's weights go beside it.
        A diagram built here without positions is laid out first."""
        if path is None and self.path is None:
            raise LayerflowError(f"{self.name}: say where to save it: p.save('{self.name}.lflow')")
        if not self._laid_out:
            from engine.diagram.layout import lay_out

            for nid, xy in lay_out(self._p.graph).items():
                self._p.graph.move(nid, xy)
            self._laid_out = True
        if self._weights is not None and self._p.weights is None:
            from engine.interop import save_imported

            out = save_imported(self._weights, path or self.path)
        else:
            out = core.save_project(self._p, path)
        self._p.path = out
        return out

    def export_onnx(self, path: str | os.PathLike, opset: int | None = None, *, run: Run | str | os.PathLike | None = None,
                    checkpoint: str | None = None) -> Path:
        """The model as ONNX (dynamic batch). Its weights: a run's (`run`: a Run or its folder;
        `checkpoint`: final, latest, best or step_N; default final, else latest), else the
        project's weights file, else the initial weights. A run of another diagram is refused."""
        from engine.interop import export_onnx
        from engine.interop.onnx.export import DEFAULT_OPSET

        return export_onnx(self._runnable(), path, opset=opset or DEFAULT_OPSET, run=_run_path(run),
                           checkpoint=checkpoint)

    def export_script(self, path: str | os.PathLike, *, run: Run | str | os.PathLike | None = None,
                      checkpoint: str | None = None) -> Path:
        """A standalone PyTorch training script (torch only) of this project; with `run`, it
        carries that run's weights (NAME.weights.pt beside it, loaded by its load_model())."""
        from engine.interop import export_script

        return export_script(self._runnable(), path, run=_run_path(run), checkpoint=checkpoint)

    # ----- a run's model ----------------------------------------------------------------------
    def use_run_weights(self, run: Run | str | os.PathLike, checkpoint: str | None = None) -> Path:
        """Make a run's weights the project's: NAME.weights.pt beside the saved project
        file (written atomically), named by the file (changed under its edit lock). Later
        runs start from them, exports carry them. Returns the weights file."""
        from engine.runs.weights import use_run_weights

        if self.path is None:
            raise LayerflowError(f"{self.name}: save the project first: its weights file goes beside it")
        wpath, _ = use_run_weights(self.path, _run_path(run), checkpoint)
        self._p.weights = wpath.name
        if self._p._read_digest is not None:
            raw = Path(self.path).read_bytes()
            if raw == self._p.dumps().encode("utf-8"):  # nothing else changed here: this object is the file again
                self._p._read_digest = (os.path.realpath(self.path), core._digest(raw))
        return wpath

    def predict(self, inputs, *, run: Run | str | os.PathLike | None = None, checkpoint: str | None = None,
                batch_size: int = 256):
        """The model's outputs as a numpy array for `inputs` (an array of samples, one
        sample, a dict {Input id: array}, or a path: .npy, .npz, an image or a folder of
        images), with a run's weights (else the project's), in eval mode on the CPU."""
        from engine.runs.weights import predict, read_inputs

        if isinstance(inputs, (str, os.PathLike)):
            inputs, _ = read_inputs(self._runnable(), inputs)
        return predict(self._runnable(), inputs, _run_path(run), checkpoint, batch_size=batch_size)

    def fine_tune(self, run: Run | str | os.PathLike, checkpoint: str | None = None, *, nproc: int | None = None,
                  steps: int | None = None, seed: int | None = None, out: str | os.PathLike | None = None,
                  **placement) -> Run:
        """Start a new run (as train does) whose initial weights are `run`'s at `checkpoint`."""
        from engine.runs.weights import init_from, note_init
        from layerflow.prepare import prepare_training
        from layerflow.runs import start

        src = str(_run_path(run))
        with init_from(self._runnable(), src, checkpoint) as project:
            prep = prepare_training(project, nproc=nproc, steps=steps, seed=seed, out=out, placement=placement)
        note_init(prep.run_dir, src, checkpoint)
        return start(prep)

    def diff(self, other: Project | str | os.PathLike):
        """What changed from this project to `other`, by meaning (engine.diff.ProjectDiff)."""
        from engine.diff import diff_projects

        theirs = other._p if isinstance(other, Project) else core.load_project(other)
        return diff_projects(self._p, theirs)


def _run_path(run) -> Path | None:
    """A Run or a run folder, as the folder."""
    if run is None:
        return None
    return run.dir if isinstance(run, Run) else Path(run)


def _check_params(spec, params: dict, where: str) -> None:
    """GraphError naming every bad parameter (an unknown one with the names it may have meant)."""
    _, errs = spec.check_params(params)
    if not errs:
        return
    names = [q.name for q in spec.params]
    msgs = []
    for e in errs:
        near = difflib.get_close_matches(e.field or "", names, n=2) if str(e).startswith("unknown parameter") else []
        msgs.append(f"{e} (did you mean {', '.join(near)}?)" if near else str(e))
    raise GraphError(f"{where}: " + "; ".join(msgs))


def _device(name: str, nproc: int, memory_gb: float | None):
    from dataclasses import replace

    from engine.planning.cost import device_from_name

    try:
        dev = device_from_name(name, nproc)
    except ValueError as exc:
        raise LayerflowError(str(exc)) from None
    if memory_gb is not None:
        if memory_gb <= 0:
            raise LayerflowError(f"memory_gb must be positive, not {memory_gb}")
        dev = replace(dev, memory_bytes=int(memory_gb * 2**30))
    return dev


def load(path: str | os.PathLike) -> Project:
    return Project.load(path)
