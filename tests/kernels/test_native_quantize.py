"""The native two-way gradient quantizer: the same codes and scales as ``quantize_matrix`` bit for bit, and a
Linear layer whose gradients do not change when it serves them."""

from __future__ import annotations

import pytest
import torch

import inttrain
from inttrain.autograd import linear as linear_fn
from inttrain.kernels import native
from inttrain.kernels.fused import _quantize_matrix_impl
from inttrain.kernels.ops import quantize_rows_cols, rows_cols_native
from inttrain.recipes.int8_mixed import Int8MixedConfig
from inttrain.spec import PerChannel, PerTensor, QuantSpec, Rounding, ScaleKind
from inttrain.spec.formats import IntFormat

needs_native = pytest.mark.skipif(not native.quantize_available(),
                                  reason=f"native quantizer unavailable: {native.QUANTIZE_LIBRARY.reason}")
RNE, SR = Rounding.NEAREST_EVEN, Rounding.STOCHASTIC


def _expected(x: torch.Tensor, spec: QuantSpec, axis: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize_matrix_impl(x, torch.tensor(seed & 0xFFFFFFFF), spec, axis, False, 0)


def _gradient(m: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    dy = torch.randn(m, n, generator=g) * torch.rand(m, 1, generator=g) ** 3  # rows of very different ranges
    dy[0] = 0.0  # an all-zero row: scale 1, codes 0
    return dy


@needs_native
@pytest.mark.parametrize("m,n", [(1, 1), (37, 53), (64, 48), (300, 17), (5, 16), (129, 1000)])
@pytest.mark.parametrize("rounding", [RNE, SR])
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("threads", [1, 3])
def test_codes_and_scales_equal_quantize_matrix(m: int, n: int, rounding: Rounding, bits: int, threads: int) -> None:
    dy = _gradient(m, n, m * n + bits)
    row_mul, col_mul = torch.rand(n) + 0.1, torch.rand(m) + 0.1
    spec = QuantSpec(IntFormat(bits), PerChannel(0), rounding)
    seed_rows, seed_cols = 123, 2**32 + 5  # seeds are taken modulo 2^32, as the torch path does
    qr, sr, qc, sc, sums = native.quantize_rows_cols(
        dy, row_mul, col_mul, IntFormat(bits).qmax, sr_rows=rounding is SR, seed_rows=seed_rows,
        sr_cols=rounding is SR, seed_cols=seed_cols, col_sum=True, threads=threads)
    er, ers = _expected(dy * row_mul, spec, 0, seed_rows)
    ec, ecs = _expected(dy * col_mul[:, None], spec, 1, seed_cols)
    assert torch.equal(qr, er) and torch.equal(sr, ers)
    assert torch.equal(qc, ec) and torch.equal(sc, ecs)
    assert torch.allclose(sums.double(), dy.double().sum(0), rtol=1e-6, atol=1e-6)


@needs_native
def test_one_side_and_no_multipliers() -> None:
    dy = _gradient(40, 24, 1)
    spec = QuantSpec(IntFormat(8), PerChannel(0))
    qr, sr, qc, sc, sums = native.quantize_rows_cols(dy, None, None, 127, cols=False)
    assert qc is None and sc is None and sums is None
    assert torch.equal(qr, _expected(dy, spec, 0, 0)[0]) and torch.equal(sr, _expected(dy, spec, 0, 0)[1])
    qr, sr, qc, sc, _ = native.quantize_rows_cols(dy, None, None, 127, rows=False)
    assert qr is None and sr is None
    assert torch.equal(qc, _expected(dy, spec, 1, 0)[0]) and torch.equal(sc, _expected(dy, spec, 1, 0)[1])


@needs_native
def test_per_tensor_multipliers_broadcast_and_op_matches() -> None:
    """The autograd layer passes a per-tensor scale as a [1, 1] multiplier; the op path equals the direct one."""
    dy = _gradient(33, 20, 2)
    spec = QuantSpec(IntFormat(8), PerChannel(0), SR)
    s = torch.tensor([[0.37]])
    got = quantize_rows_cols(dy, s, s, spec, spec, 7, 9, col_sum=True)
    assert torch.equal(got[0], _expected(dy * s, spec, 0, 7)[0])
    assert torch.equal(got[2], _expected(dy * s, spec, 1, 9)[0])
    seeds = torch.tensor([7, 9])
    args = (dy, s.reshape(1).expand(20).contiguous(), s.reshape(1).expand(33).contiguous(), seeds, 127, 2, 2, True)
    op = torch.ops.inttrain.quantize_rows_cols(*args)
    assert all(torch.equal(a, b) for a, b in zip(op, got))
    torch.library.opcheck(torch.ops.inttrain.quantize_rows_cols, args)
    torch.library.opcheck(torch.ops.inttrain.quantize_rows_cols, (dy, None, None, seeds, 127, 0, 1, False))


@needs_native
def test_non_finite_gradient_gives_non_finite_scales() -> None:
    dy = _gradient(8, 16, 3)
    dy[2, 5] = float("nan")
    dy[4, 7] = float("inf")
    _, sr, _, sc, _ = native.quantize_rows_cols(dy, None, None, 127)
    assert torch.isnan(sr[2, 0]) and torch.isinf(sr[4, 0]) and torch.isfinite(sr[[0, 1, 3, 5, 6, 7]]).all()
    assert torch.isnan(sc[0, 5]) and torch.isinf(sc[0, 7]) and torch.isfinite(sc[0, :5]).all()


@needs_native
@pytest.mark.parametrize("shape", [(7, 33), (64, 48)])
@pytest.mark.parametrize("stochastic", [False, True])
def test_bfloat16_gradient_reads_as_its_float32_upcast(shape: tuple, stochastic: bool) -> None:
    g = torch.Generator().manual_seed(3)
    dy = (torch.randn(shape, generator=g) * 3).to(torch.bfloat16)
    row_mul, col_mul = torch.rand(shape[1], generator=g) + 0.5, torch.rand(shape[0], generator=g) + 0.5
    args = (row_mul, col_mul, 127)
    kw = {"sr_rows": stochastic, "seed_rows": 5, "sr_cols": stochastic, "seed_cols": 9, "col_sum": True}
    got, want = native.quantize_rows_cols(dy, *args, **kw), native.quantize_rows_cols(dy.float(), *args, **kw)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@needs_native
def test_bad_inputs_are_refused() -> None:
    with pytest.raises(TypeError, match="expected a 2-D float32 or bfloat16 CPU tensor"):
        native.quantize_rows_cols(torch.zeros(4, 4, dtype=torch.float64), None, None, 127)
    with pytest.raises(ValueError, match="qmax must be in"):
        native.quantize_rows_cols(torch.zeros(4, 4), None, None, 200)
    with pytest.raises(ValueError, match="row_mul has 3 values, expected 4"):
        native.quantize_rows_cols(torch.zeros(4, 4), torch.ones(3), None, 127)


def test_specs_the_native_path_declines() -> None:
    cpu = torch.device("cpu")
    base = QuantSpec(IntFormat(8), PerChannel(0))
    for spec in (QuantSpec(IntFormat(12), PerChannel(0)), QuantSpec(IntFormat(8), PerTensor()),
                 QuantSpec(IntFormat(8), PerChannel(0), Rounding.FLOOR),
                 QuantSpec(IntFormat(8), PerChannel(0), scale_kind=ScaleKind.POW2),
                 QuantSpec(IntFormat(8), PerChannel(0), fixed_amax=1.0),
                 QuantSpec(IntFormat(8, signed=False), PerChannel(0))):
        assert not rows_cols_native(spec, None, cpu) and not rows_cols_native(base, spec, cpu)
    assert not rows_cols_native(base, QuantSpec(IntFormat(4), PerChannel(0)), cpu)  # one qmax for both sides
    assert not rows_cols_native(None, None, cpu)
    assert not rows_cols_native(base, base, torch.device("meta"))


@needs_native
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("rounding", [RNE, SR])
def test_linear_gradients_unchanged_by_the_native_quantizer(compiled: bool, rounding: Rounding,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A Linear's dx, dW (bit for bit) and db (float sums) equal those of the torch quantize passes."""
    grads = []
    for use_native in (False, True):
        torch.manual_seed(0)
        layer = inttrain.prepare_(torch.nn.Sequential(torch.nn.Linear(24, 40)),
                                  Int8MixedConfig(grad_rounding=rounding))[0]
        if not use_native:
            monkeypatch.setattr(linear_fn, "rows_cols_native", lambda *a: False)
        else:
            monkeypatch.undo()
        run = torch.compile(layer, fullgraph=True) if compiled else layer
        x = torch.randn(50, 24, generator=torch.Generator().manual_seed(1), requires_grad=True)
        dy = torch.randn(50, 40, generator=torch.Generator().manual_seed(2))
        run(x).backward(dy)
        grads.append((x.grad, layer.weight.grad, layer.bias.grad))
    (dx0, dw0, db0), (dx1, dw1, db1) = grads
    assert torch.equal(dx0, dx1) and torch.equal(dw0, dw1)
    assert torch.allclose(db0, db1, rtol=1e-6, atol=1e-6)
