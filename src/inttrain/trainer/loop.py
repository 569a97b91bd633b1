"""A small, deterministic training loop for classification (and next-token LM).

``train()`` applies the recipe, then runs ``epochs`` passes of SGD/Adam with a
seeded data order, evaluating on the val split after every epoch. Mutable
progress lives in :class:`TrainState` so checkpoint/resume can be added by
saving and restoring it alongside the model and optimizer state dicts.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from inttrain.data import DatasetSplits
from inttrain.schedules.lr import LrSchedule

from .augment import augment_batch
from .compiled import CompiledForward
from .lr import ScheduledLr
from .progress import Progress
from .recipe_training import build_recipe_optimizer, layer_hook_state, load_layer_hook_state
from .recipes import apply_recipe, autocast_for
from .rng import capture_rng, layer_calls, restore_rng, set_layer_calls

__all__ = [
    "OPTIMIZER_NAMES",
    "EpochStats",
    "TrainState",
    "TrainHooks",
    "RunResult",
    "NonFiniteLossError",
    "build_optimizer",
    "evaluate",
    "evaluate_metrics",
    "train",
]

OPTIMIZER_NAMES: tuple[str, ...] = ("sgd", "adam", "adamw")
DEFAULT_MOMENTUM = 0.9


def perplexity(loss: float) -> float:
    """exp(loss), inf where that overflows."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


@dataclass
class EpochStats:
    epoch: int  # 1-based
    train_loss: float  # mean over the epoch's finite-loss steps (nan if none)
    val_accuracy: float
    steps: int  # steps taken (excluding skipped)
    skipped: int
    seconds: float  # wall time of the epoch's training steps
    time_per_step: float  # mean seconds per step within the epoch
    # Mean cross-entropy on the val split (per token for language models); a
    # default so checkpoints written before it existed still load.
    val_loss: float = math.nan

    @property
    def val_perplexity(self) -> float:
        """exp(val_loss): the language-model figure (inf if the loss overflows it)."""
        return perplexity(self.val_loss)


@dataclass
class TrainState:
    """Everything about a run's progress that a resume would need (see :meth:`to_dict`)."""

    epoch: int = 0  # completed epochs
    step: int = 0  # attempted steps, skipped ones included (1-based ids)
    skipped: int = 0
    consecutive_skips: int = 0
    position: int = 0  # batches of the current epoch already consumed
    # Data-order generator state at the start of the current epoch: the epoch's
    # permutation is redrawn from it on a mid-epoch resume.
    epoch_gen_state: Tensor | None = None
    epoch_losses: list[float] = field(default_factory=list)  # current epoch so far
    epoch_times: list[float] = field(default_factory=list)
    epoch_skipped: int = 0
    best_val_accuracy: float = -math.inf
    best_val_loss: float = math.inf
    step_times: list[float] = field(default_factory=list)
    history: list[EpochStats] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain containers only (``torch.load(weights_only=True)`` compatible)."""
        d = {k: v for k, v in vars(self).items() if k != "history"}
        d["history"] = [asdict(h) for h in self.history]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainState:
        d = dict(d)
        history = [EpochStats(**h) for h in d.pop("history", [])]
        return cls(**d, history=history)


@dataclass
class RunResult:
    recipe: str
    epochs: list[EpochStats]
    steps: int  # optimizer steps taken
    skipped_steps: int
    time_per_step: float  # median seconds per taken step (robust to warm-up)
    stopped: str = ""  # why training ended before its last epoch ("" if it did not)
    # (val_loss, val_accuracy) of the validation a max_steps stop ends with (None: the run ended at an epoch).
    final_val: tuple[float, float] | None = None

    @property
    def train_losses(self) -> list[float]:
        return [e.train_loss for e in self.epochs]

    @property
    def val_accuracies(self) -> list[float]:
        return [e.val_accuracy for e in self.epochs]

    @property
    def val_accuracy(self) -> float:
        """Accuracy of the last validation (the final one of a max_steps stop, else the last epoch's)."""
        if self.final_val is not None:
            return self.final_val[1]
        return self.epochs[-1].val_accuracy if self.epochs else float("nan")

    @property
    def val_loss(self) -> float:
        if self.final_val is not None:
            return self.final_val[0]
        return self.epochs[-1].val_loss if self.epochs else float("nan")

    @property
    def val_perplexity(self) -> float:
        """exp(val_loss) of the last validation (inf if it overflows)."""
        return perplexity(self.val_loss)


class NonFiniteLossError(RuntimeError):
    """Too many consecutive non-finite losses; ``result`` holds the partial run."""

    def __init__(self, message: str, step: int, result: RunResult) -> None:
        super().__init__(message)
        self.step, self.result = step, result


def check_optimizer_options(name: str, momentum: float = 0.9, weight_decay: float = 0.0, nesterov: bool = False) -> None:
    """ValueError naming the option if ``momentum``/``weight_decay``/``nesterov`` do not apply to optimizer ``name``.

    momentum and nesterov are SGD's (adam/adamw have betas instead): a non-default value there would be
    silently ignored, so it is refused.
    """
    if name not in OPTIMIZER_NAMES:
        raise ValueError(f"unknown optimizer {name!r}; allowed: {', '.join(OPTIMIZER_NAMES)}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum={momentum}: allowed 0 <= momentum < 1")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay={weight_decay}: allowed >= 0")
    if name != "sgd" and (nesterov or momentum != DEFAULT_MOMENTUM):
        what = "nesterov" if nesterov else f"momentum={momentum}"
        raise ValueError(f"{what} applies to sgd only; optimizer {name!r} uses its betas (leave momentum at "
                         f"{DEFAULT_MOMENTUM} and nesterov off, or use sgd)")
    if nesterov and momentum == 0:
        raise ValueError("nesterov needs momentum > 0 (got momentum=0)")


def build_optimizer(name: str, params: Any, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                    nesterov: bool = False) -> torch.optim.Optimizer:
    """The trainer's optimizer ``name`` (sgd, adam, adamw) over ``params`` (tensors or parameter groups)."""
    check_optimizer_options(name, momentum, weight_decay, nesterov)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def _loss(logits: Tensor, target: Tensor) -> Tensor:
    # [B, T, V] language-model logits are scored per token.
    if logits.ndim == 3:
        logits, target = logits.flatten(0, 1), target.flatten()
    return F.cross_entropy(logits.float(), target)


@torch.no_grad()
def evaluate_metrics(model: nn.Module, loader: DataLoader, recipe: str, device: torch.device) -> tuple[float, float]:
    """(mean cross-entropy, top-1 accuracy), both per token for [B, T, V] outputs."""
    was_training = model.training
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        with autocast_for(recipe, device):
            logits = model(x)
        correct += int((logits.argmax(-1) == y).sum())
        # Summed, then divided once: batches of different sizes weigh by their token count.
        loss_sum += float(_loss(logits, y) * y.numel())
        total += y.numel()
    model.train(was_training)
    return loss_sum / max(total, 1), correct / max(total, 1)


def evaluate(model: nn.Module, loader: DataLoader, recipe: str, device: torch.device) -> float:
    """Top-1 accuracy (per token for [B, T, V] outputs)."""
    return evaluate_metrics(model, loader, recipe, device)[1]


class TrainHooks:
    """What a caller (the CLI's run folder) can plug into :func:`train`; every method is a no-op here."""

    def on_step(self, state: TrainState, loss: float | None, lr: float, seconds: float) -> None:
        """After every attempted step; ``loss`` is None for a skipped step."""

    def on_epoch(self, state: TrainState, stats: EpochStats, lr: float) -> None:
        """After each epoch's evaluation."""

    def save(self, name: str, snapshot: Callable[[], tuple[dict[str, Tensor], dict[str, Any]]]) -> None:
        """Checkpoint ``name`` ("last" or "best") is due; ``snapshot()`` gives (weights, state)."""

    def should_stop(self) -> bool:
        """Polled after every step (e.g. a signal arrived): stop after saving ``last``."""
        return False


def _first_nonfinite_grad(model: nn.Module) -> str | None:
    """Name of the first parameter (in ``named_parameters`` order) whose gradient is not finite."""
    named = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    if not named:
        return None
    # One fused reduction in the common all-finite case; the per-tensor scan runs only on failure.
    norms = torch._foreach_norm([g for _, g in named])
    if bool(torch.isfinite(torch.stack([n.float() for n in norms])).all()):
        return None
    return next((n for n, g in named if not bool(torch.isfinite(g).all())), None)


def _quality(val_loss: float, val_accuracy: float, lm: bool) -> str:
    """How a validation is logged: a language model is judged by its loss (perplexity) first."""
    if lm:
        return f"val_loss {val_loss:.4f}  val_ppl {perplexity(val_loss):.2f}  val_acc {val_accuracy:.4f}"
    return f"val_acc {val_accuracy:.4f}"


def _batch(dataset: Dataset, idx: Tensor) -> tuple[Tensor, Tensor]:
    if isinstance(dataset, TensorDataset):  # one gather per tensor instead of per-sample collation
        x, y = dataset[idx]
        return x, y
    from torch.utils.data import default_collate

    return default_collate([dataset[int(i)] for i in idx])


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
) -> RunResult:
    """Train ``model`` on ``splits`` in place and return per-epoch statistics.

    ``recipe``: "fp32", "bf16" (autocast) or any recipe of ``inttrain.prepare_``
    (applied in place before the optimizer is built; ``recipe_config``, e.g. a
    config with other ``bits``, is passed to ``prepare_`` instead of the name;
    ``prepared=True``: the caller already applied it). Seeded: same seed, model
    init and data give identical losses. Steps with a non-finite loss or
    gradient are skipped (weights, buffers and optimizer state untouched);
    ``max_consecutive_skips`` in a row raise :class:`NonFiniteLossError`.
    ``progress``: tqdm bar (True), periodic lines (False), or decide by whether
    stderr is a TTY (None). ``max_steps`` stops after that many attempted steps
    (counted over the whole run, resumes included). ``resume_from``: (weights,
    state) of a checkpoint written through ``hooks.save``; training continues
    bit-identically from it. ``augment``: "crop-flip" pads, randomly crops and
    flips image batches (a pure function of seed and step, so resumes stay exact).
    ``precision_scheduler``: an :class:`inttrain.schedules.PrecisionScheduler`, stepped after every
    attempted step with its loss (None when skipped); ``cost_counter``: an
    :class:`inttrain.cost.BitOpsCounter`, attached for the training steps. Both are saved in checkpoints
    (``state_dict``) and restored on resume, so scheduled runs resume bit-identically.
    ``data_parallel``: an :class:`inttrain.distributed.data_parallel.DataParallel` (process group
    initialized): the model is wrapped in DDP, ``batch_size`` is the global batch and each rank
    trains on its equal share of it; logged losses are global means, and all ranks skip/stop at
    the same steps. Checkpoints (``hooks.save``) equal those of a single-process run.
    ``save_every``: also save ``last`` every that many steps (resume / elastic-restart points).
    ``compile``: run the training forward (and so backward) through ``torch.compile``
    (:class:`inttrain.trainer.compiled.CompiledForward`: first-step compile time logged, eager fallback).
    The recipe's own optimizer parts apply (:mod:`inttrain.trainer.recipe_training`: ``unified-int8``'s
    per-layer DCLR learning rates unless ``dclr=False``, ``wageubn``'s WageubnSGD), and its per-layer
    state (DSGC clip ratios, counters, deviations) is saved in checkpoints and restored on resume.
    ``weight_decay``, ``momentum``, ``nesterov``: the optimizer's (momentum and nesterov: sgd only;
    ``wageubn``'s WageubnSGD takes momentum and weight decay, not nesterov). ``lr_schedule``: constant,
    step, cosine or onecycle over the whole run (``epochs`` x steps per epoch), after ``warmup_epochs`` of
    linear warm-up from 0 (:class:`inttrain.schedules.lr.LrSchedule`); each step's lr is a function of the
    step index, so resumes are exact, and recipes that rescale per-layer lrs (DCLR) scale the scheduled lr.
    ``clip_grad_norm``: rescale the gradients so their global L2 norm is at most this, before every step.
    A run stopped by ``max_steps`` ends with a validation (``RunResult.val_accuracy``/``val_loss``).
    """
    if epochs < 1 or batch_size < 1 or not lr > 0 or max_consecutive_skips < 1:
        raise ValueError(
            f"epochs, batch_size and max_consecutive_skips must be >= 1 and lr > 0; got epochs={epochs}, "
            f"batch_size={batch_size}, lr={lr}, max_consecutive_skips={max_consecutive_skips}"
        )
    if not warmup_epochs >= 0 or (clip_grad_norm is not None and not clip_grad_norm > 0):
        raise ValueError(f"warmup_epochs must be >= 0 and clip_grad_norm > 0 (or None); got warmup_epochs="
                         f"{warmup_epochs}, clip_grad_norm={clip_grad_norm}")
    check_optimizer_options(optimizer, momentum, weight_decay, nesterov)
    hooks = hooks or TrainHooks()
    dev = torch.device(device)
    torch.manual_seed(seed)  # dropout, stochastic rounding, ... inside the step
    model.to(dev)
    if not prepared:
        apply_recipe(model, recipe_config if recipe_config is not None else recipe)
    # After prepare_: the optimizer must see the parameters the model now uses.
    opt, before_step = build_recipe_optimizer(
        model, recipe_config if recipe_config is not None else recipe, optimizer, lr, dclr=dclr,
        momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    n = len(splits.train)
    # Full batches only (every step the same shape: comparable step times, no
    # 1-sample BatchNorm batches); reshuffling means no sample is lost for good.
    batches = n // batch_size if n >= batch_size else 1
    schedule = LrSchedule(lr_schedule, epochs * batches, round(warmup_epochs * batches))
    scheduled_lr = ScheduledLr(opt, schedule)
    # Data order comes from this generator alone (one permutation per epoch), so
    # (generator state at epoch start, position) pins where a resume continues.
    gen = torch.Generator().manual_seed(seed)
    state = TrainState()
    if resume_from is not None:
        weights, saved = resume_from
        model.load_state_dict(weights)
        opt.load_state_dict(saved["optimizer"])
        gen.set_state(saved["data_generator"])
        set_layer_calls(model, saved["layer_calls"])
        load_layer_hook_state(model, saved.get("layer_hooks", {}))
        restore_rng(saved["rng"])
        state = TrainState.from_dict(saved["train_state"])
        if precision_scheduler is not None and "precision_scheduler" in saved:
            precision_scheduler.load_state_dict(saved["precision_scheduler"])
        if cost_counter is not None and "cost_counter" in saved:
            cost_counter.load_state_dict(saved["cost_counter"])
        before = saved.get("lr_schedule")
        if before is not None and before != asdict(schedule):
            log(f"lr schedule changed on resume: {before} -> {asdict(schedule)} (the new one applies from "
                f"step {state.step + 1})")
    if cost_counter is not None:
        cost_counter.attach()
    dp = data_parallel
    net: nn.Module = model
    if dp is not None:
        dp.check_batch(batch_size)
        net = dp.wrap(model)  # after a resume's load: every rank starts from the same weights
        if resume_from is not None:  # each rank's int8 error-feedback residuals (if saved)
            note = dp.load_comm_state(resume_from[1].get("comm"))
            if note:
                log(note)
        hooks = dp.wrap_hooks(hooks)  # `last` checkpoints carry every rank's comm state

    step_net: Callable[[Tensor], Tensor] = CompiledForward(net, log) if compile else net
    lm = splits.task == "lm"
    val_loader = DataLoader(splits.val, batch_size=max(batch_size, 256))

    def result(stopped: str = "", final_val: tuple[float, float] | None = None) -> RunResult:
        taken = state.step_times
        return RunResult(
            recipe, list(state.history), len(taken), state.skipped,
            statistics.median(taken) if taken else float("nan"), stopped, final_val,
        )

    def snapshot() -> tuple[dict[str, Tensor], dict[str, Any]]:
        return model.state_dict(), {
            "train_state": state.to_dict(),
            "optimizer": opt.state_dict(),
            "data_generator": gen.get_state(),
            "rng": capture_rng(),
            "layer_calls": layer_calls(model),
            "layer_hooks": layer_hook_state(model),
            "lr_schedule": asdict(schedule),
            **({} if precision_scheduler is None else {"precision_scheduler": precision_scheduler.state_dict()}),
            **({} if cost_counter is None else {"cost_counter": cost_counter.state_dict()}),
        }

    for epoch in range(state.epoch + 1, epochs + 1):
        model.train()
        if state.position == 0:  # a fresh epoch
            state.epoch_gen_state = gen.get_state()
            perm = torch.randperm(n, generator=gen)
            state.epoch_losses, state.epoch_times, state.epoch_skipped = [], [], 0
        else:  # resumed mid-epoch: redraw the same permutation, skip what was consumed
            perm = torch.randperm(n, generator=torch.Generator().set_state(state.epoch_gen_state))
        bar = Progress(batches, f"epoch {epoch}/{epochs}", log, tty=progress, initial=state.position)
        try:
            for b in range(state.position, batches):
                idx = perm[b * batch_size : (b + 1) * batch_size]
                state.step += 1
                scheduled_lr.apply(state.step - 1)
                if dp is None:
                    x, y = _batch(splits.train, idx)
                    x = augment_batch(x, augment, seed, state.step)
                elif augment == "none":
                    x, y = _batch(splits.train, dp.shard(idx))
                else:  # augmentation draws per global batch: augment it whole, then take the shard
                    x, y = _batch(splits.train, idx)
                    x = augment_batch(x, augment, seed, state.step)
                    x, y = x[dp.shard(torch.arange(len(idx)))], y[dp.shard(torch.arange(len(idx)))]
                state.position = b + 1
                x, y = x.to(dev), y.to(dev)
                t0 = time.perf_counter()
                # BatchNorm statistics change in the forward; a skipped step must not keep them.
                buffers = [t.clone() for t in model.buffers()]
                with autocast_for(recipe, dev):
                    logits = step_net(x)
                loss = _loss(logits, y)
                problem = None
                # Data parallel: the global mean (one all-reduce; non-finite on all ranks if on any).
                loss_value = float(loss.detach()) if dp is None else dp.mean(loss)
                if not math.isfinite(loss_value):
                    problem = f"non-finite loss ({loss_value})"
                else:
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    if dp is None:
                        bad = _first_nonfinite_grad(model)
                        if bad is not None:
                            problem = f"non-finite gradient in {bad!r}"
                    elif not dp.grads_finite(model):
                        problem = "non-finite gradient (on some rank)"
                if problem is not None:
                    opt.zero_grad(set_to_none=True)
                    with torch.no_grad():
                        for t, saved_t in zip(model.buffers(), buffers):
                            t.copy_(saved_t)
                    state.skipped += 1
                    state.epoch_skipped += 1
                    state.consecutive_skips += 1
                    log(f"  step {state.step} (epoch {epoch}): skipped, {problem}")
                    hooks.on_step(state, None, opt.param_groups[0]["lr"], time.perf_counter() - t0)
                    if precision_scheduler is not None:
                        precision_scheduler.step(None)
                    if state.consecutive_skips >= max_consecutive_skips:
                        first = state.step - state.consecutive_skips + 1
                        raise NonFiniteLossError(
                            f"loss was non-finite for {state.consecutive_skips} consecutive steps "
                            f"(steps {first}..{state.step}); stopped at step {state.step} (epoch {epoch}): "
                            f"{problem}. Try a lower lr or a higher-precision recipe.",
                            state.step,
                            result(),
                        )
                else:
                    state.consecutive_skips = 0
                    if clip_grad_norm is not None:
                        # After DDP's all-reduce: every rank clips the same global gradient alike.
                        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
                    if before_step is not None:
                        before_step()  # e.g. DCLR: per-layer lr from the last DSGC deviation
                    opt.step()
                    seconds = time.perf_counter() - t0
                    state.epoch_times.append(seconds)
                    state.step_times.append(seconds)
                    state.epoch_losses.append(loss_value)
                    bar.update(b + 1, state.epoch_losses[-1])
                    hooks.on_step(state, state.epoch_losses[-1], opt.param_groups[0]["lr"], seconds)
                    if precision_scheduler is not None:
                        precision_scheduler.step(state.epoch_losses[-1])
                reason = "max_steps" if max_steps is not None and state.step >= max_steps else ""
                stop = hooks.should_stop()
                reason = reason or ("stop requested" if (stop if dp is None else dp.any(stop)) else "")
                if reason:
                    hooks.save("last", snapshot)
                    log(f"stopped at step {state.step} (epoch {epoch}, batch {state.position}/{batches}): {reason}")
                    if reason != "max_steps":
                        return result(reason)
                    # After the snapshot, so the checkpoint (and a resume) is what it would be without it.
                    final = evaluate_metrics(model, val_loader, recipe, dev)
                    log(f"validation at step {state.step}: " + _quality(final[0], final[1], lm))
                    return result(reason, final)
                if save_every and state.step % save_every == 0:
                    hooks.save("last", snapshot)  # resumable here (torchrun --max-restarts, `inttrain resume`)
        finally:
            bar.close()
        losses, times = state.epoch_losses, state.epoch_times
        val_loss, val_accuracy = evaluate_metrics(model, val_loader, recipe, dev)
        stats = EpochStats(
            epoch=epoch,
            train_loss=sum(losses) / len(losses) if losses else math.nan,
            val_accuracy=val_accuracy,
            steps=len(times),
            skipped=state.epoch_skipped,
            seconds=sum(times),
            time_per_step=sum(times) / len(times) if times else math.nan,
            val_loss=val_loss,
        )
        state.history.append(stats)
        state.epoch, state.position = epoch, 0
        hooks.on_epoch(state, stats, opt.param_groups[0]["lr"])
        log(
            f"epoch {epoch}/{epochs}  train_loss {stats.train_loss:.4f}  {_quality(stats.val_loss, stats.val_accuracy, lm)}  "
            f"{stats.time_per_step * 1e3:.2f} ms/step  steps {stats.steps}"
            + (f"  skipped {stats.skipped}" if stats.skipped else "")
        )
        improved = stats.val_loss < state.best_val_loss if lm else stats.val_accuracy > state.best_val_accuracy
        state.best_val_accuracy = max(state.best_val_accuracy, stats.val_accuracy)
        state.best_val_loss = min(state.best_val_loss, stats.val_loss)
        if improved:
            hooks.save("best", snapshot)
        hooks.save("last", snapshot)
        stop = hooks.should_stop()
        if stop if dp is None else dp.any(stop):
            log(f"stopped after epoch {epoch}: stop requested")
            return result("stop requested")
    return result()
