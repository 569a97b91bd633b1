"""Integer SGD (docs/integer-training.md §7).

With learning rate 2**-lr_shift the real update is lr * grad; in codes of the master weight
(exponent p.exp) that is grad * 2**(grad_exp - lr_shift - p.exp), i.e. a right shift by
s = p.exp + lr_shift - grad_exp (rounded with ``rounding``; s < 0 is a saturating left shift).
Optional momentum with beta = 1 - 2**-momentum_shift keeps an int32 buffer v in the same codes:
v <- v - rne_shift(v, momentum_shift) + u; the step is then v. Weights saturate to their range.
"""

from __future__ import annotations

import numpy as np

from .layers import Param
from .ops import INT32_MAX, absmax, qmax, shift, shift_round_fast


class SGD:
    def __init__(self, params: list[Param], lr_shift: int, momentum_shift: int | None = None,
                 rounding: str = "pstoch"):
        if not 0 <= int(lr_shift) <= 62:
            raise ValueError("lr_shift must be in [0, 62]")
        if momentum_shift is not None and not 1 <= int(momentum_shift) <= 16:
            raise ValueError("momentum_shift must be in [1, 16]")
        self.params, self.lr_shift, self.momentum_shift, self.rounding = params, int(lr_shift), momentum_shift, rounding
        self._shadow: dict[int, tuple] = {}     # id(param) -> (the codes array written last, its int32 copy)

    def update_codes(self, p: Param) -> np.ndarray:
        """The (signed) step in codes of p.acc before momentum: round(grad * 2**(grad_exp - lr_shift - exp))."""
        return shift(p.grad, p.exp + self.lr_shift - p.grad_exp, self.rounding, INT32_MAX)

    def _fast_update(self, p: Param) -> np.ndarray | None:
        """The step in int32 when that is exact: an int32 gradient, 1 <= s <= 30 (so |U| <= 2**30 + 1 and
        W - U cannot overflow int32) and, for rne, no overflow of G + 2**(s-1). None: use the int64 path."""
        s = p.exp + self.lr_shift - p.grad_exp
        g = p.grad
        if g.dtype != np.int32 or not 1 <= s <= 30:
            return None
        if self.rounding == "rne" and absmax(g) + (1 << (s - 1)) > INT32_MAX:
            return None
        return shift_round_fast(g, s, self.rounding)

    def step(self) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            u = self._fast_update(p) if self.momentum_shift is None else None
            if u is not None:
                m = qmax(p.bits)
                acc, w32 = self._shadow.get(id(p), (None, None))
                if acc is not p.acc:                     # first step, or the codes were replaced from outside
                    w32 = p.acc.astype(np.int32)
                np.subtract(w32, u, out=w32)             # W - U in int32
                np.clip(w32, -m, m, out=w32)
                p.acc = w32.astype(p.acc.dtype)
                p.acc.flags.writeable = False            # replace the codes, never edit them in place: the
                self._shadow[id(p)] = (p.acc, w32)       # int32 copy of them is reused by the next step
                p.grad = None
                continue
            u = self.update_codes(p)
            if self.momentum_shift is not None:
                if p.mom is None:
                    p.mom = np.zeros(p.acc.shape, dtype=np.int32)
                v = p.mom.astype(np.int64)
                v = v - shift(v, self.momentum_shift, "rne") + u
                v = np.clip(v, -INT32_MAX, INT32_MAX)
                p.mom = v.astype(np.int32)
                u = v
            m = qmax(p.bits)
            p.acc = np.clip(p.acc.astype(np.int64) - u, -m, m).astype(p.acc.dtype)
            p.grad = None
