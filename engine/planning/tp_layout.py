"""Tensor parallelism laid out: which layers split and how (styles), every node's output
layout on the tp axis, and the entries the runtime applies (engine/runtime/distributed/tensor_parallel.py).

Styles come from the diagram (a node's tp field), or, left on auto, from Megatron's
colwise/rowwise pairs and attention heads where tp divides them (engine/planning/partition.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.diagram.compile import CompileResult
from engine.diagram.catalog import get_layer
from engine.planning.partition import ELEMENTWISE, auto_tp_styles, single_chain
from engine.runtime.plan import REPLICATE, Layout, TPEntry, shard

SEQ = shard(1)  # sequence-parallel activations: split on the sequence (dim 1 of [batch, seq, ...])
JOINS_SEQUENCE = ELEMENTWISE | {"Add", "Mul"}  # layers that run on a sequence shard as they are


@dataclass
class TPLayout:
    """What lay_out_tp decided: styles per node (auto: the ones the planner chose), the
    runtime's entries, every node's output layout, and the problems found."""
    styles: dict[str, str] = field(default_factory=dict)
    auto: list[str] = field(default_factory=list)
    plan: dict[str, TPEntry] = field(default_factory=dict)
    layout: dict[str, Layout] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def lay_out_tp(compiled: CompileResult, tp: int, stage: dict[str, int],
               styles: dict[str, str] | None = None) -> TPLayout:
    """Tensor parallelism over tp ranks. styles overrides the diagram's (auto-placement
    tries candidates); stage: node -> pipeline stage (a Megatron pair stays in one)."""
    graph = compiled.graph
    compute = [n for n in compiled.order if graph.nodes[n].type not in ("Input", "Output")]
    out = TPLayout()
    if tp == 1:
        styles = {}
    elif styles is None:
        styles = {n: graph.nodes[n].tp for n in compute if graph.nodes[n].tp not in (None, "replicate")}
        # nodes left on auto: Megatron's pairs and attention heads, where tp divides them
        auto = auto_tp_styles(compiled, tp, only={n for n in compute if graph.nodes[n].tp is None})
        styles.update(auto)
        out.auto = sorted(auto)
    styles = dict(styles)
    for n, style in list(styles.items()):
        ntype = graph.nodes[n].type
        spec = get_layer(ntype)
        allowed = [s for s in (spec.tp_styles if spec else ()) if s != "replicate"]
        if style not in allowed:
            out.errors.append(f"node '{n}' ({ntype}): tp style '{style}' does not apply to this layer; it supports "
                              f"{', '.join(spec.tp_styles) if spec and spec.tp_styles else 'only replicate'}")
            del styles[n]
            continue
        rule = spec.tp_rule(style)
        if rule:
            size = compiled.nodes[n].params.get(rule.splits)
            if size and size % tp:
                divs = [d for d in range(2, size + 1) if size % d == 0][:6]
                out.errors.append(f"node '{n}' ({ntype}): tp={tp} does not divide its {rule.what} ({rule.splits}="
                                  f"{size}); choose tp among {', '.join(map(str, divs))} or set its tp style to replicate")
    out.styles = styles
    out.plan, out.layout, errors = tp_layouts(graph, compiled, styles, stage, tp)
    out.errors += errors
    if tp > 1 and all(e.style == "replicate" for e in out.plan.values()):
        out.warnings.append(f"placement.tp={tp} splits no layer: every tp rank holds and computes the whole model; "
                            f"set nodes' tp style (colwise then rowwise Linear pairs, attention by heads) or leave "
                            f"them on auto with sizes that tp divides, or lower placement.tp to 1")
    return out


def tp_layouts(graph, compiled: CompileResult, styles: dict[str, str], stage: dict[str, int],
               tp: int = 2) -> tuple[dict[str, TPEntry], dict[str, Layout], list[str]]:
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
    out: dict[str, TPEntry] = {}
    errors: list[str] = []
    nodes = graph.nodes
    preds_of: dict[str, list[str]] = {}  # (read once: graph.predecessors scans every edge, per node)
    succs_of: dict[str, list[str]] = {}
    for e in graph.edges:
        preds_of.setdefault(e.dst, []).append(e.src)
        succs_of.setdefault(e.src, []).append(e.dst)
    compute = [n for n in compiled.order if nodes[n].type not in ("Input", "Output")]
    # ---- the sequence-parallel region: the norms, and what joins them ----
    seq = {n for n, s in styles.items() if s == "sequence"}
    feeds_seq: set[str] = set()  # outside the region, handing it Shard(1) (to all their consumers)
    grew = bool(seq)
    while grew:
        feeds_seq = {n for n in compiled.order if n not in seq and any(c in seq for c in succs_of.get(n, []))}
        grew = False
        for n in compute:
            if n in seq or nodes[n].type not in JOINS_SEQUENCE or styles.get(n, "replicate") != "replicate":
                continue
            if any(p in seq or p in feeds_seq for p in preds_of.get(n, [])) or \
                    any(c in seq for c in succs_of.get(n, [])):
                seq.add(n)
                grew = True
    for n in sorted(feeds_seq & {n for n in compiled.order if nodes[n].type == "Input"}):
        errors.append(f"node '{n}' (Input) feeds the sequence-parallel region directly; put a layer between it "
                      f"and {', '.join(c for c in succs_of.get(n, []) if c in seq)}, or set the norms' tp style "
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
        for c in succs_of.get(n, []):
            if nodes[c].type in ("Output", "Concat"):
                errors.append(f"edge {n} -> {c}: {c} ({nodes[c].type}) cannot read a sequence shard; put a "
                              f"replicated layer between them or set the norms' tp style to replicate")

    # ---- Megatron's column-wise -> row-wise pairs ----
    feeds_shard: set[str] = set()
    pair_colwise: set[str] = set()
    for nid, style in styles.items():
        if style != "colwise" or nodes[nid].type == "MultiheadAttention":
            continue
        for nxt in single_chain(graph, nid):
            if stage.get(nxt) != stage.get(nid) or nxt in seq:
                break
            if styles.get(nxt) == "rowwise" and nodes[nxt].type == "Linear":
                pair_colwise.add(nid)
                feeds_shard.add(nxt)
                break
            if nodes[nxt].type not in ELEMENTWISE or styles.get(nxt, "replicate") != "replicate":
                break

    # ---- every node's output layout, then the entries the runtime applies ----
    layout: dict[str, Layout] = {}
    for n in compiled.order:
        ntype, style = nodes[n].type, styles.get(n)
        preds = preds_of.get(n, [])
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
        preds = preds_of.get(n, [])
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


__all__ = ["TPLayout", "lay_out_tp", "tp_layouts", "SEQ", "JOINS_SEQUENCE"]
