"""DoReFa-Net (Zhou et al. 2016): the quantizers equal the paper's equations; integer GEMMs are exact; digits."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import inttrain
from inttrain.kernels import int_kernel_calls, reset_kernel_calls
from inttrain.recipes import DoReFaConfig, from_name
from inttrain.recipes.dorefa import dorefa_activation, dorefa_gradient, dorefa_weight, quantize_k
from inttrain.spec import UnsupportedFormatError
from digits_utils import cnn as _cnn, mlp as _mlp, train as _train


def test_quantize_k_eq5_by_hand():
    # k=2: 2^k - 1 = 3 levels; round half to even: 1.5 -> 2
    r = torch.tensor([0.0, 0.5, 1 / 3, 0.9, 1.0])
    assert torch.allclose(quantize_k(r, 2), torch.tensor([0.0, 2 / 3, 1 / 3, 1.0, 1.0]))


def test_weight_eq9_by_hand():
    # tanh = [0, .76159, -.96403]; u = t / (2 * .96403) + 1/2 = [.5, .89500, 0]; 3u = [1.5, 2.685, 0] -> [2, 3, 0]
    w = torch.tensor([0.0, 1.0, -2.0])
    assert torch.allclose(dorefa_weight(w, 2), torch.tensor([1 / 3, 1.0, -1.0]))


def test_activation_eq11_by_hand():
    x = torch.tensor([-0.5, 0.2, 0.6, 1.7])  # clip -> [0, .2, .6, 1]; x3 -> [0, .6, 1.8, 3] -> [0, 1, 2, 3]
    assert torch.allclose(dorefa_activation(x, 2), torch.tensor([0.0, 1 / 3, 2 / 3, 1.0]))


def test_activation_ste_gradient_is_one_inside_the_clip():
    x = torch.tensor([-0.5, 0.2, 0.6, 1.7], requires_grad=True)
    dorefa_activation(x, 2).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 0.0]


def test_activation_max_range_by_hand():
    # M = 1.7; clip(x, 0, M) / M = [0, .1176, .3529, 1]; x3 -> [0, .353, 1.059, 3] -> [0, 0, 1, 3]; / 3 * M
    x = torch.tensor([-0.5, 0.2, 0.6, 1.7], requires_grad=True)
    a = dorefa_activation(x, 2, "max")
    assert torch.allclose(a, torch.tensor([0.0, 0.0, 1.7 / 3, 1.7]))
    a.sum().backward()  # M is a constant to autograd: the STE passes 1 on [0, M], the maximum included
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0]
    assert dorefa_activation(torch.full((3,), -2.0), 4, "max").tolist() == [0.0, 0.0, 0.0]  # nothing positive
    with pytest.raises(ValueError, match="activation_range 'wide': allowed clip, max"):
        dorefa_activation(x, 2, "wide")


@pytest.mark.parametrize("make_layer,shape", [(lambda: nn.Linear(16, 8), (5, 16)),
                                              (lambda: nn.Conv2d(4, 6, 3, padding=1), (2, 4, 6, 6))])
def test_max_activation_range_gemms_are_exact(make_layer, shape):
    """k = 8 under "max": codes n in [0, 255] with the scale M / 255 (9-bit), multiplied exactly."""
    torch.manual_seed(0)
    layer = make_layer()
    x = torch.rand(*shape) * 5.0 - 1.0  # well past 1: the clip would lose most of it
    a, w = dorefa_activation(x, 8, "max"), dorefa_weight(layer.weight.detach(), 8)
    ref = F.linear(a, w, layer.bias.detach()) if x.dim() == 2 else F.conv2d(a, w, layer.bias.detach(), padding=1)
    inttrain.prepare_(layer, DoReFaConfig(activation_range="max", first_last_float=False))
    assert layer.precision.forward.lhs.fixed_amax is None
    reset_kernel_calls()
    y = layer(x)
    assert sum(int_kernel_calls().values()) > 0
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    clipped = dorefa_activation(x, 8)  # the paper's clip gives another product on these inputs
    other = F.linear(clipped, w, layer.bias.detach()) if x.dim() == 2 else F.conv2d(clipped, w, layer.bias.detach(), padding=1)
    assert not torch.allclose(ref, other, atol=1e-2)


def test_gradient_eq12_by_hand():
    dr = torch.tensor([-2.0, 1.0, 0.5, 2.0])
    # max|dr| = 2; r = dr / 4 + 1/2 = [0, .75, .625, 1]; 3r = [0, 2.25, 1.875, 3]
    no_noise = dorefa_gradient(dr, 2, noise=torch.zeros(4))  # -> [0, 2, 2, 3] / 3 - 1/2, times 4
    assert torch.allclose(no_noise, torch.tensor([-2.0, 2 / 3, 2 / 3, 2.0]))
    # N(k) = sigma / 3 with sigma = 0.4 on element 1: 3r + 0.4 = 2.65 -> 3 -> 4 * (1 - 1/2) = 2
    noisy = dorefa_gradient(dr, 2, noise=torch.tensor([0.0, 0.4, -0.4, 0.0]))  # element 2: 1.475 -> 1
    assert torch.allclose(noisy, torch.tensor([-2.0, 2.0, -2 / 3, 2.0]))


def test_gradient_noise_is_unbiased_and_keeps_the_extremes():
    torch.manual_seed(0)
    dr = torch.randn(20000)
    q = dorefa_gradient(dr, 3, seed=7)
    assert float(q.abs().max()) == pytest.approx(float(dr.abs().max()))
    assert float((q - dr).mean()) == pytest.approx(0.0, abs=0.02)


def test_gradient_zero_and_non_finite_pass_through_unchanged():
    assert dorefa_gradient(torch.zeros(4), 3, seed=1).tolist() == [0.0] * 4
    bad = torch.tensor([1.0, float("inf"), -2.0])
    assert torch.equal(dorefa_gradient(bad, 3, seed=1), bad)  # the layer's NaN/inf guard sees it as it was


def test_integer_gemms_multiply_the_papers_values_exactly():
    torch.manual_seed(0)
    layer = nn.Linear(16, 8)
    ref_w = dorefa_weight(layer.weight.detach(), 4)
    x = torch.rand(5, 16) * 1.5
    ref = F.linear(dorefa_activation(x, 4), ref_w, layer.bias.detach())
    inttrain.prepare_(layer, DoReFaConfig(w_bits=4, a_bits=4, g_bits=4, first_last_float=False))
    reset_kernel_calls()
    y = layer(x)
    assert sum(int_kernel_calls().values()) > 0
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)


def test_bad_configs_fail_with_the_allowed_range():
    with pytest.raises(UnsupportedFormatError, match="allowed 2 to 15"):
        DoReFaConfig(w_bits=16)
    with pytest.raises(UnsupportedFormatError, match="allowed"):
        DoReFaConfig(a_bits=1)
    with pytest.raises(UnsupportedFormatError, match="conv_bits=16: allowed 2 to 15 or None"):
        DoReFaConfig(conv_bits=16)
    with pytest.raises(UnsupportedFormatError, match="activation_range='wide': allowed clip, max"):
        DoReFaConfig(activation_range="wide")
    with pytest.raises(ValueError, match="dorefa"):
        from_name("dorefa-net")


def test_first_and_last_layers_stay_float():
    model = _mlp()
    inttrain.prepare_(model, "dorefa")
    kinds = [type(m).__name__ for m in model if isinstance(m, nn.Linear)]
    assert kinds == ["Linear", "QLinear", "Linear"]


@pytest.mark.parametrize("name,make_model,image,epochs,cfg,bar", [
    ("mlp-8bit", _mlp, False, 8, DoReFaConfig(w_bits=8, a_bits=8, g_bits=8), "gap"),
    ("cnn-4bit", _cnn, True, 6, DoReFaConfig(w_bits=4, a_bits=4, g_bits=6), 90.0),
])
def test_dorefa_learns_digits(name, make_model, image, epochs, cfg, bar):
    fp32 = _train(make_model, "fp32", image, epochs, 0.05)
    reset_kernel_calls()
    acc = _train(make_model, cfg, image, epochs, 0.05)
    assert sum(int_kernel_calls().values()) > 0
    if bar == "gap":
        assert acc >= fp32 - 1.5, f"{name}: dorefa {acc:.2f}% vs fp32 {fp32:.2f}%"
    else:
        assert acc >= bar, f"{name}: dorefa {acc:.2f}% (fp32 {fp32:.2f}%)"


def test_conv_forward_is_exact_and_float_gradients_option():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = torch.rand(2, 3, 6, 6) * 1.2
    ref = F.conv2d(dorefa_activation(x, 5), dorefa_weight(conv.weight.detach(), 3), conv.bias.detach(), padding=1)
    inttrain.prepare_(conv, DoReFaConfig(w_bits=3, a_bits=5, g_bits=None, first_last_float=False))
    assert not conv.precision.grad_input.integer and not conv.precision.grad_weight.integer
    xr = x.clone().requires_grad_(True)
    y = conv(xr)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    y.sum().backward()  # float gradients through the STE transforms
    assert torch.isfinite(conv.weight.grad).all() and torch.isfinite(xr.grad).all()


def _conv_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.Conv2d(4, 4, 3), nn.Flatten(), nn.Linear(16, 8), nn.Linear(8, 8),
                         nn.Linear(8, 2))


def test_defaults_run_k8_on_convolutions_exactly():
    """The default k = 8 needs 9-bit codes: convolutions split them into int8 halves, as Linear layers do."""
    model = _conv_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # nothing is clamped any more
        inttrain.prepare_(model, "dorefa")
    assert model[1].precision.forward.rhs.fmt.bits == model[4].precision.forward.rhs.fmt.bits == 9
    x = torch.rand(4, 4, 6, 6)
    ref = F.conv2d(dorefa_activation(x, 8), dorefa_weight(model[1].weight.detach(), 8), model[1].bias.detach())
    reset_kernel_calls()
    torch.testing.assert_close(model[1](x), ref, rtol=1e-6, atol=1e-6)
    assert sum(int_kernel_calls().values()) > 0


def test_conv_bits_clamps_convolutions_and_says_so():
    model = _conv_model()
    with pytest.warns(UserWarning, match=r"Conv2d layers run k = 7/7/7 \(w/a/g\) instead of 8/8/8"):
        inttrain.prepare_(model, DoReFaConfig(conv_bits=7))
    cfg = DoReFaConfig(conv_bits=7)
    assert cfg.layer_bits(model[1]) == (7, 7, 7) and cfg.layer_bits(model[4]) == (8, 8, 8)
    assert model[1].precision.forward.rhs.fmt.bits == 8  # k = 7 -> signed 8-bit codes
    assert model[4].precision.forward.rhs.fmt.bits == 9
    x = torch.rand(4, 4, 6, 6)
    ref = F.conv2d(dorefa_activation(x, 7), dorefa_weight(model[1].weight.detach(), 7), model[1].bias.detach())
    torch.testing.assert_close(model[1](x), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("compiled", ["0", "1"])
def test_the_layer_hook_transforms_gradients_as_eq12_bit_for_bit(monkeypatch: pytest.MonkeyPatch, compiled: str) -> None:
    """The hook runs Eq. 12 as one fused (compiled) pass outside the tests: the same bits as the eager function,
    for every seed without recompiling per seed."""
    monkeypatch.setenv("INTTRAIN_COMPILE", compiled)
    hooks = DoReFaConfig().hooks_for(nn.Conv2d(3, 4, 3), "conv")
    g = torch.Generator().manual_seed(4)
    for seed, shape in [(0, (8, 4, 6, 6)), (12345, (8, 4, 6, 6)), (7, (5, 3))]:
        dy = torch.randn(shape, generator=g) * 1e-3
        assert torch.equal(hooks.grad_output(dy, seed), dorefa_gradient(dy, 8, seed))


@pytest.mark.parametrize("activation_range", ["clip", "max"])
def test_a_k8_convolution_runs_one_int8_kernel_call_per_gemm(activation_range: str) -> None:
    """At k = 8 the codes are affine in int8 (activations j + 128, weights and gradients 2 j + 1): each of the
    three GEMMs is one int8 convolution (kernels.conv_wide), not four of int8 halves."""
    torch.manual_seed(0)
    layer = nn.Conv2d(4, 6, 3, padding=1)
    inttrain.prepare_(layer, DoReFaConfig(first_last_float=False, activation_range=activation_range))
    x = torch.rand(2, 4, 7, 7, requires_grad=True)
    reset_kernel_calls()
    layer(x).square().sum().backward()
    assert int_kernel_calls() == {"conv_fwd": 1, "conv_dgrad": 1, "conv_wgrad": 1}
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


@pytest.mark.parametrize("activation_range", [pytest.param("clip", marks=pytest.mark.slow), "max"])  # ~40 s each
def test_a_dorefa_cnn_compiles_to_one_graph_and_trains_as_eager(activation_range: str) -> None:
    """fullgraph=True: no graph break (the Eq. 12 hook is a constant, the 9-bit convolutions are operator nodes);
    the compiled step's loss and gradients equal eager's up to float rounding of the fused transforms."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, stride=2),
                          nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16, 10))
    inttrain.prepare_(model, DoReFaConfig(activation_range=activation_range))
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, fullgraph=True)
    x, y = torch.rand(6, 3, 8, 8), torch.randint(0, 10, (6,))
    for run in (model, compiled):
        reset_kernel_calls()
        F.cross_entropy(run(x), y).backward()
        # the two middle convolutions (first and last layer float), one int8 call per GEMM either way
        assert int_kernel_calls() == {"conv_fwd": 2, "conv_dgrad": 2, "conv_wgrad": 2}
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6)
