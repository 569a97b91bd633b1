"""Applies an :class:`inttrain.schedules.lr.LrSchedule` to an optimizer, step by step.

The lr of every step is recomputed from the step index (nothing accumulates), so a resumed run sets
exactly the lrs an uninterrupted one would. Each parameter group is scheduled from the lr it had when
the optimizer was built; a group that a recipe rescales before every step (``unified-int8``'s DCLR keeps
its base in ``dclr_base_lr``) gets the scheduled value as that base, so the recipe's scaling applies on
top of the schedule.
"""

from __future__ import annotations

import torch

from inttrain.schedules.lr import LrSchedule

__all__ = ["ScheduledLr"]


class ScheduledLr:
    """``apply(step)`` before every optimizer step sets each group's lr to ``schedule.lr_at(step, base)``."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: LrSchedule) -> None:
        self.optimizer, self.schedule = optimizer, schedule
        self.base_lrs = [float(g.get("dclr_base_lr", g["lr"])) for g in optimizer.param_groups]

    def apply(self, step: int) -> None:
        """Set the lrs of 0-based step ``step`` (a no-op for a constant schedule without warm-up)."""
        if self.schedule.is_constant:
            return
        # param_groups is read each time: optimizer.load_state_dict (resume) replaces the group dicts.
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            lr = self.schedule.lr_at(step, base)
            group["lr"] = lr
            if "dclr_base_lr" in group:
                group["dclr_base_lr"] = lr
