"""``dorefa``: DoReFa-Net (Zhou et al. 2016, arXiv:1606.06160) — low-bit weights, activations and gradients.

The paper's three quantizers, all built on ``q_k(r) = round((2^k - 1) r) / (2^k - 1)`` for ``r in [0, 1]``
(Eq. 5), with the straight-through estimator (STE) for the rounding:

- weights (Eq. 9):      ``w_k = 2 q_k( tanh(w) / (2 max|tanh(w)|) + 1/2 ) - 1``   (``w_bits``)
- activations (Eq. 11): ``a_k = q_k( clip(x, 0, 1) )``                           (``a_bits``)
  (or, with ``activation_range="max"``, ``a_k = M q_k( clip(x, 0, M) / M )``, ``M = max(x)``: see below)
- gradients (Eq. 12):   ``dr_k = 2 max|dr| [ q_k( dr / (2 max|dr|) + 1/2 + N(k) ) - 1/2 ]``,
  ``N(k) = sigma / (2^k - 1)``, ``sigma ~ U(-1/2, 1/2)``                          (``g_bits``)

What runs on integer kernels: after these transforms every GEMM operand lies exactly on an integer grid,
and the GEMMs multiply those integer codes (int32 accumulation) and rescale once:

- ``w_k = m / (2^k - 1)`` with odd integers ``|m| <= 2^k - 1``: codes of a signed ``(w_bits + 1)``-bit
  format with the fixed range 1 (``QuantSpec.fixed_amax = 1``), so the integer code *is* ``m``;
- ``a_k = n / (2^k - 1)``, ``n in [0, 2^k - 1]``: signed ``(a_bits + 1)``-bit codes, fixed range 1, code ``n``
  (``activation_range="max"``: ``a_k = M n / (2^k - 1)``, the per-tensor amax scale ``M / (2^k - 1)``, code ``n``);
- ``dr_k = max|dr| * m / (2^k - 1)``: signed ``(g_bits + 1)``-bit codes with the per-tensor amax scale,
  which equals ``max|dr| / (2^k - 1)`` because the largest-magnitude element always keeps the extreme code
  (its noise is strictly inside ``(-1/2, 1/2)`` and it is clipped to the end of the range).

So the forward GEMM ``a_k W_k^T``, the input-gradient GEMM ``dr_k W_k`` and the weight-gradient GEMM
``dr_k^T a_k`` are exact integer products of the paper's quantized values.  The tanh/clip/normalise/noise
transforms themselves are float32 elementwise passes (as in the paper's own GPU implementation).

Differences from the paper:

- the signed GEMM formats spend one extra bit (``k + 1``) because the codes above are odd integers or
  non-negative; layers therefore accept ``k`` up to 15 (codes beyond 8 bits, e.g. the default k = 8,
  run exactly on int8 kernels via the int16 split, for Linear and Conv2d alike; at k = 8 a convolution's
  codes are ``j + 128`` or ``2 j + 1`` with int8 ``j``, so each of its three GEMMs is one int8 convolution plus
  two small exact corrections: ``kernels.conv_wide``);
- 1-bit weights (the paper's Eq. 7, ``sign(w) * E|w|``) and 1-bit activations are not offered: k >= 2;
- the gradient noise is drawn from inttrain's counter-based hash (reproducible), and ``q_k``'s argument is
  clipped to ``[0, 1]`` as in the authors' tensorpack code;
- the activation quantizer is applied to the *input* of every converted layer (so ``clip(x, 0, 1)``
  replaces whatever the previous nonlinearity left above 1); the paper's 1-bit-per-channel scaling and
  its float first/last layers are matched by ``first_last_float=True`` (the first and last converted
  Linear/Conv2d in module order stay float32, as in the paper's experiments);
- Eq. 12's maximum is taken over the whole gradient tensor, where the paper (and the authors' code) take one
  per sample: a per-sample scale lies on the reduced axis of the weight-gradient GEMM (``dr^T a`` sums over
  the batch), where it does not factor out of an integer product.  In float simulation (ResNet-20, 4000 CIFAR
  images, after 4 of 6 epochs) dropping gradient quantization altogether changed nothing measurable (training
  loss 1.849 against 1.843), so the per-tensor maximum is not where DoReFa's accuracy goes;
- ``activation_range="max"`` is inttrain's option, not the paper's: Eq. 11 needs inputs in [0, 1], which a
  ReLU network with batch norm and residual sums does not give (ResNet-20's convolution inputs reach far
  above 1).  The paper's clip then discards them and zeroes their gradients; "max" divides by the tensor's
  maximum first (as Eqs. 9 and 12 normalise weights and gradients by theirs) and multiplies it back after.
  Measured in float simulation (``benchmarks/short_ablation.py --group dorefa``: ResNet-20 on 4000 CIFAR
  images, 6 epochs, seed 0, the full-budget benchmark's SGD and OneCycle): training loss / held-out accuracy
  1.72 / 34.2% with the clip, 1.37 / 46.9% with "max", against fp32's 1.39 / 47.4% and 1.40 / 48.2% with the
  activation quantizer left out.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from ..kernels.fused import run_fused
from ..numerics.hashing import uniform_from_counter
from ..spec import GemmPrecision, LayerPrecision, PerTensor, QuantSpec, UnsupportedFormatError
from ..spec.capabilities import GEMM_BITS
from ..spec.formats import IntFormat
from .base import LayerHooks, RecipeConfig, first_last_filter

__all__ = ["ACTIVATION_RANGES", "DoReFaConfig", "quantize_k", "dorefa_weight", "dorefa_activation", "dorefa_gradient"]

# k-bit DoReFa codes need k + 1-bit signed GEMM codes (spec.capabilities.GEMM_BITS), for every layer kind.
MIN_K, MAX_K_LINEAR = GEMM_BITS[0], GEMM_BITS[1] - 1
MAX_K_CONV = MAX_K_LINEAR


def _ste_round(v: torch.Tensor) -> torch.Tensor:
    """``round(v)`` forward, identity gradient (straight-through estimator)."""
    return v + (torch.round(v) - v).detach()


def quantize_k(r: torch.Tensor, k: int) -> torch.Tensor:
    """Eq. 5: ``q_k(r) = round((2^k - 1) r) / (2^k - 1)`` for ``r`` in [0, 1] (STE gradient)."""
    n = float((1 << k) - 1)
    return _ste_round(r * n) / n


def dorefa_weight(w: torch.Tensor, k: int) -> torch.Tensor:
    """Eq. 9: ``2 q_k(tanh(w) / (2 max|tanh(w)|) + 1/2) - 1`` (differentiable through tanh and the max)."""
    t = torch.tanh(w)
    return 2.0 * quantize_k(t / (2.0 * t.abs().max().clamp_min(1e-12)) + 0.5, k) - 1.0


ACTIVATION_RANGES: tuple[str, ...] = ("clip", "max")


def dorefa_activation(x: torch.Tensor, k: int, activation_range: str = "clip") -> torch.Tensor:
    """Eq. 11 with the paper's bounded activation, ``q_k(clip(x, 0, 1))`` (``activation_range="clip"``), or on
    ``x`` divided by its maximum ``M`` and multiplied back, ``M q_k(clip(x, 0, M) / M)`` (``"max"``; ``M`` is a
    constant to autograd, so the STE gradient is 1 on ``[0, M]``)."""
    if activation_range == "clip":
        return quantize_k(x.clamp(0.0, 1.0), k)
    if activation_range != "max":
        raise ValueError(f"activation_range {activation_range!r}: allowed {', '.join(ACTIVATION_RANGES)}")
    m = x.detach().amax().clamp_min(torch.finfo(torch.float32).tiny)  # NaN stays NaN: the layer's guard names it
    return quantize_k(x.clamp_min(0.0) / m, k) * m


def dorefa_gradient(dr: torch.Tensor, k: int, seed: int | torch.Tensor = 0,
                    noise: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 12: ``2 max|dr| [q_k(clip(dr / (2 max|dr|) + 1/2 + N(k), 0, 1)) - 1/2]``, ``N(k) = sigma / (2^k - 1)``.

    ``noise`` (``sigma``, uniform in (-1/2, 1/2)) is drawn from ``seed`` unless given.
    """
    n = float((1 << k) - 1)
    m = dr.abs().amax()
    # Non-finite gradients pass through to the layer's NaN guard and zero stays zero: chosen with torch.where,
    # not a Python branch, so that a compiled backward reads no tensor into Python.
    usable = torch.isfinite(m) & (m > 0)
    m = torch.where(usable, m, torch.ones_like(m))
    if noise is None:  # strictly inside (-1/2, 1/2): the extreme element keeps its extreme code
        noise = uniform_from_counter(dr.shape, seed, dr.device) - 0.5 + 2.0**-25
    r = (dr / (2.0 * m) + 0.5 + noise / n).clamp(0.0, 1.0)
    return torch.where(usable, 2.0 * m * (torch.round(r * n) / n - 0.5), dr)


@dataclass(frozen=True)
class _Eq12Hook:
    """A layer's output-gradient transform: Eq. 12 at ``k`` bits (``None``: the gradient as it is).  A frozen
    dataclass, not a bound method, so that a compiled graph takes it as a constant of the layer's Function."""

    k: int | None

    def __call__(self, dy: torch.Tensor, seed: int | torch.Tensor) -> torch.Tensor:
        if self.k is None:
            return dy
        # One fused pass in place of ~12 eager ones (ResNet-20's 16x32x32 gradients: 61 -> 17 ms; the same bits);
        # the seed goes in as a tensor, so that a new seed does not recompile (compiling: traced into the graph).
        return run_fused(_gradient_pass, {"dr": dy, "seed": torch.as_tensor(seed, dtype=torch.int64)}, {"k": self.k})


def _gradient_pass(dr: torch.Tensor, seed: torch.Tensor, k: int) -> torch.Tensor:
    return dorefa_gradient(dr, k, seed)


class _DoReFaHooks(LayerHooks):
    def __init__(self, w_bits: int, a_bits: int, g_bits: int | None, activation_range: str):
        self.w_bits, self.a_bits, self.g_bits, self.activation_range = w_bits, a_bits, g_bits, activation_range
        self.grad_output = _Eq12Hook(g_bits)  # shadows LayerHooks.grad_output (see _Eq12Hook)

    def forward_operands(self, layer, x, weight):
        return dorefa_activation(x, self.a_bits, self.activation_range), dorefa_weight(weight, self.w_bits)


@dataclass(frozen=True)
class DoReFaConfig(RecipeConfig):
    """Config of the ``dorefa`` recipe.

    Args:
        w_bits, a_bits, g_bits: the paper's ``k`` for weights, activations and gradients (2..15 for
            Linear, 2..7 for Conv2d; see the module docstring for why); ``g_bits=None`` keeps gradients
            float32 (the dx and dW GEMMs then run in float, as in the paper's "32-bit gradient" rows).
        first_last_float: keep the first and last Linear/Conv2d of the model in float32 (paper Sec. 2.7).
        conv_bits: optionally fewer bits for Conv2d layers: they run ``min(k, conv_bits)`` for each of w/a/g
            (a warning says so). ``None`` (default): convolutions run the requested k, as Linear layers do.
        activation_range: ``"clip"`` (default, the paper): a layer's input is clipped to [0, 1] before Eq. 11;
            ``"max"``: it is divided by its per-tensor maximum first and multiplied back after (inttrain's
            option for networks whose activations are not bounded by 1; see the module docstring).
    """

    name = "dorefa"
    facts = ("Zhou et al. 2016, DoReFa-Net, arXiv:1606.06160",
             "the three GEMMs, on the paper's k-bit codes of weights, activations and gradients",
             "the tanh/clip/normalise/noise transforms (element-wise), master weights, first and last layer")
    w_bits: int = 8
    a_bits: int = 8
    g_bits: int | None = 8
    first_last_float: bool = True
    conv_bits: int | None = None
    activation_range: str = "clip"

    def __post_init__(self) -> None:
        if self.activation_range not in ACTIVATION_RANGES:
            raise UnsupportedFormatError(f"dorefa activation_range={self.activation_range!r}: allowed "
                                         f"{', '.join(ACTIVATION_RANGES)}")
        for field_name in ("w_bits", "a_bits", "g_bits"):
            v = getattr(self, field_name)
            if v is None and field_name == "g_bits":
                continue
            if not isinstance(v, int) or isinstance(v, bool) or not MIN_K <= v <= MAX_K_LINEAR:
                raise UnsupportedFormatError(
                    f"dorefa {field_name}={v!r}: allowed {MIN_K} to {MAX_K_LINEAR} bits for Linear and Conv2d layers,"
                    f" g_bits may also be None (float gradients)"
                )
        c = self.conv_bits
        if c is not None and (not isinstance(c, int) or isinstance(c, bool) or not MIN_K <= c <= MAX_K_CONV):
            raise UnsupportedFormatError(f"dorefa conv_bits={c!r}: allowed {MIN_K} to {MAX_K_CONV} or None (no clamping)")

    def with_bits(self, bits: int) -> DoReFaConfig:
        """DoReFa has no single width: ``bits`` sets the weight, activation and gradient k alike."""
        return dataclasses.replace(self, w_bits=bits, a_bits=bits, g_bits=bits)

    def layer_bits(self, module: nn.Module) -> tuple[int, int, int | None]:
        """(w, a, g) bits ``module`` runs: Conv2d layers clamped to ``conv_bits``."""
        if not isinstance(module, nn.Conv2d) or self.conv_bits is None:
            return self.w_bits, self.a_bits, self.g_bits
        c = self.conv_bits
        return min(self.w_bits, c), min(self.a_bits, c), None if self.g_bits is None else min(self.g_bits, c)

    def precision_for(self, module: nn.Module, fqn: str) -> LayerPrecision | None:
        w_bits, a_bits, g_bits = self.layer_bits(module)
        if (w_bits, a_bits, g_bits) != (self.w_bits, self.a_bits, self.g_bits):
            warnings.warn(f"dorefa: Conv2d layers run k = {w_bits}/{a_bits}/{g_bits} (w/a/g) instead of "
                          f"{self.w_bits}/{self.a_bits}/{self.g_bits} (conv_bits={self.conv_bits}); Linear layers "
                          "keep the requested k", UserWarning, stacklevel=2)
        w = QuantSpec(IntFormat(w_bits + 1), PerTensor(), fixed_amax=1.0)
        a = QuantSpec(IntFormat(a_bits + 1), PerTensor(), fixed_amax=1.0 if self.activation_range == "clip" else None)
        if g_bits is None:
            float_gemm = GemmPrecision(w, w, integer=False)
            return LayerPrecision(forward=GemmPrecision(a, w), grad_input=float_gemm, grad_weight=float_gemm)
        g = QuantSpec(IntFormat(g_bits + 1), PerTensor())
        return LayerPrecision(forward=GemmPrecision(a, w), grad_input=GemmPrecision(g, w), grad_weight=GemmPrecision(g, a))

    def hooks_for(self, module: nn.Module, fqn: str) -> LayerHooks:
        return _DoReFaHooks(*self.layer_bits(module), self.activation_range)

    def layer_filter(self, model: nn.Module):
        return first_last_filter(model) if self.first_last_float else None
