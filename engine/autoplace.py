"""Auto-placement: choose pp x dp x tp, the stage cuts and TP styles, and say why.

Like PipeDream's partitioner and torchgpipe's balance, stages are contiguous runs
of the topological order chosen to even out per-stage compute; unlike them, a cut
is only accepted when every stage's predicted memory (engine/planner.py) fits the
device. Every candidate layout is planned in full and scored by the cost model's
step time; the reasons list says what was chosen and what was ruled out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from engine.compile import CompileResult, compile_graph
from engine.cost import FLOAT_BYTES, DeviceSpec, local_cpu
from engine.project import Project

OPT_STATES = {"adam": 2, "adamw": 2, "sgd": 1}


def _node_cost(compiled: CompileResult, n: str, batch: int, optimizer: str) -> tuple[float, int]:
    """(FLOPs per step, bytes of params + grads + optimizer state + activations) of one node."""
    info = compiled.nodes[n]
    flops = 3.0 * info.flops * batch
    per_param = FLOAT_BYTES * (2 + OPT_STATES.get(optimizer, 2))
    act = info.out.nbytes() * batch if info.out else 0
    return flops, info.n_params * per_param + act


def balanced_stages(compiled: CompileResult, pp: int, device: DeviceSpec, *, dp: int = 1, tp: int = 1,
                    microbatches: int = 1, batch_size: int = 64, optimizer: str = "adam") -> tuple[list[list[str]], list[str]]:
    """Contiguous cut of the compute nodes into pp stages minimising the slowest
    stage's FLOPs, with each stage's memory under the device's capacity.
    Dynamic programming over (first node, stages left): O(n^2 p)."""
    graph = compiled.graph
    ids = [n for n in compiled.order if graph.nodes[n].type not in ("Input", "Output")]
    if pp > len(ids):
        raise ValueError(f"pp={pp} stages but the model has only {len(ids)} layers; lower pp")
    local_b = max(1, batch_size // max(1, dp))
    costs = [_node_cost(compiled, n, local_b, optimizer) for n in ids]
    flops = [c[0] / tp + 1.0 for c in costs]  # +1: even FLOP-free layers weigh something
    mem = [c[1] / tp for c in costs]
    cap = device.memory_bytes
    INF = float("inf")

    @lru_cache(maxsize=None)
    def best(i: int, k: int) -> tuple[float, tuple[int, ...]]:
        """Best cut of ids[i:] into k stages: (max stage FLOPs, cut positions)."""
        if k == 1:
            return (sum(flops[i:]), ()) if sum(mem[i:]) <= cap else (INF, ())
        out = (INF, ())
        f = mm = 0.0
        for j in range(i, len(ids) - k + 1):  # stage = ids[i..j]
            f += flops[j]
            mm += mem[j]
            if mm > cap:
                break
            rest, cuts = best(j + 1, k - 1)
            score = max(f, rest)
            if score < out[0]:
                out = (score, (j + 1, *cuts))
        return out

    score, cuts = best(0, pp)
    reasons: list[str] = []
    if score == INF:
        raise ValueError(f"no cut into {pp} stages fits {device.memory_bytes / 2**30:.2f} GiB per device; "
                         f"raise pp or tp, or use fsdp")
    bounds = [0, *cuts, len(ids)]
    stages = [ids[bounds[s]:bounds[s + 1]] for s in range(pp)]
    per = [sum(flops[bounds[s]:bounds[s + 1]]) for s in range(pp)]
    reasons.append(f"cut into {pp} stages balancing FLOPs per stage: " +
                   ", ".join(f"stage {s} {per[s] / 1e6:.1f} MFLOP" for s in range(pp)) +
                   f" (slowest/mean {max(per) / (sum(per) / pp):.2f})")
    return stages, reasons


def auto_tp_styles(compiled: CompileResult, tp: int, only: set[str] | None = None) -> dict[str, str]:
    """Megatron's pattern where it applies (megatron_pairs); nothing without tensor parallelism."""
    return {} if tp == 1 else megatron_pairs(compiled, tp, only)


PAIRS = "pairs"  # the TP style a block takes as a whole: Megatron's colwise/rowwise pairs inside it


def block_tp(compiled: CompileResult, ids: list[str], style: str | None, tp: int = 1
             ) -> tuple[dict[str, str | None], dict[str, list[str]]]:
    """A tensor-parallel style given to a block (or any selection of nodes): what each of
    its nodes gets, and the nodes it cannot apply to, by layer type.

    `style` "pairs" finds Megatron's pattern inside (Linear -> elementwise* -> Linear as
    colwise then rowwise, attention split by heads; split sizes that `tp` divides) and
    leaves the rest as they are; None ("auto") clears every node's style; a catalog style
    (colwise, rowwise, sequence, replicate) goes to the nodes whose layer supports it."""
    from engine.layers import get_layer

    graph = compiled.graph
    if style == PAIRS:
        return megatron_pairs(compiled, tp, set(ids)), {}
    if style is None:
        return {n: None for n in ids}, {}
    out: dict[str, str | None] = {}
    skipped: dict[str, list[str]] = {}
    for n in ids:
        t = graph.nodes[n].type
        if style in (get_layer(t).tp_styles if get_layer(t) else ()):
            out[n] = style
        elif t not in ("Input", "Output"):
            skipped.setdefault(t, []).append(n)
    return out, skipped


def megatron_pairs(compiled: CompileResult, tp: int, only: set[str] | None = None) -> dict[str, str]:
    """Megatron's pattern where it applies: Linear -> elementwise* -> Linear becomes
    colwise then rowwise (one all-reduce per pair); attention is split by heads.
    Only layers whose split dimension tp divides take part, and, given `only`, only
    those nodes (a pair is taken whole or not at all)."""
    free = (lambda n: True) if only is None else (lambda n: n in only)  # noqa: E731
    from engine.planner import ELEMENTWISE

    graph = compiled.graph
    styles: dict[str, str] = {}
    for n in compiled.order:
        node = graph.nodes[n]
        p = compiled.nodes[n].params
        if not free(n):
            continue
        if node.type == "MultiheadAttention" and p.get("num_heads", 1) % tp == 0:
            styles[n] = "colwise"
        if node.type != "Linear" or n in styles or p.get("out_features", 1) % tp:
            continue
        cur = n
        while True:
            outs = graph.outgoing(cur)
            if len(outs) != 1:
                break
            nxt = outs[0].dst
            t = graph.nodes[nxt].type
            if t == "Linear" and nxt not in styles and free(nxt) and \
                    compiled.nodes[nxt].params.get("in_features", 1) % tp == 0:
                styles[n], styles[nxt] = "colwise", "rowwise"
                break
            if t not in ELEMENTWISE:
                break
            cur = nxt
    return styles


def sequence_norms(compiled: CompileResult, styles: dict[str, str], tp: int) -> dict[str, str]:
    """`styles` plus 'sequence' on every norm that can take it (Megatron-SP): its
    input is [batch, seq, features], tp divides seq, and it normalizes the last
    dimension only. Its activations then split over tp at no extra communication
    (a reduce-scatter plus an all-gather move what one all-reduce did)."""
    from engine.layers import get_layer

    out = dict(styles)
    for n in compiled.order:
        spec, info = get_layer(compiled.graph.nodes[n].type), compiled.nodes[n]
        ns = info.params.get("normalized_shape")
        shape = list(info.out.shape) if info.out else []
        if spec and "sequence" in (spec.tp_styles or ()) and n not in out and len(shape) >= 2 \
                and shape[0] % tp == 0 and not (isinstance(ns, (list, tuple)) and len(ns) > 1):
            out[n] = "sequence"
    return out


@dataclass
class AutoPlacement:
    placement: dict  # pp, dp, tp, data_parallel, microbatches, schedule
    stages: list[list[str]]
    styles: dict[str, str]
    plan: object  # engine.planner.Plan
    reasons: list[str] = field(default_factory=list)
    candidates: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"placement": self.placement, "stages": self.stages, "tp_styles": self.styles,
                "reasons": self.reasons, "candidates": self.candidates}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def auto_place(project: Project, nproc: int, device: DeviceSpec | None = None,
               compiled: CompileResult | None = None) -> AutoPlacement:
    from engine.planner import make_plan

    compiled = compiled or compile_graph(project.graph)
    if not compiled.ok:
        raise ValueError("the diagram has errors: " + "; ".join(map(str, compiled.errors)))
    device = device or local_cpu(nproc)
    B = project.training.batch_size
    opt = project.training.optimizer.name
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
            kind = "fsdp" if tp > 1 or _replica_bytes(compiled, opt, tp) > device.memory_bytes // 2 else "ddp"
            pl = {"pp": pp, "dp": dp, "tp": tp, "microbatches": m, "schedule": "1f1b", "data_parallel": kind,
                  "reshard_after_forward": pp == 1}
            try:
                stages = balanced_stages(compiled, pp, device, dp=dp, tp=tp, microbatches=m, batch_size=B,
                                         optimizer=opt)[0] if pp > 1 else None
            except ValueError as exc:
                cands.append({**c, "feasible": False, "why": str(exc)})
                continue
            plan, chosen = None, styles
            if tp > 1 and sequence_norms(compiled, styles, tp) != styles:  # sequence-parallel norms if they fit
                chosen = sequence_norms(compiled, styles, tp)
                plan = make_plan(project, nproc, device, compiled, placement=pl, stages=stages, styles=chosen)
                if not plan.ok:
                    plan, chosen = None, styles
            plan = plan or make_plan(project, nproc, device, compiled, placement=pl, stages=stages, styles=styles)
            c.update(microbatches=m, data_parallel=kind, step_s=plan.doc.get("predicted", {}).get("step_s"),
                     peak_bytes=plan.doc.get("predicted", {}).get("peak_bytes_max"), feasible=plan.ok,
                     bubble=plan.doc.get("bubble_fraction"))
            if tp > 1:
                c["sequence_parallel"] = "sequence" in chosen.values()
            if not plan.ok:
                c["why"] = plan.errors[0]
            cands.append(c)
            # simpler layouts win ties: fewer stages, then less tensor parallelism
            key = (c["step_s"] * 1.02 ** (pp - 1 + tp - 1),)
            if plan.ok and (best is None or key < best[0]):
                best = (key, pl, plan.doc["stages"], chosen, plan, c)
    if best is None:
        raise ValueError(f"no layout of {nproc} devices fits: " + "; ".join(c.get("why", "") for c in cands if not c["feasible"]))
    _, pl, stages, styles, plan, c = best
    from engine.planner import _gib

    reasons = [f"chose pp={pl['pp']} x dp={pl['dp']} x tp={pl['tp']} ({pl['data_parallel']}, {pl['microbatches']} "
               f"micro-batches): predicted {c['step_s'] * 1e3:.2f} ms/step, at most "
               f"{_gib(c['peak_bytes'])} of {_gib(device.memory_bytes)} per device"]
    if pl["pp"] == 1:
        reasons.append("no pipeline: each rank holds its whole replica within memory, and a pipeline would idle "
                       "(p-1)/(m+p-1) of every step in its bubble")
    else:
        reasons.append(f"pipeline bubble {plan.doc['bubble_fraction']:.1%} with {pl['microbatches']} micro-batches")
    seq = sorted(n for n, st in styles.items() if st == "sequence")
    if seq:
        reasons.append(f"sequence parallelism on {', '.join(seq)}: each rank keeps 1/{pl['tp']} of their tokens' "
                       f"activations; a reduce-scatter and an all-gather replace each all-reduce")
    if pl["data_parallel"] == "fsdp":
        reasons.append("FSDP2: a full replica's parameters, gradients and optimizer state take more than half the device")
    for other in sorted((x for x in cands if x is not c), key=lambda x: (not x["feasible"], x.get("step_s") or 0))[:5]:
        if other["feasible"]:
            reasons.append(f"pp={other['pp']} x dp={other['dp']} x tp={other['tp']}: {other['step_s'] * 1e3:.2f} ms/step")
        else:
            reasons.append(f"ruled out: {other.get('why')}")
    if pl["pp"] > 1:
        reasons += balanced_stages(compiled, pl["pp"], device, dp=pl["dp"], tp=pl["tp"],
                                   microbatches=pl["microbatches"], batch_size=B, optimizer=opt)[1]
    return AutoPlacement(pl, stages, styles, plan, reasons, cands)


def auto_microbatches(B: int, dp: int, pp: int, least: int) -> int:
    """Micro-batches when the placement leaves them to the planner: the smallest count
    >= `least` (the stages) that divides each replica's batch, else `least` (the planner
    then names the batch size to change)."""
    local = B // dp if dp and B % dp == 0 else 0
    return next((m for m in range(least, local + 1) if local % m == 0), least)


def _microbatches(B: int, dp: int, pp: int) -> int | None:
    """Smallest m >= pp (1F1B needs it; 2*pp halves the bubble again) dividing the replica batch."""
    if B % dp:
        return None
    if pp == 1:
        return 1
    local = B // dp
    for m in (2 * pp, pp, *range(pp + 1, local + 1)):
        if m <= local and local % m == 0:
            return m
    return None


def _replica_bytes(compiled: CompileResult, optimizer: str, tp: int) -> int:
    return compiled.total_params * FLOAT_BYTES * (2 + OPT_STATES.get(optimizer, 2)) // tp


def apply_to_project(project: Project, auto: AutoPlacement) -> None:
    """Accept a placement into the diagram (each node's stage and tp style) and the
    project's placement; the user edits from there."""
    g = project.graph
    for s, ids in enumerate(auto.stages):
        for n in ids:
            g.set_placement(n, stage=s if auto.placement["pp"] > 1 else None, tp=auto.styles.get(n))
    project.placement = project.placement.model_copy(update=auto.placement)


__all__ = ["auto_place", "balanced_stages", "auto_tp_styles", "block_tp", "megatron_pairs", "PAIRS", "sequence_norms", "apply_to_project", "AutoPlacement"]
