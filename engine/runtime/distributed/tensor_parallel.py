"""Tensor parallelism: the plan's per-layer layouts (Shard/Replicate: OneFlow's split and
broadcast) as DTensor styles over the tp sub-mesh (torch.distributed.tensor.parallel)."""
from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from ..plan import Layout, TPEntry


def placement(layout: Layout):
    """A plan's layout as a DTensor placement (a layer hands on Shard(d) or Replicate())."""
    if layout.kind == "replicate":
        return Replicate()
    if layout.kind == "shard":
        return Shard(layout.dim)
    raise ValueError(f"layout {layout} is not one a layer hands on (Shard(d) or Replicate())")


def tp_module_plan(tp_plan: dict[str, TPEntry], present: set[str]) -> dict:
    """The plan's per-node entries -> a parallelize_module plan for the layers this
    stage holds. Tensors pass between layers as local pieces; each entry's input and
    output say which piece (engine/planning/planner.py tp_layouts). MultiheadAttention
    'colwise' shards heads: q/k/v column-wise, out row-wise; its input is made a
    DTensor once for all three. 'sequence' norms run on their Shard(1) tokens; a
    'replicate' entry is a layer outside TP at the sequence region's edge: it gathers
    its input and/or keeps its chunk of the tokens."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                                   PrepareModuleOutput, RowwiseParallel, SequenceParallel)

    out: dict = {}
    for nid, e in tp_plan.items():
        if nid not in present:
            continue
        style, given, made = e.style, placement(e.input), placement(e.output)
        if e.type == "MultiheadAttention" and style == "colwise":
            out[nid] = PrepareModuleInput(input_layouts=(given,), desired_input_layouts=(Replicate(),),
                                          use_local_output=False)
            for sub in ("q", "k", "v"):
                out[f"{nid}.{sub}"] = ColwiseParallel()
            out[f"{nid}.out"] = RowwiseParallel(output_layouts=made)
        elif style == "colwise":
            out[nid] = ColwiseParallel(input_layouts=given, output_layouts=made)
        elif style == "rowwise":
            out[nid] = RowwiseParallel(input_layouts=given, output_layouts=made)
        elif style == "sequence":
            out[nid] = SequenceParallel(use_local_output=True)
        elif style == "replicate":  # gather the tokens coming in, keep this rank's chunk going out
            gather = {"input_layouts": (given,), "desired_input_layouts": (Replicate(),)}
            chunk = {"output_layouts": (Replicate(),), "desired_output_layouts": (made,)}
            if given != Replicate() and made != Replicate():
                out[nid] = PrepareModuleInputOutput(**gather, use_local_input=True, **chunk)
            elif given != Replicate():
                out[nid] = PrepareModuleInput(**gather, use_local_output=True)
            elif made != Replicate():
                out[nid] = PrepareModuleOutput(**chunk)
        else:
            raise ValueError(f"node '{nid}': tensor-parallel style '{style}' is not run by this runtime; "
                             f"set it to colwise, rowwise, sequence or replicate")
    return out


def apply_tp(module: nn.Module, tp_mesh: DeviceMesh, tp_plan: dict[str, TPEntry]) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    plan = tp_module_plan(tp_plan, {n for n, _ in module.named_children()})
    if plan:
        parallelize_module(module, tp_mesh, plan)
