"""Integer training of ``y = x W^T + b``: one autograd Function, three integer GEMMs.

    forward       y  = x  W^T     lhs x  (kept axis: rows/tokens),   rhs W^T (kept axis: out features)
    grad_input    dx = dy W       lhs dy (kept axis: rows/tokens),   rhs W   (kept axis: in features)
    grad_weight   dW = dy^T x     lhs dy^T (kept axis: out features), rhs x  (kept axis: in features)
    grad_bias     db = sum_rows dy   (float, exact up to float32 summation)

Each GEMM quantizes its two operands with its own :class:`~inttrain.spec.GemmPrecision`, multiplies
the integer codes on an integer kernel (int32 accumulation) and rescales in a fused epilogue.
The activation is quantized for the weight-gradient GEMM already in forward, so backward keeps
int8 codes (a quarter of float32's memory) instead of the float input.
"""

from __future__ import annotations

import torch

from ..kernels.fused import dequant_epilogue, quantize_matrix
from ..kernels.matmul import int_mm
from ..numerics.quantize import check_finite
from ..spec import GemmPrecision, LayerPrecision

__all__ = ["int_linear", "GemmSeeds"]

GemmSeeds = tuple[int, int, int]  # stochastic-rounding seeds for the forward, grad_input, grad_weight GEMMs


def _int_gemm(a: torch.Tensor, a_kept: int, b: torch.Tensor, b_kept: int, prec: GemmPrecision, seed: int,
              *, a_transpose: bool = False, b_transpose: bool = False, what: str = "") -> torch.Tensor:
    """Quantize both operands per ``prec`` and return ``dequant(int_mm(qa, qb))`` as float32.

    ``a``/``b`` are given in their stored layout; ``*_transpose`` says the GEMM operand is its transpose.
    """
    qa, sa = quantize_matrix(a, prec.lhs, a_kept, transpose=a_transpose, seed=seed)
    qb, sb = quantize_matrix(b, prec.rhs, b_kept, transpose=b_transpose, seed=seed ^ 0x5BD1E995)
    check_finite(sa, f"{what} lhs")
    check_finite(sb, f"{what} rhs")
    return dequant_epilogue(int_mm(qa, qb), sa, sb)


class _IntLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, prec: LayerPrecision, seeds: GemmSeeds):
        x2 = x.reshape(-1, x.shape[-1])
        fwd, gw = prec.forward, prec.grad_weight
        if fwd.integer:
            qx, sx = quantize_matrix(x2, fwd.lhs, 0, seed=seeds[0])
            check_finite(sx, "linear input")
            # W^T as the rhs, written transposed+contiguous: the operand layout _int_mm runs fastest on.
            qw, sw = quantize_matrix(weight, fwd.rhs, 0, transpose=True, seed=seeds[0] ^ 0x5BD1E995)
            check_finite(sw, "linear weight")
            y = dequant_epilogue(int_mm(qx, qw), sx, sw, None if bias is None else bias.float())
        else:
            y = torch.nn.functional.linear(x2.float(), weight.float(), None if bias is None else bias.float())
        if not ctx.needs_input_grad[1]:  # inference / frozen weight: no dW, nothing to keep
            ctx.save_for_backward(weight)
        elif gw.integer:  # keep int8 codes of x for dW = dy^T x (quantized along its in-feature axis)
            qx_gw, sx_gw = quantize_matrix(x2, gw.rhs, 1, seed=seeds[2] ^ 0x5BD1E995)
            ctx.save_for_backward(weight, qx_gw, sx_gw)
        else:
            ctx.save_for_backward(weight, x2)
        ctx.prec, ctx.seeds, ctx.has_bias = prec, seeds, bias is not None
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        weight, *saved = ctx.saved_tensors
        prec, seeds = ctx.prec, ctx.seeds
        dy2 = dy.reshape(-1, dy.shape[-1]).to(torch.float32)
        if not bool(torch.isfinite(dy2).all()):
            # Propagate non-finiteness instead of raising: the trainer's step guard (GradScaler-style)
            # sees NaN gradients and skips the step with the parameters untouched.
            nan = float("nan")
            dx = torch.full(ctx.x_shape, nan, dtype=ctx.x_dtype, device=dy.device) if ctx.needs_input_grad[0] else None
            dw = torch.full_like(weight, nan)
            db = torch.full((weight.shape[0],), nan, dtype=weight.dtype, device=weight.device) if ctx.has_bias else None
            return dx, dw, db, None, None
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            if prec.grad_input.integer:
                dx = _int_gemm(dy2, 0, weight, 1, prec.grad_input, seeds[1], what="linear grad_input")
            else:
                dx = dy2 @ weight.float()
            dx = dx.to(ctx.x_dtype).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            if prec.grad_weight.integer:
                qx, sx = saved
                qg, sg = quantize_matrix(dy2, prec.grad_weight.lhs, 1, transpose=True, seed=seeds[2])
                check_finite(sg, "linear grad_weight lhs")
                dw = dequant_epilogue(int_mm(qg, qx), sg, sx)
            else:
                dw = dy2.t() @ saved[0].float()
            dw = dw.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0).to(weight.dtype)
        return dx, dw, db, None, None


def int_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, prec: LayerPrecision,
               seeds: GemmSeeds = (0, 0, 0)) -> torch.Tensor:
    """``F.linear`` with all three GEMMs in integer arithmetic as configured by ``prec``."""
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear input has {x.shape[-1]} features, the layer expects {weight.shape[1]}")
    return _IntLinearFn.apply(x, weight, bias, prec, seeds)
