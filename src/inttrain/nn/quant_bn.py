"""8-bit quantized batch normalization for the ``wageubn`` recipe (Yang et al., Neural Networks 2020).

WAGEUBN ("W, A, G, E, U and BN in 8 bits") quantizes the batch-norm layer too.  :class:`QuantBatchNorm2d`
is a drop-in ``nn.BatchNorm2d`` (same parameters, buffers and state_dict keys) whose

- normalized activation ``x_hat = (x - mu) / sqrt(var + eps)`` is quantized to ``bits`` (8) bits,
- affine parameters ``gamma`` and ``beta`` are quantized to ``bits`` bits (the float parameters stay the
  master copies that the optimizer updates; ``WageubnSGD`` keeps them on a 24-bit grid),
- output ``y = q(x_hat) * q(gamma) + q(beta)`` is quantized to ``bits`` bits (``quantize_output=True``),

each with one power-of-two scale per tensor (``s = 2^ceil(log2(amax / 127))``: a shift, as in the paper's
shift-based quantization) and round-to-nearest, with a straight-through estimator in backward (the
gradient of every rounding is the identity; the rest of BN's backward is the exact float one).

What is *not* integer here: the statistics ``mu`` and ``var`` (and the running averages) are computed in
float32, and the normalization/affine arithmetic itself runs in float32 on the quantized values (they are
simulated, not executed on integer kernels).  The paper also quantizes the statistics (to 8/16 bits, as
far as we recall — unverified); that part is not reproduced.
"""

from __future__ import annotations

import torch
from torch import nn

from ..numerics.hashing import uniform_from_counter
from ..spec import IntFormat, ScaleKind
from ..numerics.quantize import scale_from_amax

__all__ = ["pow2_quantize", "pow2_fake_quant", "QuantBatchNorm2d", "use_quant_bn_"]


def pow2_quantize(x: torch.Tensor, bits: int, stochastic: bool = False, seed: int = 0):
    """Per-tensor symmetric quantization with a power-of-two scale: ``(codes, scale)`` as float32.

    ``scale = 2^ceil(log2(max|x| / qmax))`` (1 when ``x`` is all zeros), ``codes = clamp(round(x / scale),
    -qmax, qmax)`` with ``qmax = 2^(bits-1) - 1``; ``stochastic`` rounds with ``floor(v + u)``, ``u ~ U[0, 1)``
    drawn from inttrain's counter hash (``seed``).  ``bits`` up to 24 stay exact in float32.
    """
    if not 2 <= bits <= 24:
        raise ValueError(f"pow2_quantize bits={bits}: allowed 2 to 24 (exact in float32)")
    x = x.detach().float()
    qmax = float((1 << (bits - 1)) - 1)
    amax = x.abs().amax() if x.numel() else torch.zeros(())
    if bits <= 16:
        scale = scale_from_amax(amax, IntFormat(bits), ScaleKind.POW2)
    else:  # IntFormat stops at 16 bits; same formula
        s = torch.exp2(torch.ceil(torch.log2(amax / qmax)))
        scale = torch.where(amax == 0, torch.ones_like(s), s)
    v = x / scale
    r = torch.floor(v + uniform_from_counter(v.shape, seed, v.device)) if stochastic else torch.round(v)
    return r.clamp(-qmax, qmax), scale


def pow2_fake_quant(x: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """``codes * scale`` of :func:`pow2_quantize` (round to nearest) with a straight-through gradient."""
    codes, scale = pow2_quantize(x, bits)
    return x + (codes * scale - x).detach()


class QuantBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` with 8-bit (power-of-two scaled) normalized output, affine parameters and output."""

    bits: int = 8
    quantize_output: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        use_batch = self.training or not self.track_running_stats or self.running_mean is None
        xf = x.float()
        if use_batch:
            mean = xf.mean((0, 2, 3))
            var = xf.var((0, 2, 3), unbiased=False)
            if self.training and self.track_running_stats and self.running_mean is not None:
                n = xf.numel() // xf.shape[1]
                with torch.no_grad():
                    self.num_batches_tracked.add_(1)
                    m = (1.0 / float(self.num_batches_tracked)) if self.momentum is None else self.momentum
                    self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), m)
                    unbiased = var.detach() * (n / max(n - 1, 1))
                    self.running_var.lerp_(unbiased.to(self.running_var.dtype), m)
        else:
            mean, var = self.running_mean, self.running_var
        x_hat = (xf - mean.view(1, -1, 1, 1)) / torch.sqrt(var + self.eps).view(1, -1, 1, 1)
        y = pow2_fake_quant(x_hat, self.bits)
        if self.affine:
            gamma, beta = pow2_fake_quant(self.weight, self.bits), pow2_fake_quant(self.bias, self.bits)
            y = y * gamma.view(1, -1, 1, 1) + beta.view(1, -1, 1, 1)
        if self.quantize_output:
            y = pow2_fake_quant(y, self.bits)
        return y.to(x.dtype)


def use_quant_bn_(model: nn.Module, bits: int = 8) -> nn.Module:
    """Switch every exact ``nn.BatchNorm2d`` of ``model`` to a ``bits``-bit :class:`QuantBatchNorm2d`, in place
    (no copy)."""
    if not isinstance(bits, int) or isinstance(bits, bool) or not 2 <= bits <= 24:
        raise ValueError(f"QuantBatchNorm2d bits={bits!r}: allowed 2 to 24 (exact in float32)")
    for module in model.modules():
        if type(module) is nn.BatchNorm2d:
            module.__class__ = QuantBatchNorm2d
            module.bits = bits
    return model
