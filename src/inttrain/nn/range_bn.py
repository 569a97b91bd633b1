"""Range Batch Normalization (Banner, Hubara, Hoffer, Soudry: "Scalable Methods for 8-bit Training of
Neural Networks", NeurIPS 2018, Sec. 4, Eq. 4-5).

Batch norm divides by the standard deviation, a sum of squares that is fragile in low precision.
Range BN divides by a scaled range instead:

    x_hat = (x - mu) / (C(m) * range(x)),      C(m) = c / sqrt(2 ln m)

For Gaussian data the largest deviation from the mean is about ``sigma * sqrt(2 ln m)`` (m values), so
``C(m) * range`` estimates ``sigma``.  As in the authors' reference implementation, ``range`` is taken over
**chunks** of the batch and averaged: the batch is cut into ``k`` groups of whole samples (``k`` = gcd(batch,
``num_chunks``), ``num_chunks`` 16 by default, as there; fewer if a chunk would hold a single value), each
chunk's spread ``max - min`` per channel is measured over its ``m = (batch / k) * H * W`` values, and ``range`` is the mean of the k spreads; ``c`` is that
implementation's finite-size factor ``0.35 (1 + sqrt(pi ln 4)) / 2 ~ 0.540`` on the full spread.  The chunks
matter for the backward pass: a maximum's gradient reaches one value only, so with one chunk the whole
channel's scale gradient lands on its two extreme values -- a spike that set the scale of the 8-bit output
gradient and zeroed the rest of it (input-gradient GEMM SQNR 14 dB in a ResNet-20 probe,
``benchmarks/probe_recipes.py``); with 16 chunks it is shared by 32 values at 1/16 the size each.

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


#: The authors' reference implementation's factor on the full spread (a finite-size correction of 1/2).
SPREAD_FACTOR = 0.35 * (1.0 + math.sqrt(math.pi * math.log(4.0))) / 2.0
#: Chunks of the batch over which the range is measured and averaged (the reference implementation's 16).
NUM_CHUNKS = 16


def _chunk_count(batch: int, per_sample: int, num_chunks: int) -> int:
    """The largest common divisor of ``batch`` and ``num_chunks`` whose chunks hold >= 2 values per channel (else 1).
    Plain integer loops rather than ``math.gcd``: Dynamo traces them even on a symbolic batch size, where a
    ``math.gcd`` call is a graph break (seen in this project's dynamic-shape fusion helpers)."""
    for k in range(min(batch, num_chunks), 1, -1):
        if batch % k == 0 and num_chunks % k == 0 and (batch // k) * per_sample >= 2:
            return k
    return 1


def range_scale(x: torch.Tensor, num_chunks: int = NUM_CHUNKS) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel ``(mean, C(m) * range)`` of an NCHW tensor (differentiable): ``range`` is the mean over
    ``k`` chunks of whole samples of each chunk's ``max - min`` (``k`` = gcd(batch, num_chunks), or its largest
    divisor that leaves a chunk 2 values per channel), ``m`` the values per channel in one chunk and
    ``C(m) = SPREAD_FACTOR / sqrt(2 ln m)`` (see the module doc)."""
    if not isinstance(num_chunks, int) or isinstance(num_chunks, bool) or num_chunks < 1:
        raise ValueError(f"Range BN num_chunks must be a positive integer, got {num_chunks!r}")
    n = x.numel() // x.shape[1]
    k = _chunk_count(x.shape[0], x.shape[2] * x.shape[3], num_chunks)   # an empty batch: k = 1, refused below
    m = n // k
    if m < 2:
        raise ValueError(f"Range BN needs more than 1 value per channel in training, got input shape {tuple(x.shape)}")
    mean = x.mean((0, 2, 3))
    chunks = x.unflatten(0, (k, x.shape[0] // k))                 # (k, batch / k, C, H, W): a view
    spread = (chunks.amax((1, 3, 4)) - chunks.amin((1, 3, 4))).mean(0)
    return mean, spread * (SPREAD_FACTOR / math.sqrt(2.0 * math.log(m)))


class RangeBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` normalising by ``C(m) * range`` instead of the standard deviation (see module doc);
    ``num_chunks``: the range's chunks (an instance attribute may override the class's 16)."""

    num_chunks: int = NUM_CHUNKS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        use_batch = self.training or not self.track_running_stats or self.running_mean is None
        if use_batch:
            mean, scale = range_scale(x.float(), self.num_chunks)
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
