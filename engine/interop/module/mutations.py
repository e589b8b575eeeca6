"""In-place writes an import must not lose.

torch.export records a forward in its training IR, which keeps in-place calls: a
torchvision-style Swin builds its shifted-window attention mask with
`attn_mask[h0:h1, w0:w1] = count` on a fresh `new_zeros`, recorded as `fill_` calls on
slices whose results nothing reads. The importer follows values, not side effects, so
those writes were lost: the mask stayed zero and the imported Swin was off by about 1e-2.
A program with such a call is functionalized first (`run_decompositions({})`: no
operator is decomposed; the writes become `slice_scatter` values that the mask's readers
read), so every write reaches the diagram.
"""
from __future__ import annotations


def _writes_unread(ep) -> bool:
    """A call that changes a tensor in place and whose result nothing reads."""
    for n in ep.graph_module.graph.nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is not None and schema.is_mutable and not n.users:
            return True
    return False


def functional(ep):
    """`ep`, functionalized when an in-place write would otherwise be lost."""
    return ep.run_decompositions({}) if _writes_unread(ep) else ep
