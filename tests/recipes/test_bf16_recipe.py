"""bf16 under the recipe API: prepare_ is a no-op, the config gives the autocast context."""

import torch
from torch import nn

import inttrain
from inttrain.recipes import Bf16Config, from_name


def test_prepare_bf16_is_a_noop():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    classes = [type(m) for m in model.modules()]
    assert inttrain.prepare_(model, "bf16") is model
    assert [type(m) for m in model.modules()] == classes
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    cfg = from_name("bf16")
    assert isinstance(cfg, Bf16Config) and not cfg.converts_layers() and cfg.precision_for(model[0], "0") is None
    assert "bf16" in inttrain.recipe_names()


def test_autocast_helper_runs_the_forward_in_bfloat16():
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    x = torch.randn(3, 16)
    with Bf16Config().autocast("cpu"):
        y = model(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), model(x), rtol=2e-2, atol=2e-2)
    y.float().sum().backward()
    assert model.weight.grad.dtype == torch.float32
    with Bf16Config().autocast(torch.device("cpu"), enabled=False):
        assert model(x).dtype == torch.float32


def test_trainer_paths_accept_the_name_and_the_config():
    from inttrain.trainer.recipes import apply_recipe, autocast_for

    model = nn.Linear(4, 2)
    apply_recipe(model, "bf16")
    apply_recipe(model, Bf16Config())
    assert type(model) is nn.Linear
    with autocast_for("bf16", torch.device("cpu")):
        assert model(torch.randn(2, 4)).dtype == torch.bfloat16
