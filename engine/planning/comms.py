"""What a plan moves between ranks: every tensor's layout on each edge, and every
collective or send/recv the layout implies, with bytes per step.

Layouts speak DTensor (Shard(d), Replicate(), Partial()) with OneFlow's SBP word beside
them. Bytes are the tensor moved per group and step; engine/planning/cost.py turns that into time
with the ring factor. The planner (engine/planning/planner.py) calls these after it has cut the
stages (engine/planning/partition.py) and laid out tensor parallelism (engine/planning/tp_layout.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.diagram.compile import CompileResult
from engine.planning.cost import FLOAT_BYTES, RankLoad, output_bytes, collective_bytes
from engine.runtime.plan import REPLICATE, Layout, TPEntry, shard, stage_rank
from engine.planning.tp_layout import SEQ

ONEFLOW_BOXING = {"all-reduce": "partial_sum -> broadcast", "all-gather": "split -> broadcast",
                  "reduce-scatter": "partial_sum -> split", "send/recv": "boxing between placements"}


def sbp(layouts: list[Layout]) -> dict:
    return {"dtensor": "[" + ", ".join(map(str, layouts)) + "]", "oneflow": "(" + ", ".join(x.oneflow for x in layouts) + ")"}


@dataclass
class EdgeLayout:
    """One edge's tensor over the (dp, tp) mesh dimensions: the batch split on dp, and on
    tp what the source's output is; `crosses` when the edge leaves its pipeline stage."""
    src: str
    dst: str
    dp: Layout
    tp: Layout
    bytes_per_sample: int
    crosses: str | None = None  # "stage 0 -> stage 1"

    def to_json(self) -> dict:
        d = {"edge": f"{self.src} -> {self.dst}", "src": self.src, "dst": self.dst, "mesh_dims": ["dp", "tp"],
             **sbp([self.dp, self.tp]), "tp_layout": str(self.tp), "bytes_per_sample": self.bytes_per_sample}
        if self.crosses:
            d["crosses"] = self.crosses
        return d


@dataclass
class Comm:
    """One collective (or a stage cut's send/recv) of a step."""
    op: str  # all-reduce, all-gather, reduce-scatter, send/recv
    where: str  # "node fc1", "cut stage 0 -> 1", "stage 0 gradients"
    group: str  # the mesh axis: pp, dp or tp
    group_size: int
    messages: int  # calls per step
    bytes_per_step: int
    why: str
    side: str = ""  # a node's collective: "in" when it moves what reaches the node, "out" what leaves it
    values: list[str] | None = None  # a cut: the values live across it
    carried_through: list[str] | None = None  # a cut: the skips among them from earlier stages

    @property
    def node(self) -> str | None:
        return self.where[5:] if self.where.startswith("node ") else None

    @property
    def per_rank_bytes(self) -> float:
        return collective_bytes(self.op, self.bytes_per_step, self.group_size)

    @property
    def oneflow(self) -> str:
        return ONEFLOW_BOXING[self.op]

    def to_json(self) -> dict:
        d = {"op": self.op, "where": self.where}
        if self.values is not None:
            d.update(values=self.values, carried_through=self.carried_through or [])
        d.update(group=self.group, group_size=self.group_size, messages=self.messages,
                 bytes_per_step=self.bytes_per_step, why=self.why)
        if self.side:
            d["side"] = self.side
        d.update(per_rank_bytes=self.per_rank_bytes, oneflow=self.oneflow)
        return d


def edge_layouts(compiled: CompileResult, stage: dict[str, int], layout: dict[str, Layout], dp: int,
                 tp: int) -> list[EdgeLayout]:
    """Each edge's tensor layout over the (dp, tp) mesh dims: the batch is split on
    dp; on tp it is what tp_layouts found for the edge's source."""
    graph = compiled.graph
    out = []
    for e in graph.edges:
        src = graph.nodes.get(e.src)
        if src is None or src.type == "Output":
            continue
        s0, s1 = stage.get(e.src), stage.get(e.dst)
        crosses = f"stage {s0} -> stage {s1}" if s0 is not None and s1 is not None and s0 != s1 else None
        out.append(EdgeLayout(e.src, e.dst, shard(0) if dp > 1 else REPLICATE,
                              layout.get(e.src, REPLICATE) if tp > 1 else REPLICATE, output_bytes(compiled, e.src),
                              crosses))
    return out


def communication(compiled: CompileResult, stages: list[list[str]], stage: dict[str, int],
                  tp_plan: dict[str, TPEntry], loads: list[RankLoad], *, pp: int, dp: int, tp: int,
                  microbatches: int, batch_size: int, data_parallel: str, reshard_after_forward: bool,
                  schedule: str = "1f1b") -> list[Comm]:
    """Every transfer the plan implies, with bytes per step."""
    graph, meta, m = compiled.graph, compiled.module, microbatches
    comms: list[Comm] = []
    local_b = batch_size // max(1, dp)
    # pipeline: values live across each cut, forward activations and backward grads
    last = len(stages) - 1
    for s in range(last):
        live = [n for n in compiled.order if stage.get(n, 99) <= s and any(
            stage.get(e.dst, last if graph.nodes[e.dst].type == "Output" else -1) > s for e in graph.outgoing(n))]
        nbytes = sum(output_bytes(compiled, n) for n in live) * local_b
        carried = [n for n in live if stage.get(n) < s]
        comms.append(Comm("send/recv", f"cut stage {s} -> {s + 1}", "pp", 2, 2 * m, 2 * nbytes,
                          "activations forward, their gradients backward, in "
                          f"{m} micro-batches" + (f"; {', '.join(carried)} skip(s) carried through" if carried else ""),
                          values=live, carried_through=carried))
    # tied weights on several stages: their gradients summed between the stages' ranks
    from engine.runtime.distributed.tied import stage_spread

    for names, held in stage_spread((compiled.spec or {}).get("ties") or {}, stages):
        ranks = sorted({stage_rank(schedule, pp, s) for s in held})
        if len(ranks) > 1:
            node, _, pname = names[0].partition(".")
            numel = meta.get_submodule(node).get_parameter(pname).numel()
            comms.append(Comm("all-reduce", f"tied {' = '.join(names)}", "pp", len(ranks), 1, numel * FLOAT_BYTES,
                              f"gradients of the copies on stages {', '.join(map(str, held))} summed after backward "
                              f"(the copies stay equal)"))
    # tensor parallel
    if tp > 1:
        for n, ent in tp_plan.items():
            preds = graph.predecessors(n)
            in_b = (output_bytes(compiled, preds[0]) if preds else 0) * local_b
            out_b = output_bytes(compiled, n) * local_b
            comms += tp_comms(n, ent, in_b, out_b, tp, sum(p.numel() for p in meta.get_submodule(n).parameters())
                              if ent.style == "sequence" else 0)
    # data parallel: gradient sync per stage
    if dp > 1:
        sharded, whole = [0] * pp, [0] * pp  # per stage: the dp shards' parameters, one replica's
        for x in loads:
            if x.tp_rank == 0:
                sharded[x.stage] += x.params
                if x.dp_rank == 0:
                    whole[x.stage] += x.params
        for s in range(pp):
            if data_parallel == "fsdp":
                nb = sharded[s] * FLOAT_BYTES
                gathers = (2 if reshard_after_forward else 1) * (m if pp > 1 and reshard_after_forward else 1)
                comms.append(Comm("all-gather", f"stage {s} parameters", "dp", dp, gathers, gathers * nb,
                                  "FSDP2: Shard(0) -> Replicate() before forward" +
                                  (" and again before backward" if reshard_after_forward else "")))
                comms.append(Comm("reduce-scatter", f"stage {s} gradients", "dp", dp, 1, nb,
                                  "FSDP2: gradients Partial() -> Shard(0)"))
            else:
                comms.append(Comm("all-reduce", f"stage {s} gradients", "dp", dp, 1, whole[s] * FLOAT_BYTES,
                                  "DDP: gradients Partial() -> Replicate() (bucketed, overlapped with backward)"))
    return comms


def _tp(n, op, nbytes, tp, why, side="") -> Comm:
    """side: 'in' when it moves the tensor (or gradient) on the node's inputs, 'out' on its outputs."""
    return Comm(op, f"node {n}", "tp", tp, 1, nbytes, why, side)


def tp_comms(n: str, ent: TPEntry, in_b: int, out_b: int, tp: int, norm_params: int) -> list[Comm]:
    """The collectives one tp_plan entry implies (DTensor's redistributions at its edges)."""
    style, typ, seq_in, seq_out = ent.style, ent.type, ent.input == SEQ, ent.output == SEQ
    c: list[Comm] = []
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


__all__ = ["Comm", "EdgeLayout", "communication", "edge_layouts", "tp_comms", "sbp", "ONEFLOW_BOXING"]
