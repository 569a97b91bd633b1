"""Integer SGD and its integer learning-rate schedule (docs/integer-training.md §7).

Two step-size rules (``lr_mode``):

* ``"shift"`` (NITI-style, the C code generator's rule): learning rate 2**-lr_shift on the summed batch
  gradient. In codes of the master weight (exponent p.exp) the step is grad * 2**(grad_exp - lr_shift - p.exp),
  a right shift by s = p.exp + lr_shift - grad_exp (rounded with ``rounding``; s < 0 is a saturating left shift).
  Its good value depends on the batch size, the data scale and the depth (every task needs a sweep).
* ``"norm"`` (per-tensor gradient normalisation, the CLI default): the step is the gradient shifted so that
  its largest element becomes 2**lr_bits codes at the tensor's *initial* exponent p.exp0:
  s = bitlen(max|grad|) - lr_bits + (p.exp - p.exp0). The step is then a fixed fraction of each tensor's
  initial code range whatever the gradient's scale, so one default fits every layer and task; counting it
  in initial codes keeps an adapted (raised) exponent from enlarging the real step.  ``bn_lr_bits`` (None:
  lr_bits) sets the largest step of batch-norm gamma / beta (``Param.role == "norm"``) apart: they scale
  whole channels, and on the batch-norm CNN of §7 a smaller step for them alone trained better.

A schedule multiplier ``multiplier`` (Q8: 256 = 1.0, set each step by :class:`Schedule`) scales the step:
U = shift(grad * m, s + 8) when m != 256 (m == 256 is exactly the unscheduled shift(grad, s)).
Optional momentum with beta = 1 - 2**-momentum_shift keeps an int32 buffer v in the same codes:
v <- v - rne_shift(v, momentum_shift) + U; the step is then v, or with ``nesterov`` U + beta * v, that is
v - rne_shift(v, momentum_shift) + U (Sutskever et al., ICML 2013, Eq. 3-4, in torch SGD(nesterov=True)'s form: the
step looks one momentum step ahead; on ResNet-20 in fp32 it is worth a point over plain momentum, see the
fp32-no-nesterov row of benchmarks/results/accuracy_full). Optional decay: W <- W - rne_shift(W, decay_shift).
Optional L2 weight decay ``l2_shift`` (lambda = 2**-l2_shift on the summed-batch loss, torch SGD's ``weight_decay``
times the batch size): the step's gradient is grad + lambda * W, W written in the gradient's units (an exact left
shift, or an rne right shift) before the step rule sees it, so the decay follows the schedule and the step rounding
as fp32's does.  ``decay_shift`` cannot stand in for it: fp32's ~5e-5 per step is D = 14, and rne(W / 2**14) is 0 for
every int16 code below 8192.
``adapt_exp``: after the step, a tensor whose largest |code| reached 2**(bits-2) (half its range) is
halved (rne) and its exponent raised by one (the momentum buffer likewise), so master weights keep
headroom and never sit at the saturation limit; the value is unchanged up to the halved rounding.
``frac_bits`` F (None: off): each master weight keeps the part of its steps below one code in an int16 remainder
``frac`` of F fraction bits (|frac| <= 2**(F-1)), so the weight is W + frac * 2**-F: the step is rounded at 2**-F codes
instead of one code, and the codes W the forward reads are rne(T / 2**F) of the whole T = W * 2**F + frac.  Why: late
in a cosine schedule most steps are a small fraction of a code, and rounding each one to a whole code stochastically
adds noise whose variance falls only as fast as the step (Li et al., "Training Quantized Nets: A Deeper
Understanding", NeurIPS 2017, Sec. 5: without a high-precision copy of the weights the annealing cannot settle);
the remainder is that copy, F more bits, kept apart so the codes keep their width, exponent and view.
Measured on ResNet-20 (docs §7): F = 8 from a late checkpoint left the losses unchanged, so it is off by default.
"""

from __future__ import annotations

import math

import numpy as np

from .layers import Param
from .ops import INT32_MAX, NumpyOps, absmax, qmax, shift_round_fast

LR_MODES = ("shift", "norm")
SCHEDULES = ("const", "step", "cosine")
ONE_Q8 = 256
#: |grad + lambda * W| saturates here (l2_shift): times the Q8 multiplier it stays inside int64.
L2_LIMIT = (1 << 46) - 1
#: The most fraction bits a master weight's remainder may keep (int16 remainders, |frac| <= 2**(F-1)).
FRAC_BITS_MAX = 15
# 0.5 * (1 + cos(pi * i / 256)) in Q8, i = 0..256: the cosine schedule's multipliers (integers, so both
# engines and any board use the same table; sum stated in the docs as a checksum)
COS_Q8 = tuple(int(math.floor(128 * (1 + math.cos(math.pi * i / 256)) + 0.5)) for i in range(257))
COS_Q8_SUM = sum(COS_Q8)


def default_bn_lr_bits(lr_bits: int) -> int:
    """The batch-norm gamma / beta step both engines default to: half the weights' (docs §7, cifar-bncnn)."""
    return max(0, int(lr_bits) - 1)


class Schedule:
    """Integer step-size multiplier (Q8, 0..256) as a function of the global step.

    ``warmup_steps``: linear ramp ((t + 1) * 256 // warmup_steps) over the first steps. Then ``const``: 256;
    ``step``: 256 >> (t // step_every) (halving every ``step_every`` steps: 0 from the 9th halving on);
    ``cosine``: COS_Q8[256 * t // (total_steps - warmup_steps)] (t counted after the warm-up).
    """

    def __init__(self, kind: str = "const", total_steps: int = 1, warmup_steps: int = 0, step_every: int = 1):
        if kind not in SCHEDULES:
            raise ValueError(f"unknown schedule {kind!r}; allowed: {', '.join(SCHEDULES)}")
        if total_steps < 1 or warmup_steps < 0 or step_every < 1:
            raise ValueError("schedule: total_steps >= 1, warmup_steps >= 0, step_every >= 1")
        self.kind, self.total, self.warmup, self.every = kind, int(total_steps), int(warmup_steps), int(step_every)

    def multiplier(self, step: int) -> int:
        if step < self.warmup:
            return (step + 1) * ONE_Q8 // self.warmup
        t = step - self.warmup
        if self.kind == "step":
            k = t // self.every
            return ONE_Q8 >> min(k, 9)
        if self.kind == "cosine":
            return COS_Q8[min(256, 256 * t // max(1, self.total - self.warmup))]
        return ONE_Q8


def saturation(params: list[Param]) -> list[tuple[int, int]]:
    """(codes at the integer limit +-qmax(bits), size) of each parameter's master codes."""
    return [(int(np.count_nonzero(np.abs(p.acc.astype(np.int32)) >= qmax(p.bits))), int(p.acc.size)) for p in params]


class SGDCore:
    """Integer SGD over ``params`` (module docstring, docs §7), written against the array namespace ``OPS``."""

    OPS = NumpyOps

    def __init__(self, params: list, lr_shift: int = 6, momentum_shift: int | None = None,
                 rounding: str = "pstoch", *, lr_mode: str = "shift", lr_bits: int = 4, adapt_exp: bool = False,
                 decay_shift: int | None = None, bn_lr_bits: int | None = None, l2_shift: int | None = None,
                 frac_bits: int | None = None, nesterov: bool = False):
        if lr_mode not in LR_MODES:
            raise ValueError(f"unknown lr_mode {lr_mode!r}; allowed: {', '.join(LR_MODES)}")
        if not 0 <= int(lr_shift) <= 62:
            raise ValueError("lr_shift must be in [0, 62]")
        if not 0 <= int(lr_bits) <= 14:
            raise ValueError("lr_bits must be in [0, 14]")
        if bn_lr_bits is not None and not 0 <= int(bn_lr_bits) <= 14:
            raise ValueError("bn_lr_bits must be in [0, 14]")
        if momentum_shift is not None and not 1 <= int(momentum_shift) <= 16:
            raise ValueError("momentum_shift must be in [1, 16]")
        if decay_shift is not None and not 1 <= int(decay_shift) <= 30:
            raise ValueError("decay_shift must be in [1, 30]")
        if l2_shift is not None and not 0 <= int(l2_shift) <= 30:
            raise ValueError("l2_shift must be in [0, 30]")
        if frac_bits is not None and not 1 <= int(frac_bits) <= FRAC_BITS_MAX:
            raise ValueError(f"frac_bits must be in [1, {FRAC_BITS_MAX}]")
        if nesterov and momentum_shift is None:
            raise ValueError("nesterov needs momentum_shift")
        self.nesterov = bool(nesterov)
        self.l2_shift = None if l2_shift is None else int(l2_shift)
        self.frac_bits = None if frac_bits is None else int(frac_bits)
        self.params, self.lr_shift, self.momentum_shift, self.rounding = params, int(lr_shift), momentum_shift, rounding
        self.lr_mode, self.lr_bits, self.adapt_exp, self.decay_shift = lr_mode, int(lr_bits), bool(adapt_exp), decay_shift
        self.bn_lr_bits = None if bn_lr_bits is None else int(bn_lr_bits)
        self.multiplier = ONE_Q8

    def config(self) -> dict:
        """The optimizer's settings (recorded in saved models and checkpoints)."""
        return {"lr_mode": self.lr_mode, "lr_shift": self.lr_shift, "lr_bits": self.lr_bits,
                "momentum_shift": self.momentum_shift, "rounding": self.rounding, "adapt_exp": self.adapt_exp,
                "decay_shift": self.decay_shift, "bn_lr_bits": self.bn_lr_bits, "l2_shift": self.l2_shift,
                "frac_bits": self.frac_bits, "nesterov": self.nesterov}

    def gradient(self, p):
        """The gradient the step rule sees, at exponent p.grad_exp: p.grad, plus W * 2**-l2_shift in those units
        when ``l2_shift`` is set (saturated to +-L2_LIMIT)."""
        if self.l2_shift is None:
            return p.grad
        ops = self.OPS
        k = p.grad_exp - p.exp + self.l2_shift        # W * 2**(exp - l2_shift) = (W * 2**-k) * 2**grad_exp
        decay = ops.shift(ops.wide(p.acc), k, "rne", L2_LIMIT)
        return ops.clip(ops.wide(p.grad) + decay, -L2_LIMIT, L2_LIMIT)

    def step_shift(self, p, g=None) -> int | None:
        """s of the step U = g * 2**-s in codes of p.acc, g the step's gradient (default: p.grad; None: an
        all-zero gradient in ``norm`` mode)."""
        if self.lr_mode == "shift":
            return p.exp + self.lr_shift - p.grad_exp
        top = self.OPS.absmax(p.grad if g is None else g).bit_length()
        bits = self.bn_lr_bits if self.bn_lr_bits is not None and p.role == "norm" else self.lr_bits
        return None if top == 0 else top - bits + p.exp - p.exp0

    def update_codes(self, p):
        """The (signed) step before momentum, in units of 2**-frac_bits codes of p.acc (whole codes when off)."""
        ops, g = self.OPS, self.gradient(p)
        s = self.step_shift(p, g)
        if s is None:
            return ops.zeros(p.grad, 64)
        s -= self.frac_bits or 0
        if self.multiplier == ONE_Q8:
            return ops.shift(g, s, self.rounding, INT32_MAX)
        return ops.shift(ops.wide(g) * self.multiplier, s + 8, self.rounding, INT32_MAX)

    def step_param(self, p) -> None:
        """Momentum, decay, the saturating update and the exponent adaptation of one parameter."""
        ops = self.OPS
        f = self.frac_bits or 0
        u = self.update_codes(p)
        if self.momentum_shift is not None:
            if p.mom is None:
                p.mom = ops.zeros(p.acc, 32)
            v = ops.wide(p.mom)
            v = ops.clip(v - ops.shift(v, self.momentum_shift, "rne") + u, -INT32_MAX, INT32_MAX)
            p.mom = ops.int32(v)
            u = ops.clip(v - ops.shift(v, self.momentum_shift, "rne") + u, -INT32_MAX, INT32_MAX) if self.nesterov else v
        w = ops.wide(p.acc)
        if f:                                  # the whole weight in 2**-f codes: codes and remainder
            w = w * (1 << f) + (ops.wide(p.frac) if p.frac is not None else 0)
        if self.decay_shift is not None:
            u = u + ops.shift_round(w, self.decay_shift, "rne")
        m = qmax(p.bits) << f
        w = ops.clip(w - u, -m, m)
        codes = ops.shift_round(w, f, "rne") if f else w
        if self.adapt_exp and ops.absmax(codes) >= 1 << (p.bits - 2):
            w = ops.shift_round(w, 1, "rne")
            codes = ops.shift_round(w, f, "rne") if f else w
            p.exp += 1
            if p.mom is not None:
                p.mom = ops.int32(ops.shift_round(p.mom, 1, "rne"))
        if f:
            p.frac = ops.int16(w - codes * (1 << f))
        p.acc = ops.cast_like(codes, p.acc)
        p.grad = None

    def step(self) -> None:
        for p in self.params:
            if p.grad is not None:
                self.step_param(p)


class SGD(SGDCore):
    """:class:`SGDCore` on NumPy, plus an exact int32 fast path for the plain shift rule."""

    def __init__(self, params: list[Param], lr_shift: int = 6, momentum_shift: int | None = None,
                 rounding: str = "pstoch", **kw):
        super().__init__(params, lr_shift, momentum_shift, rounding, **kw)
        self._shadow: dict[int, tuple] = {}     # id(param) -> (the codes array written last, its int32 copy)

    def _fast_update(self, p: Param) -> np.ndarray | None:
        """The step in int32 when that is exact: the plain ``shift`` rule, an int32 gradient, 1 <= s <= 30 (so
        |U| <= 2**30 + 1 and W - U cannot overflow int32) and, for rne, no overflow of G + 2**(s-1). None: use
        the int64 path."""
        if (self.lr_mode != "shift" or self.multiplier != ONE_Q8 or self.momentum_shift is not None
                or self.adapt_exp or self.decay_shift is not None or self.l2_shift is not None
                or self.frac_bits is not None):
            return None
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
            u = self._fast_update(p)
            if u is None:
                self.step_param(p)
                continue
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
