"""Synchronized BatchNorm for data-parallel training on CPU (gloo) as well as GPU.

``torch.nn.SyncBatchNorm`` refuses CPU tensors (its kernels ``batch_norm_stats`` & co. exist only
for GPUs, and DDP rejects SyncBatchNorm layers in CPU modules). :class:`CPUSyncBatchNorm` is a
BatchNorm (same parameters, buffers and state_dict keys as ``nn.BatchNorm*d``, so checkpoints load
with or without it) whose training-mode forward computes the batch statistics over all ranks with
two differentiable all-reduces (sum, then the sum of squared deviations: the two-pass variance, no
cancellation).  On GPUs :func:`convert_sync_batchnorm_` uses PyTorch's own
``torch.nn.SyncBatchNorm.convert_sync_batchnorm``.  The backward all-reduces the gradients of those sums, which is what
PyTorch's SyncBatchNorm does (``sum_dy``, ``sum_dy_xmu``): normalization, gradients and running
statistics equal those of one process on the global batch, up to float rounding.

:func:`convert_sync_batchnorm_` converts plain ``nn.BatchNorm1d/2d/3d`` layers only. Subclasses with
their own arithmetic (inttrain's :class:`~inttrain.nn.range_bn.RangeBatchNorm2d`,
:class:`~inttrain.nn.quant_bn.QuantBatchNorm2d`) have no synchronized version: converting them with
``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` would silently replace their arithmetic by plain
float BatchNorm, so they raise :class:`ValueError` instead.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["CPUSyncBatchNorm", "convert_sync_batchnorm_", "unsyncable_norms"]

_PLAIN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class _AllReduceSum(torch.autograd.Function):
    """Sum over ranks; the backward sums the incoming gradients over ranks too."""

    @staticmethod
    def forward(ctx, t: Tensor, group) -> Tensor:  # type: ignore[override]
        ctx.group = group
        out = t.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        g = grad.clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class CPUSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm (any ``N, C, ...`` input) with statistics over all ranks (see module doc); equal counts per rank."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group=None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: Tensor) -> Tensor:
        need_sync = self.training and dist.is_available() and dist.is_initialized()
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        if not need_sync or dist.get_world_size(group) == 1:
            return super().forward(input)  # eval or one process: plain BatchNorm
        self._check_input_dim(input)
        momentum = self.momentum
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if momentum is None:
                momentum = 1.0 / float(self.num_batches_tracked)
        x = input.float()
        dims = [d for d in range(x.dim()) if d != 1]
        world = dist.get_world_size(group)
        count = x.numel() // x.shape[1] * world  # every rank holds an equal shard of the global batch
        shape = [1, -1] + [1] * (x.dim() - 2)
        mean = _AllReduceSum.apply(x.sum(dims), group) / count
        xmu = x - mean.view(shape)
        var = _AllReduceSum.apply((xmu * xmu).sum(dims), group) / count
        y = xmu * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:
            with torch.no_grad():
                unbiased = var.detach() * (count / max(count - 1, 1))
                self.running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)
        return y.to(input.dtype)


def unsyncable_norms(model: nn.Module) -> list[tuple[str, str]]:
    """(name, class) of BatchNorm subclasses with their own arithmetic (no synchronized version)."""
    return [(name, type(m).__name__) for name, m in model.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and type(m) not in _PLAIN
            and not isinstance(m, (nn.SyncBatchNorm, CPUSyncBatchNorm))]


def convert_sync_batchnorm_(model: nn.Module, process_group=None) -> int:
    """Replace ``model``'s plain BatchNorm layers by :class:`CPUSyncBatchNorm` in place; returns how many.

    The new layers share the old parameters and buffers (an optimizer built before keeps working).
    Raises ValueError if the model has BatchNorm subclasses with their own arithmetic (Range BN,
    8-bit BN): their statistics cannot be synchronized.
    """
    bad = unsyncable_norms(model)
    if bad:
        names = ", ".join(f"{n or '(model)'} ({c})" for n, c in bad)
        raise ValueError(f"sync BatchNorm: {names} cannot be synchronized across ranks (only plain "
                         f"nn.BatchNorm1d/2d/3d can); train without sync BN (per-rank statistics)")
    if isinstance(model, _PLAIN):
        raise ValueError("convert_sync_batchnorm_ converts the layers inside a model, not a bare BatchNorm")
    if any(p.device.type != "cpu" for p in model.parameters()):  # GPU: PyTorch's SyncBatchNorm, in place
        before = sum(isinstance(m, nn.SyncBatchNorm) for m in model.modules())
        for name, child in list(model.named_children()):
            setattr(model, name, nn.SyncBatchNorm.convert_sync_batchnorm(child, process_group))
        return sum(isinstance(m, nn.SyncBatchNorm) for m in model.modules()) - before
    converted = 0
    for name, child in list(model.named_children()):
        if type(child) in _PLAIN:
            new = CPUSyncBatchNorm(child.num_features, child.eps, child.momentum, child.affine,
                                   child.track_running_stats, process_group)
            if child.affine:
                new.weight, new.bias = child.weight, child.bias  # the same Parameters
            if child.track_running_stats:
                new.running_mean, new.running_var = child.running_mean, child.running_var
                new.num_batches_tracked = child.num_batches_tracked
            new.train(child.training)
            setattr(model, name, new)
            converted += 1
        else:
            converted += convert_sync_batchnorm_(child, process_group)
    return converted
