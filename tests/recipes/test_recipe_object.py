"""A recipe is one object: ``prepare_`` installs all it changes in the model (its BatchNorm included), and a plain
PyTorch loop gets its optimizer and step hook from it and trains exactly what ``inttrain.trainer.train`` trains."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import inttrain
from inttrain.data import load_dataset
from inttrain.models import build_model
from inttrain.nn.quant_bn import QuantBatchNorm2d
from inttrain.nn.range_bn import RangeBatchNorm2d
from inttrain.recipes import RECIPES, DoReFaConfig, UnifiedInt8Config, WageubnSGD
from inttrain.recipes.base import no_step_hook
from inttrain.trainer import TrainHooks, train

pytestmark = pytest.mark.usefixtures("one_thread")
SRC = Path(inttrain.__file__).parent


@pytest.mark.parametrize("name,bn", [("sbm", RangeBatchNorm2d), ("wageubn", QuantBatchNorm2d),
                                     ("int8", torch.nn.BatchNorm2d), ("fp32", torch.nn.BatchNorm2d)])
def test_prepare_installs_the_recipes_batch_norm(name: str, bn: type) -> None:
    model = build_model("resnet20", 10, 3, 32)
    plain = sum(type(m) is torch.nn.BatchNorm2d for m in model.modules())
    assert plain == 21  # the count: all left plain by prepare_ before
    inttrain.prepare_(model, name)
    assert sum(type(m) is bn for m in model.modules()) == plain
    inttrain.restore_(model)
    assert sum(type(m) is torch.nn.BatchNorm2d for m in model.modules()) == plain


def test_recipe_gives_optimizer_and_step_hook() -> None:
    model = build_model("small-cnn", 10, 1, 8)
    wageubn = inttrain.get_config("wageubn")
    inttrain.prepare_(model, wageubn)
    opt = wageubn.optimizer_for(model, "sgd", lr=0.1, momentum=0.8)
    assert isinstance(opt, WageubnSGD) and opt.param_groups[0]["momentum"] == 0.8
    assert wageubn.step_hook(opt) is no_step_hook
    model = build_model("small-cnn", 10, 1, 8)
    unified = UnifiedInt8Config()
    inttrain.prepare_(model, unified)
    opt = unified.optimizer_for(model, "sgd", lr=0.1)
    assert len(opt.param_groups) == 4 and unified.step_hook(opt) is not no_step_hook
    assert len(unified.optimizer_for(model, "sgd", lr=0.1, lr_scaling=False).param_groups) == 1
    assert unified.report(model) == {"dsgc_layers": 3, "dsgc_searches": 0, "dsgc_seconds": 0.0}


def test_with_bits_is_the_recipes_own() -> None:
    assert inttrain.get_config("int8").with_bits(6).bits == 6
    d = DoReFaConfig().with_bits(4)
    assert (d.w_bits, d.a_bits, d.g_bits) == (4, 4, 4)
    with pytest.raises(ValueError, match=r"^recipe 'bf16' has no bit width; use an integer recipe such as int8$"):
        inttrain.get_config("bf16").with_bits(8)


def test_weight_grad_rounding_applies_to_the_weight_gradient_only() -> None:
    from inttrain.spec import Rounding
    cfg = inttrain.get_config("int8")  # the default: stochastic in the weight-gradient GEMM only
    for layer in (torch.nn.Linear(4, 3), torch.nn.Conv2d(2, 3, 3)):
        p = cfg.precision_for(layer, "layer")
        assert p.grad_weight.lhs.rounding is Rounding.STOCHASTIC
        assert p.grad_input.lhs.rounding is Rounding.NEAREST_EVEN
        assert p.forward.lhs.rounding is Rounding.NEAREST_EVEN
    assert cfg.with_weight_grad_rounding(Rounding.NEAREST_EVEN).precision_for(torch.nn.Linear(4, 3), "l") \
        .grad_weight.lhs.rounding is Rounding.NEAREST_EVEN
    with pytest.raises(ValueError, match=r"^recipe 'sbm' has no weight-gradient rounding choice; use int8$"):
        inttrain.get_config("sbm").with_weight_grad_rounding(Rounding.STOCHASTIC)


class _Last(TrainHooks):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_step(self, state, loss, lr, seconds) -> None:  # type: ignore[no-untyped-def]
        self.losses.append(loss)


def test_plain_pytorch_loop_trains_what_the_trainer_trains() -> None:
    """Same seed, data order and recipe calls: the weights agree bit for bit after 5 unified-int8 steps."""
    splits = load_dataset("digits")
    recipe, seed, bs, steps = UnifiedInt8Config(search_every=2), 3, 64, 5

    torch.manual_seed(0)
    by_trainer = build_model("small-cnn", 10, 1, 8)
    hooks = _Last()
    train(by_trainer, splits, recipe.name, recipe_config=recipe, batch_size=bs, lr=0.05, seed=seed, max_steps=steps,
          hooks=hooks, log=lambda s: None, progress=False)

    torch.manual_seed(0)
    model = build_model("small-cnn", 10, 1, 8)
    torch.manual_seed(seed)
    inttrain.prepare_(model, recipe)
    opt = recipe.optimizer_for(model, "sgd", lr=0.05)
    before_step = recipe.step_hook(opt)
    perm = torch.randperm(len(splits.train), generator=torch.Generator().manual_seed(seed))
    losses = []
    for b in range(steps):
        x, y = splits.train[perm[b * bs:(b + 1) * bs]]
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        before_step()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses == hooks.losses
    a, b = by_trainer.state_dict(), model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_no_recipe_config_is_tested_outside_recipes() -> None:
    """The trainer, CLI and the rest ask the recipe object; only ``inttrain.recipes`` knows the config classes."""
    names = {cls.__name__ for cls in RECIPES.values()}
    offenders = []
    for path in SRC.rglob("*.py"):
        if "recipes" in path.relative_to(SRC).parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                if any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node.args[1])):
                    offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == []
