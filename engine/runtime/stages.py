"""Pipeline stages cut from the model's fx graph.

A pipeline is a chain: stage s receives only what stage s-1 sends. torch.fx's
split_module would hand the last stage a value straight from the first (a skip
connection), which PipelineStage cannot deliver. So each stage gets its own fx
graph whose inputs are the values live across the previous cut and whose outputs
are the values live across the next cut: a value made in stage 0 and used in
stage 2 is an output of stage 1 too (carried through unchanged).

Submodules keep their node ids as names, so a stage's state_dict keys are the
full model's keys (a checkpoint written under one cut loads under another).
"""
from __future__ import annotations

import torch
from torch import fx, nn
from torch.utils.checkpoint import checkpoint as _checkpoint


def stage_of(gm: fx.GraphModule, stages: list[list[str]]) -> dict[str, int]:
    """fx node name -> stage index. Inputs live in stage 0; every node must be placed."""
    where = {nid: s for s, ids in enumerate(stages) for nid in ids}
    out: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            out[n.name] = 0
        elif n.op in ("call_module", "call_function", "call_method"):
            if n.name not in where:
                raise ValueError(f"node '{n.name}' is in no pipeline stage; give it a stage")
            out[n.name] = where[n.name]
    return out


def live_across(gm: fx.GraphModule, stages: list[list[str]]) -> list[list[str]]:
    """For each cut s (between stage s and s+1): the values made at or before stage s
    and used after it, in graph order. The model output counts as used by the last stage."""
    where = stage_of(gm, stages)
    last = len(stages) - 1
    last_use: dict[str, int] = {}
    for n in gm.graph.nodes:
        users_stage = last if n.op == "output" else where.get(n.name)
        for a in n.all_input_nodes:
            last_use[a.name] = max(last_use.get(a.name, -1), users_stage)
    order = [n.name for n in gm.graph.nodes if n.name in where]
    for n in gm.graph.nodes:
        for a in n.all_input_nodes:
            if n.op != "output" and where[a.name] > where[n.name]:
                raise ValueError(f"edge {a.name} -> {n.name} goes from stage {where[a.name]} back to stage "
                                 f"{where[n.name]}; stages must follow the data flow")
    return [[v for v in order if where[v] <= s < last_use.get(v, -1)] for s in range(last)]


def build_stage_module(gm: fx.GraphModule, stages: list[list[str]], s: int,
                       checkpointed: set[str] | frozenset = frozenset()) -> fx.GraphModule:
    """The fx GraphModule of stage s. Its submodules are the full model's own
    objects (shared, not copied)."""
    where = stage_of(gm, stages)
    live = live_across(gm, stages)
    g = fx.Graph()
    env: dict[str, fx.Node] = {}
    if s == 0:
        ins = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    else:
        ins = live[s - 1]
    for name in ins:
        env[name] = g.placeholder(name)
    root = nn.Module()
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output") or where[n.name] != s:
            continue
        if n.op == "call_module":
            root.add_module(n.target, gm.get_submodule(n.target))
            if n.name in checkpointed:
                # Recompute this layer's activations in backward instead of keeping them.
                mod = g.get_attr(n.target)
                args = tuple(env[a.name] if isinstance(a, fx.Node) else a for a in n.args)
                env[n.name] = g.call_function(_checkpoint, (mod, *args), {"use_reentrant": False})
                env[n.name].name = n.name
                continue
        env[n.name] = g.node_copy(n, lambda a: env[a.name])
    if s == len(stages) - 1:
        out = next(n for n in gm.graph.nodes if n.op == "output")
        g.output(fx.map_arg(out.args[0], lambda a: env[a.name]))
    else:
        # A value sent on that this stage also uses leaves as a copy: after the input gradient
        # the pipeline detaches what a stage sent in place, and an op here may have saved that
        # very tensor for a weight gradient computed later (zero-bubble schedules split them).
        used_here = {a.name for n in gm.graph.nodes if n.op not in ("placeholder", "output") and where[n.name] == s
                     for a in n.all_input_nodes}
        outs = [g.call_method("clone", (env[v],)) if v in used_here or env[v].op == "placeholder" else env[v]
                for v in live[s]]
        g.output(outs[0] if len(outs) == 1 else tuple(outs))
    return fx.GraphModule(root, g, class_name=f"LayerflowStage{s}")


def apply_checkpointing(gm: fx.GraphModule, nodes: set[str]) -> fx.GraphModule:
    """The whole model (no pipeline) with activation checkpointing on `nodes`."""
    if not nodes:
        return gm
    ids = [n.name for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]
    return build_stage_module(gm, [ids], 0, nodes)


def even_stages(gm: fx.GraphModule, pp: int) -> list[list[str]]:
    """A fallback cut when run.json carries no plan: contiguous runs of the topological
    order holding about the same number of parameters each."""
    ids = [n.name for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]
    if pp > len(ids):
        raise ValueError(f"pp={pp} stages but the model has only {len(ids)} layers; lower placement.pp")
    weight = []
    for n in gm.graph.nodes:
        if n.name in ids:
            w = sum(p.numel() for p in gm.get_submodule(n.target).parameters()) if n.op == "call_module" else 0
            weight.append(w + 1)
    total = sum(weight)
    stages: list[list[str]] = [[] for _ in range(pp)]
    acc, prev = 0, 0
    for i, (nid, w) in enumerate(zip(ids, weight)):
        want = min(pp - 1, int(acc * pp / total))
        # never skip a stage, never go back, leave at least one layer per later stage
        s = max(min(want, prev + 1), prev, pp - (len(ids) - i)) if i else 0
        stages[s].append(nid)
        acc, prev = acc + w, s
    return stages


__all__ = ["build_stage_module", "live_across", "stage_of", "even_stages", "apply_checkpointing"]
