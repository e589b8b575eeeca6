"""Project + devices -> Plan: a JSON document that says where everything runs.

OneFlow describes a distributed program by placement (which devices) and SBP
(how each tensor lies on them: split, broadcast, partial_sum); PyTorch's DTensor
says the same with Shard(d), Replicate(), Partial(). The plan speaks DTensor and
shows OneFlow's word beside it. It holds:

  mesh            pp x dp x tp and which global ranks form each group
  stages          lists of node ids, in topological order (pipeline cuts)
  tp_plan         per node: style, input/output layouts (what runtime/parallel.py applies)
  layouts         per edge: the tensor's layout over (dp, tp), and where it crosses a stage cut
  communication   every collective or send/recv the plan implies, with bytes per step
  devices         per rank: predicted parameter/gradient/optimizer/activation bytes, FLOPs
  bubble_fraction (p-1)/(m+p-1)
  errors/warnings messages that state the numbers and the setting to change

Parameter, gradient and optimizer bytes are exact: they follow torch.chunk, which
is how DTensor Shard and FSDP2 split a dimension (the runtime test compares them
with what the ranks allocate). Activation bytes and times are estimates (cost.py).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from engine.compile import CompileError, CompileResult, compile_graph
from engine.cost import (FLOAT_BYTES, DeviceSpec, bubble_fraction, collective_bytes, comm_time, local_cpu,
                         optimizer_slots, step_time)
from engine.layers import get_layer
from engine.partition import ELEMENTWISE, auto_microbatches, auto_tp_styles, balanced_stages
from engine.project import Project
from engine.runtime.plan import PLAN_VERSION, REPLICATE, Layout, RunPlan, TPEntry, shard
from engine.units import gib as _gib

def oneflow_name(layout: Layout | str) -> str:
    """OneFlow's SBP name of a layout (or of its DTensor name, as the plan's JSON holds it)."""
    return (layout if isinstance(layout, Layout) else Layout.parse(layout)).oneflow


def sbp(layouts: list[Layout]) -> dict:
    return {"dtensor": "[" + ", ".join(map(str, layouts)) + "]", "oneflow": "(" + ", ".join(x.oneflow for x in layouts) + ")"}


def chunk_len(size: int, n: int, i: int) -> int:
    """Length of piece i when torch.chunk cuts `size` into n (DTensor Shard, FSDP2)."""
    c = math.ceil(size / n) if n > 0 else size
    return max(0, min(c, size - i * c))


@dataclass
class Plan:
    doc: dict
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # auto-placement: why this layout

    def __str__(self) -> str:
        return format_plan(self)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict:
        return {**self.doc, "errors": list(self.errors), "warnings": list(self.warnings)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def run_plan(self) -> RunPlan:
        """The typed plan the runtime reads (engine/runtime/plan.py)."""
        keys = ("pp", "dp", "tp", "data_parallel", "reshard_after_forward", "schedule", "microbatches",
                "mixed_precision", "sync_batchnorm", "stages", "tp_plan", "checkpoint", "mesh")
        return RunPlan.from_json({k: self.doc[k] for k in keys if k in self.doc}, "the plan")

    def runtime_plan(self) -> dict:
        """What run.json carries as "plan": run_plan() as JSON, with the predicted step time beside it."""
        out = self.run_plan().to_json()
        if "predicted" in self.doc:  # kept beside the run (engine/calibration.py compares it with the run's pace)
            out["predicted"] = {"step_s": self.doc["predicted"]["step_s"], "device": self.doc["device"]["name"],
                                "world": self.doc["world"]}
        return out


# ----- tensor parallel layouts ------------------------------------------------------
SEQ = shard(1)  # sequence-parallel activations: split on the sequence (dim 1 of [batch, seq, ...])
JOINS_SEQUENCE = ELEMENTWISE | {"Add", "Mul"}  # layers that run on a sequence shard as they are


def tp_layouts(graph, compiled: CompileResult, styles: dict[str, str], stage: dict[str, int],
               tp: int = 2) -> tuple[dict[str, dict], dict[str, str], list[str]]:
    """Every node's output layout on the tp axis, the per-node entries the runtime
    applies (tp_plan), and the errors found. Local tensors flow between layers; a
    layout is what each rank's piece of the whole tensor is:

    - Megatron's pair: a column-wise layer's output stays Shard(-1) when it flows,
      through elementwise layers only, into a row-wise layer of the same stage (no
      communication in between); otherwise it is all-gathered to Replicate().
    - Sequence parallelism (Megatron-SP, torch's SequenceParallel): a norm with style
      'sequence' runs on Shard(1), its slice of the tokens. Elementwise layers and
      Add/Mul touching such a norm join that region; the layers feeding the region
      hand over Shard(1) (a row-wise layer reduce-scatters instead of all-reducing, a
      replicated one just keeps its chunk), and layers reading from it all-gather
      (a column-wise one as its backward reduce-scatter)."""
    out: dict[str, dict] = {}
    errors: list[str] = []
    nodes = graph.nodes
    compute = [n for n in compiled.order if nodes[n].type not in ("Input", "Output")]
    # ---- the sequence-parallel region: the norms, and what joins them ----
    seq = {n for n, s in styles.items() if s == "sequence"}
    feeds_seq: set[str] = set()  # outside the region, handing it Shard(1) (to all their consumers)
    grew = bool(seq)
    while grew:
        feeds_seq = {n for n in compiled.order if n not in seq and any(c in seq for c in graph.successors(n))}
        grew = False
        for n in compute:
            if n in seq or nodes[n].type not in JOINS_SEQUENCE or styles.get(n, "replicate") != "replicate":
                continue
            if any(p in seq or p in feeds_seq for p in graph.predecessors(n)) or \
                    any(c in seq for c in graph.successors(n)):
                seq.add(n)
                grew = True
    for n in sorted(feeds_seq & {n for n in compiled.order if nodes[n].type == "Input"}):
        errors.append(f"node '{n}' (Input) feeds the sequence-parallel region directly; put a layer between it "
                      f"and {', '.join(c for c in graph.successors(n) if c in seq)}, or set the norms' tp style "
                      f"to replicate")
    for n in seq | feeds_seq:
        info = compiled.nodes[n].out if n in compiled.nodes else None
        shape = list(info.shape) if info else []
        if nodes[n].type == "Input":
            continue
        if len(shape) < 2:
            errors.append(f"node '{n}' ({nodes[n].type}): sequence parallelism splits the sequence (dim 1 of "
                          f"[batch, seq, features]) but its output is {[None, *shape]}; set the norms' tp style "
                          f"to replicate")
        elif shape[0] % tp:
            errors.append(f"node '{n}' ({nodes[n].type}): tp={tp} does not divide its sequence length {shape[0]}; "
                          f"choose tp among {', '.join(str(d) for d in range(2, shape[0] + 1) if shape[0] % d == 0)}"
                          f" or set the norms' tp style to replicate")
    for n in seq:
        ns = compiled.nodes[n].params.get("normalized_shape")
        if styles.get(n) == "sequence" and isinstance(ns, (list, tuple)) and len(ns) > 1:
            errors.append(f"node '{n}' ({nodes[n].type}): sequence parallelism needs a norm over the last dimension "
                          f"only, but normalized_shape is {compiled.nodes[n].params['normalized_shape']}")
        for c in graph.successors(n):
            if nodes[c].type in ("Output", "Concat"):
                errors.append(f"edge {n} -> {c}: {c} ({nodes[c].type}) cannot read a sequence shard; put a "
                              f"replicated layer between them or set the norms' tp style to replicate")

    # ---- Megatron's column-wise -> row-wise pairs ----
    feeds_shard: set[str] = set()
    pair_colwise: set[str] = set()
    for nid, style in styles.items():
        if style != "colwise" or nodes[nid].type == "MultiheadAttention":
            continue
        cur = nid
        while True:
            outs = graph.outgoing(cur)
            if len(outs) != 1:
                break
            nxt = outs[0].dst
            if stage.get(nxt) != stage.get(nid) or nxt in seq:
                break
            if styles.get(nxt) == "rowwise" and nodes[nxt].type == "Linear":
                pair_colwise.add(nid)
                feeds_shard.add(nxt)
                break
            if nodes[nxt].type not in ELEMENTWISE or styles.get(nxt, "replicate") != "replicate":
                break
            cur = nxt

    # ---- every node's output layout, then the entries the runtime applies ----
    layout: dict[str, Layout] = {}
    for n in compiled.order:
        ntype, style = nodes[n].type, styles.get(n)
        preds = graph.predecessors(n)
        if n in seq or n in feeds_seq:
            layout[n] = SEQ
        elif n in pair_colwise:
            layout[n] = shard(-1)
        elif style is None and ntype in ELEMENTWISE and len(preds) == 1:
            layout[n] = layout.get(preds[0], REPLICATE)  # elementwise layers keep their input's layout
        else:
            layout[n] = REPLICATE
    for n in compiled.order:
        ntype, style = nodes[n].type, styles.get(n)
        if ntype in ("Input", "Output") or (n in seq and style != "sequence"):
            continue  # joined layers run on their shard as they are
        preds = graph.predecessors(n)
        given = layout[preds[0]] if preds else REPLICATE
        if style in (None, "replicate"):
            if given != SEQ and layout[n] != SEQ:
                continue
            if len(preds) > 1:  # a function layer (Add, Mul, Concat) has no module to gather in
                errors.append(f"node '{n}' ({ntype}) reads a sequence shard from {preds[0]} but cannot gather it; "
                              f"set the norms' tp style to replicate")
                continue
            style = "replicate"
        inner = "q/k/v colwise (heads split), out rowwise" if ntype == "MultiheadAttention" and style == "colwise" \
            else None
        out[n] = TPEntry(style, ntype, SEQ if given == SEQ else shard(-1) if n in feeds_shard else REPLICATE,
                         layout[n], inner)
    return out, layout, errors


def param_shards(ntype: str, style: str, pname: str) -> int | None:
    """Which dimension of a parameter TP splits (None: replicated); the layer's TPRule says."""
    spec = get_layer(ntype)
    rule = spec.tp_rule(style) if spec else None
    return rule.shard_dim(pname) if rule else None


# ----- the planner ---------------------------------------------------------------
def make_plan(project: Project, nproc: int | None = None, device: DeviceSpec | None = None,
              compiled: CompileResult | None = None, placement: dict | None = None,
              stages: list[list[str]] | None = None, styles: dict[str, str] | None = None) -> Plan:
    """The plan for running `project` on nproc processes (default: dp*tp*pp).
    placement/stages/styles override the project's (auto-placement tries candidates)."""
    compiled = compiled or compile_graph(project.graph)
    pl = {**project.placement.model_dump(), **(placement or {})}
    pp, dp, tp = int(pl["pp"]), int(pl["dp"]), int(pl["tp"])
    world = pp * dp * tp
    nproc = nproc or world
    device = device or local_cpu(nproc)
    errors: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []  # what the planner chose where the placement left it open: not problems
    if not compiled.ok:
        return Plan({"version": PLAN_VERSION}, ["the diagram has errors: " + "; ".join(map(str, compiled.errors))], [])
    graph = compiled.graph
    B = project.training.batch_size
    schedule = pl["schedule"]
    if pp == 1:
        m = 1
    elif pl.get("microbatches"):
        m = int(pl["microbatches"])
    else:  # not set: one per stage at least (1F1B's need), dividing each replica's batch
        m = auto_microbatches(B, dp, pp, 2 * pp if schedule == "interleaved1f1b" else pp)

    if world != nproc:
        errors.append(f"placement pp={pp} x dp={dp} x tp={tp} = {world} processes, but {nproc} are available; "
                      f"set placement pp/dp/tp so that pp*dp*tp = {nproc}, or run with --nproc {world}")
    interleaved = pp > 1 and schedule == "interleaved1f1b"
    if pp > 1 and schedule == "1f1b" and m < pp:
        errors.append(f"placement.schedule 1f1b needs placement.microbatches >= stages, but microbatches is {m} and "
                      f"pp is {pp}; raise placement.microbatches to {pp} (or leave it unset: the planner picks it), or choose gpipe")
    if dp > 1 and tp > 1 and pl["data_parallel"] == "ddp":
        errors.append(f"data_parallel ddp with tp={tp}: torch's DDP swaps tensor-parallel DTensor parameters for "
                      f"local ones, which breaks optimizer state and distributed checkpoints; set "
                      f"placement.data_parallel to fsdp (FSDP2 shards on the dp axis over TP's DTensors)")
    if B % (dp * m):
        good = (B // (dp * m) + 1) * dp * m
        errors.append(f"training.batch_size {B} is not divisible by dp={dp} x microbatches={m} = {dp * m}; "
                      f"set batch_size to a multiple of {dp * m} (e.g. {good}) or change dp/microbatches")

    compute = [n for n in compiled.order if graph.nodes[n].type not in ("Input", "Output")]
    # ---- stages (interleaved: several per rank, stage s on pp rank s % pp) ----
    given = {n: graph.nodes[n].stage for n in compute if graph.nodes[n].stage is not None}
    n_stages = pp
    if interleaved:
        n_stages = len(stages) if stages is not None else (max(given.values()) + 1 if given else 2 * pp)
        if n_stages % pp or n_stages < 2 * pp:
            errors.append(f"placement.schedule interleaved1f1b runs several stages per rank: the number of stages "
                          f"must be a multiple of pp={pp} and at least {2 * pp}, but it is {n_stages}; number the "
                          f"nodes' stages 0..{2 * pp - 1} (2 per rank) or choose 1f1b")
        rounds = max(1, m // pp)
        if m % rounds:
            errors.append(f"placement.schedule interleaved1f1b with pp={pp} needs microbatches divisible by "
                          f"microbatches // pp = {rounds}, but microbatches is {m}; set it to a multiple of {pp}")
    v = max(1, n_stages // pp)
    too_many = False
    if stages is None:
        if pp == 1:
            stages = [list(compute)]
        elif len(compute) < n_stages:
            errors.append(f"placement.pp={pp} asks for {n_stages} pipeline stages but the model has only "
                          f"{len(compute)} layer(s); lower placement.pp to at most {max(1, len(compute))}")
            stages = [[n] for n in compute] + [[] for _ in range(n_stages - len(compute))]
            too_many = True
        elif not given:
            stages, _ = balanced_stages(compiled, n_stages, device, dp=dp, tp=tp, microbatches=m,
                                        batch_size=B, optimizer_slots=optimizer_slots(project.training.optimizer.name,
                                                                                project.training.optimizer.momentum))
            notes.append(f"no node has a pipeline stage: the planner cut the model into {n_stages} balanced stages")
        else:
            stages = [[] for _ in range(n_stages)]
            cur = 0
            for n in compute:  # a node without a stage follows the one before it
                s = given.get(n, cur)
                if s >= n_stages:
                    errors.append(f"node '{n}' ({graph.nodes[n].type}): stage {s} but placement.pp is {pp}; "
                                  f"set its stage to 0..{pp - 1} or raise pp to {s + 1}")
                    s = n_stages - 1
                stages[s].append(n)
                cur = s
    stage = {n: s for s, ids in enumerate(stages) for n in ids}
    for n in compiled.order:
        if graph.nodes[n].type == "Input":
            stage[n] = 0
    for e in graph.edges:
        if e.src in stage and e.dst in stage and stage[e.src] > stage[e.dst]:
            errors.append(f"edge {e.src} -> {e.dst} goes from stage {stage[e.src]} back to stage {stage[e.dst]}; "
                          f"stages must follow the data flow: set '{e.dst}' to stage {stage[e.src]} or later")
    for s, ids in enumerate(stages):
        if not ids and not too_many:
            errors.append(f"stage {s} holds no layer; lower placement.pp to {len([x for x in stages if x])} "
                          f"or move a layer to stage {s}")
    for dst, src in ((compiled.spec or {}).get("ties") or {}).items():
        a, b = dst.partition(".")[0], src.partition(".")[0]
        if a in stage and b in stage and stage[a] != stage[b]:
            errors.append(f"nodes '{b}' and '{a}' share one parameter ({src} = {dst}, tied weights) but sit in "
                          f"stages {stage[b]} and {stage[a]}; a pipeline stage holds its own copy, so put both in one "
                          f"stage (set their stage) or lower placement.pp to 1")

    k = project.training.grad_accumulation
    if k > 1 and world > 1:
        errors.append(f"training.grad_accumulation {k} runs in one process only, but the plan uses {world} "
                      f"processes; set it to 1 (a pipeline cuts the batch into placement.microbatches itself)")

    # ---- tensor-parallel styles ----
    auto_styles: dict[str, str] = {}
    if styles is None:
        styles = {n: graph.nodes[n].tp for n in compute if graph.nodes[n].tp not in (None, "replicate")}
        if tp > 1:  # nodes left on auto: Megatron's pairs and attention heads, where tp divides them
            auto_styles = auto_tp_styles(compiled, tp, only={n for n in compute if graph.nodes[n].tp is None})
            styles.update(auto_styles)
    if tp == 1:
        styles = {}
    for n, style in list(styles.items()):
        ntype = graph.nodes[n].type
        spec = get_layer(ntype)
        allowed = [s for s in (spec.tp_styles if spec else ()) if s != "replicate"]
        if style not in allowed:
            errors.append(f"node '{n}' ({ntype}): tp style '{style}' does not apply to this layer; it supports "
                          f"{', '.join(spec.tp_styles) if spec and spec.tp_styles else 'only replicate'}")
            del styles[n]
            continue
        rule = spec.tp_rule(style)
        if rule:
            size = compiled.nodes[n].params.get(rule.splits)
            if size and size % tp:
                divs = [d for d in range(2, size + 1) if size % d == 0][:6]
                errors.append(f"node '{n}' ({ntype}): tp={tp} does not divide its {rule.what} ({rule.splits}={size}); "
                              f"choose tp among {', '.join(map(str, divs))} or set its tp style to replicate")
    tp_plan, tp_layout, tp_errors = tp_layouts(graph, compiled, styles, stage, tp)
    errors += tp_errors
    if tp > 1 and all(e.style == "replicate" for e in tp_plan.values()):
        warnings.append(f"placement.tp={tp} splits no layer: every tp rank holds and computes the whole model; set "
                        f"nodes' tp style (colwise then rowwise Linear pairs, attention by heads) or leave them on "
                        f"auto with sizes that tp divides, or lower placement.tp to 1")

    # ---- batch-dependent layers ----
    local_b, mb = B // max(1, dp), B // max(1, dp * m)
    for n in compute:
        spec = get_layer(graph.nodes[n].type)
        if not (spec and spec.batch_dependent):
            continue
        ntype = graph.nodes[n].type
        if ntype.startswith("BatchNorm"):
            if dp > 1 and not pl.get("sync_batchnorm"):
                warnings.append(f"node '{n}' ({ntype}): statistics come from each replica's {local_b} samples, not "
                                f"the global batch of {B}, under dp={dp}, so losses differ from one process; fix: set "
                                f"placement.sync_batchnorm (statistics over the data axis: torch's SyncBatchNorm "
                                f"on GPUs, an all-reduce on CPU)")
            if m > 1:
                warnings.append(f"node '{n}' ({ntype}): statistics come from micro-batches of {mb} samples under "
                                f"microbatches={m}; fix: compare against one process with training.grad_accumulation"
                                f"={m} (train --accumulate {m}), or set placement.microbatches to 1 (pp=1)")
        elif ntype == "Dropout" and (dp > 1 or tp > 1 or m > 1) and compiled.nodes[n].params.get("p", 0) > 0:
            warnings.append(f"node '{n}' (Dropout): masks come from each rank's own random stream, so losses are "
                            f"not the single-process ones; fix: compare with p=0, or accept statistically equal runs")

    generic = [n for n in compute if graph.nodes[n].type == "Op"]
    if tp > 1 and generic:
        warnings.append(f"{len(generic)} generic Op node(s) ({', '.join(generic[:5])}{', ...' if len(generic) > 5 else ''}) "
                        f"run replicated on every tensor-parallel rank: the planner does not split ATen calls it has "
                        f"no rule for (their inputs are gathered first)")
    # ---- memory and FLOPs per rank ----
    opt = project.training.optimizer
    meta = compiled.module
    n_opt_states = optimizer_slots(opt.name, opt.momentum)
    mesh = mesh_ranks(pp, dp, tp)
    devices = []
    fsdp = pl["data_parallel"] == "fsdp" and dp > 1
    stage_flops = [0.0] * pp
    stage_state = [0.0] * pp  # bytes each pipeline rank's optimizer step goes through
    ckpt_nodes = set(n for n in compute if graph.nodes[n].checkpoint)
    for rank in range(world):
        s, d, t = mesh["coords"][rank]
        mine = list(range(s, len(stages), pp))  # this rank's stages
        ids = [n for st in mine for n in stages[st]]
        params = tensors = 0
        seen: set[int] = set()  # a tied parameter is held once
        for n in ids:
            if get_layer(graph.nodes[n].type).kind == "function":  # no parameters
                continue
            style = styles.get(n)
            for pname, p in meta.get_submodule(n).named_parameters():
                if id(p) in seen:
                    continue
                seen.add(id(p))
                shape = list(p.shape)
                dim = param_shards(graph.nodes[n].type, style, pname)
                if dim is not None:
                    shape[dim] = chunk_len(shape[dim], tp, t)
                if fsdp:
                    shape[0] = chunk_len(shape[0], dp, d)
                params += math.prod(shape)
                tensors += 1
        acts = sum(activation_bytes(compiled, stages[st], tp_layout, tp, B // max(1, dp), m, pp, st,
                                    schedule, ckpt_nodes) for st in mine)
        flops = 3.0 * sum(compiled.nodes[n].flops / (tp if n in styles else 1) for n in ids) * (B // max(1, dp))
        stage_flops[s] = flops
        mem = {"params_bytes": params * FLOAT_BYTES, "grads_bytes": params * FLOAT_BYTES,
               "optimizer_bytes": n_opt_states * params * FLOAT_BYTES + (tensors * 4 if opt.name != "sgd" else 0),
               "activations_bytes": acts}
        mem["total_bytes"] = sum(mem.values())
        stage_state[s] = max(stage_state[s], mem["params_bytes"] + mem["grads_bytes"] + mem["optimizer_bytes"])
        devices.append({"rank": rank, "stage": s, "stages": mine, "dp_rank": d, "tp_rank": t, "memory": mem,
                        "flops_per_step": flops, "params": params})
    for dv in devices:
        if dv["memory"]["total_bytes"] > device.memory_bytes:
            mem = dv["memory"]
            errors.append(f"rank {dv['rank']} (stage {dv['stage']}) needs {_gib(mem['total_bytes'])} (parameters "
                          f"{_gib(mem['params_bytes'])}, gradients {_gib(mem['grads_bytes'])}, optimizer "
                          f"{_gib(mem['optimizer_bytes'])}, activations {_gib(mem['activations_bytes'])}) but a "
                          f"{device.name} device has {_gib(device.memory_bytes)}; raise pp or tp, use "
                          f"data_parallel fsdp, or raise microbatches")
            break

    comms = communication(compiled, stages, stage, styles, tp_plan, pp, dp, tp, m, B, pl, devices, meta)
    comm_s = sum(comm_time(c["op"], c["bytes_per_step"], c["group_size"], device, c.get("messages", 1))
                 for c in comms) / max(1, pp)
    timing = step_time(stage_flops, m, device, comm_s, v, state_bytes=stage_state)
    layouts = edge_layouts(graph, compiled, stage, tp_layout, dp, tp)
    doc = {
        "version": PLAN_VERSION, "project": project.name, "world": world, "nproc": nproc,
        "pp": pp, "dp": dp, "tp": tp,
        "mesh": {"dims": ["pp", "dp", "tp"], "shape": [pp, dp, tp], "ranks": mesh["ranks"], "groups": mesh["groups"]},
        "data_parallel": pl["data_parallel"] if dp > 1 else "none",
        "reshard_after_forward": bool(pl["reshard_after_forward"]),
        "schedule": schedule if pp > 1 else "none", "microbatches": m,
        "mixed_precision": pl["mixed_precision"], "sync_batchnorm": bool(pl.get("sync_batchnorm")),
        "batch": {"global": B, "per_replica": B // max(1, dp), "per_microbatch": B // max(1, dp * m)},
        "stages": stages, "stages_per_rank": v, "tp_plan": {n: e.to_json() for n, e in tp_plan.items()},
        "tp_auto": sorted(auto_styles), "notes": notes,
        "checkpoint": [n for n in compute if graph.nodes[n].checkpoint],
        "layouts": layouts, "communication": comms, "devices": devices,
        "bubble_fraction": bubble_fraction(pp, m, v),
        "device": device.to_dict(),
        "predicted": {**timing, "peak_bytes_max": max(d["memory"]["total_bytes"] for d in devices)},
    }
    if pp > 1 and dp > 1 and pl["data_parallel"] == "fsdp" and pl["reshard_after_forward"]:
        warnings.append(f"FSDP with reshard_after_forward under pp={pp}: parameters are gathered again for every one "
                        f"of the {m} micro-batches; set placement.reshard_after_forward to false to gather once per step")
    return Plan(doc, errors, warnings)


_NODE_RE = re.compile(r"\bnode '([^']+)'")
_EDGE_RE = re.compile(r"\bedge ([A-Za-z_]\w*) -> ([A-Za-z_]\w*)")


_PER_NODE = re.compile(r"^node '([^']+)' \(([^)]+)\): (.*)$", re.S)
SHOW_NODES = 6  # names listed in a grouped message before "..."


def grouped(messages: list[str]) -> list[tuple[str, list[str]]]:
    """Messages that say the same of many nodes as one: "53 BatchNorm2d nodes (bn1,
    layer1_0_bn1, ...): statistics come from ...", with the nodes it covers. A message
    about one node, or about none, stays as it is. Order: where each first appears."""
    out: list[tuple[str, list[str]]] = []
    groups: dict[tuple[str, str], int] = {}
    for msg in messages:
        m = _PER_NODE.match(msg)
        if m is None:
            out.append((msg, []))
            continue
        node, kind, rest = m.groups()
        key = (kind, rest)
        if key in groups:
            out[groups[key]][1].append(node)
        else:
            groups[key] = len(out)
            out.append((rest, [node]))
    result = []
    for i, (text, nodes) in enumerate(out):
        kind = next((k for k, v in groups.items() if v == i), ("", ""))[0]
        if len(nodes) == 1:
            text = f"node '{nodes[0]}' ({kind}): {text}"
        elif nodes:
            names = ", ".join(nodes[:SHOW_NODES]) + (f", ... ({len(nodes) - SHOW_NODES} more)" if len(nodes) > SHOW_NODES else "")
            text = f"{len(nodes)} {kind} nodes ({names}): {text}"
        result.append((text, nodes))
    return result


def plan_problems(plan: "Plan | None", error: str | None = None) -> tuple[list[CompileError], list[CompileError]]:
    """The plan's errors and warnings as problems (field 'placement'), each on the node
    it names (an edge's problem on the node it enters), for the editor's Problems list
    and node badges."""
    def one(msg: str, severity: str) -> CompileError:
        m, e = _NODE_RE.search(msg), _EDGE_RE.search(msg)
        return CompileError(msg, m.group(1) if m else (e.group(2) if e else None), "placement", severity=severity)

    errors = [one(m, "error") for m in (plan.errors if plan else [])
              if not m.startswith("the diagram has errors")]  # those are the compiler's own, listed already
    if error:
        errors.append(one(f"the plan failed: {error}", "error"))
    warnings = [one(w, "warning") for w in (plan.warnings if plan else [])]
    return errors, warnings


def mesh_ranks(pp: int, dp: int, tp: int) -> dict:
    """Ranks laid out as runtime/parallel.py's init_device_mesh does: rank = (s*dp + d)*tp + t."""
    ranks = [[[(s * dp + d) * tp + t for t in range(tp)] for d in range(dp)] for s in range(pp)]
    coords = {ranks[s][d][t]: (s, d, t) for s in range(pp) for d in range(dp) for t in range(tp)}
    groups = {
        "pp": [[ranks[s][d][t] for s in range(pp)] for d in range(dp) for t in range(tp)],
        "dp": [[ranks[s][d][t] for d in range(dp)] for s in range(pp) for t in range(tp)],
        "tp": [list(ranks[s][d]) for s in range(pp) for d in range(dp)],
    }
    return {"ranks": ranks, "coords": coords, "groups": groups}


def _out_bytes(compiled: CompileResult, n: str) -> int:
    info = compiled.nodes[n].out
    return info.nbytes() if info else 0


def activation_bytes(compiled, ids, layout, tp, local_b, m, pp, s, schedule, ckpt) -> int:
    """Estimate: every layer's output is kept for backward (checkpointed ones are
    recomputed), for as many micro-batches as the schedule holds at once: all m
    under GPipe, at most pp - s under 1F1B."""
    per_sample = 0
    for n in ids:
        if n in ckpt:
            continue
        b = _out_bytes(compiled, n)
        if layout.get(n, REPLICATE).is_shard:
            b //= tp
        per_sample += b
    in_flight = m if (pp == 1 or schedule != "1f1b") else min(m, pp - s)
    return per_sample * (local_b // max(1, m)) * in_flight


def edge_layouts(graph, compiled, stage, layout, dp, tp) -> list[dict]:
    """Each edge's tensor layout over the (dp, tp) mesh dims: the batch is split on
    dp; on tp it is what tp_layouts found for the edge's source."""
    out = []
    for e in graph.edges:
        src = graph.nodes.get(e.src)
        if src is None or src.type == "Output":
            continue
        tp_layout = layout.get(e.src, REPLICATE) if tp > 1 else REPLICATE
        lay = [shard(0) if dp > 1 else REPLICATE, tp_layout]
        rec = {"edge": f"{e.src} -> {e.dst}", "src": e.src, "dst": e.dst, "mesh_dims": ["dp", "tp"], **sbp(lay),
               "tp_layout": str(tp_layout),
               "bytes_per_sample": _out_bytes(compiled, e.src)}
        s0, s1 = stage.get(e.src), stage.get(e.dst)
        if s0 is not None and s1 is not None and s0 != s1:
            rec["crosses"] = f"stage {s0} -> stage {s1}"
        out.append(rec)
    return out


def communication(compiled, stages, stage, styles, tp_plan, pp, dp, tp, m, B, pl, devices, meta) -> list[dict]:
    """Every transfer the plan implies, with bytes per step (per group, the tensor
    size moved; cost.py turns that into time with the ring factor)."""
    graph = compiled.graph
    comms: list[dict] = []
    local_b = B // max(1, dp)
    # pipeline: values live across each cut, forward activations and backward grads
    last = len(stages) - 1
    for s in range(last):
        live = [n for n in compiled.order if stage.get(n, 99) <= s and any(
            stage.get(e.dst, last if graph.nodes[e.dst].type == "Output" else -1) > s for e in graph.outgoing(n))]
        nbytes = sum(_out_bytes(compiled, n) for n in live) * local_b
        carried = [n for n in live if stage.get(n) < s]
        comms.append({"op": "send/recv", "where": f"cut stage {s} -> {s + 1}", "values": live,
                      "carried_through": carried, "group": "pp", "group_size": 2, "messages": 2 * m,
                      "bytes_per_step": 2 * nbytes, "why": "activations forward, their gradients backward, "
                      f"in {m} micro-batches" + (f"; {', '.join(carried)} skip(s) carried through" if carried else "")})
    # tensor parallel
    if tp > 1:
        for n, ent in tp_plan.items():
            preds = graph.predecessors(n)
            in_b = (_out_bytes(compiled, preds[0]) if preds else 0) * local_b
            out_b = _out_bytes(compiled, n) * local_b
            comms += _tp_comms(n, ent, in_b, out_b, tp, sum(p.numel() for p in meta.get_submodule(n).parameters())
                               if ent.style == "sequence" else 0)
    # data parallel: gradient sync per stage
    if dp > 1:
        for s in range(pp):
            full = sum(dv["params"] for dv in devices if dv["stage"] == s and dv["dp_rank"] == 0 and dv["tp_rank"] == 0)
            if pl["data_parallel"] == "fsdp":
                full = sum(dv["params"] for dv in devices if dv["stage"] == s and dv["tp_rank"] == 0)
                nb = full * FLOAT_BYTES
                gathers = (2 if pl["reshard_after_forward"] else 1) * (m if pp > 1 and pl["reshard_after_forward"] else 1)
                comms.append({"op": "all-gather", "where": f"stage {s} parameters", "group": "dp", "group_size": dp,
                              "messages": gathers, "bytes_per_step": gathers * nb,
                              "why": "FSDP2: Shard(0) -> Replicate() before forward" +
                              (" and again before backward" if pl["reshard_after_forward"] else "")})
                comms.append({"op": "reduce-scatter", "where": f"stage {s} gradients", "group": "dp", "group_size": dp,
                              "messages": 1, "bytes_per_step": nb, "why": "FSDP2: gradients Partial() -> Shard(0)"})
            else:
                comms.append({"op": "all-reduce", "where": f"stage {s} gradients", "group": "dp", "group_size": dp,
                              "messages": 1, "bytes_per_step": full * FLOAT_BYTES,
                              "why": "DDP: gradients Partial() -> Replicate() (bucketed, overlapped with backward)"})
    for c in comms:
        c["per_rank_bytes"] = collective_bytes(c["op"], c["bytes_per_step"], c["group_size"])
        c["oneflow"] = {"all-reduce": "partial_sum -> broadcast", "all-gather": "split -> broadcast",
                        "reduce-scatter": "partial_sum -> split", "send/recv": "boxing between placements"}[c["op"]]
    return comms


def _tp(n, op, nbytes, tp, why, side="") -> dict:
    """side: 'in' when it moves the tensor (or gradient) on the node's inputs, 'out' on its outputs."""
    c = {"op": op, "where": f"node {n}", "group": "tp", "group_size": tp, "messages": 1,
         "bytes_per_step": nbytes, "why": why}
    return {**c, "side": side} if side else c


def _tp_comms(n: str, ent: TPEntry, in_b: int, out_b: int, tp: int, norm_params: int) -> list[dict]:
    """The collectives one tp_plan entry implies (DTensor's redistributions at its edges)."""
    style, typ, seq_in, seq_out = ent.style, ent.type, ent.input == SEQ, ent.output == SEQ
    c: list[dict] = []
    if style == "sequence":  # runs on its tokens; only its replicated weights' gradients are summed
        if norm_params:
            c.append(_tp(n, "all-reduce", norm_params * FLOAT_BYTES, tp,
                         "backward: norm weight gradients Partial() -> Replicate()"))
        return c
    if style == "replicate":  # a layer outside TP at the sequence region's edge
        if seq_in:
            c.append(_tp(n, "all-gather", in_b, tp, "forward: Shard(1) -> Replicate() (leaves the sequence region)", "in"))
        if seq_out:
            c.append(_tp(n, "all-gather", out_b, tp, "backward: gradient Shard(1) -> Replicate() (forward keeps "
                                                      "this rank's chunk of tokens: no communication)", "out"))
        return c
    # what reaches the layer
    if seq_in:
        c.append(_tp(n, "all-gather", in_b, tp, "forward: Shard(1) -> Replicate() (sequence region's tokens)", "in"))
        c.append(_tp(n, "reduce-scatter", in_b, tp, "backward: input gradient Partial() -> Shard(1)", "in"))
    elif (style == "colwise" and typ != "Embedding") or typ == "MultiheadAttention":
        c.append(_tp(n, "all-reduce", in_b, tp, "backward: input gradient Partial() -> Replicate()", "in"))
    elif style == "rowwise" and ent.input == REPLICATE and typ != "Embedding":
        c.append(_tp(n, "all-gather", in_b, tp, "backward: input gradient Shard(-1) -> Replicate()", "in"))
    # what leaves it
    partial_out = style == "rowwise" or typ == "MultiheadAttention"
    if partial_out and seq_out:
        c.append(_tp(n, "reduce-scatter", out_b, tp, "forward: Partial() -> Shard(1) (into the sequence region)", "out"))
        c.append(_tp(n, "all-gather", out_b, tp, "backward: gradient Shard(1) -> Replicate()", "out"))
    elif partial_out:
        c.append(_tp(n, "all-reduce", out_b, tp, "forward: Partial() -> Replicate()", "out"))
    elif ent.output != shard(-1):  # column-wise not paired with a row-wise layer
        c.append(_tp(n, "all-gather", out_b, tp, f"forward: Shard(-1) -> {ent.output} (no row-wise layer follows)", "out"))
    return c


MAX_ROWS = 64  # a plan of 65,536 ranks prints what a terminal can show, then says how many more


def _first_rows(rows: list, what: str) -> tuple[list, list[str]]:
    """The rows to print (all, or the first MAX_ROWS) and the line that says how many were
    left out (the --json document has every one)."""
    if len(rows) <= MAX_ROWS:
        return rows, []
    return rows[:MAX_ROWS], [f"... {len(rows) - MAX_ROWS:,} more {what} not listed (--json has all)"]


def format_plan(plan: Plan) -> str:
    """The plan as a person reads it on a terminal."""
    d = plan.doc
    lines = []
    if "mesh" in d:
        lines.append(f"mesh: pp={d['pp']} x dp={d['dp']} x tp={d['tp']} = {d['world']} ranks; "
                     f"data parallel: {d['data_parallel']}; schedule: {d['schedule']}, microbatches {d['microbatches']}; "
                     f"bubble {d['bubble_fraction']:.1%}")
        on_stage: dict[int, list[int]] = {}
        for dv in d["devices"]:
            for s in dv["stages"]:
                on_stage.setdefault(s, []).append(dv["rank"])
        rows, more = _first_rows(list(enumerate(d["stages"])), "stages")
        for s, ids in rows:
            ranks = [str(r) for r in sorted(on_stage.get(s, []))]
            shown = ranks if len(ranks) <= 16 else [*ranks[:8], "...", *ranks[-4:]]
            lines.append(f"stage {s} (ranks [{', '.join(shown)}]): {', '.join(ids)}")
        lines += more
        auto = set(d.get("tp_auto") or ())
        rows, more = _first_rows(list(d["tp_plan"].items()), "tensor-parallel layers")
        for n, e in rows:
            lines.append(f"tp {n} ({e['type']}): {e['style']}{' (auto)' if n in auto else ''}, in {e['input']} "
                         f"({oneflow_name(e['input'])}) -> out {e['output']} ({oneflow_name(e['output'])})")
        lines += more
        rows, more = _first_rows(d["communication"], "communications")
        for c in rows:
            lines.append(f"comm {c['op']:<14} {c['where']:<28} group {c['group']}({c['group_size']})  "
                         f"{_gib(c['bytes_per_step'])}/step  [{c['oneflow']}] {c['why']}")
        lines += more
        lines.append("rank stage dp tp     params      grads  optimizer  activations      total   GFLOP/step")
        rows, more = _first_rows(d["devices"], "ranks")
        for dv in rows:
            mm = dv["memory"]
            lines.append(f"{dv['rank']:>4} {dv['stage']:>5} {dv['dp_rank']:>2} {dv['tp_rank']:>2} "
                         f"{_gib(mm['params_bytes']):>10} {_gib(mm['grads_bytes']):>10} {_gib(mm['optimizer_bytes']):>10} "
                         f"{_gib(mm['activations_bytes']):>12} {_gib(mm['total_bytes']):>10} {dv['flops_per_step'] / 1e9:>11.3f}")
        lines += more
        p = d["predicted"]
        lines.append(f"predicted step: {p['step_s'] * 1e3:.2f} ms (compute {p['compute_s'] * 1e3:.2f} ms, "
                     f"optimizer {p.get('update_s', 0) * 1e3:.2f} ms, communication {p['comm_s'] * 1e3:.2f} ms) "
                     f"on {d['device']['name']}")
        cal = d.get("calibration")
        if cal:
            lines.append(f"calibrated step: {p['calibrated_step_s'] * 1e3:.2f} ms: the model's figure x{cal['ratio']:.2f}, "
                         f"as run {cal['run']}'s first steps measured ({cal['measured_step_s'] * 1e3:.2f} ms a step "
                         f"where {cal['predicted_step_s'] * 1e3:.2f} ms was predicted)")
    lines += [f"note: {n}" for n in d.get("notes", [])]
    lines += [f"warning: {w}" for w, _ in grouped(plan.warnings)]
    lines += [f"error: {e}" for e in plan.errors]
    return "\n".join(lines)


__all__ = ["Plan", "make_plan", "format_plan", "plan_problems", "chunk_len", "mesh_ranks", "oneflow_name", "tp_layouts"]
