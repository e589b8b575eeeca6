"""Project + devices -> Plan: a typed record of where everything runs (`Plan.doc` is
its JSON document, what `plan --json` prints and the editor shows).

OneFlow describes a distributed program by placement (which devices) and SBP
(how each tensor lies on them: split, broadcast, partial_sum); PyTorch's DTensor
says the same with Shard(d), Replicate(), Partial(). The plan speaks DTensor and
shows OneFlow's word beside it. It holds:

  mesh            pp x dp x tp and which global ranks form each group
  stages          lists of node ids, in topological order (pipeline cuts)
  tp_plan         per node: style, input/output layouts (what runtime/distributed/ applies)
  layouts         per edge: the tensor's layout over (dp, tp), and where it crosses a stage cut
  communication   every collective or send/recv the plan implies, with bytes per step
  devices         per rank: predicted parameter/gradient/optimizer/activation bytes, FLOPs
  bubble_fraction (p-1)/(m+p-1)
  errors/warnings messages that state the numbers and the setting to change

Parameter, gradient and optimizer bytes are exact: they follow torch.chunk, which
is how DTensor Shard and FSDP2 split a dimension (the runtime test compares them
with what the ranks allocate). Activation bytes and times are estimates (cost.py).

make_plan only strings the steps together; each is its concern's module:
engine/planning/checks.py (the placement against the project), engine/planning/partition.py (the
stages), engine/planning/tp_layout.py (tensor parallelism), engine/planning/cost.py (memory, FLOPs, time),
engine/planning/comms.py (layouts on edges, collectives).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from engine.planning.comms import Comm, EdgeLayout, communication, edge_layouts, sbp  # noqa: F401  (sbp: this module's API too)
from engine.diagram.compile import CompileError, CompileResult, compile_graph
from engine.planning.cost import (DeviceSpec, Prediction, RankLoad, activation_bytes, chunk_len, comm_time,  # noqa: F401
                         local_cpu, offload_time, optimizer_slots, predict, rank_loads, bubble_fraction, top_blocks)
from engine.planning.partition import cut_stages, mesh_ranks, microbatches_for
from engine.planning.checks import (batch_warnings, check_accumulation, check_float8, check_memory, check_placement,
                                generic_op_warnings, schedule_warnings, stage_warnings)
from engine.project import Placement, Project
from engine.runtime.plan import PLAN_VERSION, Layout, RunPlan
from engine.planning.tp_layout import lay_out_tp, tp_layouts  # noqa: F401  (tp_layouts: this module's API too)
from engine.units import gib as _gib


def oneflow_name(layout: Layout | str) -> str:
    """OneFlow's SBP name of a layout (or of its DTensor name, as the plan's JSON holds it)."""
    return (layout if isinstance(layout, Layout) else Layout.parse(layout)).oneflow


@dataclass
class Batch:
    global_: int
    per_replica: int
    per_microbatch: int

    def to_json(self) -> dict:
        return {"global": self.global_, "per_replica": self.per_replica, "per_microbatch": self.per_microbatch}


@dataclass
class MemorySavings:
    """What the planner turned on because the layout did not fit the device (placement
    memory_savings "auto"), and what it costs per step. `checkpoint` holds the nodes the
    planner chose; `user_checkpoint` the nodes whose own checkpoint flag is set (always on)."""
    checkpoint: list[str] = field(default_factory=list)
    user_checkpoint: list[str] = field(default_factory=list)
    cpu_offload: bool = False
    recompute_flops: float = 0.0  # extra FLOPs per step on the rank that recomputes most (planner's nodes)
    recompute_s: float = 0.0
    offload_s: float = 0.0  # host <-> device copies of parameters and gradients per step
    freed_bytes: int = 0  # device bytes the choice frees on the fullest rank
    fits: bool = True
    units: list[str] = field(default_factory=list)  # the regions chosen: a block's name, or "first..last" node

    @property
    def chosen(self) -> bool:
        return bool(self.checkpoint or self.cpu_offload)

    @property
    def extra_s(self) -> float:
        return self.recompute_s + self.offload_s

    def describe(self) -> str:
        parts = []
        if self.checkpoint:
            what = self.units or self.checkpoint
            names = ", ".join(what[:SHOW_NODES]) + (f", ... ({len(what) - SHOW_NODES} more)"
                                                    if len(what) > SHOW_NODES else "")
            count = f"{len(self.units)} region(s)" if self.units else f"{len(self.checkpoint)} node(s)"
            parts.append(f"activation checkpointing on {count} ({names}): recomputes "
                         f"{self.recompute_flops / 1e9:.3f} GFLOP/step, +{self.recompute_s * 1e3:.2f} ms/step")
        if self.cpu_offload:
            parts.append(f"FSDP CPU offload of parameters, gradients and optimizer state: host copies "
                         f"+{self.offload_s * 1e3:.2f} ms/step")
        return "; ".join(parts)

    def to_json(self) -> dict:
        return {"checkpoint": list(self.checkpoint), "user_checkpoint": list(self.user_checkpoint),
                "cpu_offload": self.cpu_offload, "recompute_flops": self.recompute_flops,
                "recompute_s": self.recompute_s, "offload_s": self.offload_s, "extra_s": self.extra_s,
                "freed_bytes": self.freed_bytes, "fits": self.fits, "units": list(self.units)}


@dataclass
class Plan:
    """Where everything runs, and what it costs. `run` is what the ranks run (the typed
    RunPlan of engine/runtime/plan.py, the part run.json carries); the rest explains it:
    per-rank memory and FLOPs, every edge's layout, every communication, the predicted
    step. `doc` is all of it as the JSON document `plan --json` prints."""
    run: RunPlan | None  # None when the diagram does not compile
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # auto-placement: why this layout
    project: str = ""
    nproc: int = 1
    batch: Batch | None = None
    stages_per_rank: int = 1
    tp_auto: list[str] = field(default_factory=list)  # nodes whose tp style the planner chose
    notes: list[str] = field(default_factory=list)  # what the planner chose where the placement left it open
    layouts: list[EdgeLayout] = field(default_factory=list)
    communication: list[Comm] = field(default_factory=list)
    devices: list[RankLoad] = field(default_factory=list)  # per rank, in rank order
    bubble_fraction: float = 0.0
    device: DeviceSpec | None = None
    predicted: Prediction | None = None
    calibration: dict | None = None  # engine/runs/calibration.py: the run whose pace corrected `predicted`
    memory_savings: MemorySavings | None = None  # what the planner turned on to fit the device (None: nothing)

    def __str__(self) -> str:
        return format_plan(self)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def world(self) -> int:
        return self.run.world if self.run else 0

    @property
    def doc(self) -> dict:
        """The plan as JSON (what `plan --json` prints, without errors and warnings)."""
        if self.run is None:
            return {"version": PLAN_VERSION}
        r = self.run.to_json()
        d = {"version": r["version"], "project": self.project, "world": self.world, "nproc": self.nproc,
             **{k: r[k] for k in ("pp", "dp", "tp", "mesh", "data_parallel", "reshard_after_forward", "schedule",
                                  "microbatches", "mixed_precision", "sync_batchnorm")},
             "batch": self.batch.to_json() if self.batch else None, "stages": r["stages"],
             "stages_per_rank": self.stages_per_rank, "tp_plan": r["tp_plan"], "tp_auto": list(self.tp_auto),
             "notes": list(self.notes), "checkpoint": r["checkpoint"], "cpu_offload": r["cpu_offload"],
             "memory_savings": self.memory_savings.to_json() if self.memory_savings else None,
             "layouts": [x.to_json() for x in self.layouts], "communication": [c.to_json() for c in self.communication],
             "devices": [x.to_json() for x in self.devices], "bubble_fraction": self.bubble_fraction,
             "device": self.device.to_dict() if self.device else None,
             "predicted": self.predicted.to_json() if self.predicted else None}
        if self.calibration:
            d["calibration"] = self.calibration
        return d

    def to_dict(self) -> dict:
        return {**self.doc, "errors": list(self.errors), "warnings": list(self.warnings)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def run_plan(self) -> RunPlan:
        """The typed plan the runtime reads (engine/runtime/plan.py)."""
        if self.run is None:
            raise ValueError("no plan: " + "; ".join(self.errors))
        return self.run

    def runtime_plan(self) -> dict:
        """What run.json carries as "plan": run_plan() as JSON, with the predicted step time beside it."""
        out = self.run_plan().to_json()
        if self.predicted is not None:  # kept beside the run (engine/runs/calibration.py compares it with the run's pace)
            out["predicted"] = {"step_s": self.predicted.step_s, "device": self.device.name, "world": self.world}
        return out


# ----- the planner ---------------------------------------------------------------
def make_plan(project: Project, nproc: int | None = None, device: DeviceSpec | None = None,
              compiled: CompileResult | None = None, placement: Placement | dict | None = None,
              stages: list[list[str]] | None = None, styles: dict[str, str] | None = None) -> Plan:
    """The plan for running `project` on nproc processes (default: the placement's world,
    pp*dp*tp). placement (default: the project's), stages and styles override the
    project's (auto-placement tries candidates). A dict of placement fields over the
    project's is still taken, deprecated (older tests and bench/dist_overhead.py pass one):
    pass a Placement, `project.placement.derive(...)`.
    Each step is its concern's module: check the placement (plan_checks), cut the stages
    (partition), lay out tensor parallelism (tp_layout), price memory and time (cost),
    list the communication (comms)."""
    compiled = compiled or compile_graph(project.graph)
    pl = _placement(project, placement)
    pp, dp, tp = pl.pp, pl.dp, pl.tp
    nproc = nproc or pl.world
    # the device's rate for this precision (a GPU's float32 matmuls in TF32 at half its bf16 rate)
    device = (device or local_cpu(nproc)).at_precision(pl.mixed_precision)
    if not compiled.ok:
        return Plan(None, ["the diagram has errors: " + "; ".join(map(str, compiled.errors))])
    graph, training = compiled.graph, project.training
    B, opt = training.batch_size, training.optimizer
    m = microbatches_for(pl, B)
    errors = check_placement(pl, microbatches=m, batch_size=B, nproc=nproc)
    cut = cut_stages(compiled, pl, m, B, device, optimizer_slots(opt.name, opt.momentum), stages)
    errors += cut.errors + check_accumulation(pl, training.grad_accumulation)
    tpl = lay_out_tp(compiled, tp, cut.stage_of, styles)
    errors += tpl.errors
    warnings = tpl.warnings + batch_warnings(compiled, pl, microbatches=m, batch_size=B) + generic_op_warnings(compiled, tp)
    compute = [n for n in compiled.order if graph.nodes[n].type not in ("Input", "Output")]
    fsdp = pl.data_parallel == "fsdp" and dp > 1

    def loads_for(ckpt: set, offload: bool) -> list[RankLoad]:
        return rank_loads(compiled, cut.stages, tpl.styles, tpl.layout, pp=pp, dp=dp, tp=tp, microbatches=m,
                          batch_size=B, schedule=pl.schedule, fsdp=fsdp, optimizer=opt.name, momentum=opt.momentum,
                          checkpointed=ckpt, cpu_offload=offload)

    user_ckpt = [n for n in compute if graph.nodes[n].checkpoint]  # the user's: always on
    loads = loads_for(set(user_ckpt), False)
    savings = None
    if pl.memory_savings == "auto" and not errors and check_memory(loads, device):
        savings, loads = choose_memory_savings(compiled, cut.stages, tpl.layout, loads, loads_for, device, pp=pp,
                                               tp=tp, microbatches=m, batch_size=B, dp=dp, schedule=pl.schedule,
                                               user_ckpt=user_ckpt, can_offload=fsdp)
    chosen = set(savings.checkpoint) if savings else set()
    ckpt = [n for n in compute if n in chosen or n in user_ckpt]
    errors += check_memory(loads, device, savings)
    errors += check_float8(pl, device)
    comms = communication(compiled, cut.stages, cut.stage_of, tpl.plan, loads, pp=pp, dp=dp, tp=tp, microbatches=m,
                          batch_size=B, data_parallel=pl.data_parallel, reshard_after_forward=pl.reshard_after_forward,
                          schedule=pl.schedule)
    comm_s = sum(comm_time(c.op, c.bytes_per_step, c.group_size, device, c.messages) for c in comms) / max(1, pp)
    warnings += schedule_warnings(pl, m) + [msg for _, msg in stage_warnings(graph, pl)]
    run = RunPlan(pp=pp, dp=dp, tp=tp, data_parallel=pl.data_parallel if dp > 1 else "none",
                  reshard_after_forward=pl.reshard_after_forward,
                  schedule=pl.schedule if pp > 1 else "none", microbatches=m,
                  mixed_precision=pl.mixed_precision, sync_batchnorm=pl.sync_batchnorm,
                  stages=cut.stages, tp_plan=tpl.plan, checkpoint=ckpt,
                  cpu_offload=bool(savings and savings.cpu_offload),
                  mesh={"dims": ["pp", "dp", "tp"], "shape": [pp, dp, tp], **{k: v for k, v in mesh_ranks(pp, dp, tp).items()
                                                                             if k != "coords"}})
    return Plan(run, errors, warnings, project=project.name, nproc=nproc,
                batch=Batch(B, B // max(1, dp), B // max(1, dp * m)), stages_per_rank=cut.per_rank,
                tp_auto=tpl.auto, notes=cut.notes, layouts=edge_layouts(compiled, cut.stage_of, tpl.layout, dp, tp),
                communication=comms, devices=loads, bubble_fraction=bubble_fraction(pp, m, cut.per_rank, pl.schedule),
                device=device, predicted=predict(loads, comm_s, m, device, pp, cut.per_rank, pl.schedule),
                memory_savings=savings)


# layers never put in a planner-chosen region: a recomputed BatchNorm would update its running
# statistics twice per step (a node's own checkpoint flag is the user's choice, and taken as is)
NO_RECOMPUTE = ("BatchNorm1d", "BatchNorm2d")


def checkpoint_units(compiled: CompileResult, ids: list[str]) -> list[list[str]]:
    """What the planner may checkpoint in one stage, each as one region: every top-level
    block's nodes (a transformer block, a residual block), and every run of nodes outside
    any block, in graph order (engine/runtime/distributed/stages.py checkpoint_regions cuts the same)."""
    graph = compiled.graph
    blocks = top_blocks(graph)
    pos = {n: i for i, n in enumerate(compiled.order)}
    units: list[list[str]] = []
    prev: object = object()
    for n in sorted(ids, key=lambda n: pos.get(n, 0)):
        if graph.nodes[n].type in ("Input", "Output"):
            continue
        b = blocks.get(n)
        if units and b == prev:
            units[-1].append(n)
        else:
            units.append([n])
        prev = b
    return [u for u in units if not any(graph.nodes[n].type in NO_RECOMPUTE for n in u)]


def choose_memory_savings(compiled: CompileResult, stages: list[list[str]], layout: dict, loads: list[RankLoad],
                          loads_for, device: DeviceSpec, *, pp: int, dp: int, tp: int, microbatches: int,
                          batch_size: int, schedule: str, user_ckpt: list[str],
                          can_offload: bool) -> tuple[MemorySavings, list[RankLoad]]:
    """Selective activation checkpointing, then FSDP2's CPU offload, until every rank fits.
    Per pipeline rank over the device's memory: its checkpoint units (checkpoint_units: a
    block, or a run of layers outside blocks, recomputed as one region) in order of
    activation bytes freed per recomputed FLOP, most first, taken until the excess is
    covered (units never share a region, so the bytes they free add up). If checkpointing
    every unit is not enough and the data axis is FSDP's, the state moves to host memory
    and the units are chosen again against that smaller excess.
    Returns the savings and the loads with them."""
    from engine.runtime.plan import rank_stages

    local_b = batch_size // max(1, dp)
    cap = device.memory_bytes
    base_ckpt = set(user_ckpt)

    def acts(st: int, ckpt: set) -> int:
        return activation_bytes(compiled, stages[st], layout, tp, local_b, microbatches, pp, st, schedule, ckpt)

    labels: dict[str, str] = {}  # a unit's first node -> its label
    blocks = top_blocks(compiled.graph)

    def pick(base: list[RankLoad]) -> list[str]:
        chosen: list[str] = []
        labels.clear()
        for s in range(pp):
            excess = max(x.memory.total_bytes for x in base if x.stage == s) - cap
            if excess <= 0:
                continue
            cands = []
            for st in rank_stages(schedule, pp, len(stages), s):
                before = acts(st, base_ckpt)
                for unit in checkpoint_units(compiled, stages[st]):
                    freed = before - acts(st, base_ckpt | set(unit))
                    if freed > 0:
                        flops = sum(compiled.nodes[n].flops for n in unit)
                        cands.append((freed / max(1.0, flops), freed, unit))
            for _, freed, unit in sorted(cands, key=lambda c: -c[0]):
                if excess <= 0:
                    break
                chosen += [n for n in unit if n not in base_ckpt]
                labels[unit[0]] = blocks.get(unit[0]) or (unit[0] if len(unit) == 1 else f"{unit[0]}..{unit[-1]}")
                excess -= freed
        return chosen

    def fits(ls: list[RankLoad]) -> bool:
        return all(x.memory.total_bytes <= cap for x in ls)

    before = max(x.memory.total_bytes for x in loads)
    chosen = pick(loads)
    offload = False
    new = loads_for(base_ckpt | set(chosen), offload)
    if not fits(new) and can_offload:
        offload = True
        chosen = pick(loads_for(base_ckpt, True))
        new = loads_for(base_ckpt | set(chosen), offload)
    order = {n: i for i, n in enumerate(compiled.order)}
    chosen = sorted(set(chosen), key=order.get)
    flops = max((sum(compiled.nodes[n].flops for st in rank_stages(schedule, pp, len(stages), s) for n in stages[st]
                     if n in chosen) * local_b for s in range(pp)), default=0.0)
    sav = MemorySavings(chosen, list(user_ckpt), offload, recompute_flops=flops, recompute_s=flops / device.flops_per_s,
                        offload_s=offload_time(new, device), freed_bytes=before - max(x.memory.total_bytes for x in new),
                        fits=fits(new), units=[labels[n] for n in sorted(labels, key=order.get)])
    return sav, new


def _placement(project: Project, placement: Placement | dict | None) -> Placement:
    """The placement to plan: the project's, the one given, or (deprecated) the project's
    with a dict's fields changed, validated as derive does (PlacementError names the field)."""
    if placement is None:
        return project.placement
    if isinstance(placement, Placement):
        return placement
    return project.placement.derive(**placement)


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


MAX_ROWS = 64  # a plan of 65,536 ranks prints what a terminal can show, then says how many more


def _first_rows(rows: list, what: str) -> tuple[list, list[str]]:
    """The rows to print (all, or the first MAX_ROWS) and the line that says how many were
    left out (the --json document has every one)."""
    if len(rows) <= MAX_ROWS:
        return rows, []
    return rows[:MAX_ROWS], [f"... {len(rows) - MAX_ROWS:,} more {what} not listed (--json has all)"]


def format_plan(plan: Plan) -> str:
    """The plan as a person reads it on a terminal."""
    lines = []
    r = plan.run
    if r is not None:
        lines.append(f"mesh: pp={r.pp} x dp={r.dp} x tp={r.tp} = {r.world} ranks; "
                     f"data parallel: {r.data_parallel}; schedule: {r.schedule}, microbatches {r.microbatches}; "
                     f"bubble {plan.bubble_fraction:.1%}")
        on_stage: dict[int, list[int]] = {}
        for dv in plan.devices:
            for s in dv.stages:
                on_stage.setdefault(s, []).append(dv.rank)
        rows, more = _first_rows(list(enumerate(r.stages)), "stages")
        for s, ids in rows:
            ranks = [str(x) for x in sorted(on_stage.get(s, []))]
            shown = ranks if len(ranks) <= 16 else [*ranks[:8], "...", *ranks[-4:]]
            lines.append(f"stage {s} (ranks [{', '.join(shown)}]): {', '.join(ids)}")
        lines += more
        auto = set(plan.tp_auto)
        rows, more = _first_rows(list(r.tp_plan.items()), "tensor-parallel layers")
        for n, e in rows:
            lines.append(f"tp {n} ({e.type}): {e.style}{' (auto)' if n in auto else ''}, in {e.input} "
                         f"({e.input.oneflow}) -> out {e.output} ({e.output.oneflow})")
        lines += more
        rows, more = _first_rows(plan.communication, "communications")
        for c in rows:
            lines.append(f"comm {c.op:<14} {c.where:<28} group {c.group}({c.group_size})  "
                         f"{_gib(c.bytes_per_step)}/step  [{c.oneflow}] {c.why}")
        lines += more
        lines.append("rank stage dp tp     params      grads  optimizer  activations      total   GFLOP/step")
        rows, more = _first_rows(plan.devices, "ranks")
        for dv in rows:
            mm = dv.memory
            lines.append(f"{dv.rank:>4} {dv.stage:>5} {dv.dp_rank:>2} {dv.tp_rank:>2} "
                         f"{_gib(mm.params_bytes):>10} {_gib(mm.grads_bytes):>10} {_gib(mm.optimizer_bytes):>10} "
                         f"{_gib(mm.activations_bytes):>12} {_gib(mm.total_bytes):>10} {dv.flops_per_step / 1e9:>11.3f}")
        lines += more
        p = plan.predicted
        lines.append(f"predicted step: {p.step_s * 1e3:.2f} ms (compute {p.compute_s * 1e3:.2f} ms, "
                     f"optimizer {p.update_s * 1e3:.2f} ms, communication {p.comm_s * 1e3:.2f} ms) "
                     f"on {plan.device.name}")
        cal = plan.calibration
        if cal and p.calibrated_step_s is not None:
            lines.append(f"calibrated step: {p.calibrated_step_s * 1e3:.2f} ms: the model's figure x{cal['ratio']:.2f}, "
                         f"as run {cal['run']}'s first steps measured ({cal['measured_step_s'] * 1e3:.2f} ms a step "
                         f"where {cal['predicted_step_s'] * 1e3:.2f} ms was predicted)")
    ms = plan.memory_savings
    if ms is not None and ms.chosen:
        lines.append(f"memory savings chosen by the planner (the layout did not fit {plan.device.name}'s "
                     f"{_gib(plan.device.memory_bytes)}; placement.memory_savings off turns them off): {ms.describe()}; "
                     f"frees {_gib(ms.freed_bytes)} on the fullest rank, +{ms.extra_s * 1e3:.2f} ms/step in all")
    user = [n for n in (r.checkpoint if r is not None else []) if not (ms and n in ms.checkpoint)]
    if user:
        lines.append(f"activation checkpointing set on the nodes (always): {', '.join(user)}")
    lines += [f"note: {n}" for n in plan.notes]
    lines += [f"warning: {w}" for w, _ in grouped(plan.warnings)]
    lines += [f"error: {e}" for e in plan.errors]
    return "\n".join(lines)


__all__ = ["Plan", "Batch", "MemorySavings", "choose_memory_savings", "make_plan", "format_plan", "plan_problems", "chunk_len", "mesh_ranks", "oneflow_name", "tp_layouts"]
