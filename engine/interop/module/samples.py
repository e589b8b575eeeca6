"""The inputs an import checks itself on.

Floating inputs are seeded normal noise. Token ids are drawn at random below the
vocabulary of the embeddings they feed (the smallest one, when an input feeds several),
or below a vocabulary the user gives: all-zero ids would check a language model on one
token only, and ids past an embedding's size would not run.
"""
from __future__ import annotations

import torch
from torch import fx

SEED = 0
SAMPLE_BATCH = 3  # a batch unlike any other size, so the batch dimension is easy to tell apart


def first_samples(shapes, dtypes, batch: int, vocab: int | None = None) -> list[torch.Tensor]:
    """Inputs to trace with: normal floats; integer ids below `vocab` (when given), else zeros
    (which every embedding has) until token_samples() knows each input's vocabulary."""
    g = torch.Generator().manual_seed(SEED)
    out = []
    for shape, dtype in zip(shapes, dtypes):
        dt = getattr(torch, dtype)
        if dt.is_floating_point:
            out.append(torch.randn((batch, *shape), generator=g).to(dt))
        elif vocab is not None and dt != torch.bool:
            out.append(torch.randint(0, vocab, (batch, *shape), generator=g).to(dt))
        else:
            out.append(torch.zeros((batch, *shape), dtype=dt))
    return out


def embedding_vocab(gm: fx.GraphModule, user_inputs: list[fx.Node]) -> dict[int, int]:
    """Index of a user input -> the smallest num_embeddings among the embeddings its
    values index (through any chain of calls), for the inputs that feed one."""
    bounds: dict[int, int] = {}
    pos = {n: k for k, n in enumerate(user_inputs)}
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not torch.ops.aten.embedding.default:
            continue
        weight, indices = n.args[0], n.args[1]
        val = weight.meta.get("val") if isinstance(weight, fx.Node) else None
        if not isinstance(val, torch.Tensor) or not isinstance(indices, fx.Node):
            continue
        rows = int(val.shape[0])
        seen, todo = set(), [indices]
        while todo:
            a = todo.pop()
            if a in seen:
                continue
            seen.add(a)
            if a in pos:
                bounds[pos[a]] = min(bounds.get(pos[a], rows), rows)
            todo.extend(a.all_input_nodes)
    return bounds


def token_samples(samples: list[torch.Tensor], bounds: dict[int, int], vocab: int | None = None) -> list[torch.Tensor]:
    """`samples` with each integer input that feeds an embedding redrawn, seeded, below its
    vocabulary (or `vocab`, the user's, when smaller)."""
    g = torch.Generator().manual_seed(SEED + 1)
    out = []
    for k, s in enumerate(samples):
        high = bounds.get(k)
        if vocab is not None:
            high = min(high, vocab) if high is not None else vocab
        if s.is_floating_point() or s.dtype == torch.bool or high is None or high < 1:
            out.append(s)
            continue
        out.append(torch.randint(0, high, tuple(s.shape), generator=g).to(s.dtype))
    return out
