"""Range Batch Normalization (Banner, Hubara, Hoffer, Soudry: "Scalable Methods for 8-bit Training of
Neural Networks", NeurIPS 2018, Sec. 4, Eq. 4-5).

Batch norm divides by the standard deviation, a sum of squares that is fragile in low precision.
Range BN divides by a scaled range instead:

    x_hat = (x - mu) / (C(n) * range(x - mu)),      C(n) = 1 / sqrt(2 ln n)

with ``n`` the number of values per channel (N * H * W).  For Gaussian data the largest deviation from
the mean is about ``sigma * sqrt(2 ln n)``, so ``C(n) * range`` estimates ``sigma`` when ``range`` is the
half spread ``(max(x - mu) - min(x - mu)) / 2`` — the convention used here (the authors' reference code
multiplies the full spread by ~0.54 / sqrt(2 ln n), the same factor 1/2 up to a finite-n correction).
For n between 10^3 and 10^5 the estimate is 0.85-0.9 sigma, so outputs are ~10-15 % larger than
BatchNorm's (tested within 20 %); the affine weight absorbs the constant.

:class:`RangeBatchNorm2d` is a drop-in ``nn.BatchNorm2d`` (same parameters, buffers and state_dict keys):
in training it normalises by the range estimate and keeps ``running_var`` as the running mean of its
square, so eval mode is plain affine normalisation by the running statistics.  The normalisation
itself is float32 (only the GEMMs around it are integer).
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["RangeBatchNorm2d", "range_scale", "use_range_bn_"]


def range_scale(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel ``(mean, C(n) * (max - min) / 2)`` of an NCHW tensor (differentiable)."""
    n = x.numel() // x.shape[1]
    if n < 2:
        raise ValueError(f"Range BN needs more than 1 value per channel in training, got input shape {tuple(x.shape)}")
    mean = x.mean((0, 2, 3))
    xc = x - mean.view(1, -1, 1, 1)
    spread = xc.amax((0, 2, 3)) - xc.amin((0, 2, 3))
    return mean, spread * (0.5 / math.sqrt(2.0 * math.log(n)))


class RangeBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` normalising by ``C(n) * range`` instead of the standard deviation (see module doc)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        use_batch = self.training or not self.track_running_stats or self.running_mean is None
        if use_batch:
            mean, scale = range_scale(x.float())
            if self.training and self.track_running_stats and self.running_mean is not None:
                with torch.no_grad():
                    self.num_batches_tracked.add_(1)
                    m = (1.0 / float(self.num_batches_tracked)) if self.momentum is None else self.momentum
                    self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), m)
                    self.running_var.lerp_((scale.detach() ** 2).to(self.running_var.dtype), m)
            denom = torch.sqrt(scale * scale + self.eps)
        else:
            mean, denom = self.running_mean, torch.sqrt(self.running_var + self.eps)
        y = (x.float() - mean.view(1, -1, 1, 1)) / denom.view(1, -1, 1, 1)
        if self.affine:
            y = y * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)
        return y.to(x.dtype)


def use_range_bn_(model: nn.Module) -> nn.Module:
    """Switch every exact ``nn.BatchNorm2d`` of ``model`` to :class:`RangeBatchNorm2d`, in place (no copy)."""
    for module in model.modules():
        if type(module) is nn.BatchNorm2d:
            module.__class__ = RangeBatchNorm2d
    return model
