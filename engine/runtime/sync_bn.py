"""BatchNorm with statistics over the whole data-parallel batch, on every device.

torch's nn.SyncBatchNorm runs on GPUs (cuda, xpu, hpu, a PrivateUse1 backend) and
refuses CPU tensors; there this module's SyncBatchNormCPU takes its place. Its
training forward all-reduces, over the data-parallel group, first each channel's
sum and count (the global mean), then the sum of squared deviations from that mean
(the global biased variance): two passes, as torch's CPU kernel does, so the
statistics equal one process's over the global batch up to summation order. The
all-reduces are torch's functional collectives, which are autograd-aware (the
backward of a sum all-reduce is a sum all-reduce of the gradients), so the
backward carries every replica's share of the gradient through the statistics,
which is what one process computes. Local batches may differ in size: the count
is all-reduced too. Running statistics are updated exactly as nn.BatchNorm*d does;
eval mode is plain batch norm with them. Replacement keeps the submodule names and
the parameter and buffer objects, so state_dict keys and checkpoints are unchanged.
"""
from __future__ import annotations

import torch
from torch import nn
import torch.distributed._functional_collectives as funcol
from torch.nn.modules.batchnorm import _BatchNorm

# the device types torch's own SyncBatchNorm accepts
TORCH_SYNC_BN_DEVICES = ("cuda", "xpu", "hpu", torch._C._get_privateuse1_backend_name())


class SyncBatchNormCPU(_BatchNorm):
    """BatchNorm{1,2,3}d whose training statistics come from the whole process group."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group=None, bias: bool = True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, bias=bias)
        self.process_group = process_group

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and torch.distributed.is_initialized()):
            return super().forward(x)  # eval: the running statistics (or this batch's, if none are kept)
        self._check_input_dim(x)
        dims = [0, *range(2, x.dim())]
        shape = [1, -1] + [1] * (x.dim() - 2)
        # float64 sums: the count is exact and the mean as good as one process's
        count = torch.full((1,), x.numel() // max(x.size(1), 1), dtype=torch.float64, device=x.device)
        group = self.process_group or torch.distributed.group.WORLD
        total = funcol.all_reduce(torch.cat([x.sum(dims, dtype=torch.float64), count]), "sum", group)
        n = int(total[-1].item())
        if n <= 1:
            raise ValueError(f"BatchNorm needs more than 1 value per channel when training, but the data-parallel "
                             f"group's batch has {n}; raise training.batch_size")
        mean = total[:-1] / n
        acc = torch.promote_types(x.dtype, torch.float32)  # bf16/fp16 activations: deviations in float32
        dev = x.to(acc) - mean.to(acc).view(shape)
        var = funcol.all_reduce(dev.pow(2).sum(dims, dtype=torch.float64), "sum", group) / n  # biased: what normalizes
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            f = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            with torch.no_grad():  # torch keeps the unbiased variance
                self.running_mean.mul_(1 - f).add_(f * mean.to(self.running_mean.dtype))
                self.running_var.mul_(1 - f).add_(f * (var * n / (n - 1)).to(self.running_var.dtype))
        y = dev * torch.rsqrt(var.to(acc) + self.eps).view(shape)
        if self.weight is not None:
            y = y * self.weight.view(shape)
        if self.bias is not None:
            y = y + self.bias.view(shape)
        return y.to(x.dtype)


def _to_cpu_sync(module: nn.Module, group) -> nn.Module:
    """torch's convert_sync_batchnorm, building SyncBatchNormCPU: the same parameter
    and buffer objects under the same names, children replaced in place."""
    out = module
    if isinstance(module, _BatchNorm) and not isinstance(module, (nn.SyncBatchNorm, SyncBatchNormCPU)):
        out = SyncBatchNormCPU(module.num_features, module.eps, module.momentum, module.affine,
                               module.track_running_stats, group, bias=module.bias is not None)
        if module.affine:
            out.weight, out.bias = module.weight, module.bias
        out.running_mean, out.running_var = module.running_mean, module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.train(module.training)
    for name, child in module.named_children():
        out.add_module(name, _to_cpu_sync(child, group))
    return out


def convert_sync_batchnorm(module: nn.Module, group, device: torch.device | str) -> nn.Module:
    """Every BatchNorm in `module` computes its statistics over `group` (the data-parallel
    ranks): torch's SyncBatchNorm where torch runs it, SyncBatchNormCPU elsewhere."""
    if torch.device(device).type in TORCH_SYNC_BN_DEVICES:
        return nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group=group)
    return _to_cpu_sync(module, group)
