"""The training loop: learns digits, is deterministic, survives NaN losses."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor, nn

from inttrain.data import DatasetSplits
from inttrain.models import build_model
from inttrain.trainer import NonFiniteLossError, RunResult, TrainHooks, train


pytestmark = pytest.mark.usefixtures("one_thread")




def _run(splits: DatasetSplits, recipe: str = "fp32", seed: int = 0, epochs: int = 3, **kw: object) -> RunResult:
    torch.manual_seed(seed)
    model = build_model("small-cnn", splits.num_classes, splits.in_channels, splits.image_size)
    kw.setdefault("batch_size", 32)
    return train(model, splits, recipe, epochs=epochs, lr=0.05, seed=seed, log=lambda s: None, **kw)


def test_fp32_digits_learns(digits: DatasetSplits) -> None:
    res = _run(digits, epochs=3)
    assert res.train_losses[-1] < res.train_losses[0] < math.log(10) * 1.5
    assert res.val_accuracy > 0.9
    assert res.steps == 3 * (len(digits.train) // 32) and res.skipped_steps == 0
    assert res.time_per_step > 0


def test_same_seed_identical_losses(digits: DatasetSplits) -> None:
    a, b = _run(digits, epochs=2, seed=7), _run(digits, epochs=2, seed=7)
    assert a.train_losses == b.train_losses and a.val_accuracies == b.val_accuracies
    c = _run(digits, epochs=2, seed=8)
    assert c.train_losses != a.train_losses


def test_bf16_autocast_runs(digits: DatasetSplits) -> None:
    res = _run(digits, "bf16", epochs=1)
    assert math.isfinite(res.train_losses[0]) and res.val_accuracy > 0.5


def test_logs_one_line_per_epoch(digits: DatasetSplits) -> None:
    lines: list[str] = []
    torch.manual_seed(0)
    model = build_model("small-cnn", 10, 1, 8)
    train(model, digits, epochs=2, log=lines.append, progress=False)
    # Periodic step lines (on slow machines) are indented; epoch lines are not.
    epoch_lines = [l for l in lines if not l.startswith(" ")]
    assert [l.split()[:2] for l in epoch_lines] == [["epoch", "1/2"], ["epoch", "2/2"]]
    assert "val_acc" in epoch_lines[0] and "ms/step" in epoch_lines[0]


class _NaNOnSteps(nn.Module):
    """Wraps a model and returns NaN logits on the given (1-based) train calls."""

    def __init__(self, inner: nn.Module, bad: set[int]) -> None:
        super().__init__()
        self.inner, self.bad, self.calls = inner, bad, 0

    def forward(self, x: Tensor) -> Tensor:
        out = self.inner(x)
        if self.training:
            self.calls += 1
            if self.calls in self.bad:
                return out * float("nan")
        return out


def test_non_finite_steps_are_skipped(digits: DatasetSplits) -> None:
    torch.manual_seed(0)
    model = _NaNOnSteps(build_model("small-cnn", 10, 1, 8), {2, 3, 10})
    res = train(model, digits, epochs=1, log=lambda s: None)
    assert res.skipped_steps == 3 and res.epochs[0].skipped == 3
    assert res.steps == len(digits.train) // 32 - 3
    assert math.isfinite(res.train_losses[0])


def test_consecutive_non_finite_stops_naming_step(digits: DatasetSplits) -> None:
    torch.manual_seed(0)
    model = _NaNOnSteps(build_model("small-cnn", 10, 1, 8), set(range(5, 100)))
    with pytest.raises(NonFiniteLossError, match=r"4 consecutive steps \(steps 5\.\.8\); stopped at step 8") as exc:
        train(model, digits, epochs=1, log=lambda s: None, max_consecutive_skips=4)
    assert exc.value.step == 8 and exc.value.result.skipped_steps == 4


def test_bad_arguments(digits: DatasetSplits) -> None:
    model = build_model("small-cnn", 10, 1, 8)
    with pytest.raises(ValueError, match=r"unknown optimizer 'lbfgs'; allowed: sgd, adam, adamw"):
        train(model, digits, optimizer="lbfgs", log=lambda s: None)
    with pytest.raises(ValueError, match="epochs"):
        train(model, digits, epochs=0, log=lambda s: None)


def test_int8_recipe_learns_and_is_deterministic(digits: DatasetSplits) -> None:
    # One short epoch (big batches): the first int8 run pays the kernels' compile time.
    a = _run(digits, "int8", epochs=1, seed=3, batch_size=64)
    b = _run(digits, "int8", epochs=1, seed=3, batch_size=64)
    assert a.val_accuracy > 0.8 and a.skipped_steps == 0
    assert a.train_losses == b.train_losses


class _Capture(TrainHooks):
    """Keeps the snapshot the loop offers when it saves ``last`` (i.e. when max_steps stops it)."""

    def __init__(self) -> None:
        self.snap: tuple[dict, dict] | None = None

    def save(self, name: str, snapshot) -> None:  # type: ignore[no-untyped-def]
        if name == "last":
            weights, state = snapshot()
            self.snap = ({k: v.clone() for k, v in weights.items()}, copy.deepcopy(state["optimizer"]))


def _nan_grad_model(bad_steps: set[int], param: str = "features.3.weight") -> nn.Module:
    """small-cnn whose ``param`` gradient is NaN on the given (1-based) training forwards."""
    torch.manual_seed(0)
    inner = build_model("small-cnn", 10, 1, 8)
    model = _NaNOnSteps(inner, set())  # only for its forward counter
    target = dict(inner.named_parameters())[param]
    target.register_hook(lambda g: g * float("nan") if model.calls in bad_steps else g)
    return model


def test_skipped_step_leaves_weights_and_optimizer_untouched(digits: DatasetSplits) -> None:
    before, after = _Capture(), _Capture()
    kw = dict(epochs=1, optimizer="adam", lr=1e-3, log=lambda s: None)
    train(_nan_grad_model(set()), digits, max_steps=4, hooks=before, **kw)
    lines: list[str] = []
    res = train(_nan_grad_model({5}), digits, max_steps=5, hooks=after, **{**kw, "log": lines.append})
    assert res.skipped_steps == 1
    assert "  step 5 (epoch 1): skipped, non-finite gradient in 'inner.features.3.weight'" in lines
    (w0, o0), (w1, o1) = before.snap, after.snap  # type: ignore[misc]
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)  # BN buffers included
    assert o0["param_groups"] == o1["param_groups"]
    for i, s in o0["state"].items():
        assert all(torch.equal(s[k], o1["state"][i][k]) for k in s)


def test_consecutive_nan_gradients_name_step_and_layer(digits: DatasetSplits) -> None:
    with pytest.raises(NonFiniteLossError, match=r"stopped at step 4 \(epoch 1\): non-finite gradient in "
                                                 r"'inner\.features\.3\.weight'"):
        train(_nan_grad_model({3, 4}), digits, epochs=1, log=lambda s: None, max_consecutive_skips=2)


def test_validation_runs_inside_the_callbacks_evaluation(digits: DatasetSplits) -> None:
    """A CPT run whose epoch ends on a cycle boundary (the next step at B_min) validates at B_max."""
    from contextlib import contextmanager

    import inttrain
    from inttrain.schedules import CPT, PrecisionScheduler, model_bits
    from inttrain.trainer import Callback

    class Spy(Callback):
        seen: list = []

        @contextmanager
        def evaluation(self, trainer):  # entered after the scheduler's
            self.seen.append(model_bits(trainer.model))
            yield

    torch.manual_seed(0)
    model = inttrain.prepare_(build_model("small-cnn", digits.num_classes, digits.in_channels, digits.image_size), "int8")
    steps = len(digits.train) // 32
    sched = PrecisionScheduler(model, CPT(3, 8, cycles=2, total_steps=2 * steps))
    spy = Spy()
    train(model, digits, "int8", prepared=True, epochs=1, max_steps=steps, lr=0.05, log=lambda s: None,
          batch_size=32, precision_scheduler=sched, callbacks=[spy])
    assert sched.bits == (3, 8)  # the step after the epoch opens the second cycle
    assert spy.seen == [(8, 8)]
