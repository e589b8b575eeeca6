"""What a training step is made of, as plain functions: the optimizer and the lr schedule
of the run spec's settings, the loss, accuracy counts, peak memory, the random streams.

Both trainers (trainer.py, parallel_trainer.py) use them, and the exported script
(engine/interop/script_export.py) copies the source of several (seed_all, lr_lambda,
make_optimizer, compute_loss, correct_count), so each stands alone: no helper of this
module, no name beyond torch, numpy and the standard library (not even in an annotation:
the script is linted), and the settings taken as spec.py's types or as their JSON (the
script's OPTIMIZER and SCHEDULE dicts).
"""
from __future__ import annotations

import contextlib
import math
import random
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F


def lr_lambda(schedule, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the base lr at scheduler step s (0-based): linear warm-up, then
    constant, cosine (down to min_lr_ratio at the last step) or step decay. `schedule`:
    a spec.ScheduleSpec, or its JSON (missing fields take ScheduleSpec's defaults)."""
    get = schedule.get if isinstance(schedule, dict) else lambda key, default: getattr(schedule, key)
    name, warm = get("name", "constant"), int(get("warmup_steps", 0))
    min_ratio = float(get("min_lr_ratio", 0.0))
    step_size, gamma = int(get("step_size", 100)), float(get("gamma", 0.5))

    def f(s: int) -> float:
        if warm and s < warm:
            return (s + 1) / warm
        if name == "cosine":
            progress = min(1.0, (s - warm) / max(1, total_steps - warm))
            return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        if name == "step":
            return gamma ** ((s - warm) // step_size)
        return 1.0

    return f


def make_optimizer(params, optimizer) -> torch.optim.Optimizer:
    """SGD, Adam or AdamW as `optimizer` (a spec.OptimizerSpec, or its JSON) says."""
    get = optimizer.get if isinstance(optimizer, dict) else lambda key, default: getattr(optimizer, key)
    name, lr, wd = get("name", "adam"), float(get("lr", 1e-3)), float(get("weight_decay", 0.0))
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=float(get("momentum", 0.0)), weight_decay=wd)
    betas = tuple(get("betas", (0.9, 0.999)))
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=wd)
    return torch.optim.Adam(params, lr=lr, betas=betas, weight_decay=wd)


def compute_loss(kind: str, out: torch.Tensor, y: torch.Tensor, options=None) -> torch.Tensor:
    """The Output node's loss: cross_entropy (per sample, or per token of (B, T, C) logits:
    a language model's shifted targets), bce (multi-label: logits against 0/1 targets),
    mse. `options` (the run spec's loss_options): label_smoothing, ignore_index.

    In float32 whatever the model computed in (torchtitan's way): FSDP's bf16 policy hands
    bf16 outputs straight here (no autocast there to lift the loss), and a bf16 loss, or MSE
    and BCE targets cast down to bf16 (8 bits of mantissa), lose what the loss is about."""
    opts = options or {}
    if out.is_floating_point() and out.dtype in (torch.float16, torch.bfloat16):
        out = out.float()
    if kind == "cross_entropy":
        ls, ignore = float(opts.get("label_smoothing", 0.0)), int(opts.get("ignore_index", -100))
        if out.dim() > 2:  # per-token logits (B, T, C) against targets (B, T)
            return F.cross_entropy(out.flatten(0, -2), y.flatten(), ignore_index=ignore, label_smoothing=ls)
        return F.cross_entropy(out, y, ignore_index=ignore, label_smoothing=ls)
    if kind == "bce":
        return F.binary_cross_entropy_with_logits(out, y.reshape(out.shape).to(out.dtype))
    if kind == "mse":
        return F.mse_loss(out, y.reshape(out.shape).to(out.dtype))
    raise ValueError(f"the Output node's loss is '{kind}': choose cross_entropy, bce or mse to train")


def correct_count(out: torch.Tensor, y: torch.Tensor) -> int:
    pred = out.argmax(dim=-1)
    return int((pred.reshape(y.shape) == y).sum())


def eval_sums(kind: str, out: torch.Tensor, y: torch.Tensor, options=None) -> list[float]:
    """One validation batch as sums that add over batches and ranks: [loss x its weight,
    the weight (targets counted: tokens not ignored, or samples), right (top-1), right in
    the top 5, scored (what right is out of: targets, or labels for bce)]."""
    with torch.no_grad():
        loss = float(compute_loss(kind, out, y, options))
        if kind == "cross_entropy":
            logits = out.reshape(-1, out.shape[-1])
            target = y.reshape(-1)
            keep = target != int((options or {}).get("ignore_index", -100))
            logits, target = logits[keep], target[keep]
            n = int(target.numel())
            right = int((logits.argmax(-1) == target).sum())
            top5 = right
            if logits.shape[-1] > 5:
                top5 = int((logits.topk(5, dim=-1).indices == target[:, None]).any(-1).sum())
            return [loss * n if n else 0.0, n, right, top5, n]  # (all ignored: the loss is nan)
        n = int(out.shape[0])
        if kind == "bce":
            labels = y.reshape(out.shape)
            right = int(((out > 0) == (labels > 0.5)).sum())
            return [loss * n, n, right, 0, int(labels.numel())]
        return [loss * n, n, 0, 0, 0]


def eval_record(kind: str, sums, n_classes=None, language_model: bool = False) -> dict:
    """val_loss (per target); val_acc (top-1: per sample, per token, or per label for
    bce); val_top5 when there are more than 5 classes; val_ppl for a language model."""
    loss_sum, weight, right, top5, scored = (float(v) for v in sums)
    rec = {"val_loss": loss_sum / max(weight, 1.0)}
    if kind in ("cross_entropy", "bce"):
        rec["val_acc"] = right / max(scored, 1.0)
    if kind == "cross_entropy" and (n_classes or 0) > 5:
        rec["val_top5"] = top5 / max(scored, 1.0)
    if kind == "cross_entropy" and language_model:
        rec["val_ppl"] = math.exp(min(rec["val_loss"], 700.0))
    return rec


def peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    except (ImportError, OSError):
        return 0.0


def reset_peak_mem(device: torch.device) -> None:
    """The device's peak counter starts again from what is allocated now (a GPU's; the CPU's
    ru_maxrss cannot be reset): each metrics record then says its own steps' peak, not one
    that includes compiling, a checkpoint's load or the pipeline's shape inference."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


@contextlib.contextmanager
def left_as_it_was(modules):
    """A run of the modules that must leave no trace (a warm-up, a first call that learns
    shapes): their buffers (BatchNorm's running statistics), torch's CPU and CUDA random
    streams and their gradients are as they were afterwards, whether the block ends or raises."""
    buffers = [(b, b.detach().clone()) for m in modules for b in m.buffers()]
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        for m in modules:
            m.zero_grad(set_to_none=True)


def set_matmul_precision(device) -> None:
    """A GPU's float32 matmuls (and convolutions) on TF32 tensor cores: torch's default,
    "highest", leaves them on the CUDA cores, about 1/8 of an H100's TF32 rate (the planner
    prices float32 at the TF32 rate: engine/planning/cost.py). TF32 keeps float32's range
    with a 10-bit mantissa in the products; accumulation stays float32 (torchtitan and
    nanoGPT set the same). Called where the runtime picks its device; the CPU's matmuls
    stay exact float32 (what the CPU tests compare)."""
    if torch.device(device).type == "cuda":
        torch.set_float32_matmul_precision("high")


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
