"""wageubn (Yang et al., Neural Networks 2020): pow2 int8 W/A/E GEMMs, 8-bit G, 16-bit momentum,
24-bit weights/update, 8-bit BN; digits convergence."""

import copy
import math

import pytest
import torch
from torch import nn

import inttrain
from digits_utils import cnn, mlp, train
from inttrain.kernels import int_kernel_calls, reset_kernel_calls
from inttrain.nn.quant_bn import QuantBatchNorm2d, pow2_quantize
from inttrain.recipes import WageubnConfig, WageubnSGD
from inttrain.recipes.wageubn import quantize_grads_
from inttrain.spec import PerChannel, PerTensor, ScaleKind, UnsupportedFormatError


def _is_pow2(s) -> bool:
    e = math.log2(float(s))
    return e == round(e)


def _q(t, bits=8):
    return torch.mul(*pow2_quantize(t, bits))


def test_precision_is_per_tensor_pow2_int8_everywhere():
    for layer in (nn.Linear(4, 3), nn.Conv2d(2, 3, 3)):
        inttrain.prepare_(layer, "wageubn")
        for gemm in (layer.precision.forward, layer.precision.grad_input, layer.precision.grad_weight):
            assert gemm.integer
            for spec in (gemm.lhs, gemm.rhs):
                assert spec.bits == 8 and spec.scale_kind is ScaleKind.POW2 and isinstance(spec.granularity, PerTensor)


def test_linear_gemms_are_exact_pow2_int8_products():
    torch.manual_seed(0)
    layer = nn.Linear(24, 10)
    inttrain.prepare_(layer, "wageubn")
    x = torch.randn(16, 24, requires_grad=True)
    y = layer(x)
    xq, wq = _q(x.detach()), _q(layer.weight.detach())
    torch.testing.assert_close(y, xq @ wq.t() + layer.bias, rtol=1e-6, atol=1e-6)
    dy = torch.randn(16, 10) * 0.01
    y.backward(dy)
    eq = _q(dy)
    torch.testing.assert_close(x.grad, eq @ wq, rtol=1e-6, atol=1e-9)  # E x W
    torch.testing.assert_close(layer.weight.grad, eq.t() @ xq, rtol=1e-6, atol=1e-9)  # E^T x A


def test_per_sample_grad_puts_each_samples_errors_on_its_own_pow2_scale():
    cfg = WageubnConfig(per_sample_grad=True)
    for layer in (nn.Linear(4, 3), nn.Conv2d(2, 3, 3)):
        prec = cfg.precision_for(layer, "m")
        assert prec.grad_input.lhs.granularity == PerChannel(0) and prec.grad_input.lhs.scale_kind is ScaleKind.POW2
        assert all(isinstance(s.granularity, PerTensor) for s in (prec.forward.lhs, prec.grad_weight.lhs))
    torch.manual_seed(0)
    layer = nn.Linear(24, 10)
    inttrain.prepare_(layer, cfg)
    x = torch.randn(16, 24, requires_grad=True)
    dy = torch.randn(16, 10) * torch.logspace(0, -4, 16).view(-1, 1)  # rows 10**4 apart
    layer(x).backward(dy)
    eq = torch.cat([_q(row) for row in dy.split(1)])  # each row of E on its own power-of-two grid
    torch.testing.assert_close(x.grad, eq @ _q(layer.weight.detach()), rtol=1e-6, atol=0)
    conv = nn.Conv2d(4, 4, 3, padding=1)
    xs, gs = torch.randn(4, 4, 6, 6), torch.randn(4, 4, 6, 6) * torch.logspace(0, -4, 4).view(-1, 1, 1, 1)
    grads = {}
    for on in (False, True):
        m = inttrain.prepare_(nn.Sequential(copy.deepcopy(conv)), WageubnConfig(per_sample_grad=on))
        xi = xs.clone().requires_grad_()
        m(xi).backward(gs)
        grads[on] = xi.grad
    assert torch.count_nonzero(grads[False][3]) == 0  # 1e-4 of the largest: nothing left on one scale per tensor
    assert torch.count_nonzero(grads[True][3]) > 0.9 * grads[True][3].numel()
    with pytest.raises(ValueError, match="wageubn per_sample_grad must be True or False, got 'yes'"):
        WageubnConfig(per_sample_grad="yes")


def test_quantize_grads_hand_made_and_at_most_256_levels():
    p = nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([0.3, -0.01, 1.0])  # 1/127 -> scale 2^-6: codes 19.2 -> 19, -0.64 -> -1, 64
    quantize_grads_([p])
    assert p.grad.tolist() == [19 / 64, -1 / 64, 1.0]
    torch.manual_seed(0)
    for stochastic in (False, True):
        q = nn.Parameter(torch.zeros(64, 64))
        q.grad = torch.randn(64, 64) * torch.logspace(-4, 0, 64)
        quantize_grads_([q], stochastic=stochastic, seed=5)
        levels = torch.unique(q.grad)
        assert len(levels) <= 2**8
        step = (levels[1:] - levels[:-1]).min()
        assert _is_pow2(step) and torch.equal(levels / step, (levels / step).round())


@pytest.mark.parametrize("nesterov", [False, True])
def test_wageubn_sgd_update_widths_match_the_definition(nesterov: bool):
    torch.manual_seed(0)
    w0 = torch.randn(8, 5)
    p = nn.Parameter(w0.clone())
    opt = WageubnSGD([p], lr=0.1, momentum=0.9, nesterov=nesterov)
    grads = [torch.randn(8, 5) * 0.1, torch.randn(8, 5) * 0.3]
    w, m = w0.clone(), None
    for g in grads:
        p.grad = g.clone()
        opt.step()
        gq = _q(g, 8)
        m = _q(gq if m is None else 0.9 * m + gq, 16)
        _, s_w = pow2_quantize(w, 24)
        d = gq + 0.9 * m if nesterov else m  # nesterov: torch.optim.SGD's form on the quantized g and m
        u = torch.round(0.1 * d / s_w).clamp(-(2**23 - 1), 2**23 - 1) * s_w
        w = _q(w - u, 24)
        assert torch.equal(p.grad, gq)  # the optimizer saw the 8-bit gradient
        assert len(torch.unique(p.grad)) <= 2**8
        st = opt.state[p]
        assert torch.equal(st["momentum"], m) and torch.equal(st["update"], u) and torch.equal(p.detach(), w)
        for t, bits in ((st["momentum"], 16), (p.detach(), 24)):
            codes, s = pow2_quantize(t, bits)
            assert _is_pow2(s) and torch.equal(codes * s, t) and codes.abs().max() <= 2 ** (bits - 1) - 1
        # the update is an integer number of 24-bit weight LSBs, far below the 24-bit range
        codes = st["update"] / s_w
        assert torch.equal(codes, codes.round()) and codes.abs().max() <= 2**23 - 1 and codes.abs().max() > 0


def test_bad_configs_fail_clearly():
    with pytest.raises(UnsupportedFormatError, match="allowed 2 to 8"):
        WageubnConfig(bits=12)
    with pytest.raises(UnsupportedFormatError, match="allowed 2 to 24"):
        WageubnConfig(w_bits=32)
    with pytest.raises(ValueError, match="allowed 2 to 24"):
        WageubnSGD([nn.Parameter(torch.zeros(1))], lr=0.1, m_bits=1)
    assert isinstance(inttrain.get_config("wageubn"), WageubnConfig)


def _opt(cfg):
    return lambda model, lr: cfg.optimizer(model.parameters(), lr)


def test_wageubn_mlp_matches_fp32_on_digits():
    cfg = WageubnConfig()
    fp32 = train(mlp, "fp32", False, 8, 0.05)
    reset_kernel_calls()
    acc = train(mlp, cfg, False, 8, 0.05, make_optimizer=_opt(cfg))  # measured 97.78 vs fp32 98.33
    assert sum(int_kernel_calls().values()) > 0
    print(f"wageubn mlp {acc:.2f}% vs fp32 {fp32:.2f}%")
    assert acc >= fp32 - 1.5


def test_wageubn_cnn_with_quant_bn_matches_fp32_on_digits():
    cfg = WageubnConfig()
    fp32 = train(cnn, "fp32", True, 6, 0.05)
    reset_kernel_calls()
    acc = train(lambda: cnn(bn=QuantBatchNorm2d), cfg, True, 6, 0.05, make_optimizer=_opt(cfg))  # measured 98.06 vs 98.06
    assert int_kernel_calls().get("conv_wgrad", 0) > 0
    print(f"wageubn cnn + 8-bit BN {acc:.2f}% vs fp32 + BN {fp32:.2f}%")
    assert acc >= fp32 - 1.5


def test_grad_rounding_sets_both_gradient_quantizers() -> None:
    """``--grad-rounding stochastic`` for wageubn: the errors in both backward GEMMs and the weight gradient G."""
    from inttrain.cli.run import recipe_config_for
    from inttrain.spec import Rounding

    cfg = recipe_config_for("wageubn", None, grad_rounding="stochastic")
    assert (cfg.e_rounding, cfg.g_rounding) == (Rounding.STOCHASTIC, Rounding.STOCHASTIC)
    prec = cfg.precision_for(nn.Linear(4, 4), "fc")
    assert prec.grad_input.lhs.rounding is prec.grad_weight.lhs.rounding is Rounding.STOCHASTIC
    assert prec.forward.lhs.rounding is Rounding.NEAREST_EVEN  # W and A stay nearest
    opt = cfg.optimizer(nn.Linear(4, 4).parameters(), 0.1)
    assert opt.g_stochastic
    assert not WageubnConfig().optimizer(nn.Linear(4, 4).parameters(), 0.1).g_stochastic


def test_weight_grad_rounding_sets_the_dw_gemm_and_g_only() -> None:
    """``--weight-grad-rounding stochastic`` for wageubn: E in the dW GEMM and G stochastic, E in the dx GEMM kept
    (nearest by default), the int8 recipe's split."""
    from inttrain.cli.run import recipe_config_for
    from inttrain.spec import Rounding

    cfg = recipe_config_for("wageubn", None, weight_grad_rounding="stochastic")
    prec = cfg.precision_for(nn.Conv2d(2, 2, 3), "conv")
    assert prec.grad_input.lhs.rounding is Rounding.NEAREST_EVEN
    assert prec.grad_weight.lhs.rounding is Rounding.STOCHASTIC
    assert prec.forward.lhs.rounding is prec.forward.rhs.rounding is Rounding.NEAREST_EVEN
    assert cfg.optimizer(nn.Linear(4, 4).parameters(), 0.1).g_stochastic
    both = recipe_config_for("wageubn", None, weight_grad_rounding="nearest", grad_rounding="stochastic")
    prec = both.precision_for(nn.Linear(4, 4), "fc")
    assert (prec.grad_input.lhs.rounding, prec.grad_weight.lhs.rounding) == (Rounding.STOCHASTIC, Rounding.NEAREST_EVEN)
    assert not both.optimizer(nn.Linear(4, 4).parameters(), 0.1).g_stochastic


def test_norm_bits_sets_the_quantized_batch_norm_width() -> None:
    """``--norm-bits 16``: every batch norm quantizes to 16 bits (65535 levels at most, a finer grid than 8 bits);
    ``restore_`` gives back a plain BatchNorm2d."""
    from inttrain.cli.run import recipe_config_for

    torch.manual_seed(0)
    x = torch.randn(8, 3, 6, 6)
    outputs = {}
    for bits in (8, 16):
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
        cfg = recipe_config_for("wageubn", None, norm_bits=bits) if bits != 8 else WageubnConfig()
        assert cfg.norm_bits == bits
        inttrain.prepare_(model, cfg)
        assert type(model[1]) is QuantBatchNorm2d and model[1].bits == bits
        ref = nn.functional.batch_norm(model[0](x), None, None, model[1].weight, model[1].bias, training=True)
        outputs[bits] = (model(x).detach(), ref.detach())
        inttrain.restore_(model)
        assert type(model[1]) is nn.BatchNorm2d and "bits" not in model[1].__dict__
    (y8, ref8), (y16, ref16) = outputs[8], outputs[16]
    assert len(torch.unique(y8)) <= 255 < len(torch.unique(y16)) <= 65535
    sqnr = {b: 10 * math.log10(float(r.pow(2).sum() / (y - r).pow(2).sum())) for b, (y, r) in outputs.items()}
    assert sqnr[8] < 46 and sqnr[16] > sqnr[8] + 30, sqnr  # measured 40.8 and 89.3 dB


def test_weight_grad_bits_sets_g() -> None:
    """``--weight-grad-bits 16``: the optimizer quantizes the weight gradient G to 16 bits (at most 2**16 - 1 levels,
    more than 8 bits' 255)."""
    from inttrain.cli.run import recipe_config_for

    cfg = recipe_config_for("wageubn", None, weight_grad_bits=16)
    assert cfg.g_bits == 16 and WageubnConfig().g_bits == 8
    torch.manual_seed(0)
    levels = {}
    for c in (WageubnConfig(), cfg):
        p = nn.Parameter(torch.zeros(4096))
        p.grad = torch.randn(4096)
        c.optimizer([p], 0.1).step()
        levels[c.g_bits] = len(torch.unique(p.grad))
    assert levels[8] <= 255 < 1000 < levels[16]
    with pytest.raises(UnsupportedFormatError, match="wageubn norm_bits=1: allowed 2 to 24"):
        WageubnConfig(norm_bits=1)
    for recipe, method, missing in (("int8", "with_norm_bits", "quantized batch norm; use wageubn"),
                                    ("sbm", "with_weight_grad_bits", "quantized weight gradient; use wageubn")):
        with pytest.raises(ValueError, match=f"recipe '{recipe}' has no {missing}"):
            getattr(inttrain.get_config(recipe), method)(16)
