"""training.compile: torch.compile of the model, whole or by regions (issue 47, item 1).

    off      eager, as before
    whole    one torch.compile of all the model's layers
    blocks   regional compilation, as torchtitan compiles each transformer block: one
             torch.compile per block of the diagram, so a compile is small, a failure costs
             one block, and identical blocks hit inductor's graph cache

How a block is found. The runtime's model is a flat torch.fx GraphModule (model.py): one
node per layer of the diagram, named by its id. Where the spec's nodes name their block
("block"; or "group"/"scope", what an imported model's nodes keep of their module tree:
then the outermost list item around them, h.0 or layer1.1), a region is a run of
consecutive nodes of one block. Where they do not (engine/diagram/compile.py
writes id, type, params and args only), the graph is cut where it narrows to a single
live value (between two transformer half-blocks, between two residual blocks of a
ResNet, after each layer of an MLP), and a piece without parameters joins the piece
before it (Linear + ReLU, attention + its residual add), as does the piece after a lone
layer (Conv2d, then BatchNorm + ReLU + pooling); pieces that repeat as a group (attention
half, MLP half, attention half...) make one block per repetition. Each region is outlined into a
GraphModule of its own that holds the very same layer modules, and the flat graph calls
it in place of its nodes: parameter names, state_dict and checkpoints are unchanged, so
a compiled run resumes an eager one and the other way round.

A region's compiled code runs only where gradients are on (the training step): the
evaluation runs the same layers eagerly, so it triggers no second compile of every
region for eval mode and the last, shorter validation batch.

The first compile is done before the loop's clock starts (`warm_up`): every region is
run once, compiled, forward and backward, on inputs of the real shapes (zeros), after an
eager pass that records what each region receives; then buffers (BatchNorm statistics),
random streams and gradients are put back, so the run's trajectory is that of eager
training. A region that fails to compile (then, or later at a recompile) runs eagerly
from then on, with one line in the run log naming it and the reason. CUDA graphs stay
off (inductor's default mode).

Imports only torch and the standard library: it runs on bare GPU nodes.
"""
from __future__ import annotations

import contextlib
import operator
import time
from collections.abc import Callable, Iterable

import torch
from torch import fx, nn

from .steps import left_as_it_was

MODES = ("off", "blocks", "whole")
WHOLE = "model"  # the name of the one region of `whole`
REASON_CHARS = 240  # a fallback line keeps this much of the error's first line
BACKEND = "inductor"  # torch.compile's backend (tests put one here that fails)

Log = Callable[[str], None]


# ----- which nodes make a region -----------------------------------------------------
# get_attr: a checkpointed layer's module, fetched for the checkpoint call (stages.py)
COMPUTE = ("call_module", "call_function", "call_method", "get_attr")


def _compute_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op in COMPUTE]


def _has_params(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op not in ("call_module", "get_attr"):
        return False
    obj = gm.get_submodule(node.target) if node.op == "call_module" else _attr(gm, node.target)
    return isinstance(obj, nn.Module) and any(True for _ in obj.parameters()) or isinstance(obj, nn.Parameter)


def _attr(gm: nn.Module, target: str):
    for part in target.split("."):
        gm = getattr(gm, part)
    return gm


def block_of(spec_node: dict) -> str | None:
    """The block a spec node names for itself ("block"), else None."""
    b = spec_node.get("block")
    return str(b) if b else None


def _paths(spec_node: dict) -> list[str]:
    """The module paths around a node, from the outside in: its "group" (the editor's
    block path, "h.0/h.0.attn") or its "scope" ([[path, type], ...] of an imported module)."""
    if spec_node.get("group"):
        return str(spec_node["group"]).split("/")
    return [str(p[0]) for p in spec_node.get("scope") or [] if p]


def spec_blocks(spec_nodes: Iterable[dict]) -> dict[str, str | None]:
    """Node id -> its block, where the spec says: "block" as written; else the outermost
    module path around it that is an item of a list (h.0, layer1.1: what repeats, what
    torchtitan compiles one by one) and holds more than this node."""
    nodes = [n for n in spec_nodes if isinstance(n, dict) and "id" in n]
    count: dict[str, int] = {}
    for n in nodes:
        for p in set(_paths(n)):
            count[p] = count.get(p, 0) + 1
    out: dict[str, str | None] = {}
    for n in nodes:
        b = block_of(n)
        if b is None:
            b = next((p for p in _paths(n) if p.rpartition(".")[2].isdigit() and count[p] > 1), None)
        out[str(n["id"])] = b
    return out


def narrow_segments(gm: fx.GraphModule) -> list[list[fx.Node]]:
    """The compute nodes cut where one value alone is live (what the rest of the graph
    reads of everything before): between transformer half-blocks, residual blocks, MLP
    layers. A piece without parameters joins the piece before it."""
    nodes = list(gm.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    last_use = {n: max((pos[u] for u in n.users), default=pos[n]) for n in nodes}
    pieces: list[list[fx.Node]] = []
    cur: list[fx.Node] = []
    for i, n in enumerate(nodes):
        if n.op not in COMPUTE or getattr(n.target, "__name__", "") == "contiguous_grad":
            continue  # (a pipeline stage's input marker, stages.contiguous_grad: no compute of its own)
        cur.append(n)
        live = [m for m in nodes[:i + 1] if last_use[m] > i]
        if len(live) <= 1:
            pieces.append(cur)
            cur = []
    if cur:
        pieces.append(cur)
    merged: list[list[fx.Node]] = []
    for p in pieces:
        # a piece without parameters, or one after a lone layer (Conv2d, then BatchNorm + ReLU),
        # joins the piece before it
        if merged and (not any(_has_params(gm, n) for n in p) or len(merged[-1]) == 1):
            merged[-1].extend(p)
        else:
            merged.append(p)
    # a first piece without parameters (a reshape before the first layer) joins the next one
    if len(merged) > 1 and not any(_has_params(gm, n) for n in merged[0]):
        first = merged.pop(0)  # (popped before the next is indexed: with two pieces, merged[1] is gone)
        merged[0][:0] = first
    return repeated_blocks(gm, merged)


MAX_PERIOD = 4  # pieces per repeated block looked for (a transformer block: 2, attention and MLP)


def _signature(gm: fx.GraphModule, piece: list[fx.Node]) -> tuple:
    """What a piece computes, without its names: the op of each node, the layer's class
    and its parameters' shapes."""
    sig = []
    for n in piece:
        if n.op in ("call_module", "get_attr"):
            obj = gm.get_submodule(n.target) if n.op == "call_module" else _attr(gm, n.target)
            shapes = tuple(tuple(p.shape) for p in obj.parameters()) if isinstance(obj, nn.Module) else ()
            sig.append((n.op, type(obj).__name__, shapes))
        else:
            sig.append((n.op, getattr(n.target, "__name__", str(n.target)), len(n.args)))
    return tuple(sig)


def repeated_blocks(gm: fx.GraphModule, pieces: list[list[fx.Node]]) -> list[list[fx.Node]]:
    """Pieces that repeat as a group (attention half, MLP half, attention half, ...) merged
    into one block per repetition, the unit torchtitan compiles (fewer, larger regions:
    each compiled call costs a fixed overhead). A piece that repeats alone stays a block."""
    sigs = [_signature(gm, p) for p in pieces]
    out: list[list[fx.Node]] = []
    i = 0
    while i < len(pieces):
        best = None
        for period in range(2, MAX_PERIOD + 1):
            unit = sigs[i:i + period]
            if len(unit) < period or len(set(unit)) == 1:
                continue
            reps = 1
            while sigs[i + reps * period:i + (reps + 1) * period] == unit:
                reps += 1
            if reps >= 2 and (best is None or period * reps > best[0] * best[1]):
                best = (period, reps)
        if best is None:
            out.append(pieces[i])
            i += 1
            continue
        period, reps = best
        for r in range(reps):
            out.append([n for p in pieces[i + r * period:i + (r + 1) * period] for n in p])
        i += period * reps
    return out


def plan_regions(gm: fx.GraphModule, mode: str, spec_nodes: Iterable[dict] = ()) -> list[tuple[str, list[fx.Node]]]:
    """(name, nodes) of each region to compile, in graph order; nodes consecutive."""
    compute = _compute_nodes(gm)
    if not compute:
        return []
    if mode == "whole":
        return [(WHOLE, compute)]
    if mode != "blocks":
        raise ValueError(f"training.compile is {mode!r}: choose one of {', '.join(MODES)}")
    blocks = spec_blocks(spec_nodes)
    if any(blocks.values()):
        # runs of consecutive nodes of one block; nodes of no block are cut as below
        out: list[tuple[str, list[fx.Node]]] = []
        free: list[fx.Node] = []
        last = None
        for n in compute:
            b = blocks.get(n.name)
            if b is None:
                free.append(n)
                last = None
                continue
            if free:
                out.extend(_named(_segments_of(gm, free)))
                free = []
            if b == last:
                out[-1][1].append(n)
            else:
                out.append((b, [n]))
            last = b
        if free:
            out.extend(_named(_segments_of(gm, free)))
        return out
    return _named(narrow_segments(gm))


def _segments_of(gm: fx.GraphModule, nodes: list[fx.Node]) -> list[list[fx.Node]]:
    keep = set(nodes)
    return [[n for n in seg if n in keep] for seg in narrow_segments(gm) if any(n in keep for n in seg)]


def _named(segments: list[list[fx.Node]]) -> list[tuple[str, list[fx.Node]]]:
    return [(seg[0].name if len(seg) == 1 else f"{seg[0].name}..{seg[-1].name}", seg) for seg in segments]


# ----- a region: its eager module, its compiled one, and the fallback --------------------
class CompiledRegion:
    """What the flat graph calls in place of a region's nodes (a call_function target, so
    the region's layers stay registered under their node ids alone)."""

    __module__ = __name__

    def __init__(self, name: str, module: fx.GraphModule, backend, log: Log | None):
        self.name, self.eager, self.log = name, module, log
        self.__name__ = self.__qualname__ = "compiled_" + "".join(c if c.isalnum() else "_" for c in name)
        # inductor's default mode: no CUDA graphs (they would pin the inputs' memory and
        # need static shapes); dynamic=None: static shapes first, dynamic after a recompile
        self.compiled = torch.compile(module, backend=backend or BACKEND)
        self.failed: str | None = None  # why it runs eagerly
        self.recording: list | None = None  # warm_up's eager pass: the inputs it was given
        self.seconds = 0.0  # the warm-up's compile of this region (forward and backward)

    def __call__(self, *args):
        if self.recording is not None:
            self.recording.append(args)
            return self.eager(*args)
        if self.failed is None and torch.is_grad_enabled():
            try:
                return self.compiled(*args)
            except Exception as exc:
                if not _compile_error(exc):  # the model's own error (raised eagerly too): not ours to hide
                    raise
                self.fall_back(exc)  # a recompile (new shapes) that fails: this region goes eager
        return self.eager(*args)

    def fall_back(self, exc: BaseException) -> None:
        self.failed = reason_of(exc)
        if self.log:
            self.log(f"compile: block {self.name} runs eagerly: {self.failed}")

    def __repr__(self) -> str:
        return f"CompiledRegion({self.name!r}{', eager: ' + self.failed if self.failed else ''})"


def _compile_error(exc: BaseException) -> bool:
    """An error of torch.compile itself (dynamo, a backend), not of the computation."""
    try:
        from torch._dynamo.exc import TorchDynamoException
    except ImportError:  # (a torch without it: take every error for one)
        return True
    return isinstance(exc, TorchDynamoException)


def reason_of(exc: BaseException) -> str:
    """The error in one line: its type and its message's first non-empty line (dynamo's
    and inductor's run to pages)."""
    inner = exc
    while getattr(inner, "inner_exception", None) is not None:  # BackendCompilerFailed wraps the backend's
        inner = inner.inner_exception
    lines = [ln.strip() for ln in str(inner).splitlines() if ln.strip()]
    text = f"{type(inner).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 3] + "..."


def _outline(gm: fx.GraphModule, name: str, nodes: list[fx.Node], backend, log: Log | None) -> CompiledRegion:
    """Replaces `nodes` (consecutive) of gm's graph by one call of a CompiledRegion."""
    inside = set(nodes)
    inputs: list[fx.Node] = []
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in inside and a not in inputs:
                inputs.append(a)
    outputs = [n for n in nodes if any(u not in inside for u in n.users)]
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {a: g.placeholder(a.name) for a in inputs}
    for n in nodes:
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(env[outputs[0]] if len(outputs) == 1 else tuple(env[o] for o in outputs))
    sub = fx.GraphModule(gm, g, class_name="LayerflowRegion")  # holds gm's very layer modules
    region = CompiledRegion(name, sub, backend, log)
    with gm.graph.inserting_before(nodes[0]):
        call = gm.graph.call_function(region, tuple(inputs))
    if len(outputs) == 1:
        outputs[0].replace_all_uses_with(call, delete_user_cb=lambda u: u not in inside)
    else:
        with gm.graph.inserting_after(call):
            for i, o in reversed(list(enumerate(outputs))):
                gi = gm.graph.call_function(operator.getitem, (call, i))
                o.replace_all_uses_with(gi, delete_user_cb=lambda u, gi=gi: u not in inside and u is not gi)
    for n in reversed(nodes):
        gm.graph.erase_node(n)
    return region


def compile_module(mod: nn.Module, mode: str, log: Log | None = print, *, spec_nodes: Iterable[dict] = (),
                   backend=None) -> nn.Module:
    """`mod` compiled as training.compile says, in place (its parameter names and
    state_dict unchanged); returns it. A GraphModule (the diagram's model, or a pipeline
    stage) is compiled by regions; another module, whole with nn.Module.compile.
    `spec_nodes`: the run spec's model nodes, where blocks are named; `backend`: torch.compile's
    (inductor by default; tests pass one that fails)."""
    if mode in (None, "off"):
        return mod
    if mode not in MODES:
        raise ValueError(f"training.compile is {mode!r}: choose one of {', '.join(MODES)}")
    if not isinstance(mod, fx.GraphModule):
        mod.compile(backend=backend or BACKEND)
        if log:
            log(f"compile {mode}: {type(mod).__name__} is not the diagram's graph: compiled whole")
        return mod
    regions = [_outline(mod, name, nodes, backend, log) for name, nodes in plan_regions(mod, mode, spec_nodes)]
    mod.graph.lint()
    mod.recompile()
    mod._layerflow_compile = (mode, regions)  # (warm_up and the tests find them here)
    return mod


def compiled_regions(mod: nn.Module) -> list[CompiledRegion]:
    """The regions of every module under `mod` that compile_module compiled."""
    out: list[CompiledRegion] = []
    for m in mod.modules():
        out.extend(getattr(m, "_layerflow_compile", (None, []))[1])
    return out


# ----- the first compile, before the clock starts -----------------------------------------
def _fresh(v):
    """A recorded input as a new leaf with the same requires_grad (what dynamo guards on)."""
    if isinstance(v, torch.Tensor):
        return v.detach().clone().requires_grad_(v.requires_grad and v.is_floating_point())
    if isinstance(v, (tuple, list)):
        return type(v)(_fresh(x) for x in v)
    return v


def _tensors(v) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (tuple, list)):
        return [t for x in v for t in _tensors(x)]
    if isinstance(v, dict):
        return [t for x in v.values() for t in _tensors(x)]
    return []


def warm_up(model: nn.Module, run_forward: Callable[[], object], context: Callable[[], contextlib.AbstractContextManager]
            = contextlib.nullcontext, log: Log | None = print) -> dict | None:
    """Compiles every region of `model` now: an eager pass of `run_forward` (the model on a
    batch of the step's shapes) records each region's inputs, then each region runs
    compiled, forward and backward, in `context` (the step's autocast). A region that fails
    falls back to eager (one log line). Afterwards buffers, random streams and gradients
    are as they were. Returns the metrics record {"event": "compiled", ...}, or None when
    nothing is compiled."""
    regions = compiled_regions(model)
    if not regions:
        return None
    mode = next(m._layerflow_compile[0] for m in model.modules() if hasattr(m, "_layerflow_compile"))
    t0 = time.perf_counter()
    with left_as_it_was([model]):
        if not _compile_regions(regions, run_forward, context, mode, log):
            return None
    return _compiled_record(regions, mode, time.perf_counter() - t0, log)


def _compile_regions(regions, run_forward, context, mode: str, log) -> bool:
    """The recording pass, then each region compiled on its first recorded call; False when
    the recording pass fails (the regions then compile at the first step)."""
    try:
        for r in regions:
            r.recording = []
        try:
            with torch.enable_grad(), context():
                run_forward()
        except Exception as exc:  # noqa: BLE001  (the model refuses a batch of zeros: compile at the first step)
            if log:
                log(f"compile {mode}: the warm-up on a batch of zeros failed ({reason_of(exc)}): "
                    f"the blocks compile at the first step (its time counts as step time)")
            return False
        recorded = {id(r): r.recording for r in regions}
        for r in regions:
            r.recording = None
        for r in regions:
            calls = recorded[id(r)]
            if not calls or r.failed:
                continue
            t = time.perf_counter()
            try:
                with torch.enable_grad(), context():
                    out = r.compiled(*_fresh(calls[0]))
                    outs = [o for o in _tensors(out) if o.requires_grad]
                if outs:
                    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            except Exception as exc:  # noqa: BLE001  (whatever stops a block compiling makes it eager)
                r.fall_back(exc)
            r.seconds = time.perf_counter() - t
        return True
    finally:
        for r in regions:
            r.recording = None


def _compiled_record(regions, mode: str, seconds: float, log) -> dict:
    """The metrics record of a compile, and its log line."""
    failed = [r for r in regions if r.failed]
    rec = {"event": "compiled", "mode": mode, "seconds": round(seconds, 3), "blocks": len(regions)}
    if failed:
        rec["eager_blocks"] = [r.name for r in failed]
    if log:
        slowest = max(regions, key=lambda r: r.seconds)
        what = "the model" if mode == "whole" else f"{len(regions)} blocks"
        more = f" (slowest: {slowest.name} {slowest.seconds:.2f} s)" if mode != "whole" and len(regions) > 1 else ""
        fell = f"; {len(failed)} run eagerly" if failed else ""
        log(f"compile {mode}: {what} compiled in {seconds:.2f} s{more}{fell}; not counted as step time")
    return rec


def zeros_like_inputs(spec_model: dict, batch: int, device) -> dict[str, torch.Tensor]:
    """A batch of zeros of the model's inputs (the spec's Input nodes: shape, dtype), for
    the warm-up: compiling reads shapes and dtypes, never values (token ids 0 are valid)."""
    out = {}
    for n in spec_model["nodes"]:
        if n.get("type") == "Input":
            p = n.get("params", {})
            out[n["id"]] = torch.zeros((batch, *p.get("shape", ())), dtype=getattr(torch, p.get("dtype", "float32")),
                                       device=device)
    return out
