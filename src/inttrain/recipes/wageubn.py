"""``wageubn``: Yang, Deng, Wu, Wang, Li, Shi, "Training high-performance and large-scale deep neural
networks with full 8-bit integers", Neural Networks 125 (2020) (arXiv:1909.02384) — WAGEUBN.

WAGEUBN extends WAGE (Wu et al., ICLR 2018) to quantize all six data paths of training: **W**eights,
**A**ctivations, **G**radients of the weights, **E**rrors (back-propagated gradients), the weight
**U**pdate and **B**atch **N**orm, with power-of-two ("shift") quantization so that every rescale is a
bit shift.  Mapping onto inttrain:

- **W, A, E in the three GEMMs** (paper Sec. 3, the direct/shift quantization functions, Eq. ~4-8 as we
  recall the numbering — unverified): every Linear/Conv2d runs ``y = A W^T``, ``dx = E W`` and
  ``dW = E^T A`` as int8 x int8 -> int32 products on integer kernels, each operand with **one
  power-of-two scale per tensor** (``ScaleKind.POW2``: ``s = 2^ceil(log2(amax/127))``), all rounded
  to nearest by default (``e_rounding=Rounding.STOCHASTIC`` makes E unbiased; see "differences").
- **G** (8 bits): the float32 ``dW`` that the integer GEMM produced (``int32 acc * s_E * s_A``) is
  quantized again to ``g_bits`` = 8 bits with a power-of-two per-tensor scale (round to nearest by
  default, ``g_rounding``; WAGE's gradient quantizer rounds stochastically) before the update; this happens in
  :meth:`WageubnSGD.step` (also available alone as :func:`quantize_grads_`), so ``p.grad`` holds at
  most 2^8 - 1 distinct values per tensor after the step.  Bias and BN parameter gradients get the same.
- **U** (:class:`WageubnSGD`): momentum SGD whose state lives on fixed-point grids —
  the momentum buffer has ``m_bits`` = 16 bits (``m = Q16(mu m + g_q)``), the master weights
  ``w_bits`` = 24 bits and the update ``U = lr m`` is quantized onto the weight's 24-bit grid (so
  ``W - U`` is exact integer arithmetic on 24-bit codes with one shared power-of-two scale; 24-bit codes
  times a power of two are exact in float32, which is why the master copy can stay a float32 tensor).
  The paper keeps 24-bit weights for the update path and 8 bits for the forward (as here: the GEMMs
  requantize the 24-bit master to 8 bits); the 16-bit momentum width is our recollection — flag it.
- **BN**: :class:`inttrain.nn.quant_bn.QuantBatchNorm2d` (8-bit normalized output, gamma, beta and
  output; float32 statistics).  ``prepare_(model, "wageubn")`` swaps every BatchNorm2d for it
  (:meth:`WageubnConfig.convert_norms_`); :meth:`WageubnConfig.optimizer_for` gives WageubnSGD (other
  optimizers are refused), as ``inttrain train --recipe wageubn`` uses; WageubnSGD's step counter is part
  of its ``state_dict`` (exact resume).

What is integer arithmetic: the three GEMM products (real int8 kernels, int32 accumulation).  The G/U
quantizers and the BN quantizers are exact fixed-point values held in float32 tensors (a simulation:
the elementwise ops run in float32, but every stored value is an integer code times a power of two, and
``W - U`` on the 24-bit grid is exact).  The momentum multiply ``mu * m`` and ``lr * m`` are float32
multiplies followed by rounding onto the grid.

Differences from the paper (and why):

- E is a plain per-tensor shift quantizer; the paper's E path has (as we recall) an extra "flag"
  treatment of small errors that the GEMM spec cannot express.  G and E round to nearest by default:
  on the digits MLP, stochastic rounding of G (WAGE's choice) measured 96.1-97.5 % over three seeds
  against 97.8 % with round-to-nearest (fp32: 98.3 %); both are options (``g_rounding``, ``e_rounding``).
- BN statistics (mean, variance, running averages) are float32; the paper quantizes them too.
- The learning rate and the momentum coefficient are float32 scalars (the paper uses power-of-two-ish
  constants; not reproduced).
- Weights are not clipped to the paper's fixed ``[-1, 1)`` range: the 24-bit grid uses a per-tensor
  power-of-two scale chosen from the tensor's amax each step (a weight that grows past a power of two
  loses its lowest bit once when the grid coarsens).
- Equation numbers above are from memory and may be off.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from ..nn.quant_bn import pow2_quantize, use_quant_bn_
from ..numerics.hashing import mix_seed
from ..spec import GemmPrecision, LayerPrecision, PerChannel, PerTensor, QuantSpec, Rounding, ScaleKind, UnsupportedFormatError
from ..spec.formats import IntFormat
from .base import RecipeConfig

__all__ = ["WageubnConfig", "WageubnSGD", "quantize_grads_", "pow2_quantize"]


def quantize_grads_(params, bits: int = 8, seed: int = 0, stochastic: bool = False) -> None:
    """G: replace every ``p.grad`` by its ``bits``-bit power-of-two per-tensor quantization, in place."""
    for i, p in enumerate(params):
        if p.grad is None:
            continue
        codes, scale = pow2_quantize(p.grad, bits, stochastic, mix_seed(seed, i))
        p.grad.copy_((codes * scale).to(p.grad.dtype))


class WageubnSGD(torch.optim.Optimizer):
    """Momentum SGD with quantized G, momentum and update (WAGEUBN's "G" and "U").

    Per parameter tensor, each step (all scales per tensor, powers of two; ``Q_b`` = ``b``-bit
    symmetric codes, ``qmax = 2^(b-1) - 1``)::

        g   = Q_{g_bits}(grad + weight_decay * W)     g_rounding            (8 bits)
        m   = Q_{m_bits}(momentum * m + g)            round to nearest      (16 bits)
        s_w = 2^ceil(log2(max|W| / (2^(w_bits-1) - 1)))                     (24-bit weight grid)
        U   = s_w * clamp(round(lr * d / s_w), +-(2^(w_bits-1) - 1))        (24 bits, on W's grid)
        W   = Q_{w_bits}(W - U)                                              (24 bits)

    with ``d = m`` (the paper), or ``d = g + momentum * m`` with ``nesterov=True`` (inttrain's option, torch.optim.SGD's
    nesterov form on the quantized ``g`` and ``m``; U stays on W's grid).  ``p.grad`` is overwritten by ``g`` (the
    8-bit gradient).  The first step starts from ``m = 0``.
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 g_bits: int = 8, m_bits: int = 16, w_bits: int = 24, seed: int = 0,
                 g_rounding: Rounding = Rounding.NEAREST_EVEN, nesterov: bool = False):
        for name, v in (("g_bits", g_bits), ("m_bits", m_bits), ("w_bits", w_bits)):
            if not isinstance(v, int) or not 2 <= v <= 24:
                raise ValueError(f"WageubnSGD {name}={v!r}: allowed 2 to 24 (exact in float32)")
        if lr <= 0 or not 0 <= momentum < 1 or weight_decay < 0:
            raise ValueError(f"WageubnSGD: need lr > 0, 0 <= momentum < 1, weight_decay >= 0 (got {lr}, {momentum}, {weight_decay})")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=bool(nesterov))
        super().__init__(params, defaults)
        self.g_bits, self.m_bits, self.w_bits, self.seed = g_bits, m_bits, w_bits, int(seed)
        self.g_stochastic = g_rounding is Rounding.STOCHASTIC
        self.steps = 0

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.steps += 1
        index = 0
        for group in self.param_groups:
            lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
            nesterov = group.get("nesterov", False)  # checkpoints from before the option have none
            for p in group["params"]:
                index += 1
                if p.grad is None:
                    continue
                grad = p.grad.float()
                if wd:
                    grad = grad + wd * p.float()
                codes, scale = pow2_quantize(grad, self.g_bits, self.g_stochastic, mix_seed(self.seed, self.steps, index))
                g = codes * scale
                p.grad.copy_(g.to(p.grad.dtype))
                state = self.state[p]
                m = mu * state["momentum"] + g if "momentum" in state else g
                codes, scale = pow2_quantize(m, self.m_bits)
                state["momentum"] = m = codes * scale
                w = p.float()
                wq = 2 ** (self.w_bits - 1) - 1
                _, s_w = pow2_quantize(w, self.w_bits)
                d = g + mu * m if nesterov else m
                u = torch.round(lr * d / s_w).clamp(-wq, wq) * s_w
                state["update"] = u
                codes, scale = pow2_quantize(w - u, self.w_bits)
                p.copy_((codes * scale).to(p.dtype))
        return loss

    def state_dict(self) -> dict:
        """torch's optimizer state plus the step counter that seeds stochastic G rounding (exact resume)."""
        return {**super().state_dict(), "wageubn_steps": self.steps}

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        self.steps = int(state_dict.pop("wageubn_steps", 0))
        super().load_state_dict(state_dict)


@dataclass(frozen=True)
class WageubnConfig(RecipeConfig):
    """Config of the ``wageubn`` recipe (the GEMM part: 8-bit W, A, E with power-of-two per-tensor scales).

    Train with :class:`WageubnSGD` (quantized G, momentum and 24-bit update; :meth:`optimizer` builds it
    with these widths) and :class:`inttrain.nn.quant_bn.QuantBatchNorm2d` (8-bit BN).

    Args:
        bits: W, A and E code width in the GEMMs (the paper: 8; 2..8).
        e_rounding: rounding of the errors E in the dx/dW GEMMs (see the module docstring).
        weight_grad_rounding: rounding of E in the dW GEMM only (None: ``e_rounding``; inttrain's option, the
            paper rounds E once for both).  ``inttrain train --weight-grad-rounding`` sets it and G's rounding,
            since both only feed the weight gradient.  ``benchmarks/probe_recipes.py`` (ResNet-20, one batch):
            E rounded to nearest reads 31.1 / 14.1 dB median SQNR in the dx / dW GEMM, stochastically 28.4 /
            27.2 dB -- nearest for dx and stochastic for dW keeps the better of each, the int8 recipe's split.
        g_rounding: rounding of the 8-bit weight gradient G in :meth:`optimizer`.
        g_bits, m_bits, w_bits: widths of the weight gradient, momentum and master weights / update used
            by :meth:`optimizer` (the paper: 8, 16 (?), 24).  ``inttrain train --weight-grad-bits`` sets ``g_bits``.
        norm_bits: width of the batch norm's normalized input, gamma, beta and output
            (:class:`~inttrain.nn.quant_bn.QuantBatchNorm2d`; the paper: 8).  ``inttrain train --norm-bits``.
        per_sample_grad: the errors E in the dx GEMM on one power-of-two scale per sample (a row of a Linear's,
            a sample of a convolution's) instead of one per tensor: inttrain's option, off as the paper; the int8
            recipe's default, whose probe found that late in training one scale per tensor rounds most samples'
            errors to zero (:attr:`~inttrain.recipes.Int8MixedConfig.per_sample_grad`).  That GEMM never sums across samples, so
            each scale factors out of its rows of dx.  ``inttrain train --per-sample-grad``.
    """

    name = "wageubn"
    facts = ("Yang et al., Training high-performance and large-scale deep neural networks with full 8-bit "
             "integers, Neural Networks 2020 (WAGEUBN)",
             "the three GEMMs with power-of-two scales; weight gradients, momentum and update on fixed-point "
             "grids (8/16/24 bits)",
             "BN statistics (its output, gamma and beta are 8-bit), the float32 tensors holding the grids")
    optimizers = ("sgd",)
    update_rule = "its own quantized SGD"
    bits: int = 8
    e_rounding: Rounding = Rounding.NEAREST_EVEN
    weight_grad_rounding: Rounding | None = None
    g_rounding: Rounding = Rounding.NEAREST_EVEN
    g_bits: int = 8
    m_bits: int = 16
    w_bits: int = 24
    norm_bits: int = 8
    per_sample_grad: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.per_sample_grad, bool):
            raise ValueError(f"wageubn per_sample_grad must be True or False, got {self.per_sample_grad!r}")
        if not isinstance(self.bits, int) or isinstance(self.bits, bool) or not 2 <= self.bits <= 8:
            raise UnsupportedFormatError(f"wageubn bits={self.bits!r}: allowed 2 to 8")
        for name in ("g_bits", "m_bits", "w_bits", "norm_bits"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 2 <= v <= 24:
                raise UnsupportedFormatError(f"wageubn {name}={v!r}: allowed 2 to 24")

    def precision_for(self, module: nn.Module, fqn: str) -> LayerPrecision | None:
        spec = QuantSpec(IntFormat(self.bits), PerTensor(), Rounding.NEAREST_EVEN, ScaleKind.POW2)
        per_sample = PerChannel(0) if self.per_sample_grad else PerTensor()  # rows / samples of the dx GEMM's E
        err = QuantSpec(IntFormat(self.bits), per_sample, self.e_rounding, ScaleKind.POW2)
        err_w = QuantSpec(IntFormat(self.bits), PerTensor(), self.weight_grad_rounding or self.e_rounding, ScaleKind.POW2)
        return LayerPrecision(forward=GemmPrecision(spec, spec), grad_input=GemmPrecision(err, spec),
                              grad_weight=GemmPrecision(err_w, spec))

    def with_grad_rounding(self, rounding: Rounding) -> WageubnConfig:
        """``inttrain train --grad-rounding`` sets both of WAGEUBN's gradient quantizers: the errors E in the two
        backward GEMMs (``e_rounding``) and the 8-bit weight gradient G before the update (``g_rounding``;
        WAGE rounds G stochastically)."""
        return dataclasses.replace(self, e_rounding=rounding, g_rounding=rounding)

    def with_weight_grad_rounding(self, rounding: Rounding) -> WageubnConfig:
        """``inttrain train --weight-grad-rounding`` sets the two quantizers that only feed the weight gradient: E
        in the dW GEMM (``weight_grad_rounding``) and the 8-bit G before the update (``g_rounding``); the dx GEMM
        keeps ``e_rounding``."""
        return dataclasses.replace(self, weight_grad_rounding=rounding, g_rounding=rounding)

    def convert_norms_(self, model: nn.Module) -> nn.Module:
        """``norm_bits``-bit BN (:class:`~inttrain.nn.quant_bn.QuantBatchNorm2d`) in place of every BatchNorm2d."""
        return use_quant_bn_(model, self.norm_bits)

    def optimizer_for(self, model: nn.Module, optimizer: str = "sgd", lr: float = 0.05, *, momentum: float = 0.9,
                      weight_decay: float = 0.0, nesterov: bool = False, lr_scaling: bool = True) -> WageubnSGD:
        """WageubnSGD over ``model`` (momentum, weight decay and nesterov apply; other optimizers are refused)."""
        if optimizer != "sgd":
            raise ValueError(f"recipe 'wageubn' trains with its quantized SGD (WageubnSGD); optimizer {optimizer!r} "
                             "is not allowed: use sgd")
        return self.optimizer(model.parameters(), lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)

    def optimizer(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                  nesterov: bool = False) -> WageubnSGD:
        """A :class:`WageubnSGD` with this config's widths and seed (``nesterov``: inttrain's option, not the paper's)."""
        return WageubnSGD(params, lr, momentum, weight_decay, self.g_bits, self.m_bits, self.w_bits,
                          self.seed, self.g_rounding, nesterov)
