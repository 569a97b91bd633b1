"""QLinear/QConv2d as drop-in layers and the prepare_/restore_ entry point."""

import logging

import pytest
import torch
from torch import nn

import inttrain
from inttrain.kernels import int_kernel_calls, reset_kernel_calls
from inttrain.nn import QLinear
from inttrain.recipes import Int8MixedConfig
from inttrain.spec import UnsupportedFormatError


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_prepare_swaps_in_place_and_keeps_parameters_and_keys():
    model = _mlp()
    params_before = [id(p) for p in model.parameters()]
    keys_before = list(model.state_dict())
    assert inttrain.prepare_(model, "int8") is model
    assert isinstance(model[0], QLinear) and isinstance(model[2], QLinear)
    assert [id(p) for p in model.parameters()] == params_before
    assert list(model.state_dict()) == keys_before
    inttrain.restore_(model)
    assert type(model[0]) is nn.Linear and not hasattr(model[0], "precision")


def test_fp32_checkpoint_loads_into_prepared_model_and_back():
    fp32 = _mlp()
    prepared = inttrain.prepare_(_mlp(), "int8")
    prepared.load_state_dict(fp32.state_dict())
    plain = _mlp()
    plain.load_state_dict(prepared.state_dict())
    for a, b in zip(fp32.state_dict().values(), plain.state_dict().values()):
        assert torch.equal(a, b)


def test_optimizer_built_before_prepare_still_trains_the_same_tensors():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    inttrain.prepare_(model, "int8")
    w0 = model[0].weight.detach().clone()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    assert not torch.equal(model[0].weight, w0)


def test_training_step_runs_three_int_gemms_per_layer():
    model = inttrain.prepare_(_mlp(), "int8")
    reset_kernel_calls()
    model(torch.randn(32, 8)).pow(2).mean().backward()
    # 2 layers x (forward + grad_weight) + grad_input for the second layer only: the first layer's input
    # does not require grad, so autograd never asks for dx there.
    assert int_kernel_calls()["int8_mm"] == 5


def test_filter_fn_and_logged_skips(caplog):
    model = _mlp()
    with caplog.at_level(logging.INFO, logger="inttrain"):
        inttrain.prepare_(model, "int8", filter_fn=lambda m, fqn: fqn != "2")
    assert isinstance(model[0], QLinear) and type(model[2]) is nn.Linear
    assert "excluded by filter_fn" in caplog.text


def test_unservable_layers_stay_float_with_a_reason(caplog):
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding="same"), nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"),
                          nn.MultiheadAttention(8, 2))
    with caplog.at_level(logging.INFO, logger="inttrain"), pytest.warns(inttrain.FloatFallbackWarning) as record:
        inttrain.prepare_(model, "int8")
    assert type(model[0]) is nn.Conv2d and type(model[1]) is nn.Conv2d
    messages = [str(w.message) for w in record]
    assert messages == [
        "inttrain: 0 (Conv2d) stays in float: padding='same' (give padding as numbers)",
        "inttrain: 1 (Conv2d) stays in float: padding_mode='reflect' (only zero padding)",
        "inttrain: 2 (MultiheadAttention) stays in float: its q/k/v projection is a raw parameter used by"
        " F.multi_head_attention_forward (write the projections as nn.Linear layers to convert them)",
        "inttrain: 2.out_proj (NonDynamicallyQuantizableLinear) stays in float: subclass"
        " NonDynamicallyQuantizableLinear of Linear (its owner may call the functional op on its weight, not its forward)",
    ]
    assert "padding='same'" in caplog.text and "NonDynamicallyQuantizableLinear" in caplog.text  # the logged table


def test_root_module_can_be_a_layer():
    lin = nn.Linear(3, 2)
    inttrain.prepare_(lin, "int8")
    assert isinstance(lin, QLinear)
    assert lin(torch.randn(5, 3)).shape == (5, 2)


def test_repr_shows_formats():
    text = repr(inttrain.prepare_(_mlp(), "int8"))
    assert "QLinear" in text and "fwd=int8" in text and "dW=int8" in text


def test_unknown_recipe_lists_allowed():
    with pytest.raises(ValueError, match="unknown recipe 'int7'.*allowed: fp32, int8"):
        inttrain.prepare_(_mlp(), "int7")


def test_bits_out_of_range_and_conv_over_8_bits():
    with pytest.raises(UnsupportedFormatError, match="2 to 16 bits"):
        Int8MixedConfig(bits=1)
    # Convolutions take 9..16 bits like Linear layers (int16 codes as exact int8 halves; tests/kernels).
    conv = inttrain.prepare_(nn.Conv2d(3, 4, 3), Int8MixedConfig(bits=12))
    assert conv.precision.forward.lhs.bits == conv.precision.forward.rhs.bits == 12


def test_fp32_recipe_is_a_no_op():
    model = _mlp()
    inttrain.prepare_(model, "fp32")
    assert type(model[0]) is nn.Linear


def test_eval_mode_and_no_grad():
    model = inttrain.prepare_(_mlp(), "int8").eval()
    x = torch.randn(6, 8)
    with torch.no_grad():
        y = model(x)
    ref = inttrain.restore_(model)(x)
    assert inttrain.sqnr_db(ref, y) > 30


def test_reprepare_replaces_precision():
    model = inttrain.prepare_(_mlp(), "int8")
    inttrain.prepare_(model, Int8MixedConfig(bits=4))
    assert model[0].precision.forward.lhs.bits == 4


def test_works_under_torch_compile():
    model = inttrain.prepare_(_mlp(), "int8")
    compiled = torch.compile(model)
    x = torch.randn(16, 8)
    y = compiled(x)
    y.sum().backward()
    assert model[0].weight.grad is not None and torch.isfinite(model[0].weight.grad).all()
    assert inttrain.sqnr_db(model(x), y) > 60  # same integer arithmetic, eager or compiled


def test_inplace_relu_after_int_layer():
    model = inttrain.prepare_(nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 4)), "int8")
    model(torch.randn(3, 2, 8)).sum().backward()
    assert model[0].weight.grad is not None
