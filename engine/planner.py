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
from dataclasses import dataclass, field

from engine.compile import CompileResult, compile_graph
from engine.cost import FLOAT_BYTES, DeviceSpec, bubble_fraction, collective_bytes, comm_time, local_cpu, step_time
from engine.layers import get_layer
from engine.project import Project

PLAN_VERSION = 1
ONEFLOW = {"Replicate()": "broadcast", "Partial()": "partial_sum"}
ELEMENTWISE = {"ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Dropout", "Identity"}
# the dimension each style splits, for the divisibility check: (param, what it is)
SPLIT_DIM = {
    ("Linear", "colwise"): ("out_features", "output features"),
    ("Linear", "rowwise"): ("in_features", "input features"),
    ("Embedding", "colwise"): ("embedding_dim", "embedding size"),
    ("Embedding", "rowwise"): ("num_embeddings", "vocabulary"),
    ("MultiheadAttention", "colwise"): ("num_heads", "heads"),
}


def oneflow_name(layout: str) -> str:
    if layout.startswith("Shard("):
        return "split(" + layout[6:-1] + ")"
    return ONEFLOW.get(layout, layout)


def sbp(layouts: list[str]) -> dict:
    return {"dtensor": "[" + ", ".join(layouts) + "]", "oneflow": "(" + ", ".join(oneflow_name(x) for x in layouts) + ")"}


def chunk_len(size: int, n: int, i: int) -> int:
    """Length of piece i when torch.chunk cuts `size` into n (DTensor Shard, FSDP2)."""
    c = math.ceil(size / n) if n > 0 else size
    return max(0, min(c, size - i * c))


@dataclass
class Plan:
    doc: dict
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict:
        return {**self.doc, "errors": list(self.errors), "warnings": list(self.warnings)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def runtime_plan(self) -> dict:
        """What run.json carries for engine/runtime/parallel.py."""
        keys = ("pp", "dp", "tp", "data_parallel", "reshard_after_forward", "schedule", "microbatches",
                "mixed_precision", "sync_batchnorm", "stages", "tp_plan", "checkpoint", "mesh")
        return {k: self.doc[k] for k in keys if k in self.doc}


# ----- tensor parallel layouts ------------------------------------------------------
def tp_layouts(graph, compiled: CompileResult, styles: dict[str, str], stage: dict[str, int]) -> dict[str, dict]:
    """Per TP node: input/output layouts. A column-wise layer's output stays
    Shard(-1) when it flows, through elementwise layers only, into a row-wise layer
    of the same stage (Megatron's pair: no communication in between); otherwise it is
    all-gathered to Replicate()."""
    out: dict[str, dict] = {}
    feeds_shard: set[str] = set()
    for nid, style in styles.items():
        ntype = graph.nodes[nid].type
        if style != "colwise" or ntype == "MultiheadAttention":
            continue
        cur, ok = nid, False
        while True:
            outs = graph.outgoing(cur)
            if len(outs) != 1:
                break
            nxt = outs[0].dst
            if stage.get(nxt) != stage.get(nid):
                break
            if styles.get(nxt) == "rowwise" and graph.nodes[nxt].type == "Linear":
                ok = True
                feeds_shard.add(nxt)
                break
            if graph.nodes[nxt].type not in ELEMENTWISE or styles.get(nxt, "replicate") != "replicate":
                break
            cur = nxt
        out[nid] = {"output": "Shard(-1)" if ok else "Replicate()"}
    for nid, style in styles.items():
        ntype = graph.nodes[nid].type
        e = {"style": style, "type": ntype}
        if ntype == "MultiheadAttention":
            e.update(input="Replicate()", output="Replicate()", inner="q/k/v colwise (heads split), out rowwise")
        elif style == "colwise":
            e.update(input="Replicate()", output=out[nid]["output"])
        elif style == "rowwise":
            e.update(input="Shard(-1)" if nid in feeds_shard else "Replicate()", output="Replicate()")
        out[nid] = e
    return out


def param_shards(ntype: str, style: str, pname: str) -> int | None:
    """Which dimension of a parameter TP splits (None: replicated)."""
    if style in (None, "replicate"):
        return None
    if ntype == "Linear":
        if style == "colwise":
            return 0
        return 1 if pname == "weight" else None
    if ntype == "Embedding":
        return 1 if style == "colwise" else 0
    if ntype == "MultiheadAttention" and style == "colwise":
        sub, _, leaf = pname.partition(".")
        if sub in ("q", "k", "v"):
            return 0
        if sub == "out":
            return 1 if leaf == "weight" else None
    return None


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
    if not compiled.ok:
        return Plan({"version": PLAN_VERSION}, ["the diagram has errors: " + "; ".join(map(str, compiled.errors))], [])
    graph = compiled.graph
    B = project.training.batch_size
    m = int(pl["microbatches"]) if pp > 1 else 1
    schedule = pl["schedule"]

    if world != nproc:
        errors.append(f"placement pp={pp} x dp={dp} x tp={tp} = {world} processes, but {nproc} are available; "
                      f"set placement pp/dp/tp so that pp*dp*tp = {nproc}, or run with --nproc {world}")
    interleaved = pp > 1 and schedule == "interleaved1f1b"
    if pp > 1 and schedule == "1f1b" and m < pp:
        errors.append(f"placement.schedule 1f1b needs placement.microbatches >= stages, but microbatches is {m} and "
                      f"pp is {pp}; raise microbatches to {pp} or choose gpipe")
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
    if stages is None:
        if pp == 1:
            stages = [list(compute)]
        elif not given:
            from engine.autoplace import balanced_stages

            stages, _ = balanced_stages(compiled, n_stages, device, dp=dp, tp=tp, microbatches=m,
                                        batch_size=B, optimizer=project.training.optimizer.name)
            warnings.append(f"no node has a pipeline stage: the planner cut the model into {n_stages} balanced stages")
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
        if not ids:
            errors.append(f"stage {s} holds no layer; lower placement.pp to {len([x for x in stages if x])} "
                          f"or move a layer to stage {s}")

    # ---- tensor-parallel styles ----
    if styles is None:
        styles = {n: graph.nodes[n].tp for n in compute if graph.nodes[n].tp not in (None, "replicate")}
    if tp == 1:
        styles = {}
    for n, style in list(styles.items()):
        ntype = graph.nodes[n].type
        spec = get_layer(ntype)
        allowed = [s for s in (spec.tp_styles if spec else ()) if s != "replicate"]
        if style == "sequence" and style in (spec.tp_styles if spec else ()):
            errors.append(f"node '{n}' ({ntype}): tp style 'sequence' (sequence-parallel norm) is not run by "
                          f"Layerflow's runtime yet; set its tp style to replicate")
            del styles[n]
            continue
        if style not in allowed:
            errors.append(f"node '{n}' ({ntype}): tp style '{style}' does not apply to this layer; it supports "
                          f"{', '.join(spec.tp_styles) if spec and spec.tp_styles else 'only replicate'}")
            del styles[n]
            continue
        key = SPLIT_DIM.get((ntype, style))
        if key:
            size = compiled.nodes[n].params.get(key[0])
            if size and size % tp:
                divs = [d for d in range(2, size + 1) if size % d == 0][:6]
                errors.append(f"node '{n}' ({ntype}): tp={tp} does not divide its {key[1]} ({key[0]}={size}); "
                              f"choose tp among {', '.join(map(str, divs))} or set its tp style to replicate")
    tp_plan = tp_layouts(graph, compiled, styles, stage)

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
                                f"placement.sync_batchnorm (SyncBatchNorm over the data axis, GPUs only)")
            if m > 1:
                warnings.append(f"node '{n}' ({ntype}): statistics come from micro-batches of {mb} samples under "
                                f"microbatches={m}; fix: compare against single-process gradient accumulation over "
                                f"the same {m} micro-batches, or set placement.microbatches to 1 (pp=1)")
        elif ntype == "Dropout" and (dp > 1 or tp > 1 or m > 1) and compiled.nodes[n].params.get("p", 0) > 0:
            warnings.append(f"node '{n}' (Dropout): masks come from each rank's own random stream, so losses are "
                            f"not the single-process ones; fix: compare with p=0, or accept statistically equal runs")

    # ---- memory and FLOPs per rank ----
    opt = project.training.optimizer
    meta = compiled.module
    n_opt_states = {"adam": 2, "adamw": 2, "sgd": 1 if opt.momentum > 0 else 0}[opt.name]
    mesh = mesh_ranks(pp, dp, tp)
    devices = []
    fsdp = pl["data_parallel"] == "fsdp" and dp > 1
    stage_flops = [0.0] * pp
    ckpt_nodes = set(n for n in compute if graph.nodes[n].checkpoint)
    for rank in range(world):
        s, d, t = mesh["coords"][rank]
        mine = list(range(s, len(stages), pp))  # this rank's stages
        ids = [n for st in mine for n in stages[st]]
        params = tensors = 0
        for n in ids:
            if graph.nodes[n].type in ("Add", "Mul", "Concat"):
                continue
            style = styles.get(n)
            for pname, p in meta.get_submodule(n).named_parameters():
                shape = list(p.shape)
                dim = param_shards(graph.nodes[n].type, style, pname)
                if dim is not None:
                    shape[dim] = chunk_len(shape[dim], tp, t)
                if fsdp:
                    shape[0] = chunk_len(shape[0], dp, d)
                params += math.prod(shape)
                tensors += 1
        acts = sum(activation_bytes(compiled, stages[st], styles, tp_plan, tp, B // max(1, dp), m, pp, st,
                                    schedule, ckpt_nodes) for st in mine)
        flops = 3.0 * sum(compiled.nodes[n].flops / (tp if n in styles else 1) for n in ids) * (B // max(1, dp))
        stage_flops[s] = flops
        mem = {"params_bytes": params * FLOAT_BYTES, "grads_bytes": params * FLOAT_BYTES,
               "optimizer_bytes": n_opt_states * params * FLOAT_BYTES + (tensors * 4 if opt.name != "sgd" else 0),
               "activations_bytes": acts}
        mem["total_bytes"] = sum(mem.values())
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
    timing = step_time(stage_flops, m, device, comm_s, v)
    layouts = edge_layouts(graph, compiled, stage, styles, tp_plan, dp, tp)
    doc = {
        "version": PLAN_VERSION, "project": project.name, "world": world, "nproc": nproc,
        "pp": pp, "dp": dp, "tp": tp,
        "mesh": {"dims": ["pp", "dp", "tp"], "shape": [pp, dp, tp], "ranks": mesh["ranks"], "groups": mesh["groups"]},
        "data_parallel": pl["data_parallel"] if dp > 1 else "none",
        "reshard_after_forward": bool(pl["reshard_after_forward"]),
        "schedule": schedule if pp > 1 else "none", "microbatches": m,
        "mixed_precision": pl["mixed_precision"], "sync_batchnorm": bool(pl.get("sync_batchnorm")),
        "batch": {"global": B, "per_replica": B // max(1, dp), "per_microbatch": B // max(1, dp * m)},
        "stages": stages, "stages_per_rank": v, "tp_plan": tp_plan,
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


def _gib(n: float) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB"


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


def activation_bytes(compiled, ids, styles, tp_plan, tp, local_b, m, pp, s, schedule, ckpt) -> int:
    """Estimate: every layer's output is kept for backward (checkpointed ones are
    recomputed), for as many micro-batches as the schedule holds at once: all m
    under GPipe, at most pp - s under 1F1B."""
    per_sample = 0
    for n in ids:
        if n in ckpt:
            continue
        b = _out_bytes(compiled, n)
        if n in styles and tp_plan.get(n, {}).get("output", "Replicate()").startswith("Shard"):
            b //= tp
        per_sample += b
    in_flight = m if (pp == 1 or schedule != "1f1b") else min(m, pp - s)
    return per_sample * (local_b // max(1, m)) * in_flight


def edge_layouts(graph, compiled, stage, styles, tp_plan, dp, tp) -> list[dict]:
    """Each edge's tensor layout over the (dp, tp) mesh dims: the batch is split on
    dp; on tp it is Shard(-1) between a column-wise and a row-wise layer, else Replicate."""
    out = []
    for e in graph.edges:
        src = graph.nodes.get(e.src)
        if src is None or src.type == "Output":
            continue
        tp_layout = "Replicate()"
        if tp > 1:
            cur = e.src
            while cur is not None:  # elementwise layers keep what their input had
                ent = tp_plan.get(cur)
                if ent:
                    tp_layout = ent.get("output", "Replicate()")
                    break
                if graph.nodes[cur].type in ELEMENTWISE:
                    preds = graph.predecessors(cur)
                    cur = preds[0] if len(preds) == 1 else None
                else:
                    cur = None
        lay = ["Shard(0)" if dp > 1 else "Replicate()", tp_layout]
        rec = {"edge": f"{e.src} -> {e.dst}", "src": e.src, "dst": e.dst, "mesh_dims": ["dp", "tp"], **sbp(lay),
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
            if ent["style"] == "replicate":
                continue
            preds = graph.predecessors(n)
            in_b = (_out_bytes(compiled, preds[0]) if preds else 0) * local_b
            out_b = _out_bytes(compiled, n) * local_b
            if ent["type"] == "MultiheadAttention":
                comms.append(_tp(n, "all-reduce", out_b, tp, "forward: out projection's Partial() -> Replicate()"))
                comms.append(_tp(n, "all-reduce", in_b, tp, "backward: input gradient Partial() -> Replicate()"))
            elif ent["style"] == "colwise":
                if ent["output"] == "Replicate()":
                    comms.append(_tp(n, "all-gather", out_b, tp, "forward: Shard(-1) -> Replicate() (no row-wise layer follows)"))
                if ent["type"] != "Embedding":
                    comms.append(_tp(n, "all-reduce", in_b, tp, "backward: input gradient Partial() -> Replicate()"))
            elif ent["style"] == "rowwise":
                comms.append(_tp(n, "all-reduce", out_b, tp, "forward: Partial() -> Replicate()"))
                if ent["input"] == "Replicate()" and ent["type"] != "Embedding":
                    comms.append(_tp(n, "all-gather", in_b, tp, "backward: input gradient Shard(-1) -> Replicate()"))
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


def _tp(n, op, nbytes, tp, why) -> dict:
    return {"op": op, "where": f"node {n}", "group": "tp", "group_size": tp, "messages": 1,
            "bytes_per_step": nbytes, "why": why}


def format_plan(plan: Plan) -> str:
    """The plan as a person reads it on a terminal."""
    d = plan.doc
    lines = []
    if "mesh" in d:
        lines.append(f"mesh: pp={d['pp']} x dp={d['dp']} x tp={d['tp']} = {d['world']} ranks; "
                     f"data parallel: {d['data_parallel']}; schedule: {d['schedule']}, microbatches {d['microbatches']}; "
                     f"bubble {d['bubble_fraction']:.1%}")
        for s, ids in enumerate(d["stages"]):
            ranks = sorted({dv["rank"] for dv in d["devices"] if s in dv["stages"]})
            lines.append(f"stage {s} (ranks {ranks}): {', '.join(ids)}")
        for n, e in d["tp_plan"].items():
            lines.append(f"tp {n} ({e['type']}): {e['style']}, in {e['input']} ({oneflow_name(e['input'])}) -> "
                         f"out {e['output']} ({oneflow_name(e['output'])})")
        for c in d["communication"]:
            lines.append(f"comm {c['op']:<14} {c['where']:<28} group {c['group']}({c['group_size']})  "
                         f"{_gib(c['bytes_per_step'])}/step  [{c['oneflow']}] {c['why']}")
        lines.append("rank stage dp tp     params      grads  optimizer  activations      total   GFLOP/step")
        for dv in d["devices"]:
            mm = dv["memory"]
            lines.append(f"{dv['rank']:>4} {dv['stage']:>5} {dv['dp_rank']:>2} {dv['tp_rank']:>2} "
                         f"{_gib(mm['params_bytes']):>10} {_gib(mm['grads_bytes']):>10} {_gib(mm['optimizer_bytes']):>10} "
                         f"{_gib(mm['activations_bytes']):>12} {_gib(mm['total_bytes']):>10} {dv['flops_per_step'] / 1e9:>11.3f}")
        p = d["predicted"]
        lines.append(f"predicted step: {p['step_s'] * 1e3:.2f} ms (compute {p['compute_s'] * 1e3:.2f} ms, "
                     f"communication {p['comm_s'] * 1e3:.2f} ms) on {d['device']['name']}")
    lines += [f"warning: {w}" for w in plan.warnings]
    lines += [f"error: {e}" for e in plan.errors]
    return "\n".join(lines)


__all__ = ["Plan", "make_plan", "format_plan", "chunk_len", "mesh_ranks", "oneflow_name", "tp_layouts"]
