"""The native batch-norm backward from uint8 codes (``native/batch_norm.c``) against the compiled pass's formula."""

import pytest
import torch

from inttrain.kernels import dataflow_passes as passes
from inttrain.kernels import native, ops

pytestmark = pytest.mark.skipif(not native.batch_norm_available(), reason="native batch norm not built here")


def _case(rows: int, channels: int, seed: int = 0, per_tensor: bool = False):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(1, 256, (rows, channels), generator=g).to(torch.uint8)
    scale = torch.rand(1 if per_tensor else channels, generator=g) + 0.01
    grad = torch.randn(rows, channels, generator=g)
    mean = torch.randn(channels, generator=g) * 0.3
    invstd = torch.rand(channels, generator=g) + 0.2
    weight = torch.randn(channels, generator=g)
    return codes, scale, grad, mean, invstd, weight


def _close(got, want) -> None:
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == torch.float32
        assert (a - b).abs().max() <= 1e-5 * b.abs().max() + 1e-6


@pytest.mark.parametrize("rows,channels", [(1, 1), (255, 3), (257, 16), (1000, 17), (4096, 64), (33, 130)])
@pytest.mark.parametrize("threads", [1, 3])
def test_matches_the_formula(rows, channels, threads):
    codes, scale, g, mean, invstd, weight = _case(rows, channels, seed=rows + channels)
    got = native.batch_norm_backward_u8(codes, scale, g, mean, invstd, weight, threads=threads)
    _close(got, passes._bn_backward_impl(codes, scale, g, mean, invstd, weight))


@pytest.mark.parametrize("rows", [1, 700, 5000])
def test_vector_path_equals_the_scalar_path_bit_for_bit(rows):
    # channels are independent and both paths run the same operations in the same order per channel, so the
    # first 8 channels of a 9-channel case (scalar loop) equal the same 8 channels run alone (the AVX2 path
    # for multiples of 8, where the CPU has it)
    codes, scale, g, mean, invstd, weight = _case(rows, 9, seed=rows)
    wide = native.batch_norm_backward_u8(codes, scale, g, mean, invstd, weight, threads=1)
    eight = native.batch_norm_backward_u8(codes[:, :8].contiguous(), scale[:8], g[:, :8].contiguous(), mean[:8],
                                          invstd[:8], weight[:8], threads=1)
    assert torch.equal(eight[0], wide[0][:, :8])
    assert torch.equal(eight[1], wide[1][:8]) and torch.equal(eight[2], wide[2][:8])


def test_sums_stay_accurate_over_many_rows():
    # one channel of a constant gradient over 300k rows: one float32 running sum would be off by ~3e-3 relative
    # (each add rounds at the ulp of a sum near 3e4); blocks of 256 rows added in double stay within ~3e-6
    codes, scale, _, mean, invstd, weight = _case(300_001, 1)
    g = torch.full((300_001, 1), 0.1)
    _, _, db = native.batch_norm_backward_u8(codes, scale, g, mean, invstd, weight)
    exact = 300_001 * float(g[0, 0])
    assert abs(db.item() - exact) / exact < 1e-5


def test_the_routed_pass_takes_a_per_tensor_scale():
    codes, scale, g, mean, invstd, weight = _case(500, 8, per_tensor=True)
    got = passes.batch_norm_backward_rows(codes, scale, g, mean, invstd, weight)
    _close(got, passes._bn_backward_impl(codes, scale, g, mean, invstd, weight))


def test_the_operator_registration():
    args = _case(300, 5)
    torch.library.opcheck(torch.ops.inttrain.batch_norm_backward_u8, args)
    _close(ops.batch_norm_backward_u8(*args), passes._bn_backward_impl(*args))


def test_wrong_inputs_are_refused_before_the_kernel_runs():
    codes, scale, g, mean, invstd, weight = _case(10, 4)
    with pytest.raises(TypeError, match="uint8 codes and float32 g of one"):
        native.batch_norm_backward_u8(codes.to(torch.int32), scale, g, mean, invstd, weight)
    with pytest.raises(TypeError, match="uint8 codes and float32 g of one"):
        native.batch_norm_backward_u8(codes[:5], scale, g, mean, invstd, weight)
    with pytest.raises(TypeError, match="one scale, mean, invstd and weight per channel"):
        native.batch_norm_backward_u8(codes, scale, g, mean[:3], invstd, weight)


def test_env_names_the_batch_norm_kernel():
    from inttrain import kernels

    assert "batch_norm.c" in kernels.describe()["dataflow batch-norm backward (cpu)"]
