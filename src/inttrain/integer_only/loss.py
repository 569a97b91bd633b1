"""Integer softmax cross-entropy gradient (docs/integer-training.md §6) on torch integer tensors.

The arithmetic is :mod:`inttrain.micro.loss`'s, run on :class:`~.ops.TorchOps`; the exp2 table is micro's
integer table (Q15), copied once to each device it is used on.
"""

from __future__ import annotations

import torch

from ..micro import loss as _core
from .ops import IntTensor, TorchOps

LOG2E_Q8, ERR_EXP, T_MIN, EXP2_LUT_SUM = _core.LOG2E_Q8, _core.ERR_EXP, _core.T_MIN, _core.EXP2_LUT_SUM
# EXP2_LUT[i] = round(2**(i/256) * 2**15), i = 0..255
EXP2_LUT = torch.from_numpy(_core.EXP2_LUT.copy())


def exp2_q15(t_q8: torch.Tensor) -> torch.Tensor:
    """2**(t/256) * 2**15 for integer t <= 0 (Q8): LUT[t & 255] shifted right by -(t >> 8), rne."""
    return _core.exp2_q15(t_q8, TorchOps)


def softmax_q7(logits: IntTensor) -> torch.Tensor:
    """Integer softmax of int8 logits (N, C) at exponent e: probabilities in Q7 (int64)."""
    return _core.softmax_q7(logits, TorchOps)


def softmax_cross_entropy_grad(logits: IntTensor, labels: torch.Tensor, bits: int = 8) -> tuple[IntTensor, torch.Tensor]:
    """Error p - onehot(labels) as int8 codes at exponent -7 (int16 at -15 for ``bits`` 16; summed loss);
    returns (error, p in Q7 / Q15)."""
    return _core.softmax_cross_entropy_grad(logits, labels, TorchOps, bits)


def display_loss(logits: IntTensor, labels: torch.Tensor) -> float:
    """Mean float cross-entropy for progress lines only (outside the integer training step)."""
    z = logits.to_float()
    logp = torch.log_softmax(z, dim=1)
    return float(-logp[torch.arange(labels.shape[0]), labels.to(torch.int64)].mean())
