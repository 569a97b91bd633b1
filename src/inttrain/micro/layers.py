"""Integer layers, each with its forward and its hand-derived backward side by side.

Tensors flowing between layers are IntTensor (int8 codes + exponent). ``forward`` saves what the
backward needs; ``backward(g)`` takes the int8 error of the output and returns the int8 error of
the input (or None when ``need_input_grad`` is False) and leaves the weight gradient in the
parameter as an exact int64 accumulator (value grad * 2**grad_exp). See docs/integer-training.md.
"""

from __future__ import annotations

import numpy as np

from .gemm import exact_float_dtype, int_matmul, matmul_exact
from .ops import (INT32_MAX, IntTensor, NumpyOps, absmax, bitlen, check_int32, qmax, rdiv, requantize, saturate,
                  shift_round)

INT32_LIMIT = INT32_MAX
MAX_K = INT32_LIMIT // (127 * 127)   # 133144: longest reduction whose int8 x int8 sum fits int32


def requantize_checked(acc: np.ndarray, exp: int, mode: str, what: str, bits: int = 8) -> IntTensor:
    """check_int32 + requantize (to ``bits``-bit codes) sharing one max|acc|."""
    m = absmax(acc)
    if m > INT32_LIMIT:
        raise OverflowError(f"{what}: int32 accumulator overflow")
    return requantize(acc, exp, mode, bits, amax=m)


def _int8_view_table() -> np.ndarray:
    """sat8(shift_round(W16, 8, rne)) for every int16 bit pattern, indexed by the pattern as uint16."""
    w = np.arange(65536, dtype=np.uint16).view(np.int16)
    return saturate(shift_round(w.astype(np.int64), 8, "rne"), 8).astype(np.int8)


INT8_VIEW = _int8_view_table()          # 64 KiB: the int8 weight view is one table lookup per weight

#: How int16 master codes map to the int8 view the GEMMs use (docs §1; a description's ``weight_view``):
#: "fixed" (the default): s = 8; "tensor": s = max(0, bitlen(max |W16|) - 7), the whole int8 range for the
#: tensor's largest code, as activations are requantized.
WEIGHT_VIEWS = ("fixed", "tensor")


def view_shift(max_code: int, bits: int, view: str = "fixed") -> int:
    """The right shift from master codes to their int8 view: 0 for int8 masters; 8 ("fixed"); or the smallest
    that brings ``max_code`` (the tensor's largest |code|) within 7 bits ("tensor")."""
    if bits == 8:
        return 0
    return 8 if view == "fixed" else max(0, int(max_code).bit_length() - 7)


def gemm_error(g: IntTensor, mode: str, ops: type = NumpyOps) -> IntTensor:
    """The error as a GEMM operand: int8 codes as they are; wider (16-bit) codes rounded to int8 with ``mode``."""
    return g if g.q.dtype.itemsize == 1 else ops.requantize(g.q, g.exp, mode)


def to_int32(acc: np.ndarray, what: str, bound: int | None = None) -> np.ndarray:
    """An exact accumulator (integer or integer-valued float array) checked against int32 and stored as int32.

    ``bound``: a proven bound on |acc| (reduction length x operand maxima); when it is within int32 the
    check holds without scanning the array."""
    if bound is None or bound > INT32_LIMIT:
        check_int32(acc, what)
    return acc.astype(np.int32)


class Param:
    """A weight: master codes ``acc`` (int16 or int8, ``bits``) at fixed exponent ``exp``.

    The forward uses the int8 view: for bits == 16, w8 = saturate(shift_round(acc, s, rne)) at exp + s with
    s = :func:`view_shift` (8, or the tensor's own shift when ``view`` is "tensor"); for bits == 8 the codes
    themselves. ``grad``/``grad_exp`` hold the last gradient, ``mom`` the int32 momentum buffer of the optimizer,
    ``frac`` its int16 remainders below one code (``SGD(frac_bits=)``; the weight is acc + frac * 2**-frac_bits).
    """

    def __init__(self, acc: np.ndarray, exp: int, bits: int):
        if bits not in (8, 16):
            raise ValueError("weight bits must be 8 or 16")
        self.bits = bits
        self.acc = acc.astype(np.int16 if bits == 16 else np.int8)
        self.exp = int(exp)
        self.exp0 = int(exp)         # the initial exponent: the norm rule's steps are in its units (optim.py)
        self.role = "weight"         # "norm": a batch norm's gamma / beta (the optimizer's bn_lr_bits applies)
        self.view = "fixed"          # the int8 view's shift rule (WEIGHT_VIEWS; set from the model's description)
        self.grad: np.ndarray | None = None
        self.grad_exp = 0
        self.mom: np.ndarray | None = None
        self.frac: np.ndarray | None = None

    def int8(self) -> IntTensor:
        if self.bits == 8:
            return IntTensor(self.acc, self.exp)
        if self.view != "fixed":
            return self.gemm_view()[0]
        acc = self.acc if self.acc.dtype == np.int16 else self.acc.astype(np.int16)
        return IntTensor(np.take(INT8_VIEW, acc.view(np.uint16)), self.exp + 8)

    def gemm_view(self) -> tuple[IntTensor, np.ndarray, int]:
        """(int8 view, the same codes as float32 for the exact GEMMs, their max |code|).

        For int16 master codes the view is rint(W16 * 2**-s) clipped to [-127, 127] in float32: the scaling
        by a power of two is exact and rint rounds half to even, so it equals sat8(shift_round(W16, s, rne)).
        """
        if self.bits == 8:
            q = self.acc
            wf = q.astype(np.float32)
        else:
            am = absmax(self.acc)
            s = view_shift(am, self.bits, self.view)
            wf = self.acc * np.float32(2.0 ** -s)
            np.rint(wf, out=wf)
            if s and am >= 127 * (1 << s) + (1 << (s - 1)):    # only such codes round to 128 and saturate
                np.clip(wf, -127, 127, out=wf)
            q = wf.astype(np.int8)
            # rounding is monotonic, so the largest |code| is the rounded largest |W16| (rne on a tie)
            return IntTensor(q, self.exp + s), wf, min(127, int(np.rint(am / 2.0 ** s)))
        return IntTensor(q, self.exp), wf, absmax(q)

    @staticmethod
    def init(shape: tuple[int, ...], fan_in: int, bits: int, rng: np.random.Generator) -> "Param":
        """Kaiming-uniform init (bound sqrt(6 / fan_in)); the bound maps to half the code range.

        Initialization is the one place that uses an RNG and floats; training never does.
        """
        bound = float(np.sqrt(6.0 / fan_in))
        half = qmax(bits) // 4
        exp = int(np.ceil(np.log2(bound / half)))
        limit = int(bound / 2.0**exp)
        codes = rng.integers(-limit, limit + 1, size=shape)
        return Param(codes, exp, bits)


class Layer:
    """Base of every layer of both engines.  ``OPS`` is the array library the shared arithmetic runs on
    (:class:`~inttrain.micro.ops.NumpyOps` here; ``inttrain.integer_only`` sets its torch twin)."""

    OPS = NumpyOps
    params: list[Param] = []
    need_input_grad = True
    #: width of the error codes this layer hands back (8, or 16: rounded to int8 only as a GEMM operand)
    err_bits = 8

    def named_params(self, prefix: str) -> list[tuple[str, Param]]:
        """(name, Param) of this layer: ``prefix.weight`` (layers with other parameters override this)."""
        return [(f"{prefix}.weight", self.weight)] if hasattr(self, "weight") else []

    def forward(self, x: IntTensor) -> IntTensor:
        raise NotImplementedError

    def backward(self, g: IntTensor) -> IntTensor | None:
        raise NotImplementedError

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        return in_shape

    def describe(self) -> dict:
        raise NotImplementedError


class Linear(Layer):
    """y = x @ W.T (no bias, as in NITI). x: (N, in) int8, W: (out, in)."""

    def __init__(self, in_features: int, out_features: int, bits: int = 16,
                 rng: np.random.Generator | None = None, fwd_round: str = "rne", bwd_round: str = "pstoch"):
        self.in_features, self.out_features = in_features, out_features
        self.fwd_round, self.bwd_round = fwd_round, bwd_round
        rng = rng if rng is not None else np.random.default_rng(0)
        self.weight = Param.init((out_features, in_features), in_features, bits, rng)
        self.params = [self.weight]

    @staticmethod
    def forward_acc(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return int_matmul(x, w.T)                           # (N, out), exact

    def forward(self, x: IntTensor) -> IntTensor:
        w, wf, aw = self.weight.gemm_view()                 # wf: the float view both GEMMs use (exact, §3)
        ax = absmax(x.q)
        self.saved, self.gemm_saved = (x, w), (wf, ax, aw)
        return requantize_checked(matmul_exact(x.q, wf.T, ax, aw), x.exp + w.exp, self.fwd_round, "linear forward")

    @staticmethod
    def backward_acc(x: np.ndarray, w: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """dL/dx = g @ W (N, in); dL/dW = g.T @ x (out, in); exact int64."""
        return int_matmul(g, w), int_matmul(g.T, x)

    def backward(self, g: IntTensor) -> IntTensor | None:
        (x, w), (wf, ax, aw) = self.saved, self.gemm_saved
        g = gemm_error(g, self.bwd_round)
        ag = absmax(g.q)
        self.weight.grad = to_int32(matmul_exact(g.q.T, x.q, ag, ax), "linear weight grad", len(x.q) * ag * ax)
        self.weight.grad_exp = g.exp + x.exp
        if not self.need_input_grad:
            return None
        return requantize_checked(matmul_exact(g.q, wf, ag, aw), g.exp + w.exp, self.bwd_round, "linear input grad",
                                  self.err_bits)

    def out_shape(self, in_shape):
        return (self.out_features,)

    def describe(self):
        return {"type": "linear", "in_features": self.in_features, "out_features": self.out_features}


def _pad(x: np.ndarray, p: int) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (p, p), (p, p))) if p else x


def im2col(x: np.ndarray, kh: int, kw: int, stride: int, padding: int) -> tuple[np.ndarray, int, int]:
    """(N, C, H, W) -> columns (N*OH*OW, C*kh*kw), rows ordered (n, oh, ow), columns (c, i, j)."""
    xp = _pad(x, padding)
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    n, c, oh, ow = win.shape[:4]
    cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * kh * kw)
    return cols, oh, ow


def col2im(cols: np.ndarray, x_shape: tuple[int, ...], kh: int, kw: int, stride: int, padding: int,
           oh: int, ow: int) -> np.ndarray:
    """Adjoint of im2col: scatter-add columns back to (N, C, H, W), exact in int64."""
    n, c, h, w = x_shape
    cols = cols.reshape(n, oh, ow, c, kh, kw)
    out = np.zeros((n, c, h + 2 * padding, w + 2 * padding), dtype=np.int64)
    for i in range(kh):
        for j in range(kw):
            out[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride] += cols[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    return out[:, :, padding:padding + h, padding:padding + w]


def im2col_batched(x: np.ndarray, k: int, stride: int, padding: int) -> tuple[np.ndarray, int, int]:
    """(N, C, H, W) -> columns (N, C*k*k, OH*OW) in x's dtype, column index (c, i, j): k*k strided block copies."""
    xp = _pad(x, padding)
    n, c, hp, wp = xp.shape
    oh, ow = (hp - k) // stride + 1, (wp - k) // stride + 1
    cols = np.empty((n, c, k, k, oh, ow), dtype=x.dtype)
    for i in range(k):
        for j in range(k):
            cols[:, :, i, j] = xp[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
    return cols.reshape(n, c * k * k, oh * ow), oh, ow


def im2col_rows(x: np.ndarray, k: int, padding: int, dtype=None) -> tuple[np.ndarray, int, int, int]:
    """Stride-1 columns on the padded row grid: (N, C*k*k, OH*Wp), with Wp = W + 2p the padded width.

    Column ``oh*Wp + ow`` of kernel offset (i, j) is the flat padded input at ``(oh + i)*Wp + ow + j``, so
    each of the k*k offsets is one contiguous slice of the flattened padded image. Columns ``ow >= OW``
    wrap into the next row: they are garbage, cropped from the GEMM output, and multiplied by a zero error
    in the backward, so every result is still exact. ``dtype``: of the columns (default x's; a float type
    converts the small padded image once instead of the k*k times larger columns). Returns (cols, OH, OW, Wp).
    """
    n, c, h, w = x.shape
    dtype = x.dtype if dtype is None else dtype
    hp, wp = h + 2 * padding, w + 2 * padding
    oh, ow = hp - k + 1, wp - k + 1
    buf = np.zeros((n, c, hp * wp + k), dtype=dtype)         # k spare entries: the last slices run past Hp*Wp
    buf[:, :, :hp * wp].reshape(n, c, hp, wp)[:, :, padding:padding + h, padding:padding + w] = x
    length = oh * wp
    cols = np.empty((n, c, k, k, length), dtype=dtype)
    for i in range(k):
        for j in range(k):
            cols[:, :, i, j] = buf[:, :, i * wp + j:i * wp + j + length]
    return cols.reshape(n, c * k * k, length), oh, ow, wp


def col2im_rows(dcols: np.ndarray, x_shape: tuple[int, ...], k: int, padding: int, oh: int, wp: int) -> np.ndarray:
    """Adjoint of :func:`im2col_rows` (the wrap-around columns must hold zeros): k*k contiguous slice adds."""
    n, c, h, w = x_shape
    hp = h + 2 * padding
    length = oh * wp
    d = dcols.reshape(n, c, k, k, length)
    buf = np.zeros((n, c, hp * wp + k), dtype=dcols.dtype)
    for i in range(k):
        for j in range(k):
            buf[:, :, i * wp + j:i * wp + j + length] += d[:, :, i, j]
    return buf[:, :, :hp * wp].reshape(n, c, hp, wp)[:, :, padding:padding + h, padding:padding + w]


def col2im_batched(dcols: np.ndarray, x_shape: tuple[int, ...], k: int, stride: int, padding: int,
                   oh: int, ow: int) -> np.ndarray:
    """Adjoint of :func:`im2col_batched`: scatter-add (N, C*k*k, OH*OW) back to (N, C, H, W), in dcols' dtype
    (the caller picks one in which the sums are exact), padding cropped."""
    n, c, h, w = x_shape
    d = dcols.reshape(n, c, k, k, oh, ow)
    out = np.zeros((n, c, h + 2 * padding, w + 2 * padding), dtype=dcols.dtype)
    for i in range(k):
        for j in range(k):
            out[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride] += d[:, :, i, j]
    return out[:, :, padding:padding + h, padding:padding + w]


class Conv2d(Layer):
    """Cross-correlation, zero padding, square kernel/stride/padding, no bias. W: (out, C, k, k).

    ``out_bits``: the width of the output codes, 8, or 16 where a batch norm follows (docs §4.2: its per-channel
    normalization then starts from 16-bit values instead of a per-tensor int8 grid on which a narrow channel
    has a few levels)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 bits: int = 16, rng: np.random.Generator | None = None, fwd_round: str = "rne",
                 bwd_round: str = "pstoch", out_bits: int = 8):
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.fwd_round, self.bwd_round = fwd_round, bwd_round
        self.out_bits = out_bits
        rng = rng if rng is not None else np.random.default_rng(0)
        k = kernel_size
        self.weight = Param.init((out_channels, in_channels, k, k), in_channels * k * k, bits, rng)
        self.params = [self.weight]

    @staticmethod
    def forward_acc(x: np.ndarray, w: np.ndarray, stride: int, padding: int) -> np.ndarray:
        o, _, k, _ = w.shape
        cols, oh, ow = im2col(x, k, k, stride, padding)
        acc = int_matmul(cols, w.reshape(o, -1).T)                       # (N*OH*OW, out)
        return acc.reshape(x.shape[0], oh, ow, o).transpose(0, 3, 1, 2)

    def forward(self, x: IntTensor) -> IntTensor:
        w, wflat, aw = self.weight.gemm_view()
        o, c, k, _ = w.q.shape
        n = x.q.shape[0]
        ax = absmax(x.q)
        ft = exact_float_dtype(c * k * k, ax, aw) or np.float64
        if self.stride == 1:            # columns on the padded row grid: k*k contiguous slices (see im2col_rows)
            colsf, oh, ow, wp = im2col_rows(x.q, k, self.padding, ft)         # (N, C*k*k, OH*Wp)
        else:
            cols, oh, ow = im2col_batched(x.q, k, self.stride, self.padding)   # (N, C*k*k, OH*OW) int8
            colsf, wp = cols.astype(ft), ow
        wf = wflat.reshape(o, -1).astype(ft, copy=False)
        self.saved = (x, w, colsf, wf, ax, aw, oh, ow, wp)
        acc = matmul_exact(wf, colsf, aw, ax).reshape(n, o, oh, wp)[..., :ow]    # NCHW directly
        return requantize_checked(acc, x.exp + w.exp, self.fwd_round, "conv forward", self.out_bits)

    @staticmethod
    def backward_acc(x: np.ndarray, w: np.ndarray, g: np.ndarray, stride: int, padding: int):
        """dL/dx = col2im(g_rows @ W_flat), dL/dW = g_rows.T @ cols; exact int64."""
        o, _, k, _ = w.shape
        cols, oh, ow = im2col(x, k, k, stride, padding)
        grows = g.transpose(0, 2, 3, 1).reshape(-1, o)                     # (N*OH*OW, out)
        gw = int_matmul(grows.T, cols).reshape(w.shape)
        gx = col2im(int_matmul(grows, w.reshape(o, -1)), x.shape, k, k, stride, padding, oh, ow)
        return gx, gw

    def backward(self, g: IntTensor) -> IntTensor | None:
        x, w, colsf, wf, ax, aw, oh, ow, wp = self.saved
        g = gemm_error(g, self.bwd_round)
        o, c, k, _ = w.q.shape
        n = g.q.shape[0]
        ag = absmax(g.q)
        if wp == ow:
            gq = g.q.reshape(n, o, oh * ow)
        else:                                            # zero error on the grid's wrap-around columns
            gq = np.zeros((n, o, oh, wp), dtype=g.q.dtype)
            gq[..., :ow] = g.q
            gq = gq.reshape(n, o, oh * wp)
        # weight gradient: per sample (K = OH*OW), then the exact float64 sum over the batch
        # (the big columns stay the contiguous left operand; the small error is transposed instead)
        gqt = np.ascontiguousarray(gq.transpose(0, 2, 1))
        per = matmul_exact(colsf, gqt, ax, ag)                                      # (N, C*k*k, O)
        gw = per.sum(axis=0, dtype=np.float64) if per.dtype.kind == "f" else per.sum(axis=0)
        self.weight.grad = to_int32(gw.T.reshape(w.q.shape), "conv weight grad", n * oh * ow * ag * ax)
        self.weight.grad_exp = g.exp + x.exp
        if not self.need_input_grad:
            return None
        dcols = matmul_exact(wf.T, gq, aw, ag)                                      # (N, C*k*k, OH*OW)
        s = self.stride
        overlap = (-(-k // s)) ** 2                      # most columns summed into one input position
        at = exact_float_dtype(overlap * o, aw, ag) or np.float64
        if s == 1:
            gx = col2im_rows(dcols.astype(at, copy=False), x.q.shape, k, self.padding, oh, wp)
        else:
            gx = col2im_batched(dcols.astype(at, copy=False), x.q.shape, k, s, self.padding, oh, ow)
        return requantize_checked(gx, g.exp + w.exp, self.bwd_round, "conv input grad", self.err_bits)

    def out_shape(self, in_shape):
        c, h, w = in_shape
        k, s, p = self.kernel_size, self.stride, self.padding
        return (self.out_channels, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)

    def describe(self):
        d = {"type": "conv2d", "in_channels": self.in_channels, "out_channels": self.out_channels,
             "kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding}
        return {**d, "out_bits": self.out_bits} if self.out_bits != 8 else d


class ReLU(Layer):
    """y = max(x, 0) on codes (exponent unchanged); dL/dx = g where x > 0, else 0."""

    def forward(self, x: IntTensor) -> IntTensor:
        y = np.maximum(x.q, x.q.dtype.type(0))
        self.out = y                                    # x > 0 exactly where y != 0
        return IntTensor(y, x.exp)

    @property
    def mask(self) -> np.ndarray:
        return self.out != 0

    def backward(self, g: IntTensor) -> IntTensor:
        return IntTensor(np.where(self.out != 0, g.q, g.q.dtype.type(0)), g.exp)

    def describe(self):
        return {"type": "relu"}


class MaxPool2d(Layer):
    """Non-overlapping k x k max pool (stride = k, floor: trailing rows/cols dropped).

    Forward: max code of each window (exponent unchanged); the winner is the first maximum in
    row-major window order. Backward: g goes to the winner, 0 elsewhere (no sums, so no rescale).
    """

    def __init__(self, kernel_size: int = 2):
        self.kernel_size = kernel_size

    def _views(self, a: np.ndarray, oh: int, ow: int) -> list[np.ndarray]:
        """The k*k strided views a[:, :, i::k, j::k] (cropped to oh x ow), in row-major window order."""
        k = self.kernel_size
        return [a[:, :, i:i + k * (oh - 1) + 1:k, j:j + k * (ow - 1) + 1:k] for i in range(k) for j in range(k)]

    def forward(self, x: IntTensor) -> IntTensor:
        k = self.kernel_size
        n, c, h, w = x.q.shape
        oh, ow = h // k, w // k
        views = self._views(x.q, oh, ow)
        out = views[0].copy()
        for v in views[1:]:
            np.maximum(out, v, out=out)
        arg = np.full(out.shape, k * k - 1, dtype=np.uint8)    # window index of the first maximum
        for p in range(k * k - 2, -1, -1):
            arg[views[p] == out] = p
        self.arg, self.in_shape = arg, x.q.shape
        return IntTensor(out, x.exp)

    def backward(self, g: IntTensor) -> IntTensor:
        n, c, h, w = self.in_shape
        k = self.kernel_size
        gx = np.zeros(self.in_shape, dtype=g.q.dtype)
        zero = g.q.dtype.type(0)
        for p, v in enumerate(self._views(gx, h // k, w // k)):
            v[...] = np.where(self.arg == p, g.q, zero)
        return IntTensor(gx, g.exp)

    def out_shape(self, in_shape):
        c, h, w = in_shape
        return (c, h // self.kernel_size, w // self.kernel_size)

    def describe(self):
        return {"type": "maxpool2d", "kernel_size": self.kernel_size}


def pool_shift(n: int) -> int:
    """t = ceil(log2 n): the power of two 2**t >= n the average pools scale by (docs §4.4)."""
    return (int(n) - 1).bit_length()


MAX_POOL_WINDOW = 4096     # n * 2**t * 127 < 2**31 for every window of n <= 4096 values (§4.4, §8)


class AvgPool2d(Layer):
    """k x k average pool, stride k (non-overlapping; trailing rows/cols dropped), or ``global_pool``:
    one window over the whole map, output (N, C, 1, 1). Docs §4.4.

    n = window size, t = ceil(log2 n). Forward: S = window sum (exact), A = rdiv(S * 2**t, n) at
    exponent ex - t (A = S exactly when n = 2**t: the division is then only the exponent and the
    rounding is that of the requantization), y = R_f(A). Backward: B = rdiv(G * 2**t, n) at eg - t
    (B = G for n = 2**t), gx = R_b(B) broadcast to every position of its window, 0 on dropped rows/cols.
    """

    def __init__(self, kernel_size: int = 2, global_pool: bool = False, fwd_round: str = "rne",
                 bwd_round: str = "pstoch"):
        self.kernel_size, self.global_pool = kernel_size, global_pool
        self.fwd_round, self.bwd_round = fwd_round, bwd_round
        self.last_acc: np.ndarray | None = None

    def _window(self, h: int, w: int) -> tuple[int, int]:
        return (h, w) if self.global_pool else (self.kernel_size, self.kernel_size)

    def forward(self, x: IntTensor) -> IntTensor:
        n, c, h, w = x.q.shape
        kh, kw = self._window(h, w)
        oh, ow = h // kh, w // kw
        cnt = kh * kw
        t = pool_shift(cnt)
        ops = self.OPS
        s = ops.sum(x.q[:, :, :oh * kh, :ow * kw].reshape(n, c, oh, kh, ow, kw), (3, 5))
        acc = s if cnt == 1 << t else ops.rdiv(s << t, cnt)
        self.in_shape, self.last_acc = tuple(x.q.shape), acc
        return ops.requantize(acc, x.exp - t, self.fwd_round)

    def backward(self, g: IntTensor) -> IntTensor:
        n, c, h, w = self.in_shape
        kh, kw = self._window(h, w)
        oh, ow = h // kh, w // kw
        cnt = kh * kw
        t = pool_shift(cnt)
        ops = self.OPS
        if cnt == 1 << t:
            b = ops.IntTensor(g.q, g.exp - t)                  # exact: the same codes, exponent - t
        else:
            b = ops.requantize(ops.rdiv(ops.wide(g.q) << t, cnt), g.exp - t, self.bwd_round, self.err_bits)
        gx = ops.zeros_codes(self.in_shape, b.q)
        win = ops.broadcast_to(b.q.reshape(n, c, oh, 1, ow, 1), (n, c, oh, kh, ow, kw))
        gx[:, :, :oh * kh, :ow * kw] = win.reshape(n, c, oh * kh, ow * kw)
        return ops.IntTensor(gx, b.exp)

    def out_shape(self, in_shape):
        c, h, w = in_shape
        if self.global_pool:
            return (c, 1, 1)
        return (c, h // self.kernel_size, w // self.kernel_size)

    def describe(self):
        if self.global_pool:
            return {"type": "globalavgpool2d"}
        return {"type": "avgpool2d", "kernel_size": self.kernel_size}


class Flatten(Layer):
    """(N, ...) -> (N, prod(...)); backward reshapes back."""

    def forward(self, x: IntTensor) -> IntTensor:
        self.in_shape = tuple(x.q.shape)
        return self.OPS.IntTensor(x.q.reshape(x.q.shape[0], -1), x.exp)

    def backward(self, g: IntTensor) -> IntTensor:
        return self.OPS.IntTensor(g.q.reshape(self.in_shape), g.exp)

    def out_shape(self, in_shape):
        return (int(np.prod(in_shape)),)

    def describe(self):
        return {"type": "flatten"}


# ---------------------------------------------------------------------------------------------
# Residual additions (§4.1) and integer batch normalization (§4.2)


def add_aligned(a: IntTensor, b: IntTensor, mode: str = "rne", ops: type = NumpyOps, bits: int = 8) -> IntTensor:
    """a + b for int8 tensors with different exponents (docs §4.1).

    Align to the larger exponent e = max(ea, eb) by a rounding right shift of each operand by
    e - e_i (``mode``), add (|sum| <= 254, int16), then requantize to int8 with ``mode`` (a shift
    of 0 or 1). Exact integer arithmetic; no saturation is needed before the requantization.
    """
    e = max(int(a.exp), int(b.exp))
    s = ops.shift_round(a.q, e - int(a.exp), mode) + ops.shift_round(b.q, e - int(b.exp), mode)
    return ops.requantize(s, e, mode, bits)


def run_forward(layers: list[Layer], x: IntTensor) -> IntTensor:
    for layer in layers:
        x = layer.forward(x)
    return x


def run_backward(layers: list[Layer], g: IntTensor) -> IntTensor | None:
    for layer in reversed(layers):
        g = layer.backward(g)
        if g is None:
            return None
    return g


class Residual(Layer):
    """y = Add_f(block(x), shortcut(x)); shortcut = identity when ``shortcut`` is empty (docs §4.1).

    Backward: the int8 output error (G, eg) goes unchanged to both branches (d(a+b)/da = d(a+b)/db
    = 1: same codes, same exponent); the two input errors meet at x and are summed with the same
    exponent-aligning add, rounded with the backward mode: gx = Add_b(block'(g), shortcut'(g)).
    """

    def __init__(self, block: list[Layer], shortcut: list[Layer] | None = None,
                 fwd_round: str = "rne", bwd_round: str = "pstoch"):
        self.block, self.shortcut = list(block), list(shortcut or [])
        self.fwd_round, self.bwd_round = fwd_round, bwd_round
        self.params = [p for l in self.block + self.shortcut for p in l.params]

    def named_params(self, prefix: str) -> list[tuple[str, Param]]:
        return [np_ for part in ("block", "shortcut") for j, l in enumerate(getattr(self, part))
                for np_ in l.named_params(f"{prefix}.{part}.{j}")]

    def forward(self, x: IntTensor) -> IntTensor:
        return add_aligned(run_forward(self.block, x), run_forward(self.shortcut, x), self.fwd_round, self.OPS)

    def backward(self, g: IntTensor) -> IntTensor | None:
        for part in (self.block, self.shortcut):
            if part:
                part[0].need_input_grad = self.need_input_grad
        gb = run_backward(self.block, g)
        gs = run_backward(self.shortcut, g)
        if not self.need_input_grad:
            return None
        return add_aligned(gb, gs, self.bwd_round, self.OPS, self.err_bits)

    def out_shape(self, in_shape):
        for l in self.block:
            in_shape = l.out_shape(in_shape)
        return in_shape


def layer_named_params(layer: Layer, prefix: str) -> list[tuple[str, Param]]:
    """(name, Param) of a layer: ``prefix.weight``; ``prefix.gamma``/``.beta``; residuals recurse."""
    return layer.named_params(prefix)


class SequentialCore:
    """A list of layers run in order (the containers of both engines share it).  The first layer computes no
    input error: the data needs none."""

    def __init__(self, layers: list[Layer], desc: dict):
        self.layers, self.desc = layers, desc
        self.err_bits = desc.get("error_bits", 8)   # the loss gradient's width too (softmax_cross_entropy_grad)
        for p in self.params():
            p.view = desc.get("weight_view", "fixed")
        if layers:
            layers[0].need_input_grad = False

    def named_params(self) -> list[tuple[str, Param]]:
        return [np_ for i, l in enumerate(self.layers) for np_ in l.named_params(f"layers.{i}")]

    def params(self) -> list[Param]:
        return [p for _, p in self.named_params()]

    def forward(self, x: IntTensor) -> IntTensor:
        return run_forward(self.layers, x)

    def backward(self, g: IntTensor) -> None:
        run_backward(self.layers, g)


#: Largest ``gain_shift`` of a batch norm (its output scaled by 2**gain_shift; see BatchNorm).
MAX_GAIN_SHIFT = 8

BN_MAX_COUNT = INT32_LIMIT // (127 * 128)   # 132104: sum of G << 7 over the batch fits int32


PROJ_CAP = 1 << 21          # |Xh * pg| <= 2**21 = |G << 14| bound: |g8 * h| < 127 * 3 * 2**21 < 2**31 (§4.2)


def projection_coefficient(dgamma: np.ndarray, xh: np.ndarray, ops: type = NumpyOps, frac: int = 14) -> np.ndarray:
    """pg = rdiv(sum(G Xh) * 2**frac, sum(Xh^2)) per channel, capped to |pg| <= PROJ_CAP // max|Xh| (docs §4.2).

    Xh * pg (at eg - frac; frac 14 for int8 errors, 6 for 16-bit ones) is the projection of the error on the normalized input. Float batch norm subtracts
    Xh * mean(G Xh) for a unit-variance Xh; this Xh = 128 D / r (in units of 2**-7) has a variance of ~1/144,
    so the projection is divided by sum(Xh^2) instead of M. The cap (rarely reached: only when Xh is concentrated on a few values)
    keeps every term of the input gradient within int32."""
    sxx = ops.sum(xh * xh, 1)
    pg = ops.rdiv(ops.wide(dgamma) << frac, ops.clip(sxx, 1, None))
    cap = PROJ_CAP // ops.clip(ops.amax(abs(xh), 1), 1, None) if xh.shape[1] else ops.zeros(pg, 64)
    return ops.clip(pg, -cap, cap)


def range_reciprocal(r: np.ndarray, shift: int, ops: type = NumpyOps) -> np.ndarray:
    """rdiv(2**shift, r) per channel, 0 where r == 0 (a dead channel): the fixed-point 1 / r of the batch norm."""
    live = r > 0
    return ops.where(live, ops.rdiv((ops.wide(r) * 0 + 1) << shift, ops.clip(r, 1, None)), 0)


class BatchNorm(Layer):
    """Integer range batch normalization, normalized by the exact range (docs §4.2).

    Per channel c (axis 1; statistics over the batch and, for (N, C, H, W), the pixels; M values):
    mu = rdiv(sum X, M); D = X - mu; r = max X - min X; inv = rdiv(2**23, r);
    Xh = sat8(shift(D * inv, 16, forward)) at exponent -7 (|Xh| <= 128: 128 D / r, the range-normalized
    input); A = Xh * G8 + shift(B8, (eγ - 7 + s) - eβ) at exponent eγ - 7 + s; y = R_f(A), where s is
    ``gain_shift`` (0 by default): the output times 2**s, Banner et al.'s range correction as an exponent (the
    range of M values is ~2 sqrt(2 ln M) standard deviations, ~9 at ResNet-20's M; s = 3 restores about unit
    scale), so no code changes, only exponents (forward, dgamma and the input error, each + s).
    The exact 1 / r (a fixed-point reciprocal, |D * inv| < 2**31 for int8 inputs) replaced a shift by
    bitlen(r) - 7, which scaled each channel by 128 / 2**bitlen(r), anywhere in (64 / r, 128 / r]: a channel
    whose range crossed a power of two between batches saw its output halve or double.  Measured on the
    CIFAR-10 batch-norm CNN (2000 images, 6 epochs, seeds 0 / 1): held-out accuracy 0.402 / 0.400 -> 0.447 /
    0.442 (training loss 1.545 / 1.523 -> 1.325 / 1.346).
    gamma / beta: learnable Params (per channel, int16 or int8 master codes, initialized to 1 and 0)
    trained by the integer SGD; always batch statistics (no running averages).
    """

    def __init__(self, num_features: int, bits: int = 16, fwd_round: str = "rne", bwd_round: str = "pstoch",
                 gain_shift: int = 0):
        self.num_features = num_features
        self.fwd_round, self.bwd_round = fwd_round, bwd_round
        self.gain_shift = gain_shift
        e = -((qmax(bits) // 4).bit_length() - 1)          # 1.0 -> 2**-e ~ a quarter of the range
        self.gamma = Param(np.full(num_features, 1 << -e, dtype=np.int64), e, bits)
        self.beta = Param(np.zeros(num_features, dtype=np.int64), e, bits)
        self.gamma.role = self.beta.role = "norm"
        self.params = [self.gamma, self.beta]

    def named_params(self, prefix: str) -> list[tuple[str, Param]]:
        return [(f"{prefix}.gamma", self.gamma), (f"{prefix}.beta", self.beta)]

    def _cm(self, q: np.ndarray) -> np.ndarray:
        """(N, C, ...) -> channel-major (C, M), int64."""
        return self.OPS.moveaxis(self.OPS.wide(q), 1, 0).reshape(q.shape[1], -1)

    def _uncm(self, a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        c = shape[1]
        return self.OPS.moveaxis(a.reshape((c, shape[0], *shape[2:])), 0, 1)

    def forward(self, x: IntTensor) -> IntTensor:
        ops = self.OPS
        xc = self._cm(x.q)
        m = xc.shape[1]
        mu = ops.rdiv(ops.sum(xc, 1), m)
        d = xc - mu[:, None]
        r = (ops.amax(xc, 1) - ops.amin(xc, 1)) if m else ops.zeros(mu, 64)
        k = ops.bitlen(r)
        # 128 D / r: 8 more bits of reciprocal for a 16-bit input (r up to 65534; |D * inv| <= 2**31 either way)
        wide = 8 if x.q.dtype.itemsize == 2 else 0
        xh = ops.saturate(ops.shift(d * range_reciprocal(r, 23 + wide, ops)[:, None], 16 + wide, self.fwd_round), 8)
        g8, b8 = self.gamma.int8(), self.beta.int8()
        eo = g8.exp - 7 + self.gain_shift            # Xh * G8 is 2**gain_shift * gamma * Xh at exponent eo
        bal = ops.shift(ops.wide(b8.q), eo - b8.exp, self.fwd_round)
        acc = xh * ops.wide(g8.q)[:, None] + bal[:, None]
        self.saved = (x.exp, tuple(x.q.shape), xh, r, k, g8)
        self.last_acc = self._uncm(acc, x.q.shape)
        return ops.requantize(self.last_acc, eo, self.fwd_round)

    def backward(self, g: IntTensor) -> IntTensor | None:
        ops = self.OPS
        ex, shape, xh, r, k, g8 = self.saved
        gc = self._cm(g.q)
        m = gc.shape[1]
        wide = g.q.dtype.itemsize == 2
        if wide:        # 16-bit errors: int64 sums, narrowed to int32 gradients (a rounding shift, rarely taken)
            dbeta, dgamma = ops.sum(gc, 1), ops.sum(gc * xh, 1)
            gb32 = ops.requantize(dbeta, g.exp, self.bwd_round, 32)
            gg32 = ops.requantize(dgamma, g.exp - 7 + self.gain_shift, self.bwd_round, 32)
            self.beta.grad, self.beta.grad_exp = ops.weight_grad(gb32.q), gb32.exp
            self.gamma.grad, self.gamma.grad_exp = ops.weight_grad(gg32.q), gg32.exp
        else:
            dbeta = ops.check_int32(ops.sum(gc, 1), "batchnorm beta grad")
            dgamma = ops.check_int32(ops.sum(gc * xh, 1), "batchnorm gamma grad")
            self.gamma.grad, self.gamma.grad_exp = ops.weight_grad(dgamma), g.exp - 7 + self.gain_shift
            self.beta.grad, self.beta.grad_exp = ops.weight_grad(dbeta), g.exp
        if not self.need_input_grad:
            return None
        # h, the error minus its mean and its projection on Xh, at eg - f: f = 14 for int8 errors, 6 for 16-bit
        # ones (8 bits fewer of fraction for 8 more of code), so |h| < 3 * 2**21 and g8 * h fits int32 either way
        f = 6 if wide else 14
        if wide:
            mb = ops.rdiv(dbeta << 6, m)                                    # mean(G) at eg - 6
        else:
            mb = ops.rdiv(ops.check_int32(dbeta << 7, "batchnorm mean"), m) << 7   # mean(G) at eg - 7, then eg - 14
        pg = projection_coefficient(dgamma, xh, ops, f)
        h = (gc << f) - mb[:, None] - xh * pg[:, None]                     # at eg - f
        a = ops.check_int32(ops.wide(g8.q)[:, None] * h, "batchnorm input grad")
        live = r > 0
        kmin = int(k[live].min()) if live.any() else 0
        # dXh/dX = 128 / r: a * 2**(kmin - 1) / r (<= a: r >= 2**(kmin - 1), so int32 holds it; dead channels 0)
        out = ops.shift(a * range_reciprocal(r, kmin + 15, ops)[:, None], 16, self.bwd_round)
        return ops.requantize(self._uncm(out, shape), g.exp - f + g8.exp - ex - kmin + 1 + self.gain_shift,
                              self.bwd_round, self.err_bits)

    def describe(self):
        d = {"type": "batchnorm", "num_features": self.num_features}
        return {**d, "gain_shift": self.gain_shift} if self.gain_shift else d
