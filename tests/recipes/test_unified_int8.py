"""unified-int8 (Zhu et al. CVPR 2020): DSGC lowers the direction deviation, DCLR follows Eq. 10, digits."""

import math
import statistics

import pytest
import torch
from torch import nn

import inttrain
from digits_utils import SEEDS, cnn, mlp, train
from inttrain.kernels import int_kernel_calls, reset_kernel_calls
from inttrain.recipes import UnifiedInt8Config
from inttrain.recipes.unified_int8 import (
    DeviationCounteractiveLR, DSGCState, clip_quantize, dclr_param_groups, deviation_lr_scale, direction_deviation,
    search_cost,
)
from inttrain.spec import UnsupportedFormatError


@pytest.mark.parametrize("bits,df", [(8, 3.0), (8, 4.0), (4, 3.0)])
def test_dsgc_clip_beats_no_clip_on_heavy_tailed_gradients(bits, df):
    torch.manual_seed(0)
    g = torch.distributions.StudentT(df).sample((256, 1024))  # heavy tails: amax >> typical |g|
    state = DSGCState(bits=bits)
    c = state.search(g)
    unclipped = direction_deviation(g, clip_quantize(g, float(g.abs().max()), bits))
    assert c < float(g.abs().max())
    assert state.deviation < 0.8 * unclipped
    assert state.unclipped_deviation == pytest.approx(unclipped)
    assert state.searches == 1 and state.search_seconds > 0


def test_dsgc_keeps_gaussian_gradients_nearly_unclipped():
    torch.manual_seed(0)
    g = torch.randn(64, 256)
    state = DSGCState(bits=8)
    state.search(g)
    assert state.ratio >= 0.4
    assert state.deviation <= state.unclipped_deviation


def test_search_runs_every_k_backward_passes_and_clips():
    torch.manual_seed(0)
    layer = nn.Linear(32, 16)
    inttrain.prepare_(layer, UnifiedInt8Config(search_every=3))
    for _ in range(7):
        x = torch.randn(8, 32)
        layer(x).pow(3).sum().backward()
    assert layer.hooks.steps == 7 and layer.hooks.searches == 3  # steps 0, 3, 6
    assert search_cost(layer)["searches"] == 3
    state = DSGCState(bits=4, every=1)
    dy = torch.distributions.StudentT(3.0).sample((256, 1024))
    out = state.grad_output(dy, 0)
    assert float(out.abs().max()) == pytest.approx(state.clip) and state.clip < float(dy.abs().max())


def test_dclr_scale_follows_eq10():
    assert deviation_lr_scale(0.0) == 1.0
    assert deviation_lr_scale(0.01) == pytest.approx(math.exp(-0.2))
    assert deviation_lr_scale(0.5) == 0.1  # floor beta
    assert deviation_lr_scale(0.05, alpha=10, beta=0.5) == pytest.approx(max(math.exp(-0.5), 0.5))


def test_dclr_sets_each_layers_lr():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2), nn.LayerNorm(2))
    inttrain.prepare_(model, "unified-int8")
    opt = torch.optim.SGD(dclr_param_groups(model, lr=0.1))
    assert len(opt.param_groups) == 3  # two layers + the rest (LayerNorm)
    model[0].hooks.deviation, model[2].hooks.deviation = 0.02, 0.0
    DeviationCounteractiveLR(opt).step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1 * math.exp(-0.4), 0.1, 0.1])


def test_bad_configs_fail_clearly():
    with pytest.raises(UnsupportedFormatError, match="allowed 2 to 8"):
        UnifiedInt8Config(bits=9)
    with pytest.raises(ValueError, match=r"allowed a non-empty tuple of values in \(0, 1\]"):
        UnifiedInt8Config(clip_ratios=(1.5,))
    with pytest.raises(ValueError, match="allowed an int >= 1"):
        UnifiedInt8Config(search_every=0)


@pytest.mark.parametrize("name,make_model,image,epochs", [("mlp", mlp, False, 8), ("cnn", cnn, True, 6)])
def test_unified_int8_matches_fp32_on_digits(name, make_model, image, epochs):
    seeds = SEEDS[name]  # paired mean over seeds, as test_int8_mixed (one MLP run moves by +-2 points)
    fp32 = statistics.mean(train(make_model, "fp32", image, epochs, 0.05, seed=s) for s in seeds)
    models = []

    def make_optimizer(model, lr):
        opt = torch.optim.SGD(dclr_param_groups(model, lr=lr, momentum=0.9))
        models.append((model, DeviationCounteractiveLR(opt)))
        return opt

    reset_kernel_calls()
    acc = statistics.mean(
        train(make_model, UnifiedInt8Config(search_every=20), image, epochs, 0.05, make_optimizer=make_optimizer,
              after_backward=lambda model, opt: models[-1][1].step(), seed=s) for s in seeds)
    assert sum(int_kernel_calls().values()) > 0
    cost = search_cost(models[-1][0])
    assert cost["layers"] == 3 and cost["searches"] > 3
    print(f"{name}: unified-int8 {acc:.2f}% vs fp32 {fp32:.2f}%, DSGC {cost}")
    assert acc >= fp32 - 1.5, f"{name}: unified-int8 {acc:.2f}% vs fp32 {fp32:.2f}%"
