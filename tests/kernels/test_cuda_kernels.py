"""The integer kernels on CUDA equal their int64 references bit for bit (cuBLASLt's int8 GEMM behind
``torch._int_mm``, with the padding and K-splitting of :mod:`inttrain.kernels.matmul`; the im2col convolutions of
:mod:`inttrain.kernels.conv_generic`), and the quantizer makes the same codes on CUDA as on the CPU, stochastic
rounding included.  Skipped where no CUDA device is present."""

import pytest
import torch

from inttrain.kernels import conv_generic as G
from inttrain.kernels import conv_reference as R
from inttrain.kernels.conv_geometry import ConvGeometry
from inttrain.kernels.matmul import int_mm, int_mm_reference
from inttrain.numerics.quantize import quantize
from inttrain.spec import QuantSpec, Rounding

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ONE = torch.ones(1)


def _codes(shape, dtype=torch.int8, lo=None, hi=None):
    info = torch.iinfo(dtype)
    return torch.randint(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape, dtype=dtype)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (17, 8, 8), (5, 13, 3), (33, 130, 17), (256, 1000, 72), (64, 4096, 96)])
@pytest.mark.parametrize("layout", ["rows", "a_transposed", "b_transposed", "sliced"])
def test_int8_mm_exact(m, k, n, layout):
    torch.manual_seed(m * 7 + k * 3 + n)
    a, b = _codes((m, k)), _codes((k, n))
    ref = int_mm_reference(a, b)
    ac, bc = a.cuda(), b.cuda()
    if layout == "a_transposed":
        ac = ac.t().contiguous().t()
    elif layout == "b_transposed":
        bc = bc.t().contiguous().t()
    elif layout == "sliced":
        ac = torch.cat([ac, ac], 1)[:, :k]
        bc = torch.stack([bc, bc], 2)[:, :, 0]  # column stride 2
    assert torch.equal(int_mm(ac, bc).cpu().long(), ref)


def test_int8_mm_extremes_and_long_reduction():
    """All -128 (the largest products) and a reduction past int32's safe length, split and summed in int64."""
    a = torch.full((20, 131080), -128, dtype=torch.int8)
    b = torch.full((131080, 8), -128, dtype=torch.int8)
    got = int_mm(a.cuda(), b.cuda())
    assert got.dtype == torch.int64 and torch.equal(got.cpu(), int_mm_reference(a, b))


@pytest.mark.parametrize("a_dtype,b_dtype", [(torch.int16, torch.int8), (torch.int8, torch.int16),
                                             (torch.int16, torch.int16)])
def test_int16_split_exact(a_dtype, b_dtype):
    torch.manual_seed(1)
    a, b = _codes((40, 72), a_dtype), _codes((72, 24), b_dtype)
    assert torch.equal(int_mm(a.cuda(), b.cuda()).cpu().long(), int_mm_reference(a, b))


@pytest.mark.parametrize("k,s,p,d", [(1, 1, 0, 1), (3, 1, 1, 1), (3, 2, 1, 1), (5, 2, 2, 1), (3, 1, 2, 2)])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("wide", [False, True], ids=["int8", "int16-activations"])
def test_conv_generic_exact(k, s, p, d, groups, wide):
    torch.manual_seed(k * 100 + s * 10 + p + d + groups)
    geom = ConvGeometry((s, s), (p, p), (d, d), groups)
    x = _codes((3, 8, 11, 9), torch.int16, -300, 300) if wide else _codes((3, 8, 11, 9))
    wq = _codes((8, 8 // groups, k, k))
    y_ref = R.conv2d_forward(x, ONE, wq, ONE, geom)
    g = _codes(tuple(y_ref.shape))
    assert torch.equal(G.conv2d_forward(x.cuda(), ONE.cuda(), wq.cuda(), ONE.cuda(), geom).cpu(), y_ref)
    dx = G.conv2d_input_grad(g.cuda(), ONE.cuda(), wq.cuda(), ONE.cuda(), tuple(x.shape), geom).cpu()
    assert torch.equal(dx, R.conv2d_input_grad(g, ONE, wq, ONE, tuple(x.shape), geom))
    dw = G.conv2d_weight_grad(g.cuda(), ONE.cuda(), x.cuda(), ONE.cuda(), tuple(wq.shape), geom).cpu()
    assert torch.equal(dw, R.conv2d_weight_grad(g, ONE, x, ONE, tuple(wq.shape), geom))


@pytest.mark.parametrize("rounding", [Rounding.NEAREST_EVEN, Rounding.STOCHASTIC])
def test_quantize_same_codes_as_cpu(rounding):
    x = torch.randn(257, 129, generator=torch.Generator().manual_seed(3))
    spec = QuantSpec(rounding=rounding)
    on_cpu, on_gpu = quantize(x, spec, seed=11), quantize(x.cuda(), spec, seed=11)
    assert torch.equal(on_gpu.data.cpu(), on_cpu.data) and torch.equal(on_gpu.scale.cpu(), on_cpu.scale)


def test_compiled_stochastic_rounding_same_codes_as_cpu():
    """Inductor turns the hash's position term into a Triton index expression: the compiled CUDA uniforms must
    still be the CPU's, bit for bit."""
    from inttrain.numerics.hashing import uniform_from_counter

    seed = torch.tensor(12345, dtype=torch.int64)
    compiled = torch.compile(lambda s: uniform_from_counter((1000, 777), s, "cuda"), fullgraph=True)
    assert torch.equal(compiled(seed.cuda()).cpu(), uniform_from_counter((1000, 777), 12345))
