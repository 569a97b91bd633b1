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
from ..kernels.matmul import int_mm, int_mm_dequant
from ..kernels.ops import quantize_rows_cols, rows_cols_native
from ..numerics.hashing import SeedPurpose, derive_seed
from ..numerics.quantize import check_finite, is_finite
from ..spec import LayerPrecision
from .seeds import save_with_seeds, saved_and_seeds
from .qactivation import QActivation, output_dtype, quantize_activation

__all__ = ["int_linear", "GemmSeeds"]

GemmSeeds = tuple[int, int, int]  # stochastic-rounding seeds for the forward, grad_input, grad_weight GEMMs


def _non_finite_grads(ctx, weight: torch.Tensor):
    """NaN gradients for every input that wants one.

    A non-finite output gradient is propagated rather than raised: the trainer's step guard
    (GradScaler-style) sees NaN gradients and skips the step with the parameters untouched.
    """
    nan = float("nan")
    dx = torch.full(ctx.x_shape, nan, dtype=ctx.x_dtype, device=weight.device) if ctx.needs_input_grad[0] else None
    db = torch.full((weight.shape[0],), nan, dtype=weight.dtype, device=weight.device) if ctx.has_bias else None
    return dx, torch.full_like(weight, nan), db, None, None, None, None


def _signed(u8: torch.Tensor) -> torch.Tensor:
    """uint8 ``code + 128`` -> int8 ``code`` (a sign-bit flip)."""
    return torch.bitwise_xor(u8, 128).view(torch.int8)


def _usable_codes(x, prec: LayerPrecision) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(uint8 codes + 128 [rows, K], scale) of a per-tensor int8 input that both integer GEMMs reading the
    activation (forward and weight gradient) can take unchanged: a per-tensor scale is a valid row-wise
    and column-wise scale alike."""
    fwd, gw = prec.forward, prec.grad_weight
    if not isinstance(x, QActivation) or x.per_channel or not fwd.integer or not gw.integer:
        return None
    if any(s.fmt.bits != x.bits or not s.fmt.signed or not s.fmt.symmetric for s in (fwd.lhs, gw.rhs)):
        return None
    return x.codes.reshape(-1, x.shape[-1]), x.scale


def _reuses_weight_codes(prec: LayerPrecision) -> bool:
    """Whether a compiled step computes dx from the forward's weight codes (same weight format both ways)."""
    return (torch.compiler.is_compiling() and prec.forward.integer and prec.grad_input.integer
            and prec.forward.rhs == prec.grad_input.rhs)


def _dx_from_forward_codes(dy2, qw, sw, dy_spec, seed):
    """``dx = dy W`` with the forward's codes ``W = sw * qw`` (``sw``: one scale per output feature, [out, 1]).

    A per-output-feature scale lies along this GEMM's reduction, so it cannot stay outside the integer sum;
    it is folded into the output gradient instead: ``dy W = (dy * sw^T) qw``, and ``dy * sw^T`` is quantized
    per row as ``dy`` would be.  One weight quantization per step serves both GEMMs (compiled steps only: there
    the multiply fuses into the quantize pass, while eager would pay an extra pass over ``dy``).
    """
    qg, sg = quantize_matrix(dy2 * sw.reshape(1, -1), dy_spec, 0, seed=seed)
    return dequant_epilogue(int_mm(qg, qw, reuse_output=True), sg, sg.new_ones((1, 1)))


def _dy_transposed_codes(dy2, spec, seed):
    """Codes and scale of ``dy^T``, the lhs of ``dW = dy^T x`` (one scale per output feature)."""
    if torch.compiler.is_compiling():
        # Inductor's transposed int8 store is slow; the GEMM reads the row-major codes as dy^T (a column-major
        # view) at no cost.  Same codes: the rounding hash indexes dy, not dy^T.
        qg, sg = quantize_matrix(dy2, spec, 1, seed=seed)
        return qg.t(), sg.t()
    return quantize_matrix(dy2, spec, 1, transpose=True, seed=seed)


def _reuses_activation_codes(prec: LayerPrecision) -> bool:
    """Whether a compiled step computes dW from the forward's codes of x (same activation format both ways)."""
    return (torch.compiler.is_compiling() and prec.forward.integer and prec.grad_weight.integer
            and prec.forward.lhs == prec.grad_weight.rhs)


def _dw_from_forward_codes(dy2, qx, sx, dy_spec, seed):
    """``dW = dy^T x`` with the forward's codes ``x = sx * qx`` (``sx``: one scale per row, [rows, 1]).

    The row scales lie along this GEMM's reduction (rows), so they are folded into the output gradient:
    ``dy^T x = (dy * sx)^T qx``; ``dy * sx`` is quantized per column (output feature) as ``dy`` would be.  The
    forward then quantizes x once instead of twice (per row, and per column for dW).
    """
    qg, sg = quantize_matrix(dy2 * sx, dy_spec, 1, seed=seed)
    return int_mm_dequant(qg.t(), qx, sg.t(), sg.new_ones((1, 1)))


# In compiled steps Inductor fuses what produced dy (a ReLU or GELU backward, the next layer's dx epilogue) into
# its quantize loops, which wins while dy stays in cache (measured: MLP 512x1024 gradients 34.9 ms per step with
# Inductor's loops vs 36.9 with the native passes); on larger gradients the native two passes win.
_NATIVE_MIN_COMPILED = 1 << 21


def _native_pays(dy2: torch.Tensor) -> bool:
    return not torch.compiler.is_compiling() or dy2.numel() >= _NATIVE_MIN_COMPILED


def _input_codes(x2: torch.Tensor, spec, seed):
    """Row codes of the forward's input: the native pass (one read of float32 or bfloat16 x, each row's amax and
    codes while the row is in L1) where it pays, else the fused torch quantizer (any float dtype); the same codes
    either way."""
    if x2.dtype in (torch.float32, torch.bfloat16) and _native_pays(x2) and rows_cols_native(spec, None, x2.device):
        qx, sx, *_ = quantize_rows_cols(x2, None, None, spec, None, seed, 0)
        return qx, sx
    return quantize_matrix(x2, spec, 0, seed=seed)


def _weight_grad(ctx, dy2, saved, codes, seeds):
    """``dW = dy^T x`` (None: ``dy`` is not finite).  ``codes``: the native quantizer's output, or None."""
    gw = ctx.prec.grad_weight
    if not gw.integer:
        return dy2.float().t() @ saved[0].float()
    qx, sx = saved
    if ctx.x_shifted:
        qx = _signed(qx)
    ones = sx.new_ones((1, 1))
    if codes is not None:
        qc, sc = codes[2], codes[3]
        if not ctx.x_rows_folded and not is_finite(sc):
            return None
        return int_mm_dequant(qc.t(), qx, sc.t(), ones if ctx.x_rows_folded else sx)
    if ctx.x_rows_folded:
        return _dw_from_forward_codes(dy2, qx, sx, gw.lhs, seeds[2])
    qg, sg = _dy_transposed_codes(dy2, gw.lhs, seeds[2])
    if not is_finite(sg):  # amax propagates inf/NaN, so this tiny check covers all of dy
        return None
    return int_mm_dequant(qg, qx, sg, sx)


def _input_grad(ctx, dy2, weight, w_codes, codes, seeds):
    """``dx = dy W`` (None: ``dy`` is not finite).  ``codes``: the native quantizer's output, or None."""
    gi = ctx.prec.grad_input
    if not gi.integer:
        return dy2.float() @ weight.float()
    if codes is not None and w_codes is not None:
        return dequant_epilogue(int_mm(codes[0], w_codes[0], reuse_output=True), codes[1], codes[1].new_ones((1, 1)))
    if w_codes is not None:
        return _dx_from_forward_codes(dy2, *w_codes, gi.lhs, seeds[1])
    qg, sg = (codes[0], codes[1]) if codes is not None else quantize_matrix(dy2, gi.lhs, 0, seed=seeds[1])
    if not is_finite(sg):
        return None
    qw, sw = quantize_matrix(weight, gi.rhs, 1, seed=derive_seed(seeds[1], SeedPurpose.RHS_OPERAND))
    return dequant_epilogue(int_mm(qg, qw, reuse_output=True), sg, sw)


@torch.compiler.allow_in_graph  # see autograd/conv.py
class _IntLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias, prec: LayerPrecision, seeds: GemmSeeds, grad_hook=None, emit_int8=False):
        # x2 is 2-D: int_linear flattens leading dims outside the Function, so the output is no view of
        # a Function-internal tensor (in-place ops such as ReLU(inplace=True) after the layer stay legal).
        # Dataflow: x2 may be an int8 QActivation; a per-tensor one serves both GEMMs with its codes.
        fwd, gw = prec.forward, prec.grad_weight
        codes = _usable_codes(x2, prec)
        in_shape = x2.shape
        if codes is None and isinstance(x2, QActivation):
            x2 = x2.dequantize()
        if codes is None:
            x2 = x2.reshape(-1, in_shape[-1])
        if fwd.integer:
            if codes is not None:
                qx, sx = _signed(codes[0]), codes[1].reshape(1, 1)
            else:
                qx, sx = _input_codes(x2, fwd.lhs, seeds[0])
                check_finite(sx, "linear input")
            # W^T as the rhs is read through a transposed view: measured faster than having the quantizer
            # write it transposed (e.g. 2.1 vs 2.6 ms at 512x1024x1024, 149 vs 156 ms at 4096^3).
            qw, sw = quantize_matrix(weight, fwd.rhs, 0, seed=derive_seed(seeds[0], SeedPurpose.RHS_OPERAND))
            check_finite(sw, "linear weight")
            y = dequant_epilogue(int_mm(qx, qw.t(), reuse_output=True), sx, sw.t(), None if bias is None else bias.float())
        else:
            y = torch.nn.functional.linear(x2.float(), weight.float(), None if bias is None else bias.float())
        # Compiled steps keep the forward's weight codes for dx = dy W (see _dx_from_forward_codes).
        ctx.fold_w = fwd.integer and _reuses_weight_codes(prec) and ctx.needs_input_grad[0]
        ctx.x_rows_folded = False
        w_extra = (qw, sw) if ctx.fold_w else ()
        if not ctx.needs_input_grad[1]:  # inference / frozen weight: no dW, nothing to keep
            save_with_seeds(ctx, seeds, weight, *w_extra)
        elif codes is not None:  # the int8 input is the activation: its (shared, uint8) codes serve dW = dy^T x
            save_with_seeds(ctx, seeds, weight, codes[0], codes[1].reshape(1, 1), *w_extra)
        elif gw.integer and fwd.integer and _reuses_activation_codes(prec):
            # the forward's codes of x serve dW = dy^T x as well; x's row scales fold into dy in backward
            save_with_seeds(ctx, seeds, weight, qx, sx, *w_extra)
            ctx.x_rows_folded = True
        elif gw.integer:  # keep int8 codes of x for dW = dy^T x (quantized along its in-feature axis)
            qx_gw, sx_gw = quantize_matrix(x2, gw.rhs, 1, seed=derive_seed(seeds[2], SeedPurpose.RHS_OPERAND))
            save_with_seeds(ctx, seeds, weight, qx_gw, sx_gw, *w_extra)
        else:
            save_with_seeds(ctx, seeds, weight, x2.float(), *w_extra)
        ctx.prec, ctx.has_bias, ctx.grad_hook = prec, bias is not None, grad_hook
        ctx.x_shape, ctx.x_dtype = in_shape, torch.float32 if isinstance(x2, QActivation) else x2.dtype
        ctx.x_shifted = codes is not None  # saved dW operand is uint8 code + 128
        if emit_int8:  # hand the next op int8 codes with one scale (a valid row scale for the next Linear)
            q = quantize_activation(y, per_channel=False, name="linear output")
            return QActivation(q.codes.reshape(*in_shape[:-1], y.shape[-1]), q.scale, q.zero_point, q.bits)
        # 2-D: the caller reshapes (a view made in here could not be modified in place)
        return y.to(torch.float32 if isinstance(x2, QActivation) else output_dtype(x2))

    @staticmethod
    def backward(ctx, dy):
        (weight, *saved), seeds = saved_and_seeds(ctx)
        w_codes = None
        if ctx.fold_w:
            *saved, qwf, swf = saved
            w_codes = (qwf, swf)
        prec = ctx.prec
        # bfloat16 under autocast stays bfloat16: the quantizers read it as it is, float paths upcast
        dy2 = (dy if dy.dtype == torch.bfloat16 else dy.to(torch.float32)).reshape(-1, dy.shape[-1])
        if ctx.grad_hook is not None:  # a recipe's transform of the output gradient (clip, noise) before quantizing
            dy2 = ctx.grad_hook(dy2.float(), derive_seed(seeds[2], SeedPurpose.GRAD_HOOK))
        dx = dw = db = None
        gi, gw = prec.grad_input, prec.grad_weight
        row_spec = gi.lhs if ctx.needs_input_grad[0] and gi.integer else None
        col_spec = gw.lhs if ctx.needs_input_grad[1] and gw.integer else None
        codes = None
        if _native_pays(dy2) and rows_cols_native(row_spec, col_spec, dy2.device):  # both quantizations in two passes
            row_mul = None if w_codes is None or row_spec is None else w_codes[1]
            col_mul = saved[1] if col_spec is not None and ctx.x_rows_folded else None
            codes = quantize_rows_cols(dy2, row_mul, col_mul, row_spec, col_spec, seeds[1], seeds[2],
                                       col_sum=ctx.has_bias and ctx.needs_input_grad[2])
        if ctx.needs_input_grad[1]:
            dw = _weight_grad(ctx, dy2, saved, codes, seeds)
            if dw is None:
                return _non_finite_grads(ctx, weight)
            dw = dw.to(weight.dtype)
        if ctx.needs_input_grad[0]:
            dx = _input_grad(ctx, dy2, weight, w_codes, codes, seeds)
            if dx is None:
                return _non_finite_grads(ctx, weight)
            dx = dx.to(ctx.x_dtype).reshape(ctx.x_shape)
        if ctx.has_bias and ctx.needs_input_grad[2]:  # the native pass summed dy's columns already
            db = (codes[4] if codes is not None else dy2.sum(0, dtype=torch.float32)).to(weight.dtype)
        return dx, dw, db, None, None, None, None


def int_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, prec: LayerPrecision,
               seeds: GemmSeeds = (0, 0, 0), grad_hook=None, emit_int8: bool = False) -> torch.Tensor:
    """``F.linear`` with all three GEMMs in integer arithmetic as configured by ``prec``.

    ``grad_hook(dy, seed) -> dy``, if given, transforms the float output gradient before it is quantized
    (a recipe's gradient clipping or noise); it sees the 2-D ``[rows, out_features]`` gradient.
    ``x`` may be an int8 :class:`QActivation` (its codes are used as they are when both GEMMs reading it
    allow); ``emit_int8=True`` returns the output as one (dataflow).
    """
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear input has {x.shape[-1]} features, the layer expects {weight.shape[1]}")
    # An int8 input goes in whole (its codes are reshaped inside); a float one as a 2-D view.
    y = _IntLinearFn.apply(x if isinstance(x, QActivation) else x.reshape(-1, x.shape[-1]), weight, bias, prec,
                           seeds, grad_hook, emit_int8)
    return y.reshape(*x.shape[:-1], weight.shape[0])
