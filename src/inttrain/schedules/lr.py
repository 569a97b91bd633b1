"""Learning-rate schedules as pure functions of the step index (so a resumed run continues exactly).

``LrSchedule(name, total_steps, warmup_steps).lr_at(step, base_lr)`` is the learning rate of the
``step``-th optimizer step (0-based, skipped steps included) for a parameter group whose unscheduled
lr is ``base_lr``:

- ``constant``: ``base_lr``.
- ``step``: ``base_lr * 0.1 ** k``, ``k`` the number of milestones ``int(0.5 T)``, ``int(0.75 T)`` that
  ``step`` has reached (torch's ``MultiStepLR(milestones, gamma=0.1)``).
- ``cosine``: ``base_lr * (1 + cos(pi * step / T)) / 2``, from ``base_lr`` to 0 over the run (torch's
  ``CosineAnnealingLR(T_max=T)``).
- ``onecycle``: torch's ``OneCycleLR(max_lr=base_lr, total_steps=T, cycle_momentum=False)`` with its
  defaults (30 % cosine rise from ``base_lr / 25``, cosine fall to ``base_lr / 25 / 1e4``); the
  momentum is not cycled.

Warm-up multiplies any of them by ``step / W`` while ``step < W`` (linear from 0, as Hugging Face's
``get_*_schedule_with_warmup``). ``T`` is the run's total number of steps (epochs x steps per epoch).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

__all__ = ["LR_SCHEDULES", "LrSchedule"]

LR_SCHEDULES: tuple[str, ...] = ("constant", "step", "cosine", "onecycle")

# torch.optim.lr_scheduler.OneCycleLR defaults.
_ONECYCLE_PCT_START, _ONECYCLE_DIV, _ONECYCLE_FINAL_DIV = 0.3, 25.0, 1e4


def _cos_anneal(start: float, end: float, pct: float) -> float:
    """OneCycleLR's ``_annealing_cos``: from ``start`` (pct 0) to ``end`` (pct 1)."""
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


@dataclass(frozen=True)
class LrSchedule:
    """A learning-rate schedule over a run of ``total_steps`` steps with ``warmup_steps`` of linear warm-up."""

    name: str = "constant"
    total_steps: int = 1
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        if self.name not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule {self.name!r}: allowed {', '.join(LR_SCHEDULES)}")
        if self.total_steps < 1 or self.warmup_steps < 0:
            raise ValueError(f"lr schedule needs total_steps >= 1 and warmup_steps >= 0 (got {self.total_steps}, "
                             f"{self.warmup_steps})")

    @property
    def is_constant(self) -> bool:
        """True when every step's lr is the base lr (nothing to apply)."""
        return self.name == "constant" and self.warmup_steps == 0

    def lr_at(self, step: int, base_lr: float) -> float:
        """The lr of 0-based step ``step`` for a group whose unscheduled lr is ``base_lr``."""
        lr = self._main(step, base_lr)
        if step < self.warmup_steps:
            lr = lr * step / self.warmup_steps
        return lr

    def _main(self, step: int, base_lr: float) -> float:
        t = self.total_steps
        if self.name == "step":
            return base_lr * 0.1 ** bisect.bisect_right((int(0.5 * t), int(0.75 * t)), step)
        if self.name == "cosine":
            return base_lr * (1 + math.cos(math.pi * min(step, t) / t)) / 2
        if self.name == "onecycle":
            return self._onecycle(step, base_lr)
        return base_lr

    def _onecycle(self, step: int, max_lr: float) -> float:
        # The phase arithmetic of torch's OneCycleLR.get_lr (two phases), so values agree to the last bit.
        initial = max_lr / _ONECYCLE_DIV
        phases = ((float(_ONECYCLE_PCT_START * self.total_steps) - 1, initial, max_lr),
                  (self.total_steps - 1, max_lr, initial / _ONECYCLE_FINAL_DIV))
        start_step = 0.0
        for i, (end_step, start_lr, end_lr) in enumerate(phases):
            if step <= end_step or i == len(phases) - 1:
                span = end_step - start_step
                return _cos_anneal(start_lr, end_lr, (step - start_step) / span if span else 1.0)
            start_step = end_step
        raise AssertionError("unreachable")
