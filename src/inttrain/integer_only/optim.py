"""Integer SGD (docs/integer-training.md §7) on torch integer tensors; twin of :class:`inttrain.micro.SGD`.

The same rules, options and schedule multiplier as micro's (see :mod:`inttrain.micro.optim`): the step in
master-weight codes is the gradient (times the Q8 ``multiplier`` when it is not 256) shifted by
s = E + lr_shift - grad_exp (``lr_mode="shift"``) or s = bitlen(max|grad|) - lr_bits + E - E0 (``"norm"``, E0 the initial exponent); optional
momentum v <- sat32(v - rne_shift(v, momentum_shift) + u), decay W -= rne_shift(W, decay_shift), saturation,
and ``adapt_exp`` (halve a tensor that reached half its range, exponent + 1).
"""

from __future__ import annotations

import torch

from ..micro.optim import LR_MODES, ONE_Q8
from .layers import Param
from .ops import INT32_MAX, absmax, qmax, shift, shift_round


class SGD:
    def __init__(self, params: list[Param], lr_shift: int = 6, momentum_shift: int | None = None,
                 rounding: str = "pstoch", *, lr_mode: str = "shift", lr_bits: int = 4, adapt_exp: bool = False,
                 decay_shift: int | None = None):
        if lr_mode not in LR_MODES:
            raise ValueError(f"unknown lr_mode {lr_mode!r}; allowed: {', '.join(LR_MODES)}")
        if not 0 <= int(lr_shift) <= 62:
            raise ValueError("lr_shift must be in [0, 62]")
        if not 0 <= int(lr_bits) <= 14:
            raise ValueError("lr_bits must be in [0, 14]")
        if momentum_shift is not None and not 1 <= int(momentum_shift) <= 16:
            raise ValueError("momentum_shift must be in [1, 16]")
        if decay_shift is not None and not 1 <= int(decay_shift) <= 30:
            raise ValueError("decay_shift must be in [1, 30]")
        self.params, self.lr_shift, self.momentum_shift, self.rounding = params, int(lr_shift), momentum_shift, rounding
        self.lr_mode, self.lr_bits, self.adapt_exp, self.decay_shift = lr_mode, int(lr_bits), bool(adapt_exp), decay_shift
        self.multiplier = ONE_Q8

    def update_codes(self, p: Param) -> torch.Tensor:
        if self.lr_mode == "shift":
            s = p.exp + self.lr_shift - p.grad_exp
        else:
            top = absmax(p.grad).bit_length()
            if top == 0:
                return torch.zeros(p.grad.shape, dtype=torch.int64, device=p.grad.device)
            s = top - self.lr_bits + p.exp - p.exp0
        if self.multiplier == ONE_Q8:
            return shift(p.grad, s, self.rounding, INT32_MAX)
        return shift(p.grad.to(torch.int64) * self.multiplier, s + 8, self.rounding, INT32_MAX)

    def step(self) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            u = self.update_codes(p)
            if self.momentum_shift is not None:
                if p.mom is None:
                    p.mom = torch.zeros(p.acc.shape, dtype=torch.int32, device=p.acc.device)
                v = p.mom.to(torch.int64)
                v = torch.clamp(v - shift(v, self.momentum_shift, "rne") + u, -INT32_MAX, INT32_MAX)
                p.mom = v.to(torch.int32)
                u = v
            w = p.acc.to(torch.int64)
            if self.decay_shift is not None:
                u = u + shift_round(w, self.decay_shift, "rne")
            m = qmax(p.bits)
            w = torch.clamp(w - u, -m, m)
            if self.adapt_exp and absmax(w) >= 1 << (p.bits - 2):
                w = shift_round(w, 1, "rne")
                p.exp += 1
                if p.mom is not None:
                    p.mom = shift_round(p.mom, 1, "rne").to(torch.int32)
            p.acc = w.to(p.acc.dtype)
            p.grad = None
