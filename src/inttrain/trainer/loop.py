"""A small, deterministic training loop for classification (and next-token LM).

``train()`` applies the recipe, then runs ``epochs`` passes with a seeded data order, evaluating on the
val split after every epoch.  The step itself is :func:`inttrain.trainer.step.train_step`; everything
around it (progress, lr schedule, metrics hooks, precision schedules, cost counting) is a
:class:`~inttrain.trainer.callbacks.Callback`; data parallelism is the step's ``comm``.  Mutable progress
lives in :class:`TrainState`, so a checkpoint (``Trainer.snapshot``) resumes bit-identically.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from inttrain.data import DatasetSplits
from inttrain.optim import DEFAULT_MOMENTUM, OPTIMIZER_NAMES, build_optimizer, check_optimizer_options
from inttrain.schedules.lr import LrSchedule

from .callbacks import (
    Callback, CostCounterCallback, HooksCallback, LrScheduleCallback, PrecisionScheduleCallback, ProgressBar,
)
from .compiled import CompiledForward
from .lr import ScheduledLr
from .recipes import apply_recipe, get_recipe
from .rng import capture_rng, layer_calls, restore_rng, set_layer_calls
from .state import EpochStats, NonFiniteLossError, RunResult, TrainHooks, TrainState, perplexity
from .step import DataParallelComm, LocalComm, StepOutcome, loss_fn, train_step

__all__ = [
    "OPTIMIZER_NAMES",
    "EpochStats",
    "TrainState",
    "TrainHooks",
    "TrainOptions",
    "Trainer",
    "RunResult",
    "NonFiniteLossError",
    "build_optimizer",
    "check_optimizer_options",
    "evaluate",
    "evaluate_metrics",
    "train",
]


@torch.no_grad()
def evaluate_metrics(model: nn.Module, loader: DataLoader, recipe: Any, device: torch.device) -> tuple[float, float]:
    """(mean cross-entropy, top-1 accuracy), both per token for [B, T, V] outputs; ``recipe``: name or config."""
    autocast = get_recipe(recipe).autocast
    was_training = model.training
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        with autocast(device):
            logits = model(x)
        correct += int((logits.argmax(-1) == y).sum())
        # Summed, then divided once: batches of different sizes weigh by their token count.
        loss_sum += float(loss_fn(logits, y) * y.numel())
        total += y.numel()
    model.train(was_training)
    return loss_sum / max(total, 1), correct / max(total, 1)


def evaluate(model: nn.Module, loader: DataLoader, recipe: Any, device: torch.device) -> float:
    """Top-1 accuracy (per token for [B, T, V] outputs)."""
    return evaluate_metrics(model, loader, recipe, device)[1]


@dataclass
class TrainOptions:
    """The knobs of :func:`train` (see its docstring)."""

    epochs: int = 5
    batch_size: int = 32
    lr: float = 0.05
    optimizer: str = "sgd"
    seed: int = 0
    max_consecutive_skips: int = 10
    max_steps: int | None = None
    augment: str = "none"
    save_every: int | None = None
    dclr: bool = True
    compile: bool = False
    weight_decay: float = 0.0
    momentum: float = DEFAULT_MOMENTUM
    nesterov: bool = False
    lr_schedule: str = "constant"
    warmup_epochs: float = 0.0
    clip_grad_norm: float | None = None

    def check(self) -> None:
        """ValueError naming the bad values."""
        if self.epochs < 1 or self.batch_size < 1 or not self.lr > 0 or self.max_consecutive_skips < 1:
            raise ValueError(
                f"epochs, batch_size and max_consecutive_skips must be >= 1 and lr > 0; got epochs={self.epochs}, "
                f"batch_size={self.batch_size}, lr={self.lr}, max_consecutive_skips={self.max_consecutive_skips}"
            )
        if not self.warmup_epochs >= 0 or (self.clip_grad_norm is not None and not self.clip_grad_norm > 0):
            raise ValueError(f"warmup_epochs must be >= 0 and clip_grad_norm > 0 (or None); got warmup_epochs="
                             f"{self.warmup_epochs}, clip_grad_norm={self.clip_grad_norm}")
        check_optimizer_options(self.optimizer, self.momentum, self.weight_decay, self.nesterov)


def _quality(val_loss: float, val_accuracy: float, lm: bool) -> str:
    """How a validation is logged: a language model is judged by its loss (perplexity) first."""
    if lm:
        return f"val_loss {val_loss:.4f}  val_ppl {perplexity(val_loss):.2f}  val_acc {val_accuracy:.4f}"
    return f"val_acc {val_accuracy:.4f}"


class Trainer:
    """One run of :func:`train` on an already prepared model: the loop, its state and its callbacks."""

    def __init__(self, model: nn.Module, splits: DatasetSplits, recipe: Any, opts: TrainOptions, *,
                 device: torch.device, log: Callable[[str], Any], hooks: TrainHooks, callbacks: Sequence[Callback],
                 name: str = ""):
        self.model, self.splits, self.recipe, self.opts, self.device, self.log = model, splits, recipe, opts, device, log
        self.name = name or recipe.name  # as the caller named the recipe (RunResult.recipe)
        self.optimizer = recipe.optimizer_for(model, opts.optimizer, opts.lr, momentum=opts.momentum,
                                              weight_decay=opts.weight_decay, nesterov=opts.nesterov,
                                              lr_scaling=opts.dclr)
        self.before_step = recipe.step_hook(self.optimizer)
        n = len(splits.train)
        # Full batches only (every step the same shape: comparable step times, no
        # 1-sample BatchNorm batches); reshuffling means no sample is lost for good.
        self.batches = n // opts.batch_size if n >= opts.batch_size else 1
        schedule = LrSchedule(opts.lr_schedule, opts.epochs * self.batches, round(opts.warmup_epochs * self.batches))
        # The lr is set first; the caller's hooks see each step before a schedule sees its loss.
        self.callbacks = [LrScheduleCallback(ScheduledLr(self.optimizer, schedule)), HooksCallback(), *callbacks]
        # Data order comes from this generator alone (one permutation per epoch), so
        # (generator state at epoch start, position) pins where a resume continues.
        self.gen = torch.Generator().manual_seed(opts.seed)
        self.state = TrainState()
        self.hooks, self.net, self.comm = hooks, model, LocalComm()
        self.val_loader = DataLoader(splits.val, batch_size=max(opts.batch_size, 256))
        self.lm = splits.task == "lm"

    @property
    def lr(self) -> float:
        """The lr the first parameter group steps with (the base lr: recipes put scaled groups after it)."""
        return self.optimizer.param_groups[0]["lr"]

    def validate(self) -> tuple[float, float]:
        """(loss, accuracy) on the validation split, inside every callback's :meth:`Callback.evaluation`."""
        with ExitStack() as stack:
            for cb in self.callbacks:
                stack.enter_context(cb.evaluation(self))
            return evaluate_metrics(self.model, self.val_loader, self.recipe, self.device)

    def _emit(self, event: str, *args: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, event)(self, *args)

    # ------------------------------------------------------------------ checkpoints
    def snapshot(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """(weights, state) of a checkpoint that :meth:`resume` continues bit-identically."""
        return self.model.state_dict(), {
            "train_state": self.state.to_dict(),
            "optimizer": self.optimizer.state_dict(),
            "data_generator": self.gen.get_state(),
            "rng": capture_rng(),
            "layer_calls": layer_calls(self.model),
            "layer_hooks": self.recipe.training_state(self.model),
            **{cb.state_key: cb.state_dict() for cb in self.callbacks if cb.state_key},
        }

    def resume(self, weights: dict[str, Tensor], saved: dict[str, Any]) -> None:
        self.model.load_state_dict(weights)
        self.optimizer.load_state_dict(saved["optimizer"])
        self.gen.set_state(saved["data_generator"])
        set_layer_calls(self.model, saved["layer_calls"])
        self.recipe.load_training_state(self.model, saved.get("layer_hooks", {}))
        restore_rng(saved["rng"])
        self.state = TrainState.from_dict(saved["train_state"])
        for cb in self.callbacks:
            if cb.state_key and cb.state_key in saved:
                cb.load_state_dict(self, saved[cb.state_key])

    def use_data_parallel(self, dp: Any, resumed: dict[str, Any] | None) -> None:
        """Train as one rank of ``dp`` (after a resume's load: every rank starts from the same weights)."""
        dp.check_batch(self.opts.batch_size)
        self.net, self.comm = dp.wrap(self.model), DataParallelComm(dp)
        if resumed is not None:  # each rank's int8 error-feedback residuals (if saved)
            note = dp.load_comm_state(resumed.get("comm"))
            if note:
                self.log(note)
        self.hooks = dp.wrap_hooks(self.hooks)  # `last` checkpoints carry every rank's comm state

    # ------------------------------------------------------------------ the loop
    def start(self) -> None:
        """Callbacks' ``on_train_start`` (after a resume's load, before data parallel or compile wrap the model)."""
        self._emit("on_train_start")

    def fit(self) -> RunResult:
        for epoch in range(self.state.epoch + 1, self.opts.epochs + 1):
            stopped = self._run_epoch(epoch)
            if stopped is not None:
                return stopped
        return self.result()

    def _run_epoch(self, epoch: int) -> RunResult | None:
        self.model.train()
        perm = self._epoch_order()
        self._emit("on_epoch_start", epoch)
        try:
            for b in range(self.state.position, self.batches):
                self._step(perm[b * self.opts.batch_size : (b + 1) * self.opts.batch_size], b, epoch)
                stopped = self._after_step(epoch)
                if stopped is not None:
                    return stopped
        finally:
            self._emit("on_epoch_close")
        return self._end_epoch(epoch)

    def _epoch_order(self) -> Tensor:
        s = self.state
        if s.position == 0:  # a fresh epoch
            s.epoch_gen_state = self.gen.get_state()
            s.epoch_losses, s.epoch_times, s.epoch_skipped = [], [], 0
            return torch.randperm(len(self.splits.train), generator=self.gen)
        # Resumed mid-epoch: redraw the same permutation, skip what was consumed.
        return torch.randperm(len(self.splits.train), generator=torch.Generator().set_state(s.epoch_gen_state))

    def _step(self, idx: Tensor, b: int, epoch: int) -> None:
        s, o = self.state, self.opts
        s.step += 1
        self._emit("on_step_start")
        x, y = self.comm.batch(self.splits.train, idx, o.augment, o.seed, s.step)
        s.position = b + 1
        out = train_step(self.net, self.model, self.optimizer, (x.to(self.device), y.to(self.device)), self.recipe,
                         self.device, before_step=self.before_step, clip_grad_norm=o.clip_grad_norm, comm=self.comm)
        self._count(out, epoch)
        self._emit("on_step_end", out)
        if out.loss is None and s.consecutive_skips >= o.max_consecutive_skips:
            first = s.step - s.consecutive_skips + 1
            raise NonFiniteLossError(
                f"loss was non-finite for {s.consecutive_skips} consecutive steps (steps {first}..{s.step}); stopped "
                f"at step {s.step} (epoch {epoch}): {out.problem}. Try a lower lr or a higher-precision recipe.",
                s.step, self.result())

    def _count(self, out: StepOutcome, epoch: int) -> None:
        s = self.state
        if out.loss is None:
            s.skipped += 1
            s.epoch_skipped += 1
            s.consecutive_skips += 1
            self.log(f"  step {s.step} (epoch {epoch}): skipped, {out.problem}")
            return
        s.consecutive_skips = 0
        s.epoch_times.append(out.seconds)
        s.step_times.append(out.seconds)
        s.epoch_losses.append(out.loss)

    def _after_step(self, epoch: int) -> RunResult | None:
        """Stop (max_steps, a requested stop) or save (``save_every``) after a step."""
        s, o = self.state, self.opts
        reason = "max_steps" if o.max_steps is not None and s.step >= o.max_steps else ""
        stop = self.hooks.should_stop()
        reason = reason or ("stop requested" if self.comm.any(stop) else "")
        if reason:
            self.hooks.save("last", self.snapshot)
            self.log(f"stopped at step {s.step} (epoch {epoch}, batch {s.position}/{self.batches}): {reason}")
            if reason != "max_steps":
                return self.result(reason)
            # After the snapshot, so the checkpoint (and a resume) is what it would be without it.
            final = self.validate()
            self.log(f"validation at step {s.step}: " + _quality(final[0], final[1], self.lm))
            return self.result(reason, final)
        if o.save_every and s.step % o.save_every == 0:
            self.hooks.save("last", self.snapshot)  # resumable here (torchrun --max-restarts, `inttrain resume`)
        return None

    def _end_epoch(self, epoch: int) -> RunResult | None:
        s = self.state
        losses, times = s.epoch_losses, s.epoch_times
        val_loss, val_accuracy = self.validate()
        stats = EpochStats(
            epoch=epoch, train_loss=sum(losses) / len(losses) if losses else math.nan, val_accuracy=val_accuracy,
            steps=len(times), skipped=s.epoch_skipped, seconds=sum(times),
            time_per_step=sum(times) / len(times) if times else math.nan, val_loss=val_loss,
        )
        s.history.append(stats)
        s.epoch, s.position = epoch, 0
        self._emit("on_epoch_end", stats)
        self.log(
            f"epoch {epoch}/{self.opts.epochs}  train_loss {stats.train_loss:.4f}  "
            f"{_quality(stats.val_loss, stats.val_accuracy, self.lm)}  "
            f"{stats.time_per_step * 1e3:.2f} ms/step  steps {stats.steps}"
            + (f"  skipped {stats.skipped}" if stats.skipped else "")
        )
        improved = stats.val_loss < s.best_val_loss if self.lm else stats.val_accuracy > s.best_val_accuracy
        s.best_val_accuracy = max(s.best_val_accuracy, stats.val_accuracy)
        s.best_val_loss = min(s.best_val_loss, stats.val_loss)
        if improved:
            self.hooks.save("best", self.snapshot)
        self.hooks.save("last", self.snapshot)
        if self.comm.any(self.hooks.should_stop()):
            self.log(f"stopped after epoch {epoch}: stop requested")
            return self.result("stop requested")
        return None

    def result(self, stopped: str = "", final_val: tuple[float, float] | None = None) -> RunResult:
        taken = self.state.step_times
        return RunResult(self.name, list(self.state.history), len(taken), self.state.skipped,
                         statistics.median(taken) if taken else float("nan"), stopped, final_val)


def train(
    model: nn.Module,
    splits: DatasetSplits,
    recipe: str = "fp32",
    epochs: int = 5,
    batch_size: int = 32,
    lr: float = 0.05,
    optimizer: str = "sgd",
    seed: int = 0,
    device: str | torch.device = "cpu",
    log: Callable[[str], Any] = print,
    *,
    max_consecutive_skips: int = 10,
    progress: bool | None = None,
    recipe_config: Any = None,
    prepared: bool = False,
    max_steps: int | None = None,
    hooks: TrainHooks | None = None,
    resume_from: tuple[dict[str, Tensor], dict[str, Any]] | None = None,
    augment: str = "none",
    precision_scheduler: Any = None,
    cost_counter: Any = None,
    data_parallel: Any = None,
    save_every: int | None = None,
    dclr: bool = True,
    compile: bool = False,
    weight_decay: float = 0.0,
    momentum: float = DEFAULT_MOMENTUM,
    nesterov: bool = False,
    lr_schedule: str = "constant",
    warmup_epochs: float = 0.0,
    clip_grad_norm: float | None = None,
    callbacks: Sequence[Callback] = (),
) -> RunResult:
    """Train ``model`` on ``splits`` in place and return per-epoch statistics (seeded: same seed, init, data ->
    identical losses).

    ``recipe``: a name (``inttrain.recipe_names()``) or ``recipe_config``; applied with ``inttrain.prepare_``
    unless ``prepared``; the recipe object gives the autocast, optimizer (``dclr=False``: no per-layer lr
    scaling), step hook and checkpointed state. Non-finite steps are skipped (weights, buffers, optimizer
    untouched); ``max_consecutive_skips`` in a row raise :class:`NonFiniteLossError`. ``progress``: tqdm bar,
    lines, or by TTY (None). ``max_steps``: stop after that many steps (resumes included), after a final
    validation. ``hooks``: metrics and checkpoints (:class:`TrainHooks`); ``resume_from``: such a checkpoint,
    continued bit-identically; ``save_every``: also save ``last`` every that many steps. ``augment``:
    "crop-flip" (a function of seed and step). ``precision_scheduler`` / ``cost_counter``
    (:class:`inttrain.schedules.PrecisionScheduler`, :class:`inttrain.cost.BitOpsCounter`): stepped /
    attached and checkpointed. ``data_parallel``: a :class:`inttrain.distributed.data_parallel.DataParallel`
    (``batch_size`` is global). ``compile``: the forward through ``torch.compile``. ``weight_decay``,
    ``momentum``, ``nesterov``: the optimizer's (momentum/nesterov: sgd only). ``lr_schedule``: constant,
    step, cosine or onecycle over the run, after ``warmup_epochs`` of linear warm-up
    (:class:`inttrain.schedules.lr.LrSchedule`, a function of the step; recipes such as DCLR scale it).
    ``clip_grad_norm``: bound on the global gradient norm. ``callbacks``: more
    :class:`~inttrain.trainer.callbacks.Callback` objects, after the built-in ones.
    """
    opts = TrainOptions(epochs, batch_size, lr, optimizer, seed, max_consecutive_skips, max_steps, augment,
                        save_every, dclr, compile, weight_decay, momentum, nesterov, lr_schedule, warmup_epochs,
                        clip_grad_norm)
    opts.check()
    dev = torch.device(device)
    torch.manual_seed(seed)  # dropout, stochastic rounding, ... inside the step
    model.to(dev)
    cfg = get_recipe(recipe_config if recipe_config is not None else recipe)
    if not prepared:
        apply_recipe(model, cfg)
    # After prepare_: the optimizer must see the parameters the model now uses.
    extra = [ProgressBar(progress)]
    extra += [PrecisionScheduleCallback(precision_scheduler)] if precision_scheduler is not None else []
    extra += [CostCounterCallback(cost_counter)] if cost_counter is not None else []
    trainer = Trainer(model, splits, cfg, opts, device=dev, log=log, hooks=hooks or TrainHooks(),
                      callbacks=[*extra, *callbacks], name=recipe)
    if resume_from is not None:
        trainer.resume(*resume_from)
    trainer.start()
    if data_parallel is not None:
        trainer.use_data_parallel(data_parallel, None if resume_from is None else resume_from[1])
    if compile:
        # A BitOPs counter learns the step's GEMMs from one eager step (a resume brings them along).
        learn = cost_counter is not None and not cost_counter.has_template
        trainer.net = CompiledForward(trainer.net, log, eager_calls=1 if learn else 0)
    return trainer.fit()
