"""Integer layers on torch integer tensors: the twins of :mod:`inttrain.micro.layers` (§4-§5).

Every GEMM is the project's exact integer kernel :func:`inttrain.kernels.matmul.int_mm`
(``torch._int_mm``, int8 x int8 -> int32); rescaling is :func:`.ops.requantize`. ``forward``
keeps its int32 accumulator in ``last_acc`` (for parity tests), and ``backward(g)`` leaves the
exact int32 weight gradient in ``weight.grad`` (exponent ``weight.grad_exp``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..micro.layers import PROJ_CAP
from .ops import IntTensor, check_int32, gemm, qmax, requantize, saturate, shift, shift_left_saturate, shift_round

_MASTER_DTYPE = {16: torch.int16, 8: torch.int8}


class Param:
    """Master codes ``acc`` (int16 or int8 tensor, ``bits``) at the fixed exponent ``exp``."""

    def __init__(self, acc: torch.Tensor, exp: int, bits: int):
        if bits not in (8, 16):
            raise ValueError("weight bits must be 8 or 16")
        if acc.dtype.is_floating_point:
            raise TypeError("master weights are integer codes")
        m = qmax(bits)
        if acc.numel() and (int(acc.min()) < -m or int(acc.max()) > m):
            raise ValueError(f"master codes outside [-{m}, {m}]")
        self.bits = bits
        self.acc = acc.to(_MASTER_DTYPE[bits])
        self.exp = int(exp)
        self.exp0 = int(exp)         # the initial exponent (micro's Param.exp0)
        self.grad: torch.Tensor | None = None
        self.grad_exp = 0
        self.mom: torch.Tensor | None = None

    @classmethod
    def from_micro(cls, p, device: torch.device | str | None = None) -> "Param":
        """Copy a :class:`inttrain.micro.layers.Param` (NumPy codes) into torch."""
        acc = torch.from_numpy(np.array(p.acc, copy=True))        # a writable copy (micro's codes may be read-only)
        out = cls(acc.to(device) if device is not None else acc, p.exp, p.bits)
        out.exp0 = p.exp0
        return out

    def int8(self) -> IntTensor:
        """The int8 weight view used by the GEMMs: sat8(shift_round(W16, 8, rne)) at exp + 8 (int16)."""
        if self.bits == 8:
            return IntTensor(self.acc, self.exp)
        return IntTensor(saturate(shift_round(self.acc, 8, "rne"), 8).to(torch.int8), self.exp + 8)


class Layer:
    params: list[Param] = []
    need_input_grad = True

    def forward(self, x: IntTensor) -> IntTensor:
        raise NotImplementedError

    def backward(self, g: IntTensor) -> IntTensor | None:
        raise NotImplementedError


class Linear(Layer):
    """y = R_f(x @ W8.T); grads GW = g.T @ x, gx = R_b(g @ W8). No bias."""

    def __init__(self, weight: Param, fwd_round: str = "rne", bwd_round: str = "pstoch"):
        self.weight = weight
        self.out_features, self.in_features = weight.acc.shape
        self.fwd_round, self.bwd_round = fwd_round, bwd_round
        self.params = [weight]
        self.last_acc: torch.Tensor | None = None

    def forward(self, x: IntTensor) -> IntTensor:
        w = self.weight.int8()
        self.saved = (x, w)
        acc = check_int32(gemm(x.q, w.q.t()), "linear forward")
        self.last_acc = acc
        return requantize(acc, x.exp + w.exp, self.fwd_round)

    def backward(self, g: IntTensor) -> IntTensor | None:
        x, w = self.saved
        self.weight.grad = check_int32(gemm(g.q.t(), x.q), "linear weight grad")
        self.weight.grad_exp = g.exp + x.exp
        if not self.need_input_grad:
            return None
        gx = check_int32(gemm(g.q, w.q), "linear input grad")
        return requantize(gx, g.exp + w.exp, self.bwd_round)


def im2col(x: torch.Tensor, k: int, stride: int, padding: int) -> tuple[torch.Tensor, int, int]:
    """(N, C, H, W) -> columns (N*OH*OW, C*k*k), rows ordered (n, oh, ow), columns (c, i, j)."""
    xp = F.pad(x, (padding, padding, padding, padding)) if padding else x
    win = xp.unfold(2, k, stride).unfold(3, k, stride)            # (N, C, OH, OW, k, k)
    n, c, oh, ow = win.shape[:4]
    return win.permute(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * k * k), oh, ow


def col2im(cols: torch.Tensor, x_shape, k: int, stride: int, padding: int, oh: int, ow: int) -> torch.Tensor:
    """Adjoint of im2col: exact integer scatter-add of the columns back to (N, C, H, W), padding cropped."""
    n, c, h, w = x_shape
    cols = cols.to(torch.int64).reshape(n, oh, ow, c, k, k)
    out = torch.zeros((n, c, h + 2 * padding, w + 2 * padding), dtype=torch.int64, device=cols.device)
    for i in range(k):
        for j in range(k):
            out[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride] += cols[:, :, :, :, i, j].permute(0, 3, 1, 2)
    return out[:, :, padding:padding + h, padding:padding + w]


class Conv2d(Layer):
    """Cross-correlation with zero padding, square kernel, no bias; W: (O, C, k, k); im2col + int GEMM."""

    def __init__(self, weight: Param, stride: int = 1, padding: int = 0, fwd_round: str = "rne",
                 bwd_round: str = "pstoch"):
        self.weight = weight
        self.out_channels, self.in_channels, self.kernel_size, _ = weight.acc.shape
        self.stride, self.padding = stride, padding
        self.fwd_round, self.bwd_round = fwd_round, bwd_round
        self.params = [weight]
        self.last_acc: torch.Tensor | None = None

    def forward(self, x: IntTensor) -> IntTensor:
        w = self.weight.int8()
        o, k = self.out_channels, self.kernel_size
        cols, oh, ow = im2col(x.q, k, self.stride, self.padding)
        self.saved = (x, w, cols, oh, ow)
        acc = gemm(cols, w.q.reshape(o, -1).t()).reshape(x.q.shape[0], oh, ow, o).permute(0, 3, 1, 2)
        acc = check_int32(acc, "conv forward")
        self.last_acc = acc
        return requantize(acc, x.exp + w.exp, self.fwd_round)

    def backward(self, g: IntTensor) -> IntTensor | None:
        x, w, cols, oh, ow = self.saved
        o, k = self.out_channels, self.kernel_size
        grows = g.q.permute(0, 2, 3, 1).reshape(-1, o)                # (N*OH*OW, O)
        self.weight.grad = check_int32(gemm(grows.t(), cols).reshape(w.q.shape), "conv weight grad")
        self.weight.grad_exp = g.exp + x.exp
        if not self.need_input_grad:
            return None
        gx = col2im(gemm(grows, w.q.reshape(o, -1)), x.q.shape, k, self.stride, self.padding, oh, ow)
        return requantize(check_int32(gx, "conv input grad"), g.exp + w.exp, self.bwd_round)


class ReLU(Layer):
    """y = max(x, 0) on codes; dL/dx = g where x > 0, else 0 (exponents unchanged)."""

    def forward(self, x: IntTensor) -> IntTensor:
        self.off = x.q <= 0
        return IntTensor(x.q.masked_fill(self.off, 0), x.exp)

    def backward(self, g: IntTensor) -> IntTensor:
        return IntTensor(g.q.masked_fill(self.off, 0), g.exp)


class MaxPool2d(Layer):
    """Non-overlapping k x k max pool (stride k, trailing rows/cols dropped); first maximum wins."""

    def __init__(self, kernel_size: int = 2):
        self.kernel_size = kernel_size

    def forward(self, x: IntTensor) -> IntTensor:
        k = self.kernel_size
        n, c, h, w = x.q.shape
        oh, ow = h // k, w // k
        win = x.q[:, :, :oh * k, :ow * k].reshape(n, c, oh, k, ow, k).permute(0, 1, 2, 4, 3, 5)
        win = win.reshape(n, c, oh, ow, k * k)
        self.arg = win.argmax(dim=-1, keepdim=True)                    # first maximum (torch semantics)
        self.in_shape = tuple(x.q.shape)
        return IntTensor(torch.gather(win, -1, self.arg)[..., 0], x.exp)

    def backward(self, g: IntTensor) -> IntTensor:
        k = self.kernel_size
        n, c, h, w = self.in_shape
        oh, ow = h // k, w // k
        win = torch.zeros((n, c, oh, ow, k * k), dtype=g.q.dtype, device=g.q.device)
        win.scatter_(-1, self.arg, g.q.unsqueeze(-1))
        gx = torch.zeros(self.in_shape, dtype=g.q.dtype, device=g.q.device)
        gx[:, :, :oh * k, :ow * k] = win.reshape(n, c, oh, ow, k, k).permute(0, 1, 2, 4, 3, 5).reshape(n, c, oh * k, ow * k)
        return IntTensor(gx, g.exp)


def pool_shift(n: int) -> int:
    """t = ceil(log2 n) (docs §4.4)."""
    return (int(n) - 1).bit_length()


def _rdiv(a: torch.Tensor, m: int) -> torch.Tensor:
    return torch.div(a + m // 2, m, rounding_mode="floor")


class AvgPool2d(Layer):
    """k x k average pool, stride k (trailing rows/cols dropped), or ``global_pool`` (output (N, C, 1, 1)).

    Twin of :class:`inttrain.micro.layers.AvgPool2d` (docs §4.4): A = rdiv(S * 2**t, n) at ex - t with
    t = ceil(log2 n) (A = S for n = 2**t), y = R_f(A); backward B = rdiv(G * 2**t, n) (B = G for
    n = 2**t) at eg - t, R_b, broadcast over the window.
    """

    def __init__(self, kernel_size: int = 2, global_pool: bool = False, fwd_round: str = "rne",
                 bwd_round: str = "pstoch"):
        self.kernel_size, self.global_pool = kernel_size, global_pool
        self.fwd_round, self.bwd_round = fwd_round, bwd_round
        self.last_acc: torch.Tensor | None = None

    def _window(self, h: int, w: int) -> tuple[int, int]:
        return (h, w) if self.global_pool else (self.kernel_size, self.kernel_size)

    def forward(self, x: IntTensor) -> IntTensor:
        n, c, h, w = x.q.shape
        kh, kw = self._window(h, w)
        oh, ow = h // kh, w // kw
        cnt = kh * kw
        t = pool_shift(cnt)
        s = x.q[:, :, :oh * kh, :ow * kw].reshape(n, c, oh, kh, ow, kw).to(torch.int64).sum(dim=(3, 5))
        acc = s if cnt == 1 << t else _rdiv(s << t, cnt)
        self.in_shape, self.last_acc = tuple(x.q.shape), acc
        return requantize(acc, x.exp - t, self.fwd_round)

    def backward(self, g: IntTensor) -> IntTensor:
        n, c, h, w = self.in_shape
        kh, kw = self._window(h, w)
        oh, ow = h // kh, w // kw
        cnt = kh * kw
        t = pool_shift(cnt)
        if cnt == 1 << t:
            b = IntTensor(g.q, g.exp - t)
        else:
            b = requantize(_rdiv(g.q.to(torch.int64) << t, cnt), g.exp - t, self.bwd_round)
        gx = torch.zeros(self.in_shape, dtype=torch.int8, device=g.q.device)
        win = b.q.to(torch.int8).reshape(n, c, oh, 1, ow, 1).expand(n, c, oh, kh, ow, kw)
        gx[:, :, :oh * kh, :ow * kw] = win.reshape(n, c, oh * kh, ow * kw)
        return IntTensor(gx, b.exp)


class Flatten(Layer):
    """(N, ...) -> (N, prod(...)); backward reshapes back."""

    def forward(self, x: IntTensor) -> IntTensor:
        self.in_shape = tuple(x.q.shape)
        return IntTensor(x.q.reshape(x.q.shape[0], -1), x.exp)

    def backward(self, g: IntTensor) -> IntTensor:
        return IntTensor(g.q.reshape(self.in_shape), g.exp)


# ---------------------------------------------------------------------------------------------
# Residual additions (§4.1) and integer batch normalization (§4.2): twins of inttrain.micro.layers


def add_aligned(a: IntTensor, b: IntTensor, mode: str = "rne") -> IntTensor:
    """a + b with exponent alignment: right-shift both to e = max(ea, eb) (``mode``), add, requantize."""
    e = max(int(a.exp), int(b.exp))
    s = shift_round(a.q, e - int(a.exp), mode) + shift_round(b.q, e - int(b.exp), mode)
    return requantize(s, e, mode)


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
    """y = Add_f(block(x), shortcut(x)) (identity shortcut when empty); gx = Add_b(block'(g), shortcut'(g))."""

    def __init__(self, block: list[Layer], shortcut: list[Layer] | None = None,
                 fwd_round: str = "rne", bwd_round: str = "pstoch"):
        self.block, self.shortcut = list(block), list(shortcut or [])
        self.fwd_round, self.bwd_round = fwd_round, bwd_round
        self.params = [p for l in self.block + self.shortcut for p in l.params]

    def named_params(self, prefix: str):
        out = []
        for part in ("block", "shortcut"):
            for j, l in enumerate(getattr(self, part)):
                out += layer_named_params(l, f"{prefix}.{part}.{j}")
        return out

    def forward(self, x: IntTensor) -> IntTensor:
        return add_aligned(run_forward(self.block, x), run_forward(self.shortcut, x), self.fwd_round)

    def backward(self, g: IntTensor) -> IntTensor | None:
        for part in (self.block, self.shortcut):
            if part:
                part[0].need_input_grad = self.need_input_grad
        gb = run_backward(self.block, g)
        gs = run_backward(self.shortcut, g)
        if not self.need_input_grad:
            return None
        return add_aligned(gb, gs, self.bwd_round)


def layer_named_params(layer: Layer, prefix: str) -> list[tuple[str, Param]]:
    if isinstance(layer, Residual):
        return layer.named_params(prefix)
    if isinstance(layer, BatchNorm):
        return [(f"{prefix}.gamma", layer.gamma), (f"{prefix}.beta", layer.beta)]
    if hasattr(layer, "weight"):
        return [(f"{prefix}.weight", layer.weight)]
    return []


_POW2 = [1 << i for i in range(10)]


def bitlen(r: torch.Tensor) -> torch.Tensor:
    """bit_length of non-negative integers < 2**10, elementwise (0 for 0)."""
    p = torch.tensor(_POW2, dtype=torch.int64, device=r.device)
    return (r.to(torch.int64).unsqueeze(-1) >= p).sum(-1)


def rdiv(a: torch.Tensor, m: int) -> torch.Tensor:
    """round(a / m), halves up: (a + m // 2) // m."""
    return torch.div(a.to(torch.int64) + m // 2, m, rounding_mode="floor")


def _rows_shift(a: torch.Tensor, s: torch.Tensor, mode: str) -> torch.Tensor:
    out = torch.empty_like(a)
    for sv in sorted(set(s.tolist())):
        rows = s == sv
        out[rows] = shift_round(a[rows], sv, mode) if sv >= 0 else shift_left_saturate(a[rows], -sv)
    return out


class BatchNorm(Layer):
    """Integer range batch normalization (docs §4.2); twin of :class:`inttrain.micro.layers.BatchNorm`."""

    def __init__(self, gamma: Param, beta: Param, fwd_round: str = "rne", bwd_round: str = "pstoch"):
        self.gamma, self.beta = gamma, beta
        self.num_features = gamma.acc.shape[0]
        self.fwd_round, self.bwd_round = fwd_round, bwd_round
        self.params = [gamma, beta]
        self.last_acc: torch.Tensor | None = None

    @staticmethod
    def _cm(q: torch.Tensor) -> torch.Tensor:
        return q.to(torch.int64).movedim(1, 0).reshape(q.shape[1], -1)

    @staticmethod
    def _uncm(a: torch.Tensor, shape) -> torch.Tensor:
        return a.reshape((shape[1], shape[0], *shape[2:])).movedim(0, 1)

    def forward(self, x: IntTensor) -> IntTensor:
        xc = self._cm(x.q)
        m = xc.shape[1]
        mu = rdiv(xc.sum(dim=1), m)
        d = xc - mu[:, None]
        r = xc.amax(dim=1) - xc.amin(dim=1)
        k = bitlen(r)
        xh = saturate(_rows_shift(d, k - 7, self.fwd_round), 8)
        g8, b8 = self.gamma.int8(), self.beta.int8()
        eo = g8.exp - 7
        bal = shift(b8.q.to(torch.int64), eo - b8.exp, self.fwd_round)
        acc = xh * g8.q.to(torch.int64)[:, None] + bal[:, None]
        self.saved = (x.exp, tuple(x.q.shape), xh, r, k, g8)
        self.last_acc = self._uncm(acc, x.q.shape)
        return requantize(self.last_acc, eo, self.fwd_round)

    def backward(self, g: IntTensor) -> IntTensor | None:
        ex, shape, xh, r, k, g8 = self.saved
        gc = self._cm(g.q)
        m = gc.shape[1]
        dbeta = check_int32(gc.sum(dim=1), "batchnorm beta grad")
        dgamma = check_int32((gc * xh).sum(dim=1), "batchnorm gamma grad")
        self.gamma.grad, self.gamma.grad_exp = dgamma.to(torch.int32), g.exp - 7
        self.beta.grad, self.beta.grad_exp = dbeta.to(torch.int32), g.exp
        if not self.need_input_grad:
            return None
        mb = rdiv(check_int32(dbeta << 7, "batchnorm mean"), m)
        sxx = torch.clamp((xh * xh).sum(dim=1), min=1)              # micro's projection_coefficient (§4.2)
        pg = rdiv(dgamma << 14, sxx)
        amx = torch.clamp(xh.abs().amax(dim=1), min=1)
        cap = torch.div(torch.full_like(amx, PROJ_CAP), amx, rounding_mode="floor")
        pg = torch.maximum(torch.minimum(pg, cap), -cap)
        h = (gc << 14) - (mb << 7)[:, None] - xh * pg[:, None]
        a = check_int32(g8.q.to(torch.int64)[:, None] * h, "batchnorm input grad")
        live = r > 0
        kmin = int(k[live].min()) if bool(live.any()) else 0
        s = torch.where(live, k - kmin, torch.full_like(k, 63))
        out = _rows_shift(a, s, self.bwd_round)
        return requantize(self._uncm(out, shape), g.exp - 14 + g8.exp - ex - kmin, self.bwd_round)
