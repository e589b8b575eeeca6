"""The checks an import of a module makes: as many inputs as forward takes, and the
diagram computes what the module computes."""
from __future__ import annotations

import torch
from torch import nn

from engine.interop.common import Imported, InteropError


def check_arity(module: nn.Module, n: int, source: str) -> None:
    """As many input shapes as forward takes tensors (arguments with defaults may be left out)."""
    import inspect

    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # a builtin or C++ forward: running it will tell
        return
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not len(required) <= n <= len(positional):
        raise InteropError(f"{source}: forward takes {len(required)} input(s) ({', '.join(p.name for p in required)}) "
                           f"but {n} input shape(s) were given (--input-shape)")


def check_outputs(imported: Imported, module: nn.Module, samples: list[torch.Tensor]) -> None:
    """The diagram computes what the module computes (eval mode, same weights)."""
    from engine.diagram.compile import compile_graph

    gm = compile_graph(imported.project.graph).build(seed=0)
    gm.load_state_dict(imported.state)
    gm.eval()
    with torch.no_grad():
        want, got = module(*samples), gm(*samples)
    want = want if isinstance(want, (tuple, list)) else [want]
    got = got if isinstance(got, (tuple, list)) else [got]
    for w, g in zip(want, got):
        if w.shape != g.shape:
            raise InteropError(f"{imported.source}: the imported diagram gives shape {tuple(g.shape)} where the module "
                               f"gives {tuple(w.shape)}; please report this module")
        if w.is_floating_point() and not torch.isfinite(w).all():
            raise InteropError(f"{imported.source}: the model itself gives non-finite outputs on random inputs; "
                               "check its weights")
        scale = max(w.abs().max().item(), 1e-6) if w.is_floating_point() and w.numel() else 1.0
        if not torch.allclose(w.double(), g.double(), rtol=1e-4, atol=1e-4 * scale):
            raise InteropError(f"{imported.source}: the imported diagram computes something else than the module "
                               f"(largest difference {(w.double() - g.double()).abs().max().item():.3g} at output "
                               f"scale {scale:.3g}); please report this module")
