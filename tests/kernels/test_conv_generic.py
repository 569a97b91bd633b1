"""The device-generic im2col convolutions (the non-CPU path) equal the int64 reference bit for bit.

They run on CPU here; on CUDA the same code feeds cuBLASLt's int8 GEMM.
"""

import pytest
import torch

from inttrain.kernels import conv_generic as G
from inttrain.kernels import conv_reference as R
from inttrain.kernels.conv_geometry import ConvGeometry

ONE = torch.ones(1)
GEOMS = [(1, 1, 0, 1), (1, 2, 0, 1), (3, 1, 1, 1), (3, 2, 1, 1), (3, 2, 0, 1), (3, 1, 2, 2), (5, 2, 2, 1), (3, 3, 1, 1)]


def _codes(shape):
    return torch.randint(-128, 128, shape, dtype=torch.int8)


@pytest.mark.parametrize("k,s,p,d", GEOMS)
@pytest.mark.parametrize("groups", [1, 2, 6])
@pytest.mark.parametrize("n,h,w", [(1, 7, 9), (3, 8, 6)])
def test_generic_path_exact(k, s, p, d, groups, n, h, w):
    torch.manual_seed(k * 1000 + s * 100 + p * 10 + d + groups + n)
    geom = ConvGeometry((s, s), (p, p), (d, d), groups)
    cin, cout = 6, 6 if groups == 6 else 4
    x = _codes((n, cin, h, w))
    wq = _codes((cout, cin // groups, k, k))
    ho, wo = (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1
    g = _codes((n, cout, ho, wo))
    assert torch.equal(G.conv2d_forward(x, ONE, wq, ONE, geom), R.conv2d_forward(x, ONE, wq, ONE, geom))
    dx = G.conv2d_input_grad(g, ONE, wq, ONE, tuple(x.shape), geom)
    assert torch.equal(dx, R.conv2d_input_grad(g, ONE, wq, ONE, tuple(x.shape), geom))
    dw = G.conv2d_weight_grad(g, ONE, x, ONE, tuple(wq.shape), geom)
    assert torch.equal(dw, R.conv2d_weight_grad(g, ONE, x, ONE, tuple(wq.shape), geom))


def test_generic_accepts_shifted_uint8_and_scales():
    torch.manual_seed(0)
    geom = ConvGeometry((1, 1), (1, 1), (1, 1), 1)
    x, wq = _codes((2, 4, 5, 5)), _codes((3, 4, 3, 3))
    xu8 = torch.bitwise_xor(x, -128).view(torch.uint8)  # q + 128
    sx, sw = torch.tensor([0.5]), torch.tensor([1.0, 2.0, 0.25])
    got = G.conv2d_forward(xu8, sx, wq, sw, geom)
    ref = R.conv2d_forward(x, sx, wq, sw, geom)
    assert torch.allclose(got, ref, rtol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.cuda
def test_cuda_layer_trains():
    import inttrain

    conv = inttrain.prepare_(torch.nn.Conv2d(8, 16, 3, padding=1).cuda(), "int8")
    x = torch.randn(32, 8, 16, 16, device="cuda", requires_grad=True)
    conv(x).sum().backward()
    assert torch.isfinite(conv.weight.grad).all() and x.grad.shape == x.shape
