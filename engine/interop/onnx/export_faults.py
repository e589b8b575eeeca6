"""Why torch.onnx could not export a diagram, said of the diagram: the node and the
operator at fault, with torch's own reason, not only its first line ("Failed to
decompose the FX graph for ONNX compatibility ...").

torch.onnx runs the program through fx interpreters (decomposition, then translation);
the frame that was running a node when the error rose holds that fx node, whose
`nn_module_stack` ends at the diagram node's module (its path is the node id).
"""
from __future__ import annotations

import re

from torch import fx

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def fault(exc: BaseException, node_ids: set[str]) -> tuple[str | None, str | None]:
    """(diagram node id, ATen operator) of the fx node torch was running when `exc` rose."""
    for ex in _chain(exc):
        tb, found = ex.__traceback__, None
        while tb is not None:
            for name in ("n", "node", "fx_node"):
                v = tb.tb_frame.f_locals.get(name)
                if isinstance(v, fx.Node) and v.op == "call_function":
                    found = v  # the innermost frame running a node
            tb = tb.tb_next
        if found is not None:
            stack = found.meta.get("nn_module_stack") or {}
            paths = [p for p, _ in stack.values() if p]
            nid = next((p for p in reversed(paths) if p in node_ids), None)
            return nid, str(found.target)
    return None, None


def reason(exc: BaseException) -> str:
    """torch's reason in one line: the exception summary of a ConversionError, the first
    line of anything else."""
    text = _ANSI.sub("", str(exc))
    op = re.search(r"No ONNX function found for <OpOverload\(op='([^']+)'", text)
    if op:
        return f"the operator {op.group(1)} has no ONNX translation"
    m = re.search(r"## Exception summary\s*\n\s*\n?(.+)", text)
    if m:
        line = m.group(1).strip()
        return re.sub(r"^<class '(?:[\w.]+\.)?(\w+)'>:", r"\1:", line)
    return f"{type(exc).__name__}: {(text.strip().splitlines() or [''])[0]}"


def describe(exc: BaseException, spec: dict) -> str:
    """'node 'x' (Reshape), operator aten.view.default: ValueError: ...' for an export error."""
    types = {n["id"]: n["type"] for n in spec["nodes"]}
    nid, op = fault(exc, set(types))
    where = []
    if nid:
        where.append(f"node '{nid}' ({types[nid]})")
    if op:
        where.append(f"operator {op}")
    return (", ".join(where) + ": " if where else "") + reason(exc)
