"""Integer softmax cross-entropy gradient (docs/integer-training.md §6).

exp is computed base 2 with a 256-entry Q15 table: e^(z * 2**e) = 2^(t), t = z * 2**e * log2(e),
t in Q8 fixed point with LOG2E_Q8 = round(256 * log2(e)) = 369.

Written once for both engines: ``ops`` is the array library (:class:`~inttrain.micro.ops.NumpyOps` here,
``inttrain.integer_only`` passes its torch twin).
"""

from __future__ import annotations

import numpy as np

from .ops import IntTensor, NumpyOps

LOG2E_Q8 = 369                                    # round(256 * log2(e)) = round(369.33)
EXP2_LUT = np.array([round(2.0 ** (i / 256) * 32768) for i in range(256)], dtype=np.int64)  # Q15
EXP2_LUT_SUM = 12085828                           # checksum of the table (stated in the docs)
ERR_EXP = -7                                      # the error is p - onehot in Q7
T_MIN = -(63 << 8)                                # t below this gives E = 0 anyway


def exp2_q15(t_q8: np.ndarray, ops: type = NumpyOps) -> np.ndarray:
    """2**(t/256) * 2**15 for integer t <= 0 (Q8): LUT[t & 255] shifted right by -(t >> 8), rne."""
    t = ops.clip(ops.wide(t_q8), T_MIN, None)
    ip = t >> 8                                   # floor(t / 256) <= 0
    f = t & 255
    lut = ops.table(EXP2_LUT, t)[f]
    # the same as shift_round(lut, -ip, "rne") element by element, vectorized over the shift; since
    # lut < 2**17, any shift >= 18 gives 0 either way, so shifts are capped at 20
    s = ops.clip(-ip, None, 20)
    q = lut >> s
    r = lut & ((1 << s) - 1)
    half = (1 << s) >> 1
    up = (s > 0) & ((r > half) | ((r == half) & ((q & 1) == 1)))
    return q + up


def softmax_q(logits: IntTensor, ops: type = NumpyOps, frac: int = 7) -> np.ndarray:
    """Integer softmax of int8 logits (N, C) at exponent e: probabilities in Q``frac`` (sum ~ 2**frac; 7 or 15)."""
    q = ops.wide(logits.q)
    z = q - ops.amax(q, 1, keepdims=True)         # <= 0, >= -254
    zl = z * LOG2E_Q8
    e = int(logits.exp)
    t = ops.shift_round(zl, -e, "rne") if e <= 0 else ops.shift_left_saturate(zl, e, limit=-T_MIN)
    big_e = exp2_q15(t, ops)                      # (N, C), the maximum is exactly 32768
    s = ops.sum(big_e, 1, keepdims=True)          # >= 32768
    return (big_e * (2 << frac) + s) // (2 * s)   # round(E * 2**frac / S), halves up


def softmax_q7(logits: IntTensor, ops: type = NumpyOps) -> np.ndarray:
    """Integer softmax of int8 logits (N, C) at exponent e: probabilities in Q7 (sum ~ 128)."""
    return softmax_q(logits, ops, 7)


def softmax_cross_entropy_grad(logits: IntTensor, labels: np.ndarray, ops: type = NumpyOps,
                               bits: int = 8) -> tuple[IntTensor, np.ndarray]:
    """Error dL/dlogits = p - onehot(labels) (summed loss, no mean) as ``bits``-bit codes: int8 at exponent -7,
    or int16 at exponent -15 (probabilities below 1/256 then still reach the last layer).

    Returns (error, p in Q7 or Q15). Saturation maps -2**(bits-1) (p_y = 0) to -(2**(bits-1) - 1).
    """
    frac = bits - 1
    p = softmax_q(logits, ops, frac)
    err = ops.copy(p)
    err[ops.arange(len(labels), p), ops.index(labels, p)] -= 1 << frac
    top = (1 << frac) - 1
    codes = ops.clip(err, -top, top)
    return ops.IntTensor(ops.int8(codes) if bits == 8 else ops.int16(codes), -frac), p


def display_loss(logits: IntTensor, labels: np.ndarray) -> float:
    """Mean cross-entropy in float, for progress lines only (not part of training)."""
    z = logits.to_float()
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(labels)), labels].mean())


