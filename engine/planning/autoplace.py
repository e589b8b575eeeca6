"""Auto-placement: choose pp x dp x tp, the stage cuts and TP styles, and say why.

Like PipeDream's partitioner and torchgpipe's balance, stages are contiguous runs
of the topological order chosen to even out per-stage compute (engine/planning/partition.py);
unlike them, a cut is only accepted when every stage's predicted memory fits the
device. Every candidate layout is planned in full (engine/planning/planner.py) and scored by
the cost model's step time; the reasons list says what was chosen and what was ruled out.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.diagram.compile import CompileResult, compile_graph
from engine.planning.cost import GPUS, DeviceSpec, local_cpu, optimizer_slots
from engine.planning.partition import (  # noqa: F401  (PAIRS, block_tp, megatron_pairs, auto_microbatches: this module's API too)
    PAIRS, _microbatches, auto_microbatches, auto_tp_styles, balanced_stages, block_tp, megatron_pairs,
    replica_bytes, sequence_norms,
)
from engine.planning.planner import Plan, make_plan
from engine.project import MAX_PROCESSES, Placement, PlacementError, Project
from engine.units import gib


@dataclass
class AutoPlacement:
    placement: dict  # the fields chosen: pp, dp, tp, data_parallel, microbatches, schedule, reshard_after_forward
    stages: list[list[str]]
    styles: dict[str, str]
    plan: Plan
    reasons: list[str] = field(default_factory=list)
    candidates: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"placement": self.placement, "stages": self.stages, "tp_styles": self.styles,
                "reasons": self.reasons, "candidates": self.candidates}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def auto_place(project: Project, nproc: int, device: DeviceSpec | None = None,
               compiled: CompileResult | None = None) -> AutoPlacement:
    compiled = compiled or compile_graph(project.graph)
    if not compiled.ok:
        raise ValueError("the diagram has errors: " + "; ".join(map(str, compiled.errors)))
    if nproc > MAX_PROCESSES:
        raise PlacementError(f"{nproc:,} devices: a placement takes at most {MAX_PROCESSES:,} processes "
                             f"(pp x dp x tp); lower --nproc")
    device = device or local_cpu(nproc)
    B = project.training.batch_size
    opt = project.training.optimizer
    slots = optimizer_slots(opt.name, opt.momentum)
    n_layers = sum(1 for n in compiled.order if compiled.graph.nodes[n].type not in ("Input", "Output"))
    cands: list[dict] = []
    best = None
    for tp in _divisors(nproc):
        styles = auto_tp_styles(compiled, tp)
        if tp > 1 and not styles:
            cands.append({"pp": 0, "dp": 0, "tp": tp, "feasible": False,
                          "why": f"tp={tp}: no layer of the model splits evenly {tp} ways"})
            continue
        for pp in _divisors(nproc // tp):
            dp = nproc // (tp * pp)
            c = {"pp": pp, "dp": dp, "tp": tp}
            if pp > n_layers:
                cands.append({**c, "feasible": False, "why": f"pp={pp} is more stages than the {n_layers} layers"})
                continue
            m = _microbatches(B, dp, pp)
            if m is None:
                cands.append({**c, "feasible": False,
                              "why": f"batch_size {B} does not split into dp={dp} replicas x >= {pp} micro-batches"})
                continue
            # FSDP2 when a replica would fill half the device, and always beside TP (DDP cannot hold DTensors)
            kind = "fsdp" if tp > 1 or replica_bytes(compiled, slots, tp) > device.memory_bytes // 2 else "ddp"
            fields = {"pp": pp, "dp": dp, "tp": tp, "microbatches": m, "schedule": "1f1b", "data_parallel": kind,
                      "reshard_after_forward": pp == 1}
            if device.name in GPUS and project.placement.mixed_precision == "none":
                fields["mixed_precision"] = "bf16"  # GPUs: bf16 is the recommendation (float8 stays the user's choice)
            try:
                pl = project.placement.derive(**fields)  # the rest (precision, sync_batchnorm) as the project has it
                stages = balanced_stages(compiled, pp, device, dp=dp, tp=tp, microbatches=m, batch_size=B,
                                         optimizer_slots=slots)[0] if pp > 1 else None
            except ValueError as exc:  # PlacementError too
                cands.append({**c, "feasible": False, "why": str(exc)})
                continue
            plan, chosen = None, styles
            if tp > 1 and sequence_norms(compiled, styles, tp) != styles:  # sequence-parallel norms if they fit
                chosen = sequence_norms(compiled, styles, tp)
                plan = make_plan(project, nproc, device, compiled, placement=pl, stages=stages, styles=chosen)
                if not plan.ok:
                    plan, chosen = None, styles
            plan = plan or make_plan(project, nproc, device, compiled, placement=pl, stages=stages, styles=styles)
            if not plan.ok and kind == "ddp" and dp > 1:  # does not fit even with checkpointing: FSDP2 shards, and offloads
                fsdp_pl = pl.derive(data_parallel="fsdp")
                alt = make_plan(project, nproc, device, compiled, placement=fsdp_pl, stages=stages, styles=styles)
                if alt.ok:
                    plan, pl, kind = alt, fsdp_pl, "fsdp"
                    fields = {**fields, "data_parallel": "fsdp"}
            pred = plan.predicted
            ms = plan.memory_savings
            if ms is not None and ms.chosen:
                c["memory_savings"] = {"checkpoint": len(ms.checkpoint), "cpu_offload": ms.cpu_offload,
                                       "extra_s": ms.extra_s}
            c.update(microbatches=m, data_parallel=kind, step_s=pred.step_s if pred else None,
                     peak_bytes=pred.peak_bytes_max if pred else None, feasible=plan.ok, bubble=plan.bubble_fraction)
            if tp > 1:
                c["sequence_parallel"] = "sequence" in chosen.values()
            if not plan.ok:
                c["why"] = plan.errors[0]
            cands.append(c)
            # simpler layouts win ties: fewer stages, then less tensor parallelism
            key = (c["step_s"] * 1.02 ** (pp - 1 + tp - 1),)
            if plan.ok and (best is None or key < best[0]):
                best = (key, fields, pl, plan.run.stages, chosen, plan, c)
    if best is None:
        raise ValueError(f"no layout of {nproc} devices fits: " + "; ".join(c.get("why", "") for c in cands if not c["feasible"]))
    _, fields, pl, stages, styles, plan, c = best
    return AutoPlacement(fields, stages, styles, plan, _reasons(compiled, pl, styles, plan, c, cands, device, slots), cands)


def _reasons(compiled: CompileResult, pl: Placement, styles: dict[str, str], plan: Plan, c: dict, cands: list[dict],
             device: DeviceSpec, slots: int) -> list[str]:
    """Why this layout: its predicted step and memory, its bubble, what was ruled out."""
    B = plan.batch.global_
    reasons = [f"chose pp={pl.pp} x dp={pl.dp} x tp={pl.tp} ({pl.data_parallel}, {pl.microbatches} "
               f"micro-batches): predicted {c['step_s'] * 1e3:.2f} ms/step, at most "
               f"{gib(c['peak_bytes'])} of {gib(device.memory_bytes)} per device"]
    if device.name in GPUS and pl.mixed_precision == "bf16":
        reasons.append(f"bf16 mixed precision: {device.name}'s tensor cores run bf16 at full rate; weights, "
                       f"gradients and the optimizer stay float32")
    if pl.pp == 1:
        reasons.append("no pipeline: each rank holds its whole replica within memory, and a pipeline would idle "
                       "(p-1)/(m+p-1) of every step in its bubble")
    else:
        reasons.append(f"pipeline bubble {plan.bubble_fraction:.1%} with {pl.microbatches} micro-batches")
    seq = sorted(n for n, st in styles.items() if st == "sequence")
    if seq:
        reasons.append(f"sequence parallelism on {', '.join(seq)}: each rank keeps 1/{pl.tp} of their tokens' "
                       f"activations; a reduce-scatter and an all-gather replace each all-reduce")
    ms = plan.memory_savings
    if pl.data_parallel == "fsdp" and not (ms and ms.cpu_offload):
        reasons.append("FSDP2: a full replica's parameters, gradients and optimizer state take more than half the device")
    if ms is not None and ms.chosen:
        reasons.append(f"memory savings chosen by the planner (the layout does not fit {gib(device.memory_bytes)} "
                       f"without them): {ms.describe()}")
    for other in sorted((x for x in cands if x is not c), key=lambda x: (not x["feasible"], x.get("step_s") or 0))[:5]:
        if other["feasible"]:
            reasons.append(f"pp={other['pp']} x dp={other['dp']} x tp={other['tp']}: {other['step_s'] * 1e3:.2f} ms/step")
        else:
            reasons.append(f"ruled out: {other.get('why')}")
    if pl.pp > 1:
        reasons += balanced_stages(compiled, pl.pp, device, dp=pl.dp, tp=pl.tp,
                                   microbatches=pl.microbatches, batch_size=B, optimizer_slots=slots)[1]
    return reasons


def apply_to_project(project: Project, auto: AutoPlacement) -> None:
    """Accept a layout into the diagram (each node's assignment: stage and tp style) and
    the project's placement; the user edits from there."""
    g = project.graph
    for s, ids in enumerate(auto.stages):
        for n in ids:
            g.assign(n, stage=s if auto.placement["pp"] > 1 else None, tp=auto.styles.get(n))
    project.placement = project.placement.derive(**auto.placement)


__all__ = ["auto_place", "balanced_stages", "auto_tp_styles", "block_tp", "megatron_pairs", "PAIRS", "sequence_norms", "apply_to_project", "AutoPlacement"]
