"""``--schedule``: build the precision schedule of a run from its config (see :mod:`inttrain.schedules`).

On this CPU, fewer than 8 bits run on the same int8 kernels, so a schedule does not make steps faster;
the ``gbitops`` column of ``metrics.csv`` (BitOPs, :mod:`inttrain.cost`) is the hardware-independent
measure of what it saves.
"""

from __future__ import annotations

from typing import Any

from .config import RunConfig
from .errors import UsageProblem, check_choice

__all__ = ["build_schedule", "make_scheduler", "parse_bits", "parse_steps", "total_steps"]


def parse_steps(text: str) -> list[tuple[int, tuple[int, int]]]:
    """``"0:4/8,100:6"`` -> ``[(0, (4, 8)), (100, (6, 6))]``."""
    out = []
    for item in text.split(","):
        step, sep, bits = item.strip().partition(":")
        fwd, _, grad = bits.partition("/")
        try:
            if not sep:
                raise ValueError
            out.append((int(step), (int(fwd), int(grad or fwd))))
        except ValueError:
            raise UsageProblem("--set schedule_steps", f"{item!r}: expected step:forward_bits[/grad_bits],"
                                                       " e.g. 0:4/8,100:6,200:8") from None
    return out


def parse_bits(text: str) -> tuple[int, ...]:
    """``"4,6,8"`` -> ``(4, 6, 8)`` (the DFQ gate's options)."""
    try:
        return tuple(int(b) for b in text.split(","))
    except ValueError:
        raise UsageProblem("--set schedule_dfq_bits", f"{text!r}: expected comma-separated bit widths, e.g. 4,6,8") from None


def total_steps(cfg: RunConfig, n_train: int) -> int:
    return max(1, n_train // cfg.batch_size) * cfg.epochs


def build_schedule(cfg: RunConfig, n_train: int) -> Any:
    """The :class:`~inttrain.schedules.Schedule` of ``cfg`` (None for ``schedule=none``; dfq: a ``DFQConfig``,
    fractrain: ``(DFQConfig, PFQ)``, turned into a scheduler by :func:`make_scheduler`); UsageProblem if invalid."""
    import inttrain
    from inttrain import schedules as S

    check_choice("--schedule", cfg.schedule, S.SCHEDULE_NAMES)
    if cfg.schedule == "none":
        return None
    if not inttrain.get_config(cfg.recipe).converts_layers():
        raise UsageProblem("--schedule", f"{cfg.schedule}: recipe {cfg.recipe!r} has no bit width; use an integer recipe such as int8")
    try:
        if cfg.schedule == "constant":
            return S.Constant(cfg.schedule_min_bits, cfg.schedule_grad_bits)
        if cfg.schedule == "steps":
            if not cfg.schedule_steps:
                raise UsageProblem("--set schedule_steps", "schedule 'steps' needs milestones, e.g. schedule_steps=0:4/8,100:6,200:8")
            return S.Steps(parse_steps(cfg.schedule_steps))
        if cfg.schedule == "cpt":
            return S.CPT(cfg.schedule_min_bits, cfg.schedule_max_bits, cfg.schedule_cycles,
                         total_steps(cfg, n_train), grad_bits=cfg.schedule_grad_bits)
        if cfg.schedule in ("dfq", "fractrain"):
            from inttrain.recipes.fractrain_dfq import DFQConfig

            dfq = DFQConfig(parse_bits(cfg.schedule_dfq_bits), cfg.schedule_target_cost, cfg.schedule_cost_weight,
                            grad_bits=cfg.schedule_grad_bits, seed=cfg.seed,
                            per_sample=cfg.schedule_dfq_per_sample)
            if cfg.schedule == "dfq":
                return dfq
            return dfq, S.PFQ(threshold=cfg.schedule_threshold, window=cfg.schedule_window)
        return S.PFQ(threshold=cfg.schedule_threshold, window=cfg.schedule_window)
    except ValueError as e:
        if isinstance(e, UsageProblem):
            raise
        raise UsageProblem("--schedule", f"{cfg.schedule}: {e}") from None


def make_scheduler(model: Any, schedule: Any) -> Any:
    """The scheduler the trainer steps: a PrecisionScheduler, or for dfq / fractrain the gates'
    :class:`~inttrain.recipes.fractrain_dfq.DFQController` (gates added to ``model``; ValueError if unsupported)."""
    from inttrain.recipes.fractrain_dfq import DFQConfig, attach_dfq
    from inttrain.schedules import PrecisionScheduler

    if isinstance(schedule, DFQConfig):
        return attach_dfq(model, schedule)
    if isinstance(schedule, tuple):  # fractrain: (DFQConfig, PFQ cap)
        return attach_dfq(model, schedule[0], cap=schedule[1])
    return PrecisionScheduler(model, schedule)
