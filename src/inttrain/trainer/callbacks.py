"""What happens around the training step, one concern per callback.

The loop (:class:`inttrain.trainer.loop.Trainer`) calls, in list order: ``on_train_start`` once (after a
resume's state is back), ``on_epoch_start`` / ``on_epoch_close``, ``on_step_start`` (the step counter
already advanced), ``on_step_end`` with the step's :class:`~inttrain.trainer.step.StepOutcome`, and
``on_epoch_end`` with the epoch's statistics.  A callback with a ``state_key`` is saved in checkpoints
under that key (``state_dict``) and put back on resume (``load_state_dict``), so resumes stay exact.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .lr import ScheduledLr
from .progress import Progress

if TYPE_CHECKING:  # the loop imports this module
    from .loop import EpochStats, Trainer
    from .step import StepOutcome

__all__ = ["Callback", "ProgressBar", "LrScheduleCallback", "HooksCallback", "PrecisionScheduleCallback",
           "CostCounterCallback"]


class Callback:
    """Every method is a no-op; ``state_key`` None: nothing to checkpoint."""

    state_key: str | None = None

    def on_train_start(self, trainer: Trainer) -> None: ...
    def on_epoch_start(self, trainer: Trainer, epoch: int) -> None: ...
    def on_step_start(self, trainer: Trainer) -> None: ...
    def on_step_end(self, trainer: Trainer, outcome: StepOutcome) -> None: ...
    def on_epoch_end(self, trainer: Trainer, stats: EpochStats) -> None: ...
    def on_epoch_close(self, trainer: Trainer) -> None:
        """After the epoch's steps, also when a step raised or the run stopped."""

    def evaluation(self, trainer: Trainer) -> AbstractContextManager[Any]:
        """A context the validation passes run in (e.g. a precision schedule's evaluation bits)."""
        return nullcontext()

    def state_dict(self) -> Any:
        return None

    def load_state_dict(self, trainer: Trainer, state: Any) -> None: ...


class ProgressBar(Callback):
    """A tqdm bar (or periodic lines) per epoch; a resumed epoch's bar starts where it stopped."""

    def __init__(self, tty: bool | None) -> None:
        self.tty, self.bar = tty, None

    def on_epoch_start(self, trainer: Trainer, epoch: int) -> None:
        self.bar = Progress(trainer.batches, f"epoch {epoch}/{trainer.opts.epochs}", trainer.log, tty=self.tty,
                            initial=trainer.state.position)

    def on_step_end(self, trainer: Trainer, outcome: StepOutcome) -> None:
        if outcome.loss is not None:
            self.bar.update(trainer.state.position, outcome.loss)

    def on_epoch_close(self, trainer: Trainer) -> None:
        self.bar.close()


class LrScheduleCallback(Callback):
    """Sets every step's lr from the schedule (a function of the step index) before the step."""

    state_key = "lr_schedule"

    def __init__(self, scheduled: ScheduledLr) -> None:
        self.scheduled = scheduled

    def on_step_start(self, trainer: Trainer) -> None:
        self.scheduled.apply(trainer.state.step - 1)

    def state_dict(self) -> dict[str, Any]:
        return asdict(self.scheduled.schedule)

    def load_state_dict(self, trainer: Trainer, state: Any) -> None:
        # Nothing to restore (the lr follows the step); a schedule stretched by --epochs is worth a line.
        if state != self.state_dict():
            trainer.log(f"lr schedule changed on resume: {state} -> {self.state_dict()} (the new one applies from "
                        f"step {trainer.state.step + 1})")


class HooksCallback(Callback):
    """Reports steps and epochs to the trainer's :class:`~inttrain.trainer.state.TrainHooks` (e.g. the run folder)."""

    def on_step_end(self, trainer: Trainer, outcome: StepOutcome) -> None:
        trainer.hooks.on_step(trainer.state, outcome.loss, trainer.lr, outcome.seconds)

    def on_epoch_end(self, trainer: Trainer, stats: EpochStats) -> None:
        trainer.hooks.on_epoch(trainer.state, stats, trainer.lr)


class PrecisionScheduleCallback(Callback):
    """Steps an :class:`inttrain.schedules.PrecisionScheduler` (or FracTrain's gates) after every step."""

    state_key = "precision_scheduler"

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def on_step_end(self, trainer: Trainer, outcome: StepOutcome) -> None:
        self.scheduler.step(outcome.loss)

    def evaluation(self, trainer: Trainer) -> AbstractContextManager[Any]:
        return self.scheduler.evaluation()

    def state_dict(self) -> Any:
        return self.scheduler.state_dict()

    def load_state_dict(self, trainer: Trainer, state: Any) -> None:
        self.scheduler.load_state_dict(state)


class CostCounterCallback(Callback):
    """Counts BitOPs (:class:`inttrain.cost.BitOpsCounter`) over the training steps."""

    state_key = "cost_counter"

    def __init__(self, counter: Any) -> None:
        self.counter = counter

    def on_train_start(self, trainer: Trainer) -> None:
        self.counter.attach()

    def on_step_start(self, trainer: Trainer) -> None:
        self.counter.begin_step()

    def on_step_end(self, trainer: Trainer, outcome: Any) -> None:
        self.counter.end_step()

    def state_dict(self) -> Any:
        return self.counter.state_dict()

    def load_state_dict(self, trainer: Trainer, state: Any) -> None:
        self.counter.load_state_dict(state)
