"""How a model is cut and split: pipeline stages balanced by FLOPs under the device's
memory, Megatron's colwise/rowwise pairs, sequence-parallel norms, micro-batch counts.

The planner (engine/planning/planner.py) uses these when the placement leaves a choice to it;
auto-placement (engine/planning/autoplace.py) uses them to build each candidate it then plans.
Below both, so neither imports the other. Costs come from engine/planning/cost.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from engine.diagram.compile import CompileResult
from engine.planning.cost import FLOAT_BYTES, DeviceSpec
from engine.project import Placement
from engine.runtime.plan import LOOPED, MULTI_STAGE, V_SHAPED


ELEMENTWISE = {"ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Dropout", "Identity"}  # run on any shard as they are


def _node_cost(compiled: CompileResult, n: str, batch: int, slots: int) -> tuple[float, int]:
    """(FLOPs per step, bytes of params + grads + optimizer state + activations) of one node;
    `slots`: the optimizer's float32 tensors per parameter (cost.optimizer_slots)."""
    info = compiled.nodes[n]
    flops = 3.0 * info.flops * batch
    per_param = FLOAT_BYTES * (2 + slots)
    act = info.out.nbytes() * batch if info.out else 0
    return flops, info.n_params * per_param + act


def balanced_stages(compiled: CompileResult, pp: int, device: DeviceSpec, *, dp: int = 1, tp: int = 1,
                    microbatches: int = 1, batch_size: int = 64, optimizer_slots: int = 2) -> tuple[list[list[str]], list[str]]:
    """Contiguous cut of the compute nodes into pp stages minimising the slowest
    stage's FLOPs, with each stage's memory under the device's capacity.
    Dynamic programming over (first node, stages left): O(n^2 p)."""
    graph = compiled.graph
    ids = [n for n in compiled.order if graph.nodes[n].type not in ("Input", "Output")]
    if pp > len(ids):
        raise ValueError(f"pp={pp} stages but the model has only {len(ids)} layers; lower pp")
    local_b = max(1, batch_size // max(1, dp))
    costs = [_node_cost(compiled, n, local_b, optimizer_slots) for n in ids]
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
    from engine.diagram.catalog import get_layer

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
        for nxt in single_chain(graph, n):
            t = graph.nodes[nxt].type
            if t == "Linear" and nxt not in styles and free(nxt) and \
                    compiled.nodes[nxt].params.get("in_features", 1) % tp == 0:
                styles[n], styles[nxt] = "colwise", "rowwise"
                break
            if t not in ELEMENTWISE:
                break
    return styles


def single_chain(graph, start: str):
    """The nodes after `start` while each has one consumer: start -> a -> b -> ... (a
    Megatron pair is a colwise layer and the rowwise one such a chain reaches)."""
    cur = start
    while True:
        outs = graph.outgoing(cur)
        if len(outs) != 1:
            return
        cur = outs[0].dst
        yield cur


def sequence_norms(compiled: CompileResult, styles: dict[str, str], tp: int) -> dict[str, str]:
    """`styles` plus 'sequence' on every norm that can take it (Megatron-SP): its
    input is [batch, seq, features], tp divides seq, and it normalizes the last
    dimension only. Its activations then split over tp at no extra communication
    (a reduce-scatter plus an all-gather move what one all-reduce did)."""
    from engine.diagram.catalog import get_layer

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
class Cut:
    """The pipeline stages of a plan: node ids per stage (stage s runs on pipeline rank
    s % pp), each node's stage, stages per rank, and what was found on the way."""
    stages: list[list[str]]
    stage_of: dict[str, int]
    per_rank: int = 1
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the planner chose where the placement left it open


def microbatches_for(placement: Placement, batch_size: int) -> int:
    """The placement's micro-batch count, or when it is not set one per stage at least
    (1F1B's need; two per rank under interleaved 1F1B), dividing each replica's batch."""
    pp, dp = placement.pp, placement.dp
    if pp == 1:
        return 1
    if placement.microbatches:
        return placement.microbatches
    return auto_microbatches(batch_size, dp, pp, 2 * pp if placement.schedule in MULTI_STAGE else pp)


def cut_stages(compiled: CompileResult, placement: Placement, microbatches: int, batch_size: int, device: DeviceSpec,
               slots: int, stages: list[list[str]] | None = None) -> Cut:
    """The stages: given (auto-placement's candidate), numbered on the nodes (a node
    without a stage follows the one before it), or, when no node has one, a balanced cut
    (balanced_stages). Then checked: the data flows forward, no stage is empty, tied
    weights on two stages are held by each (not with tensor parallelism). Interleaved
    1F1B runs several stages per rank."""
    graph = compiled.graph
    pp, dp, tp = placement.pp, placement.dp, placement.tp
    m = microbatches
    errors: list[str] = []
    notes: list[str] = []
    compute = [n for n in compiled.order if graph.nodes[n].type not in ("Input", "Output")]
    given = {n: graph.nodes[n].stage for n in compute if graph.nodes[n].stage is not None}
    n_stages = pp
    sched = placement.schedule
    if pp > 1 and sched in LOOPED:
        n_stages = len(stages) if stages is not None else (max(given.values()) + 1 if given else 2 * pp)
        if n_stages % pp or n_stages < 2 * pp:
            errors.append(f"placement.schedule {sched} runs several stages per rank: the number of stages "
                          f"must be a multiple of pp={pp} and at least {2 * pp}, but it is {n_stages}; number the "
                          f"nodes' stages 0..{2 * pp - 1} (2 per rank) or choose 1f1b")
    if pp > 1 and sched in V_SHAPED:  # exactly two stages per rank, in a V
        n_stages = len(stages) if stages is not None else (max(given.values()) + 1 if given else 2 * pp)
        if n_stages != 2 * pp:
            errors.append(f"placement.schedule {sched} runs two stages per rank in a V (rank r holds stages r and "
                          f"{2 * pp - 1}-r): it needs exactly {2 * pp} stages for pp={pp}, but there are {n_stages}; "
                          f"number the nodes' stages 0..{2 * pp - 1} or choose 1f1b")
        if m < 2 * pp:
            errors.append(f"placement.schedule {sched} with pp={pp} needs at least {2 * pp} micro-batches (one per "
                          f"stage), but microbatches is {m}; set placement.microbatches to {2 * pp} or more")
    if pp > 1 and sched in LOOPED:
        rounds = max(1, m // pp)
        if m % rounds:
            errors.append(f"placement.schedule {sched} with pp={pp} needs microbatches divisible by "
                          f"microbatches // pp = {rounds}, but microbatches is {m}; set it to a multiple of {pp}")
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
                                        batch_size=batch_size, optimizer_slots=slots)
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
            if tp > 1:
                errors.append(f"nodes '{b}' and '{a}' share one parameter ({src} = {dst}, tied weights) in stages "
                              f"{stage[b]} and {stage[a]}; with tensor parallelism (tp={tp}) a tie runs inside one "
                              f"stage only: put both in one stage, or use tp 1")
            else:  # each stage keeps a copy; their gradients are summed every step (runtime/tied.py)
                notes.append(f"tied weights {src} = {dst}: a copy on stages {stage[b]} and {stage[a]}, their "
                             f"gradients summed between them every step")
    return Cut(stages, stage, max(1, n_stages // pp), errors, notes)


def mesh_ranks(pp: int, dp: int, tp: int) -> dict:
    """Ranks laid out as runtime/distributed/mesh.py's init_device_mesh does: rank = (s*dp + d)*tp + t."""
    ranks = [[[(s * dp + d) * tp + t for t in range(tp)] for d in range(dp)] for s in range(pp)]
    coords = {ranks[s][d][t]: (s, d, t) for s in range(pp) for d in range(dp) for t in range(tp)}
    groups = {
        "pp": [[ranks[s][d][t] for s in range(pp)] for d in range(dp) for t in range(tp)],
        "dp": [[ranks[s][d][t] for d in range(dp)] for s in range(pp) for t in range(tp)],
        "tp": [list(ranks[s][d]) for s in range(pp) for d in range(dp)],
    }
    return {"ranks": ranks, "coords": coords, "groups": groups}


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


def replica_bytes(compiled: CompileResult, slots: int, tp: int) -> int:
    """Parameters, gradients and optimizer state of one replica split tp ways."""
    return compiled.total_params * FLOAT_BYTES * (2 + slots) // tp
