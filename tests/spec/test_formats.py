import pytest

from inttrain.spec import (
    GemmPrecision, IntFormat, PerBlock, PerChannel, PerTensor, QuantSpec, Rounding, UnsupportedFormatError,
)


@pytest.mark.parametrize("bits,qmin,qmax", [(2, -1, 1), (4, -7, 7), (8, -127, 127), (16, -32767, 32767)])
def test_signed_symmetric_range(bits, qmin, qmax):
    fmt = IntFormat(bits)
    assert (fmt.qmin, fmt.qmax) == (qmin, qmax)


def test_asymmetric_and_unsigned_ranges():
    assert (IntFormat(8, symmetric=False).qmin, IntFormat(8, symmetric=False).qmax) == (-128, 127)
    assert (IntFormat(8, signed=False).qmin, IntFormat(8, signed=False).qmax) == (0, 255)
    assert IntFormat(8, signed=False) == IntFormat(8, signed=False, symmetric=False)


@pytest.mark.parametrize("bits", [0, 1, 17, 32, -8])
def test_unsupported_bit_width_names_the_allowed_range(bits):
    with pytest.raises(UnsupportedFormatError, match="2 to 16 bits"):
        IntFormat(bits)


def test_non_int_bits_rejected():
    with pytest.raises(UnsupportedFormatError):
        IntFormat(8.0)  # type: ignore[arg-type]


def test_storage_bits():
    assert IntFormat(8).storage_bits == 8 and IntFormat(9).storage_bits == 16


def test_formats_are_frozen_and_hashable():
    spec = QuantSpec(IntFormat(4), PerChannel(1), Rounding.STOCHASTIC)
    with pytest.raises(AttributeError):
        spec.fmt = IntFormat(8)  # type: ignore[misc]
    assert {spec: 1}[QuantSpec(IntFormat(4), PerChannel(1), Rounding.STOCHASTIC)] == 1
    assert str(spec) == "int4/channel(axis=1)/sr"


def test_block_size_validated():
    with pytest.raises(UnsupportedFormatError):
        PerBlock(0)


def test_gemm_precision_rejects_block_granularity():
    with pytest.raises(UnsupportedFormatError, match="PerBlock"):
        GemmPrecision(QuantSpec(granularity=PerBlock(32)), QuantSpec(granularity=PerTensor()))


def test_rounding_must_be_enum():
    with pytest.raises(UnsupportedFormatError):
        QuantSpec(rounding="nearest")  # type: ignore[arg-type]
