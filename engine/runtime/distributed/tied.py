"""Tied weights across pipeline stages, as Megatron-LM and torchtitan keep them: a parameter
shared by layers on different stages (a language model's token embedding and output head)
lives on every stage that uses it. Every copy starts equal (each rank builds the whole
model from the same seed, ties applied, before its stage is cut out); after each backward
the copies' gradients are summed over the pipeline ranks that hold them (one all-reduce
per tie, between the data-parallel and tensor-parallel peers' positions), so every copy
takes the same optimizer step and they stay bit for bit equal.

A checkpoint holds the parameter under each name it has on its stages (the embedding's
on one, the head's on another): the same values, which load under any layout, in one
process included. Clipping counts a tied parameter once (on the first stage holding it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from ..plan import stage_rank


def tie_classes(ties: dict[str, str]) -> list[list[str]]:
    """The parameters that are one tensor, as sorted lists of "node.param" names (a tie's
    target and every name tied to it)."""
    root: dict[str, str] = {}

    def find(x: str) -> str:
        while root.get(x, x) != x:
            x = root[x]
        return x

    for dst, src in ties.items():
        a, b = find(dst), find(src)
        if a != b:
            root[max(a, b)] = min(a, b)
    classes: dict[str, set[str]] = {}
    for name in {*ties, *ties.values()}:
        classes.setdefault(find(name), set()).add(name)
    return [sorted(c) for _, c in sorted(classes.items())]


def stage_spread(ties: dict[str, str], stages: list[list[str]]) -> list[tuple[list[str], list[int]]]:
    """For each tied parameter that spans several pipeline stages: (its names, the stages
    holding them, sorted)."""
    where = {nid: s for s, ids in enumerate(stages) for nid in ids}
    out = []
    for names in tie_classes(ties):
        held = sorted({where[n.partition(".")[0]] for n in names if n.partition(".")[0] in where})
        if len(held) > 1:
            out.append((names, held))
    return out


@dataclass
class TiedCopy:
    """One tied parameter on this rank: its tensor (the stage module's parameter), the
    process group of the pipeline ranks holding a copy, and whether this rank counts it
    in the gradient norm."""

    names: list[str]
    param: nn.Parameter
    group: object
    counts_in_norm: bool


@dataclass
class TiedWeights:
    copies: list[TiedCopy] = field(default_factory=list)
    seconds: float = 0.0  # spent in sync_grads (the rank log says it at the end: bench/tied_pipeline.py)
    calls: int = 0

    @property
    def not_counted(self) -> set[int]:
        """ids of parameters a gradient norm leaves out here (counted on another stage)."""
        return {id(c.param) for c in self.copies if not c.counts_in_norm}

    @torch.no_grad()
    def sync_grads(self) -> None:
        """Sum each tied parameter's gradient over the stages holding it (after backward)."""
        if not self.copies:
            return
        t0 = time.perf_counter()
        for c in self.copies:
            p = c.param
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            dist.all_reduce(g, group=c.group)
        self.seconds += time.perf_counter() - t0
        self.calls += 1


def find_param(parts: list[nn.Module], name: str) -> nn.Parameter | None:
    """The parameter `node.param` in this rank's stage modules (DDP's wrapper looked
    through), or None when none of them holds the node."""
    node, _, pname = name.partition(".")
    for m in parts:
        inner = m.module if isinstance(m, nn.parallel.DistributedDataParallel) else m
        if hasattr(inner, node):
            return inner.get_submodule(node).get_parameter(pname)
    return None


def setup(ties: dict[str, str], stages: list[list[str]], pp: int, dp: int, tp: int, rank: int,
          parts: list[nn.Module], schedule: str = "1f1b") -> TiedWeights:
    """The tied parameters this rank holds a copy of, each with its group. Every rank calls
    this with the same arguments (new_group is collective), in the same order."""
    out = TiedWeights()
    for names, held in stage_spread(ties, stages):
        pp_ranks = sorted({stage_rank(schedule, pp, s) for s in held})
        if len(pp_ranks) < 2:
            continue  # one rank holds every stage using it (interleaved): one tensor there already
        mine = None
        for d in range(dp):
            for t in range(tp):
                ranks = [(s * dp + d) * tp + t for s in pp_ranks]
                group = dist.new_group(ranks)
                if rank in ranks:
                    mine = (group, ranks)
        if mine is None:
            continue
        group, ranks = mine
        param = next((p for p in (find_param(parts, n) for n in names) if p is not None), None)
        if param is None:
            continue
        out.copies.append(TiedCopy(names, param, group, counts_in_norm=rank == ranks[0]))
    return out
