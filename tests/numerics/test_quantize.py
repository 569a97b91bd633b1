"""Quantize/dequantize semantics: error bounds, edge inputs, unbiased stochastic rounding."""

import math

import pytest
import torch

from inttrain.numerics import (
    NonFiniteError, cosine_deviation, dequantize, fake_quantize, mix_seed, quantize, sqnr_db, uniform_from_counter,
)
from inttrain.spec import PER_COLUMN, PER_ROW, PER_TENSOR, IntFormat, PerBlock, QuantSpec, Rounding, ScaleKind

GRANULARITIES = [PER_TENSOR, PER_ROW, PER_COLUMN, PerBlock(16)]


@pytest.mark.parametrize("gran", GRANULARITIES, ids=str)
@pytest.mark.parametrize("bits", [2, 4, 8, 12, 16])
def test_error_within_half_step_and_codes_in_range(gran, bits):
    torch.manual_seed(0)
    x = torch.randn(32, 64)
    spec = QuantSpec(IntFormat(bits), gran)
    q = quantize(x, spec)
    assert int(q.data.min()) >= spec.fmt.qmin and int(q.data.max()) <= spec.fmt.qmax
    err = (dequantize(q) - x).abs()
    scale = q.scale if not isinstance(gran, PerBlock) else q.scale.repeat_interleave(16, dim=-1).reshape(32, 64)
    assert bool((err <= scale.expand_as(x) / 2 + 1e-6).all()), "round-to-nearest error must be <= s/2"


def test_sqnr_of_int8_gaussian_is_about_40db():
    torch.manual_seed(0)
    x = torch.randn(256, 256)
    db = sqnr_db(x, fake_quantize(x, QuantSpec(granularity=PER_ROW)))
    assert db > 38.0, f"int8 per-row SQNR {db:.1f} dB"


def test_storage_dtypes():
    x = torch.randn(8)
    assert quantize(x, QuantSpec(IntFormat(8))).data.dtype == torch.int8
    assert quantize(x.abs(), QuantSpec(IntFormat(8, signed=False))).data.dtype == torch.uint8
    assert quantize(x, QuantSpec(IntFormat(16))).data.dtype == torch.int16


def test_hand_computed_codes():
    q = quantize(torch.tensor([0.5, -1.0, 0.25, 1.0 / 254]))
    assert q.data.tolist() == [64, -127, 32, 0]  # 63.5 -> 64, 0.5 -> 0: ties to even


def test_floor_rounding():
    q = quantize(torch.tensor([1.0, -0.999, 0.5]), QuantSpec(rounding=Rounding.FLOOR))
    assert q.data.tolist() == [127, -127, 63]


def test_pow2_scales_are_powers_of_two():
    q = quantize(torch.randn(16, 16) * 3, QuantSpec(granularity=PER_ROW, scale_kind=ScaleKind.POW2))
    log2 = torch.log2(q.scale)
    assert torch.equal(log2, torch.round(log2))


def test_zero_tensor_gives_zero_codes_and_unit_scale():
    q = quantize(torch.zeros(4, 5), QuantSpec(granularity=PER_ROW))
    assert torch.equal(q.data, torch.zeros(4, 5, dtype=torch.int8))
    assert torch.equal(q.scale, torch.ones(4, 1))
    assert torch.equal(dequantize(q), torch.zeros(4, 5))


def test_partly_zero_rows():
    x = torch.tensor([[0.0, 0.0], [1.0, -2.0]])
    q = quantize(x, QuantSpec(granularity=PER_ROW))
    assert torch.equal(dequantize(q)[0], torch.zeros(2)) and torch.isfinite(q.scale).all()


def test_empty_tensor():
    q = quantize(torch.zeros(0, 7), QuantSpec(granularity=PER_COLUMN))
    assert q.data.shape == (0, 7) and dequantize(q).shape == (0, 7)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_input_raises(bad):
    x = torch.ones(3, 3)
    x[1, 2] = bad
    with pytest.raises(NonFiniteError, match="inf or NaN"):
        quantize(x, QuantSpec(granularity=PER_ROW))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes_are_quantized_via_float32(dtype):
    x = torch.randn(8, 8)
    assert torch.equal(quantize(x.to(dtype)).data, quantize(x.to(dtype).float()).data)
    assert fake_quantize(x.to(dtype)).dtype == dtype


def test_integer_input_rejected():
    with pytest.raises(TypeError, match="floating-point"):
        quantize(torch.ones(3, dtype=torch.int32))


def test_block_length_must_divide():
    with pytest.raises(ValueError, match="multiple of the block size"):
        quantize(torch.randn(4, 10), QuantSpec(granularity=PerBlock(4)))


def test_stochastic_rounding_needs_explicit_randomness():
    with pytest.raises(ValueError, match="seed or torch.Generator"):
        quantize(torch.randn(4), QuantSpec(rounding=Rounding.STOCHASTIC))


def test_stochastic_rounding_is_unbiased_over_1e5_draws():
    # Invariant: E[q] * s == x for values strictly between codes; 1e5 independent draws per value.
    values = torch.tensor([0.1, 0.25, 0.5, 0.73, -0.31, -0.9]) / 127
    x = values.repeat(100_000, 1)  # columns = values, rows = draws
    spec = QuantSpec(granularity=PER_TENSOR, rounding=Rounding.STOCHASTIC)
    x_with_anchor = torch.cat([x, torch.full((1, 6), 1.0)])  # pins the scale to exactly 1/127
    deq = dequantize(quantize(x_with_anchor, spec, seed=1234))[:-1]
    mean = deq.mean(0)
    # std of a Bernoulli mean over 1e5 draws <= 0.5 / sqrt(1e5) code steps; allow 5 sigma.
    tol = 5 * 0.5 / math.sqrt(1e5) / 127
    assert torch.allclose(mean, values, atol=tol), (mean * 127, values * 127)


def test_stochastic_rounding_is_reproducible_and_seed_dependent():
    x = torch.randn(64, 64)
    spec = QuantSpec(rounding=Rounding.STOCHASTIC)
    a, b, c = (quantize(x, spec, seed=s).data for s in (7, 7, 8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(quantize(x, spec, generator=g1).data, quantize(x, spec, generator=g2).data)


def test_counter_uniforms_are_uniform():
    u = uniform_from_counter((200_000,), seed=mix_seed(1, 2, 3))
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    hist = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert torch.allclose(hist, torch.full((10,), 0.1), atol=0.005)
    assert abs(float(u[1:] @ u[:-1]) / (u.numel() - 1) - 0.25) < 0.005  # neighbours uncorrelated


def test_metrics():
    x = torch.randn(100)
    assert sqnr_db(x, x) == math.inf
    assert abs(sqnr_db(x, 0.9 * x) - 20.0) < 1e-4  # 0.9 * x is rounded to float32
    assert cosine_deviation(x, 2 * x) < 1e-12 and abs(cosine_deviation(x, -x) - 2.0) < 1e-12
