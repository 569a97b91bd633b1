"""The trainer's knobs: lr schedules and warm-up, weight decay / momentum / nesterov, gradient clipping,
the final validation of a max_steps stop, and exact resume with all of them on."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from inttrain.data import DatasetSplits
from inttrain.recipes import UnifiedInt8Config, WageubnSGD
from inttrain.recipes.unified_int8 import DSGCState, deviation_lr_scale
from inttrain.schedules.lr import LrSchedule
from inttrain.trainer import apply_recipe, load_checkpoint, save_checkpoint, train
from inttrain.trainer.recipe_training import build_recipe_optimizer
from trainer_utils import Record, small_cnn

pytestmark = pytest.mark.usefixtures("one_thread")

# digits at batch 128: 1438 training images -> 11 steps per epoch.
STEPS_PER_EPOCH = 11


# ----------------------------------------------------------------------------- the schedules themselves


def test_step_schedule_values() -> None:
    s = LrSchedule("step", total_steps=100)  # milestones at steps 50 and 75
    assert [s.lr_at(t, 1.0) for t in (0, 49, 50, 74, 75, 99)] == [1.0, 1.0, 0.1, 0.1, 0.1 ** 2, 0.1 ** 2]


def test_cosine_schedule_values() -> None:
    s = LrSchedule("cosine", total_steps=100)
    assert s.lr_at(0, 0.2) == 0.2 and s.lr_at(100, 0.2) == 0.0
    assert s.lr_at(25, 1.0) == pytest.approx(0.8535533905932737, abs=1e-15)  # (1 + cos(pi/4)) / 2
    assert s.lr_at(50, 1.0) == pytest.approx(0.5, abs=1e-15)


def test_onecycle_schedule_values() -> None:
    s = LrSchedule("onecycle", total_steps=100)  # rise over steps 0..29, fall over 29..99
    assert s.lr_at(0, 1.0) == pytest.approx(0.04, rel=1e-12)  # max_lr / 25
    assert s.lr_at(29, 1.0) == 1.0
    assert s.lr_at(99, 1.0) == pytest.approx(4e-6, rel=1e-12)  # max_lr / 25 / 1e4


def test_warmup_is_linear_from_zero() -> None:
    s = LrSchedule("constant", total_steps=100, warmup_steps=10)
    assert [s.lr_at(t, 0.5) for t in (0, 1, 5, 9, 10, 50)] == [0.0, 0.05, 0.25, 0.45, 0.5, 0.5]
    assert LrSchedule("cosine", 100, 10).lr_at(5, 1.0) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.05)) / 2)
    assert not s.is_constant and LrSchedule("constant", 100).is_constant


@pytest.mark.parametrize("name", ["step", "cosine", "onecycle"])
def test_schedules_agree_with_torch(name: str) -> None:
    total = 37
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.3)
    sched: Any = {
        "step": lambda: torch.optim.lr_scheduler.MultiStepLR(opt, [int(0.5 * total), int(0.75 * total)], 0.1),
        "cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(opt, total),
        "onecycle": lambda: torch.optim.lr_scheduler.OneCycleLR(opt, 0.3, total_steps=total, cycle_momentum=False),
    }[name]()
    theirs = []
    for _ in range(total):
        theirs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    ours = [LrSchedule(name, total).lr_at(t, 0.3) for t in range(total)]
    if name == "onecycle":  # the same arithmetic: equal to the last bit
        assert ours == theirs
    else:  # torch multiplies recursively; the closed form agrees to rounding
        assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-15)


def test_bad_schedule_refused() -> None:
    with pytest.raises(ValueError, match=r"lr_schedule 'linear': allowed constant, step, cosine, onecycle"):
        LrSchedule("linear", 10)


# ----------------------------------------------------------------------------- in the trainer


_model = small_cnn


def _train(splits: DatasetSplits, recipe: Any = "fp32", **kw: Any) -> tuple[torch.nn.Module, Record, Any]:
    model, hooks = _model(splits), Record()
    name = recipe if isinstance(recipe, str) else recipe.name
    kw.setdefault("epochs", 2)
    res = train(model, splits, name, batch_size=128, lr=0.05, log=kw.pop("log", lambda s: None), progress=False,
                recipe_config=None if isinstance(recipe, str) else recipe, hooks=hooks, **kw)
    return model, hooks, res


def test_trainer_follows_the_schedule_step_by_step(digits: DatasetSplits) -> None:
    _, hooks, _ = _train(digits, lr_schedule="cosine", warmup_epochs=0.5)
    total = 2 * STEPS_PER_EPOCH
    expected = LrSchedule("cosine", total, round(0.5 * STEPS_PER_EPOCH))
    assert expected.warmup_steps == 6
    assert [lr for _, lr in hooks.steps] == [expected.lr_at(t, 0.05) for t in range(total)]
    assert hooks.steps[0][1] == 0.0 and hooks.steps[6][1] == pytest.approx(0.05 * (1 + math.cos(math.pi * 6 / 22)) / 2)


def test_schedule_scales_the_base_lr_that_dclr_scales(digits: DatasetSplits) -> None:
    recipe = UnifiedInt8Config(search_every=3)
    model, hooks, _ = _train(digits, recipe, lr_schedule="step", max_steps=12)  # step 12 is past the 50 % milestone
    groups = hooks.last[1]["optimizer"]["param_groups"]
    states = [m.hooks for m in model.modules() if isinstance(getattr(m, "hooks", None), DSGCState)]
    base = 0.05 * 0.1
    assert groups[0]["lr"] == base and hooks.steps[-1][1] == base and hooks.steps[10][1] == 0.05
    assert [g["lr"] for g in groups[1:]] == [base * deviation_lr_scale(s.deviation, recipe.alpha, recipe.beta)
                                            for s in states]


def test_optimizer_options_reach_the_optimizer(digits: DatasetSplits) -> None:
    model = _model(digits)
    opt, _ = build_recipe_optimizer(model, "fp32", "sgd", 0.1, momentum=0.8, weight_decay=1e-4, nesterov=True)
    g = opt.param_groups[0]
    assert (type(opt), g["momentum"], g["weight_decay"], g["nesterov"]) == (torch.optim.SGD, 0.8, 1e-4, True)
    opt, _ = build_recipe_optimizer(model, "fp32", "adamw", 0.1, weight_decay=0.05)
    assert type(opt) is torch.optim.AdamW and opt.param_groups[0]["weight_decay"] == 0.05
    # Through train(): the optimizer saved in the checkpoint carries them.
    _, hooks, _ = _train(digits, momentum=0.5, weight_decay=1e-3, nesterov=True, max_steps=2)
    saved = hooks.last[1]["optimizer"]["param_groups"][0]
    assert (saved["momentum"], saved["weight_decay"], saved["nesterov"]) == (0.5, 1e-3, True)


def test_wageubn_takes_momentum_decay_and_nesterov(digits: DatasetSplits) -> None:
    model = _model(digits)
    apply_recipe(model, "wageubn")
    opt, _ = build_recipe_optimizer(model, "wageubn", "sgd", 0.05, momentum=0.7, weight_decay=5e-4)
    assert isinstance(opt, WageubnSGD)
    assert (opt.param_groups[0]["momentum"], opt.param_groups[0]["weight_decay"]) == (0.7, 5e-4)
    assert opt.param_groups[0]["nesterov"] is False  # the paper's update by default
    opt, _ = build_recipe_optimizer(model, "wageubn", "sgd", 0.05, nesterov=True)
    assert isinstance(opt, WageubnSGD) and opt.param_groups[0]["nesterov"] is True


def test_options_that_do_not_apply_are_refused(digits: DatasetSplits) -> None:
    model = _model(digits)
    with pytest.raises(ValueError, match=r"^nesterov applies to sgd only; optimizer 'adam' uses its betas"):
        train(model, digits, optimizer="adam", nesterov=True, log=lambda s: None)
    with pytest.raises(ValueError, match=r"^momentum=0\.5 applies to sgd only; optimizer 'adamw' uses its betas"):
        train(model, digits, optimizer="adamw", momentum=0.5, log=lambda s: None)
    with pytest.raises(ValueError, match=r"^nesterov needs momentum > 0 \(got momentum=0\)$"):
        train(model, digits, momentum=0.0, nesterov=True, log=lambda s: None)
    with pytest.raises(ValueError, match=r"warmup_epochs must be >= 0 and clip_grad_norm > 0"):
        train(model, digits, clip_grad_norm=0.0, log=lambda s: None)


def _grad_norm(model: torch.nn.Module) -> float:
    # The gradients of the last step stay on the parameters after train() returns.
    return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])))


def test_clipping_bounds_the_gradient_norm(digits: DatasetSplits) -> None:
    free, _, _ = _train(digits, max_steps=3)
    clipped, _, _ = _train(digits, max_steps=3, clip_grad_norm=0.05)
    assert _grad_norm(free) > 0.5  # so the bound below is the clipping's doing
    assert _grad_norm(clipped) <= 0.05 * (1 + 1e-5)
    assert _grad_norm(clipped) == pytest.approx(0.05, rel=1e-4)


@pytest.mark.parametrize("recipe", ["fp32", UnifiedInt8Config(search_every=3)], ids=["fp32", "unified-int8"])
def test_resume_mid_schedule_is_bit_identical(recipe: Any, digits: DatasetSplits, tmp_path: Any) -> None:
    knobs = dict(lr_schedule="onecycle", warmup_epochs=0.4, clip_grad_norm=1.0, weight_decay=1e-3, nesterov=True)
    whole, full, _ = _train(digits, recipe, **knobs)
    _, first, _ = _train(digits, recipe, max_steps=7, **knobs)
    save_checkpoint(tmp_path, "last", *first.last)
    weights, state = load_checkpoint(tmp_path / "last.safetensors", tmp_path / "last.state.pt")  # weights_only
    assert state["lr_schedule"] == {"name": "onecycle", "total_steps": 22, "warmup_steps": 4}
    resumed, second, _ = _train(digits, recipe, resume_from=(weights, state), **knobs)
    assert first.steps + second.steps == full.steps  # losses and lrs, step by step, bit for bit
    sa, sb = whole.state_dict(), resumed.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_max_steps_ends_with_a_validation(digits: DatasetSplits) -> None:
    lines: list[str] = []
    _, hooks, res = _train(digits, max_steps=5, log=lines.append)
    assert res.stopped == "max_steps" and res.epochs == [] and res.final_val is not None
    assert 0.2 < res.val_accuracy <= 1 and math.isfinite(res.val_loss)
    assert lines[-1] == f"validation at step 5: val_acc {res.val_accuracy:.4f}"
    assert hooks.last[1]["train_state"]["step"] == 5


def test_resumed_progress_bar_continues(digits: DatasetSplits, monkeypatch: pytest.MonkeyPatch) -> None:
    import inttrain.trainer.callbacks as loop

    bars: list[dict[str, Any]] = []

    class Bar:
        def __init__(self, total: int, desc: str, log: Any, tty: Any = None, initial: int = 0) -> None:
            bars.append({"desc": desc, "initial": initial, "updates": []})

        def update(self, step: int, loss: float) -> None:
            bars[-1]["updates"].append(step)

        def close(self) -> None:
            pass

    _, first, _ = _train(digits, max_steps=14)
    monkeypatch.setattr(loop, "Progress", Bar)
    _train(digits, resume_from=first.last)
    assert [(b["desc"], b["initial"]) for b in bars] == [("epoch 2/2", 3)]
    assert bars[0]["updates"] == list(range(4, STEPS_PER_EPOCH + 1))
