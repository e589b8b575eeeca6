"""Parameters an import leaves out, named: a module whose weights forward never reads in
eval mode (the mode an import records) is not in the diagram. The usual case is a
training-only branch, GoogLeNet's and Inception's auxiliary classifiers (`if
self.training: aux1 = self.aux1(x)`); the note says which modules, how many weights,
and why, so the diagram's parameter count is never silently short of the module's.
"""
from __future__ import annotations

import torch
from torch import nn


def _unused(module: nn.Module, ep) -> list[str]:
    """Names of the module's parameters no call of the exported program reads."""
    users = {n.name: len(n.users) for n in ep.graph_module.graph.nodes if n.op == "placeholder"}
    return [spec.target for spec in ep.graph_signature.input_specs
            if spec.kind.name == "PARAMETER" and users.get(spec.arg.name, 1) == 0]


def _owners(module: nn.Module, names: list[str]) -> list[str]:
    """The outermost modules all of whose parameters are among `names` (else the names)."""
    unused, out = set(names), []
    for name in names:
        parts = name.split(".")
        owner = name
        for k in range(1, len(parts)):
            path = ".".join(parts[:k])
            own = [f"{path}.{p}" for p, _ in module.get_submodule(path).named_parameters()]
            if own and all(p in unused for p in own):
                owner = path
                break
        if owner not in out:
            out.append(owner)
    return out


def _run_in_training(module: nn.Module, paths: list[str], samples: list[torch.Tensor]) -> set[str]:
    """Which of the modules at `paths` forward calls in training mode.

    The module is the one being imported and must come out as it went in, so nothing of
    its state is written: its buffers are swapped for copies for the call
    (torch.func.functional_call), which BatchNorm's running statistics then update, and
    the random state is forked. Writing the saved values back instead broke imports: a
    buffer that is a broadcast view (an ONNX file's expanded constants) refuses copy_."""
    from torch.func import functional_call

    called: set[str] = set()
    hooks = []
    for p in paths:
        try:
            m = module.get_submodule(p)
        except AttributeError:
            continue  # a parameter of the model itself, not of a submodule
        hooks.append(m.register_forward_pre_hook(lambda _m, _a, p=p: called.add(p)))
    copies = {k: b.clone() for k, b in module.named_buffers()}
    modes = {m: m.training for m in module.modules()}
    try:
        with torch.random.fork_rng(), torch.no_grad():
            module.train()
            functional_call(module, copies, tuple(samples))
    except Exception:  # noqa: BLE001 - a model that cannot run in training mode here: say "never read"
        pass
    finally:
        for m, training in modes.items():
            m.training = training
        for h in hooks:
            h.remove()
    return called


def unused_note(module: nn.Module, ep, samples: list[torch.Tensor], strip: str = "") -> str | None:
    """One line naming the modules whose parameters are not in the diagram, and why."""
    names = _unused(module, ep)
    if not names:
        return None
    params = dict(module.named_parameters())
    owners = _owners(module, names)
    trained = _run_in_training(module, owners, samples)
    n = sum(params[p].numel() for p in names)
    total = sum(p.numel() for p in params.values())

    def show(ps):
        return ", ".join(f"'{p.removeprefix(strip)}'" for p in ps)

    why = []
    if trained:
        why.append(f"{show([p for p in owners if p in trained])} run only in training mode (auxiliary outputs: "
                   "an import records eval mode)")
    rest = [p for p in owners if p not in trained]
    if rest:
        why.append(f"{show(rest)} are never read by forward")
    return (f"{n} of the module's {total} parameters are not in the diagram: " + "; ".join(why)
            + "; to train them, return their outputs from forward in eval mode too")
