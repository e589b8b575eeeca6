"""What an import leaves out of the diagram, named. An import records forward in eval
mode, so two things a model does only in training are not in the diagram:

- weights forward never reads in eval mode: a training-only branch, GoogLeNet's and
  Inception's auxiliary classifiers (`if self.training: aux1 = self.aux1(x)`);
- computations without weights that run only in training: stochastic depth
  (`if not training: return x`), a noise layer written the same way.

One run of the model in training mode (on copies of its buffers, so the module comes
out as it went in) tells them apart; the lines say which modules, how many weights and
why, so the diagram's parameter count is never silently short of the module's and a
diagram that trains differently from its source says so. (Dropout is recorded in eval
mode too, as a call that is off: it comes in as a Dropout node and trains as such.)
"""
from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode


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


def _eval_paths(ep) -> set[str]:
    """The module paths the eval-mode program has calls in (any depth of the module tree)."""
    out: set[str] = set()
    for n in ep.graph_module.graph.nodes:
        for val in (n.meta.get("nn_module_stack") or {}).values():
            if isinstance(val, tuple) and val and isinstance(val[0], str):
                out.add(val[0])
    return out


class _OpsIn(TorchDispatchMode):
    """Adds the innermost watched module running each operator to `ran`."""

    def __init__(self, stack: list[str], ran: set[str]):
        super().__init__()
        self.stack, self.ran = stack, ran

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.stack:
            self.ran.add(self.stack[-1])
        return func(*args, **(kwargs or {}))


def _enter(called: set[str], stack: list[str], path: str, *_) -> None:
    """A forward pre-hook: `path` is called (None: the inputs go on unchanged)."""
    called.add(path)
    stack.append(path)


def _leave(stack: list[str], *_) -> None:
    """A forward hook: the call is over (None: its output goes on unchanged)."""
    stack.pop()


def _run_in_training(module: nn.Module, paths: list[str], samples: list[torch.Tensor]) -> tuple[set[str], set[str]]:
    """(which of the modules at `paths` forward calls in training mode, which of them run
    an operator there themselves, not only through a watched module inside).

    The module is the one being imported and must come out as it went in, so nothing of
    its state is written: its buffers are swapped for copies for the call
    (torch.func.functional_call), which BatchNorm's running statistics then update, and
    the random state is forked. Writing the saved values back instead broke imports: a
    buffer that is a broadcast view (an ONNX file's expanded constants) refuses copy_."""
    from torch.func import functional_call

    called: set[str] = set()
    ran: set[str] = set()
    stack: list[str] = []
    hooks = []
    for p in paths:
        try:
            m = module.get_submodule(p)
        except AttributeError:
            continue  # a parameter of the model itself, not of a submodule
        hooks.append(m.register_forward_pre_hook(partial(_enter, called, stack, p)))
        hooks.append(m.register_forward_hook(partial(_leave, stack)))
    copies = {k: b.clone() for k, b in module.named_buffers()}
    modes = {m: m.training for m in module.modules()}
    try:
        with torch.random.fork_rng(), torch.no_grad(), _OpsIn(stack, ran):
            module.train()
            functional_call(module, copies, tuple(samples))
    except Exception:  # noqa: BLE001 - a model that cannot run in training mode here: say "never read"
        pass
    finally:
        for m, training in modes.items():
            m.training = training
        for h in hooks:
            h.remove()
    return called, ran


def _outermost(paths: list[str]) -> list[str]:
    return [p for p in paths if not any(p.startswith(q + ".") for q in paths if q != p)]


def left_out_notes(module: nn.Module, ep, samples: list[torch.Tensor], strip: str = "") -> list[str]:
    """One line naming the modules whose parameters are not in the diagram, and why; one
    naming the computations without weights that run only in training. No line when the
    diagram holds all the module does; no training run when nothing could be missing."""
    names = _unused(module, ep)
    owners = _owners(module, names) if names else []
    seen = _eval_paths(ep)
    quiet = [p for p, m in module.named_modules() if p and p not in seen
             and not any(p == o or p.startswith(o + ".") for o in owners)]
    if not owners and not quiet:
        return []
    called, ran = _run_in_training(module, owners + quiet, samples)

    def show(ps):
        return ", ".join(f"'{p.removeprefix(strip)}'" for p in ps)

    lines = [_unused_line(module, names, owners, called, show)] if names else []
    extra = _outermost([p for p in quiet if p in ran])
    if extra:
        kinds = sorted({type(module.get_submodule(p)).__name__ for p in extra})
        lines.append(f"{show(extra)} ({', '.join(kinds)}) compute only in training mode, so the diagram (an "
                     "eval-mode recording) trains without them; to keep them, write them as layers the diagram has "
                     "(a Dropout) or call them in eval mode too")
    return lines


def _unused_line(module: nn.Module, names: list[str], owners: list[str], trained: set[str], show) -> str:
    params = dict(module.named_parameters())
    n = sum(params[p].numel() for p in names)
    total = sum(p.numel() for p in params.values())
    why = []
    if trained:
        why.append(f"{show([p for p in owners if p in trained])} run only in training mode (auxiliary outputs: "
                   "an import records eval mode)")
    rest = [p for p in owners if p not in trained]
    if rest:
        why.append(f"{show(rest)} are never read by forward")
    return (f"{n} of the module's {total} parameters are not in the diagram: " + "; ".join(why)
            + "; to train them, return their outputs from forward in eval mode too")
