"""The compiled quantize/epilogue passes equal their eager definitions bit for bit."""

import pytest
import torch

from inttrain.kernels import fused
from inttrain.numerics import quantize
from inttrain.spec import PER_ROW, PER_TENSOR, IntFormat, QuantSpec, Rounding


@pytest.fixture
def compiled(monkeypatch):
    monkeypatch.setenv("INTTRAIN_COMPILE", "1")


@pytest.mark.parametrize("spec", [QuantSpec(granularity=PER_ROW), QuantSpec(IntFormat(4), PER_TENSOR),
                                  QuantSpec(IntFormat(12), PER_ROW)], ids=str)
@pytest.mark.parametrize("kept_axis,transpose", [(0, False), (1, True)])
def test_compiled_quantize_matches_eager(compiled, spec, kept_axis, transpose):
    x = torch.randn(97, 61) * 3
    q, s = fused.quantize_matrix(x, spec, kept_axis, transpose=transpose)
    qe, se = fused._quantize_matrix_impl(x, torch.tensor(0), spec, kept_axis, transpose, 0)
    assert torch.equal(q, qe) and torch.equal(s, se)
    assert q.is_contiguous()


def test_quantize_matrix_agrees_with_numerics_quantize():
    # The GEMM-operand quantizer and the public quantize() share one definition of the codes.
    x = torch.randn(20, 30)
    q, s = fused.quantize_matrix(x, QuantSpec(granularity=PER_ROW), 0)
    ref = quantize(x, QuantSpec(granularity=PER_ROW))
    assert torch.equal(q, ref.data) and torch.equal(s, ref.scale)


def test_transposed_codes_and_scales_line_up():
    x = torch.randn(6, 4)
    q, s = fused.quantize_matrix(x, QuantSpec(granularity=PER_ROW), 1, transpose=True)
    assert q.shape == (4, 6) and s.shape == (4, 1)
    assert torch.allclose(q.float() * s, x.t(), atol=float(s.max()) / 2 + 1e-7)


def test_zero_point_emits_shifted_uint8():
    x = torch.randn(5, 5)
    q, _ = fused.quantize_matrix(x, QuantSpec(), 0, zero_point=128)
    q0, _ = fused.quantize_matrix(x, QuantSpec(), 0)
    assert q.dtype == torch.uint8 and torch.equal(q.int() - 128, q0.int())


def test_stochastic_compiled_is_unbiased(compiled):
    x = torch.full((200_000, 1), 0.3 / 127)
    x[0, 0] = 1.0  # pins the scale to 1/127
    q, s = fused.quantize_matrix(x, QuantSpec(rounding=Rounding.STOCHASTIC), 0, seed=99)
    assert abs(float(q[1:].float().mean()) - 0.3) < 0.01


def test_epilogue(compiled):
    acc = torch.randint(-1000, 1000, (33, 17), dtype=torch.int32)
    sa, sb, bias = torch.rand(33, 1), torch.rand(1, 17), torch.randn(17)
    ref = acc.float() * sa * sb + bias
    assert torch.allclose(fused.dequant_epilogue(acc, sa, sb, bias), ref, rtol=1e-6, atol=1e-6)
    assert torch.allclose(fused.dequant_epilogue(acc, sa, sb), acc.float() * sa * sb, rtol=1e-6)


@pytest.mark.parametrize("rows", [1, 7, 64, 96, 131072])
def test_column_reductions_in_row_groups(rows: int) -> None:
    """The grouped column reductions (parallel when compiled) give amax(0) exactly and sum(0) to rounding."""
    from inttrain.kernels.fused import column_amax, column_sum

    x = torch.randn(rows, 16, generator=torch.Generator().manual_seed(rows))
    assert torch.equal(column_amax(x), x.amax(0, keepdim=True))
    torch.testing.assert_close(column_sum(x), x.sum(0), rtol=1e-5, atol=1e-4)
