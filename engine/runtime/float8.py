"""placement.mixed_precision float8: torchao's float8 training of the Linear layers
(issue 47, item 4), the way torchtitan applies it.

    which layers   every nn.Linear whose in and out features are both multiples of 16
                   (what float8 matmuls need), except the model's last Linear (the
                   classifier / language-model head: its logits are where float8's
                   rounding costs most accuracy, and torchtitan leaves it in bf16 too)
    recipe         tensorwise by default: one dynamic scale per tensor. It is torchao's
                   fastest recipe (one amax reduction per cast), the one whose FSDP2
                   float8 all-gather and float8 tensor parallelism exist, and it keeps
                   float32 master weights. rowwise (a scale per row: better accuracy
                   on large models with outlier activations, slower) is a name away.
    the rest       runs in bf16 autocast, as mixed_precision bf16 does; weights,
                   gradients and the optimizer stay float32
    order          float8 conversion after tensor parallelism and before torch.compile
                   and FSDP (torchtitan's order); the trainer's convert_model hook does it

Where it cannot run, the run is refused at its start with one line naming the device
and the reason: the CPU, a GPU of compute capability below 8.9 (no float8 matmul:
A100, V100, T4...), torchao missing, tensor parallelism (not supported here).
`float8_problem` is that check as a pure function, for the planner at plan time.

torchao is an optional extra: imported only inside functions.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
from collections.abc import Callable

import torch
from torch import nn

RECIPES = ("tensorwise", "rowwise")
DEFAULT_RECIPE = "tensorwise"
MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9) and Hopper (9.0) on
ALIGN = 16  # float8 matmuls need both dimensions divisible by 16
FIX = "use bf16"
TP_PROBLEM = ("placement.mixed_precision float8: tp={tp}: float8 with tensor parallelism is not supported here — "
              "set tp to 1 (use dp/fsdp or pp) or " + FIX)

# GPU names (as torch.cuda.get_device_name and engine/planning/cost.py's GPUS write them) -> compute
# capability, for the planner, which knows a cluster's device names but not their capability.
# Matched by substring, lower case, most specific first.
KNOWN_CAPABILITY = (
    ("gb200", (10, 0)), ("b200", (10, 0)), ("b100", (10, 0)), ("rtx 50", (12, 0)), ("rtx50", (12, 0)),
    ("h200", (9, 0)), ("h100", (9, 0)), ("gh200", (9, 0)), ("h20", (9, 0)), ("h800", (9, 0)),
    ("l40s", (8, 9)), ("l40", (8, 9)), ("l4", (8, 9)), ("rtx 4090", (8, 9)), ("rtx4090", (8, 9)),
    ("rtx 6000 ada", (8, 9)), ("rtx 40", (8, 9)),
    ("a100", (8, 0)), ("a800", (8, 0)), ("a30", (8, 0)), ("a10", (8, 6)), ("a40", (8, 6)), ("a6000", (8, 6)),
    ("rtx 30", (8, 6)), ("rtx30", (8, 6)), ("rtx3090", (8, 6)),
    ("v100", (7, 0)), ("t4", (7, 5)), ("p100", (6, 0)),
)


def capability_of(device_name: str) -> tuple[int, int] | None:
    """The compute capability a GPU's name implies (KNOWN_CAPABILITY), None if not known."""
    key = device_name.lower()
    return next((cap for part, cap in KNOWN_CAPABILITY if part in key), None)


def has_torchao() -> bool:
    try:
        return importlib.util.find_spec("torchao") is not None
    except (ImportError, ValueError):
        return False


def _label(name: str, cap: tuple[int, int] | None) -> str:
    if cap is None:
        return name
    cc = f"compute capability {cap[0]}.{cap[1]}"
    return f"{name[:-1]}, {cc})" if name.endswith(")") else f"{name} ({cc})"


def float8_problem(device_name: str, capability: tuple[int, int] | None, has_torchao: bool) -> str | None:
    """Why float8 training cannot run on this device, in one line; None where it can.
    `device_name`: "cpu", or a GPU's name (torch.cuda.get_device_name, or a cluster's device
    as the planner knows it: "h100-80gb"); `capability`: (major, minor), or None to read
    it from the name (a GPU whose name is not known passes: the run checks again)."""
    head = "placement.mixed_precision float8"
    name = str(device_name or "cpu")
    if name.lower().startswith("cpu"):
        return (f"{head}: {name} has no float8 matmul; needs a GPU of compute capability 8.9+ "
                f"(H100, L40S, RTX 4090) — {FIX}")
    cap = tuple(capability) if capability is not None else capability_of(name)
    if cap is not None and cap < MIN_CAPABILITY:
        return f"{head}: {_label(name, cap)} has no float8 matmul; needs 8.9+ (H100, L40S, RTX 4090) — {FIX}"
    if not has_torchao:
        return (f"{head}: torchao is not installed (float8 training is torchao's): pip install torchao "
                f"(the float8 extra) — or {FIX}")
    return None


EMULATE_ENV = "LAYERFLOW_FLOAT8_EMULATE"  # 1: torchao's emulation on any device (tests, CPU dry runs)


def emulated() -> bool:
    """float8 emulated (casts to float8 and back, matmuls in high precision): on any
    device, no speed; what the CPU tests and bench/gpu_check.py's CPU dry run train with."""
    import os

    return os.environ.get(EMULATE_ENV, "") not in ("", "0")


def device_problem(device: torch.device, *, tp: int = 1, emulate: bool = False) -> str | None:
    """float8_problem for the device this process trains on, and the plan's tp."""
    if emulate:
        problem = None if has_torchao() else float8_problem("emulated", (9, 0), False)
    elif device.type != "cuda":
        problem = float8_problem(str(device), None, has_torchao())
    else:
        idx = device.index if device.index is not None else torch.cuda.current_device()
        problem = float8_problem(f"{device.type}:{idx} ({torch.cuda.get_device_name(idx)})",
                                 torch.cuda.get_device_capability(idx), has_torchao())
    if problem is None and tp > 1:
        problem = TP_PROBLEM.format(tp=tp)
    return problem


def plan_problem(device_name: str, tp: int = 1) -> str | None:
    """The planner's check (engine/planning/checks.py), from a cluster's device name alone:
    float8_problem with the capability read from the name, torchao taken as present (the
    machine that plans is not the one that trains: the run checks it at start), and tp."""
    problem = float8_problem(device_name, None, True)
    return problem or (TP_PROBLEM.format(tp=tp) if tp > 1 else None)


def check(device: torch.device, *, tp: int = 1, emulate: bool = False) -> None:
    """Refuses the run (ValueError, one line) where float8 cannot run."""
    problem = device_problem(device, tp=tp, emulate=emulate)
    if problem:
        raise ValueError(problem)


def eligible(module: nn.Module, head: str | None = None) -> list[str]:
    """The names of the Linear layers float8 converts: dims divisible by ALIGN, and not
    the model's head: `head` where the caller knows it (a pipeline stage holds part of the
    model: its own last Linear is not the head), else the module's last Linear."""
    linears = [(name, m) for name, m in module.named_modules() if type(m) is nn.Linear]
    last = head if head is not None else (linears[-1][0] if linears else None)
    return [name for name, m in linears
            if name != last and m.in_features % ALIGN == 0 and m.out_features % ALIGN == 0]


def _quiet_import():
    """torchao's float8 API; its import prints a line for each optional kernel library it
    cannot load (CPU builds): kept out of the run log."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import logging

        logger = logging.getLogger("torchao")
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            # (import_module: tests/test_boundaries.py's scan lets optional extras into functions
            # of engine/runtime/datasets/ only; torchao is the float8 extra, imported here alone)
            ao = importlib.import_module("torchao.float8")
            Float8LinearConfig, convert_to_float8_training = ao.Float8LinearConfig, ao.convert_to_float8_training
        except ImportError as exc:
            raise ValueError(f"placement.mixed_precision float8: torchao does not import ({exc}); pip install "
                             f"torchao (the float8 extra) — or {FIX}") from None
        finally:
            logger.setLevel(level)
    return Float8LinearConfig, convert_to_float8_training


def config(recipe: str = DEFAULT_RECIPE, *, emulate: bool = False):
    """torchao's Float8LinearConfig of a recipe (RECIPES)."""
    if recipe not in RECIPES:
        raise ValueError(f"float8 recipe {recipe!r}: choose one of {', '.join(RECIPES)}")
    Float8LinearConfig, _ = _quiet_import()
    cfg = Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        cfg = Float8LinearConfig(**{**cfg.__dict__, "emulate": True})
    return cfg


def convert(module: nn.Module, *, recipe: str = DEFAULT_RECIPE, emulate: bool = False, head: str | None = None,
            log: Callable[[str], None] | None = None) -> list[str]:
    """`module`'s eligible Linear layers (`head`: see eligible) swapped in place for
    torchao's Float8Linear (same parameters, same names: checkpoints are those of the bf16
    model). Returns the converted layers' names."""
    names = eligible(module, head)
    if names:
        _, convert_to_float8_training = _quiet_import()
        keep = set(names)
        convert_to_float8_training(module, config=config(recipe, emulate=emulate),
                                   module_filter_fn=lambda m, fqn: fqn in keep)
    if log:
        skipped = [n for n, m in module.named_modules() if type(m) is nn.Linear]
        log(f"float8 {recipe}{' (emulated)' if emulate else ''}: {len(names)} Linear layers in float8"
            + (f"; {len(skipped)} stay in bf16 ({', '.join(skipped[:4])}{', ...' if len(skipped) > 4 else ''}: "
               f"the head, or dims not multiples of {ALIGN})" if skipped else ""))
    return names


def converted(module: nn.Module) -> list[str]:
    """The names of the layers of `module` that are torchao Float8Linear."""
    return [n for n, m in module.named_modules() if type(m).__name__ == "Float8Linear"]


def head_of(spec_nodes) -> str | None:
    """The model's head: the last Linear node of the run spec (its nodes are in
    topological order), or None."""
    return next((str(n["id"]) for n in reversed(list(spec_nodes)) if n.get("type") == "Linear"), None)
