"""Integer layers, each with its forward and its hand-derived backward side by side.

Tensors flowing between layers are IntTensor (int8 codes + exponent). ``forward`` saves what the
backward needs; ``backward(g)`` takes the int8 error of the output and returns the int8 error of
the input (or None when ``need_input_grad`` is False) and leaves the weight gradient in the
parameter as an exact int64 accumulator (value grad * 2**grad_exp). See docs/integer-training.md.
"""

from __future__ import annotations

import numpy as np

from .gemm import int_matmul
from .ops import IntTensor, qmax, requantize, saturate, shift_round

INT32_LIMIT = 2**31 - 1
MAX_K = INT32_LIMIT // (127 * 127)   # 133144: longest reduction whose int8 x int8 sum fits int32


def check_int32(acc: np.ndarray, what: str) -> np.ndarray:
    """Accumulators are int32 in the spec; the shapes are validated so this never fires."""
    if acc.size and int(np.abs(acc).max()) > INT32_LIMIT:
        raise OverflowError(f"{what}: int32 accumulator overflow")
    return acc


class Param:
    """A weight: master codes ``acc`` (int16 or int8, ``bits``) at fixed exponent ``exp``.

    The forward uses the int8 view: for bits == 16, w8 = saturate(shift_round(acc, 8, rne)) at
    exp + 8; for bits == 8 the codes themselves. ``grad``/``grad_exp`` hold the last gradient,
    ``mom`` the int32 momentum buffer of the optimizer.
    """

    def __init__(self, acc: np.ndarray, exp: int, bits: int):
        if bits not in (8, 16):
            raise ValueError("weight bits must be 8 or 16")
        self.bits = bits
        self.acc = acc.astype(np.int16 if bits == 16 else np.int8)
        self.exp = int(exp)
        self.grad: np.ndarray | None = None
        self.grad_exp = 0
        self.mom: np.ndarray | None = None

    def int8(self) -> IntTensor:
        if self.bits == 8:
            return IntTensor(self.acc, self.exp)
        return IntTensor(saturate(shift_round(self.acc, 8, "rne"), 8).astype(np.int8), self.exp + 8)

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
    params: list[Param] = []
    need_input_grad = True

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
        w = self.weight.int8()
        self.saved = (x, w)
        acc = check_int32(self.forward_acc(x.q, w.q), "linear forward")
        return requantize(acc, x.exp + w.exp, self.fwd_round)

    @staticmethod
    def backward_acc(x: np.ndarray, w: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """dL/dx = g @ W (N, in); dL/dW = g.T @ x (out, in); exact int64."""
        return int_matmul(g, w), int_matmul(g.T, x)

    def backward(self, g: IntTensor) -> IntTensor | None:
        x, w = self.saved
        self.weight.grad = check_int32(int_matmul(g.q.T, x.q), "linear weight grad")
        self.weight.grad_exp = g.exp + x.exp
        if not self.need_input_grad:
            return None
        gx = check_int32(int_matmul(g.q, w.q), "linear input grad")
        return requantize(gx, g.exp + w.exp, self.bwd_round)

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


class Conv2d(Layer):
    """Cross-correlation, zero padding, square kernel/stride/padding, no bias. W: (out, C, k, k)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 bits: int = 16, rng: np.random.Generator | None = None, fwd_round: str = "rne",
                 bwd_round: str = "pstoch"):
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.fwd_round, self.bwd_round = fwd_round, bwd_round
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
        w = self.weight.int8()
        o, _, k, _ = w.q.shape
        cols, oh, ow = im2col(x.q, k, k, self.stride, self.padding)
        self.saved = (x, w, cols, oh, ow)
        acc = int_matmul(cols, w.q.reshape(o, -1).T).reshape(x.q.shape[0], oh, ow, o).transpose(0, 3, 1, 2)
        return requantize(check_int32(acc, "conv forward"), x.exp + w.exp, self.fwd_round)

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
        x, w, cols, oh, ow = self.saved
        o, _, k, _ = w.q.shape
        grows = g.q.transpose(0, 2, 3, 1).reshape(-1, o)
        self.weight.grad = check_int32(int_matmul(grows.T, cols).reshape(w.q.shape), "conv weight grad")
        self.weight.grad_exp = g.exp + x.exp
        if not self.need_input_grad:
            return None
        gx = col2im(int_matmul(grows, w.q.reshape(o, -1)), x.q.shape, k, k, self.stride, self.padding, oh, ow)
        return requantize(check_int32(gx, "conv input grad"), g.exp + w.exp, self.bwd_round)

    def out_shape(self, in_shape):
        c, h, w = in_shape
        k, s, p = self.kernel_size, self.stride, self.padding
        return (self.out_channels, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)

    def describe(self):
        return {"type": "conv2d", "in_channels": self.in_channels, "out_channels": self.out_channels,
                "kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding}


class ReLU(Layer):
    """y = max(x, 0) on codes (exponent unchanged); dL/dx = g where x > 0, else 0."""

    def forward(self, x: IntTensor) -> IntTensor:
        self.mask = x.q > 0
        return IntTensor(np.where(self.mask, x.q, 0).astype(x.q.dtype), x.exp)

    def backward(self, g: IntTensor) -> IntTensor:
        return IntTensor(np.where(self.mask, g.q, 0).astype(g.q.dtype), g.exp)

    def describe(self):
        return {"type": "relu"}


class MaxPool2d(Layer):
    """Non-overlapping k x k max pool (stride = k, floor: trailing rows/cols dropped).

    Forward: max code of each window (exponent unchanged); the winner is the first maximum in
    row-major window order. Backward: g goes to the winner, 0 elsewhere (no sums, so no rescale).
    """

    def __init__(self, kernel_size: int = 2):
        self.kernel_size = kernel_size

    def forward(self, x: IntTensor) -> IntTensor:
        k = self.kernel_size
        n, c, h, w = x.q.shape
        oh, ow = h // k, w // k
        win = x.q[:, :, :oh * k, :ow * k].reshape(n, c, oh, k, ow, k).transpose(0, 1, 2, 4, 3, 5)
        win = win.reshape(n, c, oh, ow, k * k)
        self.arg = win.argmax(axis=-1)                                      # first maximum
        self.in_shape = x.q.shape
        out = np.take_along_axis(win, self.arg[..., None], axis=-1)[..., 0]
        return IntTensor(out, x.exp)

    def backward(self, g: IntTensor) -> IntTensor:
        k = self.kernel_size
        n, c, h, w = self.in_shape
        oh, ow = h // k, w // k
        win = np.zeros((n, c, oh, ow, k * k), dtype=g.q.dtype)
        np.put_along_axis(win, self.arg[..., None], g.q[..., None], axis=-1)
        gx = np.zeros(self.in_shape, dtype=g.q.dtype)
        gx[:, :, :oh * k, :ow * k] = win.reshape(n, c, oh, ow, k, k).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, oh * k, ow * k)
        return IntTensor(gx, g.exp)

    def out_shape(self, in_shape):
        c, h, w = in_shape
        return (c, h // self.kernel_size, w // self.kernel_size)

    def describe(self):
        return {"type": "maxpool2d", "kernel_size": self.kernel_size}


class Flatten(Layer):
    """(N, ...) -> (N, prod(...)); backward reshapes back."""

    def forward(self, x: IntTensor) -> IntTensor:
        self.in_shape = x.q.shape
        return IntTensor(x.q.reshape(x.q.shape[0], -1), x.exp)

    def backward(self, g: IntTensor) -> IntTensor:
        return IntTensor(g.q.reshape(self.in_shape), g.exp)

    def out_shape(self, in_shape):
        return (int(np.prod(in_shape)),)

    def describe(self):
        return {"type": "flatten"}
