"""Exactness tests of the int8 conv kernels against the int64 reference, and of the reference
against float64 torch convolutions."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from inttrain.kernels import conv as K
from inttrain.kernels import conv_reference as R

ONE = torch.ones(1)


def _codes(shape: tuple, lo: int = -128, hi: int = 127) -> torch.Tensor:
    return torch.randint(lo, hi + 1, shape, dtype=torch.int8)


def _out_hw(h: int, w: int, k: int, geom: K.ConvGeometry) -> tuple[int, int]:
    (sh, sw), (ph, pw), (dh, dw) = geom.stride, geom.padding, geom.dilation
    return (h + 2 * ph - dh * (k - 1) - 1) // sh + 1, (w + 2 * pw - dw * (k - 1) - 1) // sw + 1


def _case(n: int, cin: int, cout: int, h: int, w: int, k: int, geom: K.ConvGeometry, cl: bool):
    x = _codes((n, cin, h, w))
    wq = _codes((cout, cin // geom.groups, k, k))
    g = _codes((n, cout, *_out_hw(h, w, k, geom)))
    if cl:
        x, g = x.contiguous(memory_format=torch.channels_last), g.contiguous(memory_format=torch.channels_last)
    return x, wq, g


def _assert_all_exact(x: torch.Tensor, wq: torch.Tensor, g: torch.Tensor, geom: K.ConvGeometry) -> None:
    y = K.conv2d_forward(x, ONE, wq, ONE, geom)
    assert torch.equal(y, R.conv2d_forward(x, ONE, wq, ONE, geom))
    dx = K.conv2d_input_grad(g, ONE, wq, ONE, tuple(x.shape), geom)
    assert dx.shape == x.shape
    assert torch.equal(dx, R.conv2d_input_grad(g, ONE, wq, ONE, tuple(x.shape), geom))
    dw = K.conv2d_weight_grad(g, ONE, x, ONE, tuple(wq.shape), geom)
    assert torch.equal(dw, R.conv2d_weight_grad(g, ONE, x, ONE, tuple(wq.shape), geom))


# (k, stride, padding, dilation): 1x1 / 3x3 / 5x5 with the usual and some odd geometries
GEOMS = [
    (1, 1, 0, 1), (1, 2, 0, 1), (3, 1, 1, 1), (3, 2, 1, 1), (3, 1, 0, 1), (3, 2, 2, 1),
    (3, 1, 2, 2), (3, 2, 1, 2), (5, 1, 2, 1), (5, 2, 2, 1), (5, 1, 0, 1), (3, 1, 2, 1),
]


@pytest.mark.parametrize("k,s,p,d", GEOMS)
@pytest.mark.parametrize("groups", ["1", "2", "dw"])
@pytest.mark.parametrize("cl", [True, False], ids=["cl", "nchw"])
def test_exact_grid(k: int, s: int, p: int, d: int, groups: str, cl: bool) -> None:
    torch.manual_seed(hash((k, s, p, d, groups, cl)) % 2**31)
    cin = 6
    g = {"1": 1, "2": 2, "dw": cin}[groups]
    cout = cin if groups == "dw" else 4
    geom = K.ConvGeometry((s, s), (p, p), (d, d), g)
    for n, h, w in [(1, 7, 9), (3, 8, 6)]:
        _assert_all_exact(*_case(n, cin, cout, h, w, k, geom, cl), geom)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_batch_sizes(n: int) -> None:
    torch.manual_seed(n)
    geom = K.ConvGeometry((1, 1), (1, 1), (1, 1), 1)
    x, wq, g = _case(n, 8, 8, 5, 5, 3, geom, cl=True)
    _assert_all_exact(x, wq, g, geom)
    assert K.conv2d_forward(x, ONE, wq, ONE, geom).shape == (n, 8, 5, 5)


def test_resnet_shapes_exact() -> None:
    torch.manual_seed(1)
    for cin, cout, hw, s in [(16, 16, 32, 1), (16, 32, 32, 2), (64, 64, 8, 1)]:
        geom = K.ConvGeometry((s, s), (1, 1), (1, 1), 1)
        _assert_all_exact(*_case(4, cin, cout, hw, hw, 3, geom, cl=True), geom)


def test_anisotropic_geometry() -> None:
    torch.manual_seed(2)
    geom = K.ConvGeometry((2, 1), (1, 0), (1, 2), 1)
    x = _codes((2, 3, 9, 8))
    wq = _codes((5, 3, 3, 2))
    y = R.conv2d_forward(x, ONE, wq, ONE, geom)
    g = _codes(tuple(y.shape))
    _assert_all_exact(x, wq, g, geom)


def test_onednn_exactness_probe_tells_the_truth() -> None:
    """The probe's verdict holds on other codes and another geometry: exact sums where it says exact, and where it
    says not (an AVX2-only CPU: saturating int16 pairs), a 1x1 convolution whose every product pair overflows
    int16 comes out wrong."""
    xu8 = torch.full((2, 32, 5, 5), 255, dtype=torch.uint8)
    wq = torch.full((16, 32, 1, 1), 127, dtype=torch.int8)
    wq[::2] = -128
    exact = F.conv2d(xu8.double() - 128, wq.double())
    got = K._qconv_raw(xu8.contiguous(memory_format=torch.channels_last), 1.0, wq, torch.ones(16), [1, 1], [0, 0],
                       [1, 1], 1)
    assert torch.equal(got.double(), exact) == K.onednn_int8_conv_exact()


@pytest.mark.parametrize("k,s,p,d", [(3, 1, 1, 1), (3, 2, 1, 1), (1, 2, 0, 1), (5, 1, 2, 2)])
@pytest.mark.parametrize("groups", [1, 2])
def test_exact_where_onednn_conv_saturates(monkeypatch: pytest.MonkeyPatch, k: int, s: int, p: int, d: int,
                                           groups: int) -> None:
    """Where oneDNN's int8 convolution is not exact (no VNNI) and the native kernel cannot run, forward and input
    gradient take im2col + the exact integer GEMM: still bit for bit the reference, on codes at the extremes."""
    monkeypatch.setattr(K, "onednn_int8_conv_exact", lambda: False)
    monkeypatch.setattr(K.native, "conv_forward_supported", lambda *a: False)
    torch.manual_seed(k * 100 + s * 10 + p + d + groups)
    geom = K.ConvGeometry((s, s), (p, p), (d, d), groups)
    x, wq, g = _case(3, 8, 8, 9, 8, k, geom, cl=True)
    x[0] = 127
    wq[0] = -128
    _assert_all_exact(x, wq, g, geom)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 3), cg=st.integers(1, 4), og=st.integers(1, 4), groups=st.integers(1, 3),
    h=st.integers(3, 10), w=st.integers(3, 10), k=st.sampled_from([1, 2, 3, 5]),
    s=st.integers(1, 3), p=st.integers(0, 2), d=st.integers(1, 2), cl=st.booleans(), seed=st.integers(0, 999),
)
def test_exact_random(n, cg, og, groups, h, w, k, s, p, d, cl, seed) -> None:
    geom = K.ConvGeometry((s, s), (p, p), (d, d), groups)
    if min(h, w) + 2 * p < d * (k - 1) + 1:
        return
    torch.manual_seed(seed)
    _assert_all_exact(*_case(n, cg * groups, og * groups, h, w, k, geom, cl), geom)


def test_large_reduction_forward_exact() -> None:
    """Cin*k*k > 514: oneDNN's float zero-point compensation would round; must stay exact."""
    torch.manual_seed(3)
    cin = 128
    geom = K.ConvGeometry((1, 1), (1, 1), (1, 1), 1)
    x = torch.where(torch.rand(2, cin, 6, 6) < 0.9, 127, _codes((2, cin, 6, 6)).int()).to(torch.int8)
    wq = torch.where(torch.rand(cin, cin, 3, 3) < 0.9, 127, _codes((cin, cin, 3, 3)).int()).to(torch.int8)
    assert not K._accumulator_safe(wq)
    y = K.conv2d_forward(x, ONE, wq, ONE, geom)
    assert torch.equal(y, R.conv2d_forward(x, ONE, wq, ONE, geom))
    g = _codes((2, cin, 6, 6))
    dx = K.conv2d_input_grad(g, ONE, wq, ONE, tuple(x.shape), geom)
    assert torch.equal(dx, R.conv2d_input_grad(g, ONE, wq, ONE, tuple(x.shape), geom))


def test_accumulator_bound_matches_its_definition() -> None:
    """The per-channel bound (worst of 255 * max(pos, neg) and 128 * (pos + neg) within 2^24) on weights on both
    sides of it, the code -128 included."""
    gen = torch.Generator().manual_seed(5)
    seen = set()
    for trial in range(60):
        taps, lim = (576, 1800, 4000)[trial % 3], (128, 60, 20)[trial % 3]
        wq = torch.randint(-lim, lim, (4, taps), dtype=torch.int8, generator=gen)
        if trial % 4 == 0:
            wq[trial % 4] = -128
        w = wq.to(torch.int64)
        pos, neg = w.clamp(min=0).sum(1), (-w).clamp(min=0).sum(1)
        want = bool(torch.maximum(255 * torch.maximum(pos, neg), 128 * (pos + neg)).max() <= 1 << 24)
        assert K._accumulator_safe(wq.reshape(4, taps, 1, 1)) is want
        seen.add(want)
    assert seen == {True, False}
    # a long reduction of saturated weights (products past 2^31: the sums are int64, no wrap-around)
    assert K._accumulator_safe(torch.full((1, 40000, 1, 1), -128, dtype=torch.int8)) is False


def test_real_scales() -> None:
    torch.manual_seed(4)
    for s, groups in [(1, 1), (2, 1), (1, 2)]:
        geom = K.ConvGeometry((s, s), (1, 1), (1, 1), groups)
        x, wq, g = _case(3, 8, 6, 9, 9, 3, geom, cl=True)
        xs, gs = torch.tensor([0.0123]), torch.tensor([3.7e-5])
        ws_out = torch.rand(6) + 0.01  # per output channel (forward)
        ws_in = torch.rand(8) + 0.01  # per input channel (input grad)
        gs_out = torch.rand(6) + 0.01  # per output channel (weight grad)
        pairs = [
            (K.conv2d_forward(x, xs, wq, ws_out, geom), R.conv2d_forward(x, xs, wq, ws_out, geom)),
            (K.conv2d_input_grad(g, gs, wq, ws_in, tuple(x.shape), geom),
             R.conv2d_input_grad(g, gs, wq, ws_in, tuple(x.shape), geom)),
            (K.conv2d_weight_grad(g, gs_out, x, xs, tuple(wq.shape), geom),
             R.conv2d_weight_grad(g, gs_out, x, xs, tuple(wq.shape), geom)),
        ]
        for got, want in pairs:
            torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


def test_per_channel_scale_axes() -> None:
    """Each per-channel scale lands on its own axis: scaling one channel scales only it."""
    torch.manual_seed(5)
    geom = K.ConvGeometry((1, 1), (1, 1), (1, 1), 1)
    x, wq, g = _case(2, 4, 3, 5, 5, 3, geom, cl=True)
    base_y = K.conv2d_forward(x, ONE, wq, ONE, geom)
    y = K.conv2d_forward(x, ONE, wq, torch.tensor([1.0, 2.0, 4.0]), geom)
    assert torch.equal(y, base_y * torch.tensor([1.0, 2.0, 4.0]).view(1, 3, 1, 1))
    base_dx = K.conv2d_input_grad(g, ONE, wq, ONE, tuple(x.shape), geom)
    dx = K.conv2d_input_grad(g, ONE, wq, torch.tensor([1.0, 2.0, 4.0, 8.0]), tuple(x.shape), geom)
    assert torch.equal(dx, base_dx * torch.tensor([1.0, 2.0, 4.0, 8.0]).view(1, 4, 1, 1))
    base_dw = K.conv2d_weight_grad(g, ONE, x, ONE, tuple(wq.shape), geom)
    dw = K.conv2d_weight_grad(g, torch.tensor([1.0, 2.0, 4.0]), x, ONE, tuple(wq.shape), geom)
    assert torch.equal(dw, base_dw * torch.tensor([1.0, 2.0, 4.0]).view(3, 1, 1, 1))


def test_weight_grad_overflow_chunking() -> None:
    """Worst-case codes: the full-batch int32 sum would overflow (> 2^31); chunks must not."""
    n, c, hw = 130, 2, 32  # 130 * 32 * 32 * 128 * 128 = 2.18e9 > 2^31 - 1
    geom = K.ConvGeometry((1, 1), (0, 0), (1, 1), 1)
    for xv, gv in [(-128, -128), (127, -128)]:
        x = torch.full((n, c, hw + 2, hw + 2), xv, dtype=torch.int8)
        g = torch.full((n, c, hw, hw), gv, dtype=torch.int8)
        dw = K.conv2d_weight_grad(g, ONE, x, ONE, (c, c, 3, 3), geom)
        exact = torch.full((c, c, 3, 3), n * hw * hw * xv * gv, dtype=torch.int64)  # int64 reference
        assert exact.abs().max() > 2**31 - 1
        assert torch.equal(dw, exact.to(torch.float64).to(torch.float32))
        assert torch.equal(dw, R.conv2d_weight_grad(g, ONE, x, ONE, (c, c, 3, 3), geom))


def test_u8_variants_match() -> None:
    torch.manual_seed(6)
    geom = K.ConvGeometry((2, 2), (1, 1), (1, 1), 1)
    x, wq, g = _case(2, 4, 4, 8, 8, 3, geom, cl=True)
    xu = (x.to(torch.int16) + 128).to(torch.uint8)
    gu = (g.to(torch.int16) + 128).to(torch.uint8)
    assert torch.equal(K.to_shifted_u8(x), xu)
    assert torch.equal(K.conv2d_forward_u8(xu, ONE, wq, ONE, geom), K.conv2d_forward(x, ONE, wq, ONE, geom))
    assert torch.equal(
        K.conv2d_input_grad_u8(gu, ONE, wq, ONE, tuple(x.shape), geom),
        K.conv2d_input_grad(g, ONE, wq, ONE, tuple(x.shape), geom),
    )


@pytest.mark.parametrize("k,s,p,d", GEOMS)
@pytest.mark.parametrize("groups", [1, 2])
def test_reference_matches_torch_float64(k: int, s: int, p: int, d: int, groups: int) -> None:
    torch.manual_seed(7)
    geom = K.ConvGeometry((s, s), (p, p), (d, d), groups)
    x, wq, g = _case(2, 4, 6, 8, 7, k, geom, cl=False)
    xd, wd, gd = x.double(), wq.double(), g.double()
    kw = dict(stride=s, padding=p, dilation=d, groups=groups)
    assert torch.equal(R.conv2d_forward(x, ONE, wq, ONE, geom), F.conv2d(xd, wd, **kw).float())
    assert torch.equal(
        R.conv2d_input_grad(g, ONE, wq, ONE, tuple(x.shape), geom),
        torch.nn.grad.conv2d_input(x.shape, wd, gd, **kw).float(),
    )
    assert torch.equal(
        R.conv2d_weight_grad(g, ONE, x, ONE, tuple(wq.shape), geom),
        torch.nn.grad.conv2d_weight(xd, wq.shape, gd, **kw).float(),
    )


@pytest.mark.parametrize("cig,cog", [(1, 36), (5, 41), (4, 48), (1, 1), (1, 2)])
def test_grouped_wide_exact(cig: int, cog: int) -> None:
    """Grouped shapes where oneDNN's grouped int8 conv is wrong (worked around per group)."""
    torch.manual_seed(8)
    geom = K.ConvGeometry((1, 1), (1, 1), (1, 1), 2)
    _assert_all_exact(*_case(2, 2 * cig, 2 * cog, 6, 5, 3, geom, cl=True), geom)
