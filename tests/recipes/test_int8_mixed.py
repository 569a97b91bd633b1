"""The int8 recipe trains to fp32's accuracy on real data (scikit-learn digits), same seed and budget."""

import statistics

import pytest
from digits_utils import SEEDS, cnn, mlp, train

from inttrain.kernels import int_kernel_calls, reset_kernel_calls

MAX_GAP_POINTS = 1.0  # issue bar: int8 within 1 accuracy point of fp32



@pytest.mark.parametrize("name,make_model,image,epochs,lr", [
    ("mlp", mlp, False, 8, 0.05),
    ("cnn", cnn, True, 6, 0.05),
])
def test_int8_matches_fp32_accuracy_on_digits(name, make_model, image, epochs, lr):
    fp32 = statistics.mean(train(make_model, "fp32", image, epochs, lr, seed=s) for s in SEEDS[name])
    reset_kernel_calls()
    int8 = statistics.mean(train(make_model, "int8", image, epochs, lr, seed=s) for s in SEEDS[name])
    calls = int_kernel_calls()
    assert sum(calls.values()) > 0, "integer kernels never ran"
    assert fp32 > 94.0, f"fp32 baseline too weak to compare against: {fp32:.2f}%"
    assert int8 >= fp32 - MAX_GAP_POINTS, f"{name}: int8 {int8:.2f}% vs fp32 {fp32:.2f}% (gap > {MAX_GAP_POINTS})"


def test_first_last_float_keeps_the_end_layers_in_float() -> None:
    import torch
    from torch import nn

    import inttrain
    from inttrain.nn import IntLayerMixin
    from inttrain.recipes.int8_mixed import Int8MixedConfig

    def model() -> nn.Sequential:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(4, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.Flatten(),
                             nn.Linear(8 * 4 * 4, 16), nn.ReLU(), nn.Linear(16, 10))

    ends = inttrain.prepare_(model(), Int8MixedConfig(first_last_float=True))
    assert [isinstance(ends[i], IntLayerMixin) for i in (0, 2, 4, 6)] == [False, True, True, False]
    every = inttrain.prepare_(model(), Int8MixedConfig())
    assert all(isinstance(every[i], IntLayerMixin) for i in (0, 2, 4, 6))
    reset_kernel_calls()
    ends(torch.randn(32, 4, 8, 8)).square().mean().backward()
    calls = int_kernel_calls()
    assert sum(calls.values()) > 0 and ends[0].weight.grad is not None and ends[6].weight.grad is not None


def test_per_sample_grad_is_the_default_for_convolutions() -> None:
    from torch import nn

    from inttrain.recipes import SbmConfig
    from inttrain.recipes.int8_mixed import Int8MixedConfig
    from inttrain.spec import PerChannel, PerTensor
    from inttrain.spec.capabilities import conv_layout_problem

    conv, linear = nn.Conv2d(4, 4, 3), nn.Linear(4, 4)
    dy_scales = lambda cfg, m=conv: cfg.precision_for(m, "m").grad_input.lhs.granularity  # noqa: E731
    for cfg in (Int8MixedConfig(), Int8MixedConfig(bits=4), Int8MixedConfig(grad_bits=12)):
        assert dy_scales(cfg) == PerChannel(0)  # one scale per sample, at any width
        assert conv_layout_problem(cfg.precision_for(conv, "m")) is None
    assert dy_scales(Int8MixedConfig(per_sample_grad=False)) == PerTensor()
    assert dy_scales(Int8MixedConfig(), linear) == PerChannel(0)  # a Linear's gradient rows: per sample anyway
    assert dy_scales(SbmConfig()) == PerTensor()  # the paper's recipe keeps its one scale per tensor
    with pytest.raises(ValueError, match="per_sample_grad must be True or False, got 1"):
        Int8MixedConfig(per_sample_grad=1)
