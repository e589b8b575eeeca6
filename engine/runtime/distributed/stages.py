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

import operator

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


BLOCK_SEP = "/"  # engine/diagram/graph.py's: a node's group "h.0/h.0.attn" is inside the top-level block "h.0"


def top_blocks(spec_nodes: list[dict]) -> dict[str, str | None]:
    """node id -> the top-level block (editor block, imported module) it is in; None: none.
    From the run spec's model nodes (engine/diagram/compile.py writes their `group`)."""
    return {n["id"]: (n["group"].split(BLOCK_SEP)[0] if n.get("group") else None) for n in spec_nodes}


def checkpoint_regions(order: list[str], checkpointed, blocks: dict[str, str | None] | None = None) -> list[list[str]]:
    """Activation checkpointing's regions: the runs of consecutive checkpointed nodes in
    `order`, cut where the top-level block changes. A region is recomputed as one piece in
    backward: autograd keeps only its inputs and the outputs used after it, none of the
    values inside (one layer checkpointed alone saves nothing: the next layer keeps its
    output anyway). A block per region, as torchtitan checkpoints each transformer block,
    bounds what one recomputation holds at once. The planner (engine/planning/cost.py) and the
    runtime cut them with this one function, so the plan's memory is what runs."""
    blocks = blocks or {}
    regions: list[list[str]] = []
    prev = None
    for n in order:
        if n not in checkpointed:
            prev = None
            continue
        key = ("block", blocks.get(n))
        if prev is not None and key == prev:
            regions[-1].append(n)
        else:
            regions.append([n])
        prev = key
    return regions


class _ContiguousGrad(torch.autograd.Function):
    """The identity, whose gradient is made contiguous: a stage sends the gradients of its
    inputs back to the stage before, which receives them into buffers of the strides the
    gradients had (a permute's gradient is a permuted view), and gloo refuses those."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def contiguous_grad(x: torch.Tensor) -> torch.Tensor:
    """x, with its gradient made contiguous (a plain function: fx's generated code names it)."""
    return _ContiguousGrad.apply(x)


class _Region(nn.Module):
    """A checkpointed region of a stage: its fx graph (sharing the stage's layer objects,
    held outside the module tree so parameters keep their names) run under
    torch.utils.checkpoint. Holds no parameters of its own.

    The region calls the layers the stage holds when it runs, not the ones it was cut
    with: what comes after the cut swaps a stage's children for others (float8's
    Float8Linear, SyncBatchNorm) and would otherwise never be called here (the region
    then trained the old layers, in bf16 beside FSDP's sharded float8 ones)."""

    def __init__(self, region: fx.GraphModule, names: list[str], layers: list[str]):
        super().__init__()
        object.__setattr__(self, "region", region)  # not a submodule: the stage root owns its layers
        object.__setattr__(self, "owner", None)  # the stage (build_stage_module sets it); not a submodule either
        self.names = names
        self.layers = layers  # the stage's children the region's graph calls

    def _sync(self) -> None:
        owner, mods = self.owner, self.region._modules
        if owner is None:
            return
        for name in self.layers:
            m = owner._modules.get(name)
            if m is not None and mods.get(name) is not m:
                mods[name] = m

    def forward(self, *args):
        self._sync()
        return _checkpoint(self.region, *args, use_reentrant=False)

    def extra_repr(self) -> str:
        return f"checkpointed: {', '.join(self.names)}"


def _region_module(gm: fx.GraphModule, nodes: list[fx.Node]) -> tuple[fx.GraphModule, list[fx.Node], list[fx.Node]]:
    """The fx GraphModule of a region (its layers are gm's own objects), its inputs (values
    made before it) and its outputs (its values used after it), in graph order."""
    inside = {n.name for n in nodes}
    inputs: list[fx.Node] = []
    for n in nodes:
        for a in n.all_input_nodes:
            if a.name not in inside and a not in inputs:
                inputs.append(a)
    outputs = [n for n in nodes if any(u.name not in inside for u in n.users)]
    rg = fx.Graph()
    env = {a.name: rg.placeholder(a.name) for a in inputs}
    for n in nodes:
        env[n.name] = rg.node_copy(n, lambda a: env[a.name])
    rg.output(tuple(env[o.name] for o in outputs))
    return fx.GraphModule(gm, rg, class_name="LayerflowCheckpointed"), inputs, outputs


def build_stage_module(gm: fx.GraphModule, stages: list[list[str]], s: int,
                       checkpointed: set[str] | frozenset = frozenset(),
                       blocks: dict[str, str | None] | None = None) -> fx.GraphModule:
    """The fx GraphModule of stage s. Its submodules are the full model's own
    objects (shared, not copied). `checkpointed` nodes are recomputed in backward, in the
    regions checkpoint_regions cuts (`blocks`: node -> top-level block, top_blocks)."""
    where = stage_of(gm, stages)
    live = live_across(gm, stages)
    by_name = {n.name: n for n in gm.graph.nodes}
    order = [n.name for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")
             and where[n.name] == s]
    regions = [r for r in checkpoint_regions(order, checkpointed, blocks)
               if not (len(r) == 1 and by_name[r[0]].op == "call_module")]  # one layer: checkpointed in place
    region_of = {n: i for i, r in enumerate(regions) for n in r}
    g = fx.Graph()
    env: dict[str, fx.Node] = {}
    if s == 0:
        ins = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    else:
        ins = live[s - 1]
    for name in ins:
        env[name] = g.placeholder(name)
        if s > 0:  # what this stage sends back is the gradient of what it received: contiguous too
            env[name] = g.call_function(contiguous_grad, (env[name],))
    root = nn.Module()
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output") or where[n.name] != s:
            continue
        if n.op == "call_module":
            root.add_module(n.target, gm.get_submodule(n.target))
        if n.name in region_of:
            i = region_of[n.name]
            if n.name == regions[i][0]:  # the region runs where its first node did (its inputs are made by then)
                rgm, inputs, outputs = _region_module(gm, [by_name[x] for x in regions[i]])
                name = f"checkpointed_{i}"
                layers = sorted({str(x.target).split(".")[0] for x in rgm.graph.nodes
                                 if x.op in ("call_module", "get_attr")})
                root.add_module(name, _Region(rgm, regions[i], layers))
                call = g.call_module(name, tuple(env[a.name] for a in inputs))
                for j, o in enumerate(outputs):
                    env[o.name] = g.call_function(operator.getitem, (call, j))
            continue
        if n.op == "call_module":
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
        # What is sent is contiguous: the pipeline makes the next stage's receive buffers with
        # the strides the sent values had, and gloo refuses a non-contiguous buffer ("input
        # tensor has to be contiguous": a transpose's output sent on, in ViT, Llama, T5, ...).
        outs = [g.call_method("clone", (env[v],), {"memory_format": torch.contiguous_format})
                if v in used_here or v in ins else g.call_method("contiguous", (env[v],))
                for v in live[s]]
        g.output(outs[0] if len(outs) == 1 else tuple(outs))
    stage = fx.GraphModule(root, g, class_name=f"LayerflowStage{s}")
    for name, mod in root.named_children():  # the layers only a region calls: the stage still owns
        if not hasattr(stage, name):        # them (its parameters, state_dict keys, FSDP units)
            stage.add_module(name, mod)
    for mod in stage.children():  # a region looks its layers up in the stage when it runs
        if isinstance(mod, _Region):
            object.__setattr__(mod, "owner", stage)
    return stage


def apply_checkpointing(gm: fx.GraphModule, nodes: set[str],
                        blocks: dict[str, str | None] | None = None) -> fx.GraphModule:
    """The whole model (no pipeline) with activation checkpointing on `nodes`."""
    if not nodes:
        return gm
    ids = [n.name for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]
    return build_stage_module(gm, [ids], 0, nodes, blocks)


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


__all__ = ["build_stage_module", "live_across", "stage_of", "even_stages", "apply_checkpointing", "checkpoint_regions",
           "top_blocks"]
