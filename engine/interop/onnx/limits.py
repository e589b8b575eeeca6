"""What reading an ONNX file may cost, checked before the cost is paid.

A file is read only if it is a regular file (never a FIFO, a device, or a link to one)
of at most the input size limit, and parsed from those bytes alone (weights in external
files only from regular files inside its own folder). Before anything is built, the
graph is checked as declared: its node count, every size it declares (inputs for a
sample batch, initializers, constants, the shapes ONNX's inference gives each value)
against a memory budget, every tensor holds the data its shape says, every value read
is made somewhere and nothing depends on itself, and inputs are numbers. While it is
built and traced, the sizes an operator asks for (a ConstantOfShape, an Expand) are
checked before they are allocated, and the whole import runs against a clock. Each
refusal is one line naming the file and the node, value or field, and the limit.

Limits (environment variables raise them): LAYERFLOW_MAX_INPUT_MB (the file's size, as
for data files), LAYERFLOW_IMPORT_MEMORY_MB (the memory budget; half this machine's
memory by default), LAYERFLOW_MAX_ONNX_NODES (10,000), LAYERFLOW_IMPORT_TIMEOUT_S (240).
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import stat
import time
from pathlib import Path

from engine.interop.common import InteropError

PROTOBUF_LIMIT = 2 ** 31 - 1  # bytes protobuf parses in one message; bigger models keep weights outside
DEFAULT_MAX_INPUT_MB = 16_384  # as engine.project's data files
DEFAULT_MAX_NODES = 10_000
DEFAULT_TIMEOUT_S = 240.0
SAMPLE_BATCH = 3  # engine.interop.module.importer.SAMPLE_BATCH: the batch an import runs with
STANDARD_DOMAINS = ("", "ai.onnx")
_FLOAT_TYPES = {1: "FLOAT", 10: "FLOAT16", 11: "DOUBLE", 16: "BFLOAT16"}
_INT_TYPES = {2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64", 9: "BOOL", 12: "UINT32",
              13: "UINT64"}


class LimitError(InteropError):
    """A file that would cost more than a limit allows (memory, nodes, time): raised at
    once, not gathered with the operators that cannot be read."""

    stops_the_import = True  # (common.best_effort lets it through)


def _env_number(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


def memory_budget() -> int:
    """Bytes an import may hold at once: LAYERFLOW_IMPORT_MEMORY_MB, else half of this
    machine's memory."""
    if "LAYERFLOW_IMPORT_MEMORY_MB" in os.environ:
        return int(_env_number("LAYERFLOW_IMPORT_MEMORY_MB", 4096) * 2 ** 20)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 8 * 2 ** 30


def _gb(n: float) -> str:
    return f"{n / 2 ** 30:,.1f} GB" if n >= 2 ** 30 else f"{n / 2 ** 20:,.1f} MB"


def budget_hint() -> str:
    how = "set by LAYERFLOW_IMPORT_MEMORY_MB" if "LAYERFLOW_IMPORT_MEMORY_MB" in os.environ else \
        "half this machine's memory; LAYERFLOW_IMPORT_MEMORY_MB raises it"
    return f"the import's memory budget of {_gb(memory_budget())} ({how})"


def check_bytes(nbytes: float, what: str) -> None:
    """Refuse `what` when it would take more than the memory budget."""
    if nbytes > memory_budget():
        raise LimitError(f"{what} would take {_gb(nbytes)}, more than {budget_hint()}")


# ----- the clock ----------------------------------------------------------------------
_DEADLINE: contextvars.ContextVar[tuple[float, float, str] | None] = contextvars.ContextVar("deadline", default=None)


@contextlib.contextmanager
def deadline(source: str):
    """Bound the import of `source` in time (LAYERFLOW_IMPORT_TIMEOUT_S); check_time raises past it."""
    limit = _env_number("LAYERFLOW_IMPORT_TIMEOUT_S", DEFAULT_TIMEOUT_S)
    token = _DEADLINE.set((time.monotonic(), limit, source))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def check_time(where: str) -> None:
    """Raise InteropError when the running import is past its time (a no-op outside one)."""
    d = _DEADLINE.get()
    if d is None:
        return
    start, limit, source = d
    if time.monotonic() - start > limit:
        raise LimitError(f"{source}: the import took more than {limit:,.0f} s (stopped while {where}); "
                           "import a smaller model, or raise LAYERFLOW_IMPORT_TIMEOUT_S")


# ----- the file -----------------------------------------------------------------------
def _read_regular(path: Path, most: int, what: str, offset: int = 0, length: int | None = None) -> bytes:
    """The bytes of a regular file (a FIFO or device is never opened for reading, and a
    file swapped for one after the check is refused too), at most `most` of them."""
    try:
        text = os.fspath(path)
        if "\0" in text:
            raise InteropError(f"{text!r}: the path holds a NUL byte (\\0), which no file name may hold")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InteropError(f"{path}: no such file") from None
    except OSError as exc:
        from engine.files import os_error_text

        raise InteropError(f"{path}: cannot read {what}: {os_error_text(exc)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO, device or socket"
            raise InteropError(f"{path}: {what} is {kind}, not a regular file; only regular files are read")
        size = (st.st_size - offset) if length is None else length
        if offset < 0 or size < 0 or offset + size > st.st_size:
            raise InteropError(f"{path}: {what} asks for bytes {offset}..{offset + size} of a file of {st.st_size}")
        if size > most:
            raise InteropError(f"{path}: {what} is {_gb(size)}, more than the limit of {_gb(most)}"
                               + (" (raise it with the environment variable LAYERFLOW_MAX_INPUT_MB)"
                                  if most < PROTOBUF_LIMIT else " (what one ONNX message may hold)"))
        chunks, left = [], size
        os.lseek(fd, offset, os.SEEK_SET)
        while left > 0:
            b = os.read(fd, min(left, 1 << 24))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    except OSError as exc:
        raise InteropError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_model(path: Path):
    """The ModelProto of an ONNX file, read within the limits above (weights stored in
    external files included)."""
    import onnx

    most = min(PROTOBUF_LIMIT, int(_env_number("LAYERFLOW_MAX_INPUT_MB", DEFAULT_MAX_INPUT_MB) * 2 ** 20))
    data = _read_regular(path, most, "the file")
    try:
        model = onnx.load_model_from_string(data)
    except RecursionError:
        raise InteropError(f"{path}: not an ONNX model (values nested too deeply to read)") from None
    except Exception as exc:  # protobuf decode errors have many types
        raise InteropError(f"{path}: not an ONNX model ({type(exc).__name__}: {str(exc)[:200]})") from None
    del data
    _external_data(path, model)
    return model


def _tensors(model):
    """Every tensor the file stores: initializers and constants of nodes (subgraphs too)."""
    def walk(graph):
        yield from ((t, f"initializer '{t.name}'") for t in graph.initializer)
        for node in graph.node:
            label = node.name or (node.output[0] if node.output else node.op_type)
            for a in node.attribute:
                if a.HasField("t"):
                    yield a.t, f"node '{label}' ({node.op_type}) attribute '{a.name}'"
                for t in a.tensors:
                    yield t, f"node '{label}' ({node.op_type}) attribute '{a.name}'"
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    yield from walk(g)
    yield from walk(model.graph)


def _external_data(path: Path, model) -> None:
    """Weights kept in files beside the model: read from regular files in its folder only,
    each at most what the memory budget allows, the total too."""
    from onnx import TensorProto

    folder = Path(os.path.realpath(path.parent))
    total = 0
    for t, what in _tensors(model):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        target = Path(os.path.realpath(folder / loc)) if loc and "\0" not in loc else None
        if target is None or os.path.isabs(loc) or folder not in target.parents:
            raise InteropError(f"{path}: {what} keeps its data in {loc!r}, which is not a file inside the model's "
                               "folder; only files beside the model are read")
        try:
            offset, length = int(info.get("offset", 0)), (int(info["length"]) if "length" in info else None)
        except ValueError:
            raise InteropError(f"{path}: {what}: its external data's offset or length is not a number") from None
        data = _read_regular(target, max(0, memory_budget() - total), f"the data of {what} ({loc})", offset, length)
        total += len(data)
        t.raw_data = data
        del t.external_data[:]
        t.data_location = TensorProto.DEFAULT


# ----- the graph as declared ------------------------------------------------------------
def _numel(dims) -> int:
    return math.prod(int(d) for d in dims)


def _itemsize(elem: int) -> int:
    import numpy as np
    from onnx import helper

    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem)).itemsize
    except (KeyError, TypeError, ValueError):
        return 8


def _type_name(elem: int) -> str:
    from onnx import TensorProto

    try:
        return TensorProto.DataType.Name(elem)
    except ValueError:
        return f"type {elem}"


def check_tensor(source: str, t, what: str) -> int:
    """A stored tensor is numbers, its declared size fits the budget, and it holds the
    data its shape says; returns its bytes."""
    from onnx import TensorProto

    if t.data_type not in _FLOAT_TYPES and t.data_type not in _INT_TYPES:
        raise InteropError(f"{source}: {what} holds {_type_name(t.data_type)} values; Layerflow reads tensors of "
                           "numbers (float, integer or bool)")
    if any(d < 0 for d in t.dims):
        raise InteropError(f"{source}: {what} declares shape {list(t.dims)} with a negative size")
    n = _numel(t.dims)
    nbytes = n * _itemsize(t.data_type)
    check_bytes(nbytes, f"{source}: {what} of shape {list(t.dims)}")
    if t.data_location == TensorProto.EXTERNAL:
        return nbytes  # read by read_model; a model built in memory keeps its own
    if t.raw_data:
        have, want, unit = len(t.raw_data), nbytes, "bytes"
    else:
        have = max(len(f) for f in (t.float_data, t.int32_data, t.int64_data, t.double_data, t.uint64_data))
        want, unit = n, "values"
    if have != want:
        raise InteropError(f"{source}: {what} declares shape {list(t.dims)} ({want:,} {unit}) but holds "
                           f"{'no data' if have == 0 else f'{have:,} {unit}'}")
    return nbytes


def _dims(vi) -> list:
    """Declared sizes of a value (None where unknown or symbolic)."""
    tt = vi.type.tensor_type
    return [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]


def check_graph(source: str, model) -> None:
    """Everything that can be known before anything is built (see the module docstring).
    Puts the nodes in an order where every value is made before it is read."""
    g = model.graph
    most = int(_env_number("LAYERFLOW_MAX_ONNX_NODES", DEFAULT_MAX_NODES))
    if len(g.node) > most:
        raise InteropError(f"{source}: {len(g.node):,} nodes, more than the limit of {most:,} for an import "
                           "(raise it with LAYERFLOW_MAX_ONNX_NODES; a model this size takes minutes to read)")
    _check_opsets(source, model)
    total = sum(check_tensor(source, t, what) for t, what in _tensors(model))
    check_bytes(total, f"{source}: its weights and constants together")
    if g.sparse_initializer:
        raise InteropError(f"{source}: sparse initializer '{g.sparse_initializer[0].values.name}': "
                           "Layerflow reads dense tensors only")
    _sort_nodes(source, g)


def _check_opsets(source: str, model) -> None:
    import onnx

    known = onnx.defs.onnx_opset_version()
    standard = [o for o in model.opset_import if o.domain in STANDARD_DOMAINS]
    if not standard:
        declared = ", ".join(repr(o.domain) for o in model.opset_import) or "none"
        raise InteropError(f"{source}: declares no version of ONNX's standard operators (opset_import: {declared}); "
                           "Layerflow reads the standard domain ('' / ai.onnx) only")
    version = standard[0].version
    if not 1 <= version <= known:
        raise InteropError(f"{source}: declares opset {version} of the standard domain; this reader knows "
                           f"opsets 1 to {known}")
    # (a node of another domain is named with the other operators that cannot be read: OnnxModule)


def _sort_nodes(source: str, g) -> None:
    """Nodes in an order where each value is made before it is read; a value read but
    made nowhere, or a cycle, is refused naming the node."""
    made = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    maker = {}
    for node in g.node:
        for o in node.output:
            if o:
                maker[o] = node
    for node in g.node:
        for i in node.input:
            if i not in made and i not in maker:
                label = node.name or (node.output[0] if node.output else node.op_type)
                raise InteropError(f"{source}: node '{label}' ({node.op_type}) reads '{i}', which no node, input or "
                                   "initializer makes (a dangling input)")
    for o in g.output:
        if o.name not in made and o.name not in maker:
            raise InteropError(f"{source}: graph output '{o.name}' is made by no node")
    known = set(made)
    for node in g.node:
        if any(i not in known for i in node.input):
            break
        known.update(node.output)
    else:
        return  # already in order (as ONNX asks): keep the file's order
    import heapq

    needs, waiting = {}, {}
    for k, node in enumerate(g.node):
        missing = {i for i in node.input if i not in made}
        needs[k] = len(missing)
        for i in missing:
            waiting.setdefault(i, []).append(k)
    heap = [k for k, n in needs.items() if n == 0]  # by position in the file: the order stays close to it
    heapq.heapify(heap)
    order, seen = [], set(made)
    while heap:
        k = heapq.heappop(heap)
        order.append(k)
        for o in g.node[k].output:
            if o and o not in seen:
                seen.add(o)
                for j in waiting.get(o, ()):
                    needs[j] -= 1
                    if needs[j] == 0:
                        heapq.heappush(heap, j)
    if len(order) < len(g.node):
        raise InteropError(f"{source}: the graph has a cycle: {_ring(g, needs, seen)}")
    nodes = [g.node[k] for k in order]
    copies = [type(n)() for n in nodes]
    for c, n in zip(copies, nodes):
        c.CopyFrom(n)
    del g.node[:]
    g.node.extend(copies)


def _ring(g, needs: dict, seen: set) -> str:
    """One cycle among the nodes that never got their inputs, as 'node reads value from node ...'."""
    stuck = {k for k, n in needs.items() if n > 0}
    maker = {o: k for k in stuck for o in g.node[k].output if o}
    k, path, pos = min(stuck), [], {}
    while k not in pos:
        pos[k] = len(path)
        value = next(i for i in g.node[k].input if i not in seen and i in maker)
        path.append((k, value))
        k = maker[value]
    ring = path[pos[k]:]

    def label(j: int) -> str:
        node = g.node[j]
        return f"'{node.name or (node.output[0] if node.output else node.op_type)}' ({node.op_type})"
    text = f"node {label(ring[0][0])} reads '{ring[0][1]}'"
    for j, v in ring[1:6]:
        text += f" from node {label(j)}, which reads '{v}'"
    more = f" ... ({len(ring) - 6} more nodes)" if len(ring) > 6 else ""
    return f"{text}{more} from node {label(ring[0][0])}; an ONNX graph must flow one way"


def check_values(source: str, model) -> None:
    """Every size declared or inferred for a value, for a batch of SAMPLE_BATCH, within the budget."""
    g = model.graph
    maker = {o: n for n in g.node for o in n.output}
    for vi in (*g.input, *g.value_info, *g.output):
        if not vi.type.HasField("tensor_type"):
            continue
        dims = _dims(vi)
        if not dims or any(d is None for d in dims[1:]):
            continue
        shape = [SAMPLE_BATCH if d is None or d in (0, 1) else d for d in dims[:1]] + dims[1:]
        nbytes = _numel(shape) * _itemsize(vi.type.tensor_type.elem_type)
        node = maker.get(vi.name)
        where = f"node '{node.name or vi.name}' ({node.op_type}) output" if node is not None else "input"
        check_bytes(nbytes, f"{source}: {where} '{vi.name}' of shape {dims} (batch {SAMPLE_BATCH})")


def input_types(source: str, model, names: list[str]) -> None:
    """Inputs are tensors of numbers (a string or a sequence input is refused by name)."""
    vis = {vi.name: vi for vi in model.graph.input}
    for name in names:
        t = vis[name].type
        if not t.HasField("tensor_type"):
            raise InteropError(f"{source}: input '{name}' is a {t.WhichOneof('value') or 'value'} of no tensor type; "
                               "Layerflow's inputs are tensors of numbers")
        elem = t.tensor_type.elem_type
        if elem not in _FLOAT_TYPES and elem not in _INT_TYPES:
            raise InteropError(f"{source}: input '{name}' holds {_type_name(elem)} values; Layerflow's inputs are "
                               "tensors of numbers (float or integer)")


# ----- while the module is built and run ------------------------------------------------
def _shape_of(v) -> tuple:
    if hasattr(v, "shape") and not isinstance(v, (int, float)):
        return tuple(int(s) for s in v.shape)
    if isinstance(v, (list, tuple)):
        return (len(v),)
    return ()


def _ints(v) -> list[int]:
    if hasattr(v, "reshape"):
        return [int(x) for x in v.reshape(-1).tolist()]
    if isinstance(v, (list, tuple)):
        return [int(x) for x in v]
    return [int(v)]


def _broadcast(*shapes) -> tuple:
    out: list[int] = []
    for s in shapes:
        s = list(s)
        if len(s) > len(out):
            out = [1] * (len(s) - len(out)) + out
        s = [1] * (len(out) - len(s)) + s
        out = [max(a, b) for a, b in zip(out, s)]  # (an upper bound: the operator checks the rest)
    return tuple(out)


_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Sum", "Max", "Min"}


def fold_numel(node, ins: list, a: dict) -> int | None:
    """Values a constant-folded ONNX node would make, from its inputs' sizes alone (for
    the operators that can make more than they read); None for the others."""
    op = node.op_type
    shapes = [_shape_of(v) for v in ins if v is not None]
    if op == "ConstantOfShape":
        return _numel(max(0, d) for d in _ints(ins[0]))
    if op == "Expand":
        return _numel(_broadcast(shapes[0], [max(0, d) for d in _ints(ins[1])]))
    if op == "Range":
        s, e, d = (float(_ints(v)[0]) if not isinstance(v, float) else v for v in ins[:3])
        return max(0, math.ceil((e - s) / d)) if d else 0
    if op == "Pad":
        pads = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else list(a.get("pads", []))
        nd = len(shapes[0])
        return _numel(max(0, shapes[0][i] + pads[i] + pads[i + nd]) for i in range(nd)) if len(pads) == 2 * nd \
            else None
    if op in _ELEMENTWISE:
        return _numel(_broadcast(*shapes))
    if op in ("MatMul", "Gemm") and len(shapes) >= 2 and len(shapes[0]) >= 2 and len(shapes[1]) >= 2:
        (n, m) = (shapes[0][-2], shapes[1][-1])
        if op == "Gemm":
            n = shapes[0][-1] if a.get("transA", 0) else shapes[0][-2]
            m = shapes[1][-2] if a.get("transB", 0) else shapes[1][-1]
        return _numel(_broadcast(shapes[0][:-2], shapes[1][:-2])) * n * m
    if op == "Concat":
        return sum(_numel(s) for s in shapes)
    if op == "Gather" and len(shapes) == 2:
        axis = a.get("axis", 0) % max(1, len(shapes[0]))
        return _numel(shapes[1]) * _numel(s for i, s in enumerate(shapes[0]) if i != axis)
    return None


def check_fold(source: str, node, ins: list, a: dict) -> None:
    """Refuse a constant-folded node whose result would not fit the memory budget."""
    try:
        n = fold_numel(node, ins, a)
    except (TypeError, ValueError, IndexError, ZeroDivisionError, OverflowError):
        return  # the operator itself will say what is wrong with its inputs
    if n is not None:
        label = node.name or (node.output[0] if node.output else node.op_type)
        check_bytes(n * 8, f"{source}: node '{label}' ({node.op_type}), a constant of {n:,} values,")


class Measure:
    """What a traced run of the module holds: each node's outputs, and all of them, are
    checked against the budget as they are made (on fake tensors: nothing is allocated)."""

    def __init__(self, source: str):
        self.source, self.total, self.budget = source, 0, memory_budget()

    def step(self, node, outs) -> None:
        check_time(f"running node '{node.name or node.op_type}'")
        for o, v in zip(node.output, outs if isinstance(outs, tuple) else (outs,)):
            nbytes = v.numel() * v.element_size() if hasattr(v, "element_size") else 0
            label = node.name or (node.output[0] if node.output else node.op_type)
            check_bytes(nbytes, f"{self.source}: node '{label}' ({node.op_type}) output '{o}' of shape "
                                f"{list(v.shape) if nbytes else []} (batch {SAMPLE_BATCH})")
            self.total += nbytes
        check_bytes(self.total, f"{self.source}: the values its nodes make for a batch of {SAMPLE_BATCH}, together,")


def dry_run(module, shapes: list[list[int]], dtypes: list[str]) -> None:
    """Run the module once on fake tensors (shapes only, no memory) with a Measure, so a
    node that would exhaust memory is refused by name before the real run; a module the
    fake run cannot take is left to the real one."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)  # an operator the fake run cannot take is no error of the user's
    module._measure = Measure(module.source)
    try:  # (no fallback kernels: an operator without a meta kernel would run for real, allocating)
        with FakeTensorMode(allow_non_fake_inputs=True, allow_fallback_kernels=False), torch.no_grad():
            xs = [torch.empty((SAMPLE_BATCH, *s), dtype=getattr(torch, d)) for s, d in zip(shapes, dtypes)]
            module(*xs)
    except InteropError:
        raise
    except Exception:  # noqa: BLE001 - value-dependent code (an .item()) the fake run cannot take
        pass
    finally:
        module._measure = None
        log.setLevel(level)
