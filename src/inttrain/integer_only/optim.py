"""Integer SGD (docs/integer-training.md §7) on torch integer tensors; twin of :class:`inttrain.micro.SGD`.

The step in master-weight codes is the gradient shifted by s = E + lr_shift - grad_exp (rounding
``rounding``; s < 0 is a saturating left shift); optional momentum beta = 1 - 2**-momentum_shift
keeps an int32 buffer v <- sat32(v - rne_shift(v, momentum_shift) + u); weights saturate.
"""

from __future__ import annotations

import torch

from .layers import Param
from .ops import INT32_MAX, qmax, shift


class SGD:
    def __init__(self, params: list[Param], lr_shift: int, momentum_shift: int | None = None,
                 rounding: str = "pstoch"):
        if not 0 <= int(lr_shift) <= 62:
            raise ValueError("lr_shift must be in [0, 62]")
        if momentum_shift is not None and not 1 <= int(momentum_shift) <= 16:
            raise ValueError("momentum_shift must be in [1, 16]")
        self.params, self.lr_shift, self.momentum_shift, self.rounding = params, int(lr_shift), momentum_shift, rounding

    def update_codes(self, p: Param) -> torch.Tensor:
        return shift(p.grad, p.exp + self.lr_shift - p.grad_exp, self.rounding, INT32_MAX)

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
            m = qmax(p.bits)
            p.acc = torch.clamp(p.acc.to(torch.int64) - u, -m, m).to(p.acc.dtype)
            p.grad = None
