"""int16 output gradients in the weight-gradient convolution: exact via the int16 split (vs the int64 reference)."""

import pytest
import torch

from inttrain.kernels import conv as conv_kernels
from inttrain.kernels import conv_reference
from inttrain.kernels.conv import ConvGeometry, to_shifted_u8


@pytest.mark.parametrize("n,cin,cout,hw,k,stride,pad,groups", [
    (3, 4, 6, 7, 3, 1, 1, 1),    # shifted-GEMM path
    (2, 24, 8, 6, 3, 1, 1, 1),   # im2col path (more channels)
    (2, 8, 4, 9, 3, 2, 0, 1),    # strided
    (2, 8, 6, 5, 3, 1, 1, 2),    # grouped
])
@pytest.mark.parametrize("shifted_x", [False, True])
@pytest.mark.parametrize("fused", ["0", "1"])
def test_int16_weight_grad_is_exact(n, cin, cout, hw, k, stride, pad, groups, shifted_x, fused, monkeypatch):
    monkeypatch.setenv("INTTRAIN_COMPILE", fused)  # "1": the halves split in one compiled pass, as outside the tests
    torch.manual_seed(0)
    geom = ConvGeometry((stride, stride), (pad, pad), (1, 1), groups)
    xq = torch.randint(-127, 128, (n, cin, hw, hw), dtype=torch.int8)
    ho = (hw + 2 * pad - k) // stride + 1
    gq = torch.randint(-32767, 32768, (n, cout, ho, ho), dtype=torch.int16)
    gq[0, 0, 0, 0], gq[-1, -1, -1, -1] = 32767, -32767
    g_scale, x_scale = torch.rand(cout) + 0.5, torch.tensor([0.03])
    wshape = (cout, cin // groups, k, k)
    ref = conv_reference.conv2d_weight_grad(gq, g_scale, xq, x_scale, wshape, geom)
    x_in = to_shifted_u8(xq) if shifted_x else xq
    got = conv_kernels.conv2d_weight_grad(gq, g_scale, x_in, x_scale, wshape, geom)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
