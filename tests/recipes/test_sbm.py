"""sbm (Banner et al. NeurIPS 2018): gradient bifurcation is the exact 16-bit dW product; digits."""

import pytest
import torch
from torch import nn

import inttrain
from digits_utils import cnn, mlp, train
from inttrain.kernels import int_kernel_calls, reset_kernel_calls
from inttrain.kernels.fused import quantize_matrix
from inttrain.autograd.conv import _quantize_activation
from inttrain.kernels import conv_reference
from inttrain.kernels.conv import ConvGeometry
from inttrain.kernels.matmul import int_mm_reference
from inttrain.nn.range_bn import RangeBatchNorm2d, use_range_bn_
from inttrain.recipes import SbmConfig
from inttrain.spec import Rounding, UnsupportedFormatError


def test_bifurcation_dw_is_the_exact_16bit_product_and_dx_uses_8bit():
    torch.manual_seed(0)
    layer = nn.Linear(48, 24)
    inttrain.prepare_(layer, SbmConfig(grad_rounding=Rounding.NEAREST_EVEN))
    prec = layer.precision
    assert prec.grad_weight.lhs.bits == 16 and prec.grad_input.lhs.bits == 8 and prec.forward.lhs.bits == 8
    x = torch.randn(40, 48, requires_grad=True)
    dy = torch.randn(40, 24) * torch.logspace(-3, 1, 24)  # wide dynamic range: 8 bits would lose the small ones
    layer(x).backward(dy)
    qg, sg = quantize_matrix(dy, prec.grad_weight.lhs, 1, transpose=True)
    qx, sx = quantize_matrix(x.detach(), prec.grad_weight.rhs, 1)
    assert qg.dtype == torch.int16
    exact = int_mm_reference(qg, qx).double() * sg.double() * sx.double()
    torch.testing.assert_close(layer.weight.grad.double(), exact, rtol=1e-6, atol=1e-9)
    float_dw = dy.t() @ x.detach()
    err16 = float((layer.weight.grad - float_dw).norm())
    q8, s8 = quantize_matrix(dy, prec.grad_input.lhs, 1, transpose=True)  # 8-bit dy^T for comparison
    err8 = float(((int_mm_reference(q8, qx).double() * s8 * sx).float() - float_dw).norm())
    assert err16 < err8


def test_conv_bifurcation_dw_is_the_exact_16bit_product():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, 3, padding=1)
    inttrain.prepare_(conv, SbmConfig(grad_rounding=Rounding.NEAREST_EVEN))
    prec = conv.precision
    assert prec.grad_weight.lhs.bits == 16 and prec.grad_input.lhs.bits == 8
    x = torch.randn(4, 3, 6, 6)
    dy = torch.randn(4, 5, 6, 6) * torch.logspace(-3, 1, 5).view(1, -1, 1, 1)
    conv(x).backward(dy)
    qx, sx = _quantize_activation(x, prec.grad_weight.rhs, 0)
    qg, sg = _quantize_activation(dy, prec.grad_weight.lhs, 0, per_channel=True)
    assert qg.dtype == torch.int16
    geom = ConvGeometry((1, 1), (1, 1), (1, 1), 1)
    exact = conv_reference.conv2d_weight_grad(qg, sg, qx, sx, tuple(conv.weight.shape), geom)
    torch.testing.assert_close(conv.weight.grad, exact, rtol=0, atol=0)


def test_bad_configs_fail_clearly():
    with pytest.raises(UnsupportedFormatError, match="allowed 2 to 16"):
        SbmConfig(wgrad_bits=17)
    with pytest.raises(UnsupportedFormatError, match="allowed 2 to 8"):
        SbmConfig(grad_bits=16)
    with pytest.raises(UnsupportedFormatError, match="sbm range_bn=1: allowed True or False"):
        SbmConfig(range_bn=1)


def test_range_bn_is_the_recipes_batch_norm_unless_turned_off():
    assert type(SbmConfig().convert_norms_(cnn())[1]) is RangeBatchNorm2d
    assert type(SbmConfig(range_bn=False).convert_norms_(cnn())[1]) is nn.BatchNorm2d
    assert SbmConfig().with_range_bn(False) == SbmConfig(range_bn=False)
    with pytest.raises(ValueError, match="recipe 'int8' has no Range BN choice; use sbm"):
        inttrain.get_config("int8").with_range_bn(False)


def test_sbm_mlp_matches_fp32_on_digits():
    fp32 = train(mlp, "fp32", False, 8, 0.05)
    reset_kernel_calls()
    acc = train(mlp, "sbm", False, 8, 0.05)
    assert sum(int_kernel_calls().values()) > 0
    print(f"sbm mlp {acc:.2f}% vs fp32 {fp32:.2f}%")
    assert acc >= fp32 - 1.5


def test_sbm_cnn_with_range_bn_learns_digits():
    def range_cnn():
        return cnn(bn=RangeBatchNorm2d)

    fp32 = train(cnn, "fp32", True, 6, 0.05)
    reset_kernel_calls()
    acc = train(range_cnn, "sbm", True, 6, 0.05)  # 16-bit weight-gradient convolutions
    assert int_kernel_calls().get("conv_wgrad", 0) > 0
    print(f"sbm cnn + Range BN {acc:.2f}% vs fp32 + BN {fp32:.2f}%")
    assert acc >= fp32 - 1.5
    assert type(use_range_bn_(cnn())[1]) is RangeBatchNorm2d
