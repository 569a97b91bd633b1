"""The trainer runs each recipe's own training parts (DCLR, WageubnSGD, Range/8-bit BN) and resumes them exactly."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from inttrain.data import DatasetSplits
from inttrain.nn.quant_bn import QuantBatchNorm2d
from inttrain.nn.range_bn import RangeBatchNorm2d
from inttrain.recipes import DoReFaConfig, UnifiedInt8Config, WageubnSGD
from inttrain.recipes.unified_int8 import DSGCState, deviation_lr_scale
from inttrain.trainer import apply_recipe, load_checkpoint, save_checkpoint, train
from inttrain.trainer.recipe_training import build_recipe_optimizer
from trainer_utils import Record, small_cnn

# search_every=3 and a stop at step 7: the resumed leg starts between two clip searches.
RECIPES: dict[str, Any] = {
    "unified-int8": UnifiedInt8Config(search_every=3),
    "wageubn": "wageubn",
    "sbm": "sbm",
    "dorefa": DoReFaConfig(w_bits=4, a_bits=4, g_bits=6, first_last_float=False),
}


pytestmark = pytest.mark.usefixtures("one_thread")




Keep = Record
_model = small_cnn


def _train(splits: DatasetSplits, recipe: Any, **kw: Any) -> tuple[torch.nn.Module, Keep]:
    model, hooks = _model(splits), Keep()
    name = recipe if isinstance(recipe, str) else recipe.name
    train(model, splits, name, epochs=2, batch_size=128, lr=0.05, log=lambda s: None, progress=False,
          recipe_config=None if isinstance(recipe, str) else recipe, hooks=hooks, **kw)
    return model, hooks


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("name", list(RECIPES))
def test_resume_through_a_checkpoint_is_bit_identical(name: str, digits: DatasetSplits, tmp_path: Path) -> None:
    recipe = RECIPES[name]
    whole, _ = _train(digits, recipe)
    _, first = _train(digits, recipe, max_steps=7)
    save_checkpoint(tmp_path, "last", *first.last)
    weights, state = load_checkpoint(*[tmp_path / f"last.{s}" for s in ("safetensors", "state.pt")])  # weights_only
    resumed, _ = _train(digits, recipe, resume_from=(weights, state))
    assert _same(whole, resumed)
    if name == "unified-int8":  # the DSGC state is what makes it exact: without it the resumed run drifts
        assert len(state["layer_hooks"]) == 3 and state["layer_hooks"]["features.0"]["steps"] == 7
        state = {**state, "layer_hooks": {}}
        drifted, _ = _train(digits, recipe, resume_from=(weights, state))
        assert not _same(whole, drifted)
    if name == "wageubn":
        assert state["optimizer"]["wageubn_steps"] == 7


def test_dclr_scales_each_layers_lr_and_can_be_turned_off(digits: DatasetSplits) -> None:
    recipe = UnifiedInt8Config(search_every=3)
    model, hooks = _train(digits, recipe, max_steps=12)
    groups = hooks.last[1]["optimizer"]["param_groups"]
    states = [m.hooks for m in model.modules() if isinstance(getattr(m, "hooks", None), DSGCState)]
    assert len(groups) == 1 + len(states) == 4
    assert groups[0]["lr"] == 0.05  # the unscaled rest (BatchNorm) first: the lr the trainer logs
    expected = [0.05 * deviation_lr_scale(s.deviation, recipe.alpha, recipe.beta) for s in states]
    assert [g["lr"] for g in groups[1:]] == pytest.approx(expected)
    assert all(0.05 * recipe.beta <= lr < 0.05 for lr in expected)  # quantized gradients deviate: lr < base
    plain, off = _train(digits, recipe, max_steps=12, dclr=False)
    assert [g["lr"] for g in off.last[1]["optimizer"]["param_groups"]] == [0.05]
    assert not _same(model, plain)


@pytest.mark.parametrize("name,bn", [("wageubn", QuantBatchNorm2d), ("sbm", RangeBatchNorm2d), ("int8", torch.nn.BatchNorm2d)])
def test_recipe_norm_layers(name: str, bn: type, digits: DatasetSplits) -> None:
    model = _model(digits)
    keys = model.state_dict().keys()
    apply_recipe(model, name)
    assert type(model.features[1]) is bn and type(model.features[4]) is bn
    assert model.state_dict().keys() == keys  # checkpoints and `inttrain eval` see the same tensors


def test_wageubn_trains_with_its_quantized_sgd_only(digits: DatasetSplits) -> None:
    model = _model(digits)
    apply_recipe(model, "wageubn")
    opt, before_step = build_recipe_optimizer(model, "wageubn", "sgd", 0.05)
    assert isinstance(opt, WageubnSGD) and before_step is None
    with pytest.raises(ValueError, match="recipe 'wageubn' trains with its quantized SGD .*optimizer 'adam' is not allowed: use sgd"):
        build_recipe_optimizer(model, "wageubn", "adam", 0.05)


def test_float_recipes_keep_one_plain_group(digits: DatasetSplits) -> None:
    for name in ("fp32", "bf16", "int8"):
        model = _model(digits)
        apply_recipe(model, name)
        opt, before_step = build_recipe_optimizer(model, name, "adam", 0.01)
        assert type(opt) is torch.optim.Adam and len(opt.param_groups) == 1 and before_step is None
    assert math.isclose(opt.param_groups[0]["lr"], 0.01)
