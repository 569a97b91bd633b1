"""Integer layers on torch integer tensors: the twins of :mod:`inttrain.micro.layers` (§4-§5).

Residual add, batch norm, average pool, flatten and the containers are micro's classes themselves, run on
:class:`~.ops.TorchOps` (one definition of the arithmetic); Linear, Conv2d, ReLU and max pool have their own
torch forms here, since micro's are NumPy fast paths.

Every GEMM is the project's exact integer kernel :func:`inttrain.kernels.matmul.int_mm`
(``torch._int_mm``, int8 x int8 -> int32); rescaling is :func:`.ops.requantize`. ``forward``
keeps its int32 accumulator in ``last_acc`` (for parity tests), and ``backward(g)`` leaves the
exact int32 weight gradient in ``weight.grad`` (exponent ``weight.grad_exp``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..micro import layers as _ml
from .ops import IntTensor, TorchOps, check_int32, gemm, qmax, requantize, saturate, shift_round

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
        self.role = "weight"         # micro's Param.role
        self.view = "fixed"          # micro's Param.view
        self.grad: torch.Tensor | None = None
        self.grad_exp = 0
        self.mom: torch.Tensor | None = None
        self.frac: torch.Tensor | None = None     # micro's Param.frac

    @classmethod
    def from_micro(cls, p, device: torch.device | str | None = None) -> "Param":
        """Copy a :class:`inttrain.micro.layers.Param` (NumPy codes) into torch."""
        acc = torch.from_numpy(np.array(p.acc, copy=True))        # a writable copy (micro's codes may be read-only)
        out = cls(acc.to(device) if device is not None else acc, p.exp, p.bits)
        out.exp0, out.role, out.view = p.exp0, p.role, p.view
        return out

    def int8(self) -> IntTensor:
        """The int8 weight view used by the GEMMs: sat8(shift_round(W16, s, rne)) at exp + s (int16), s =
        :func:`inttrain.micro.layers.view_shift` (8, or the tensor's own shift for ``view`` "tensor")."""
        if self.bits == 8:
            return IntTensor(self.acc, self.exp)
        am = int(self.acc.abs().max()) if self.view != "fixed" and self.acc.numel() else 0
        s = _ml.view_shift(am, self.bits, self.view)
        return IntTensor(saturate(shift_round(self.acc, s, "rne"), 8).to(torch.int8), self.exp + s)


class Layer(_ml.Layer):
    """Base of the torch engine's layers: micro's, on :class:`~.ops.TorchOps`."""

    OPS = TorchOps


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
        g = _ml.gemm_error(g, self.bwd_round, TorchOps)
        self.weight.grad = check_int32(gemm(g.q.t(), x.q), "linear weight grad")
        self.weight.grad_exp = g.exp + x.exp
        if not self.need_input_grad:
            return None
        gx = check_int32(gemm(g.q, w.q), "linear input grad")
        return requantize(gx, g.exp + w.exp, self.bwd_round, self.err_bits)


def im2col(x: torch.Tensor, k: int, stride: int, padding: int) -> tuple[torch.Tensor, int, int]:
    """(N, C, H, W) -> columns (N*OH*OW, C*k*k), rows ordered (n, oh, ow), columns (c, i, j)."""
    xp = F.pad(x, (padding, padding, padding, padding)) if padding else x
    win = xp.unfold(2, k, stride).unfold(3, k, stride)            # (N, C, OH, OW, k, k)
    n, c, oh, ow = win.shape[:4]
    return win.permute(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * k * k), oh, ow


def col2im(cols: torch.Tensor, x_shape, k: int, stride: int, padding: int, oh: int, ow: int,
           bound: int | None = None) -> torch.Tensor:
    """Adjoint of im2col: exact integer scatter-add of the columns back to (N, C, H, W), padding cropped; int64.

    The columns are first laid out offset-major, (k, k, N, C, OH, OW), so that each of the k*k adds reads one
    contiguous block (adding the strided column views in place had been a fifth of an integer ResNet-20 step).
    ``bound``: the largest |column| (known from the GEMM's operands); the sums are taken in int32 when that many
    overlapping columns cannot overflow it."""
    n, c, h, w = x_shape
    overlap = (-(-k // stride)) ** 2                     # most columns summed into one input position
    narrow = bound is not None and overlap * bound < 2 ** 31
    dtype = torch.int32 if narrow else torch.int64
    blocks = cols.reshape(n, oh, ow, c, k, k).permute(4, 5, 0, 3, 1, 2).to(dtype, memory_format=torch.contiguous_format)
    out = torch.zeros((n, c, h + 2 * padding, w + 2 * padding), dtype=dtype, device=cols.device)
    for i in range(k):
        for j in range(k):
            out[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride] += blocks[i, j]
    return out[:, :, padding:padding + h, padding:padding + w].to(torch.int64)


class Conv2d(Layer):
    """Cross-correlation with zero padding, square kernel, no bias; W: (O, C, k, k); im2col + int GEMM."""

    def __init__(self, weight: Param, stride: int = 1, padding: int = 0, fwd_round: str = "rne",
                 bwd_round: str = "pstoch", out_bits: int = 8):
        self.weight = weight
        self.out_channels, self.in_channels, self.kernel_size, _ = weight.acc.shape
        self.stride, self.padding = stride, padding
        self.fwd_round, self.bwd_round = fwd_round, bwd_round
        self.out_bits = out_bits            # 16: the batch norm that follows gets 16-bit codes (micro's Conv2d)
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
        return requantize(acc, x.exp + w.exp, self.fwd_round, self.out_bits)

    def backward(self, g: IntTensor) -> IntTensor | None:
        x, w, cols, oh, ow = self.saved
        g = _ml.gemm_error(g, self.bwd_round, TorchOps)
        o, k = self.out_channels, self.kernel_size
        grows = g.q.permute(0, 2, 3, 1).reshape(-1, o)                # (N*OH*OW, O)
        self.weight.grad = check_int32(gemm(grows.t(), cols).reshape(w.q.shape), "conv weight grad")
        self.weight.grad_exp = g.exp + x.exp
        if not self.need_input_grad:
            return None
        int8_codes = g.q.dtype == torch.int8 and w.q.dtype == torch.int8
        bound = o * 128 * 128 if int8_codes else None                  # |int8| <= 128 on both sides, o terms
        gx = col2im(gemm(grows, w.q.reshape(o, -1)), x.q.shape, k, self.stride, self.padding, oh, ow, bound)
        return requantize(check_int32(gx, "conv input grad"), g.exp + w.exp, self.bwd_round, self.err_bits)


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


pool_shift = _ml.pool_shift


class AvgPool2d(Layer, _ml.AvgPool2d):
    """k x k average pool, stride k, or ``global_pool``: :class:`inttrain.micro.layers.AvgPool2d` on torch."""


class Flatten(Layer, _ml.Flatten):
    """(N, ...) -> (N, prod(...)); backward reshapes back (:class:`inttrain.micro.layers.Flatten` on torch)."""


# ---------------------------------------------------------------------------------------------
# Residual additions (§4.1) and integer batch normalization (§4.2): twins of inttrain.micro.layers


def add_aligned(a: IntTensor, b: IntTensor, mode: str = "rne", bits: int = 8) -> IntTensor:
    """a + b with exponent alignment, to ``bits``-bit codes (:func:`inttrain.micro.layers.add_aligned` on torch)."""
    return _ml.add_aligned(a, b, mode, TorchOps, bits)


run_forward, run_backward, layer_named_params = _ml.run_forward, _ml.run_backward, _ml.layer_named_params


class Residual(Layer, _ml.Residual):
    """y = Add_f(block(x), shortcut(x)); gx = Add_b(block'(g), shortcut'(g)) (micro's Residual on torch)."""


class BatchNorm(Layer, _ml.BatchNorm):
    """Integer range batch normalization (docs §4.2): :class:`inttrain.micro.layers.BatchNorm` on torch, over
    given ``gamma``/``beta`` parameters."""

    def __init__(self, gamma: Param, beta: Param, fwd_round: str = "rne", bwd_round: str = "pstoch",
                 gain_shift: int = 0):
        self.gamma, self.beta = gamma, beta
        gamma.role = beta.role = "norm"
        self.num_features = gamma.acc.shape[0]
        self.fwd_round, self.bwd_round = fwd_round, bwd_round
        self.gain_shift = gain_shift
        self.params = [gamma, beta]
        self.last_acc: torch.Tensor | None = None
