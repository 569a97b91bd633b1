"""Precision schedules: the (forward bits, gradient bits) of every training step.

A schedule is a function of the step index ``t`` (0-based: the bits used by the ``t``-th optimizer
step).  :class:`Constant`, :class:`Steps` and :class:`CPT` are pure functions of ``t``; :class:`PFQ`
also depends on the loss history it has been shown (:meth:`PFQ.observe`) and keeps that state
explicitly (``state_dict`` / ``load_state_dict``) so that resumed runs continue exactly.

*Forward bits* are the widths of both operands of the forward GEMM (activation and weight);
*gradient bits* are the width of the output-gradient operand of the two backward GEMMs
(``grad_input.lhs`` and ``grad_weight.lhs``; see :mod:`inttrain.spec.precision`).

Note on speed: on a CPU, 2..8-bit values are stored and multiplied as int8, so fewer bits do **not**
run faster than 8.  What fewer bits save is measured with BitOPs (``MACs x bits_a x bits_b``,
:mod:`inttrain.cost`), the hardware-independent cost measure that CPT and FracTrain report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inttrain.spec import MAX_BITS, MIN_BITS

__all__ = ["Schedule", "Constant", "Steps", "CPT", "PFQ", "cpt_bits"]

Bits = tuple[int, int]


def _check_bits(*values: int) -> None:
    for b in values:
        if not isinstance(b, int) or isinstance(b, bool) or not MIN_BITS <= b <= MAX_BITS:
            raise ValueError(f"bit width must be an int in [{MIN_BITS}, {MAX_BITS}], got {b!r}")


class Schedule:
    """Base class: ``bits_at(step) -> (forward_bits, grad_bits)``; stateless unless overridden."""

    stateful = False

    def bits_at(self, step: int) -> Bits:  # pragma: no cover - abstract
        raise NotImplementedError

    def eval_bits(self, step: int) -> Bits:
        """The bits the model is validated (and saved for inference) at after ``step`` steps: by default those
        of the step it is training at."""
        return self.bits_at(step)

    def observe(self, step: int, loss: float | None) -> None:
        """Called once per finished step with its training loss (None: skipped step)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@dataclass(frozen=True)
class Constant(Schedule):
    """Fixed bits for the whole run."""

    forward_bits: int = 8
    grad_bits: int = 8

    def __post_init__(self) -> None:
        _check_bits(self.forward_bits, self.grad_bits)

    def bits_at(self, step: int) -> Bits:
        return self.forward_bits, self.grad_bits


@dataclass(frozen=True)
class Steps(Schedule):
    """Piecewise-constant bits: ``milestones`` is a list of ``(first_step, bits)``, ``bits`` an int (forward
    and gradient alike) or a ``(forward, grad)`` pair.  Before the first milestone the first entry's bits
    apply.

    >>> Steps([(0, (4, 8)), (100, 6), (200, (8, 8))]).bits_at(150)
    (6, 6)
    """

    milestones: Sequence[tuple[int, int | tuple[int, int]]] = ((0, 8),)

    def __post_init__(self) -> None:
        if not self.milestones:
            raise ValueError("Steps needs at least one (step, bits) milestone")
        norm = []
        for s, b in self.milestones:
            pair = (b, b) if isinstance(b, int) else tuple(b)
            if len(pair) != 2:
                raise ValueError(f"bits must be an int or a (forward, grad) pair, got {b!r}")
            _check_bits(*pair)
            norm.append((int(s), (int(pair[0]), int(pair[1]))))
        if any(a[0] >= b[0] for a, b in zip(norm, norm[1:])):
            raise ValueError(f"milestone steps must be strictly increasing, got {[s for s, _ in norm]}")
        object.__setattr__(self, "milestones", tuple(norm))

    def bits_at(self, step: int) -> Bits:
        bits = self.milestones[0][1]
        for s, b in self.milestones:
            if step >= s:
                bits = b
        return bits


def cpt_bits(step: int, b_min: int, b_max: int, cycles: int, total_steps: int) -> int:
    """Cyclic precision of CPT (Fu et al., "CPT: Efficient Deep Neural Network Training via Cyclic
    Precision", ICLR 2021, Eq. 1)::

        B_t = ceil( B_min + 1/2 (B_max - B_min) (1 - cos(pi * (t mod T_c) / T_c)) ),   T_c = total / N

    Each of the ``N = cycles`` cycles rises along a half cosine from ``B_min`` (at the cycle's first step)
    towards ``B_max`` and then drops back to ``B_min``.  ``T_c`` is ``total_steps / cycles`` (a float:
    cycles need not be whole numbers of steps).  The ceil is taken with a 1e-9 tolerance so that values
    that are integers up to float rounding (e.g. ``5.000000000001``) are not pushed up a bit.
    """
    t_c = total_steps / cycles
    phase = (step % t_c) / t_c
    value = b_min + 0.5 * (b_max - b_min) * (1.0 - math.cos(math.pi * phase))
    return int(min(b_max, max(b_min, math.ceil(value - 1e-9))))


@dataclass(frozen=True)
class CPT(Schedule):
    """Cyclic Precision Training (Fu et al., ICLR 2021): forward bits follow :func:`cpt_bits` between
    ``b_min`` and ``b_max`` with ``cycles`` cycles over ``total_steps``.  Gradient bits are fixed at
    ``grad_bits`` (the paper's main setting, e.g. "FW 3-8 / BW 8"), or, with ``grad_min`` set, cycle in phase
    between ``grad_min`` and ``grad_max`` (default ``grad_bits``).  The paper picks ``b_min`` with a
    precision range test (:func:`inttrain.schedules.precision_range_test`) and uses 32 cycles in its
    CIFAR experiments.
    """

    b_min: int = 3
    b_max: int = 8
    cycles: int = 32
    total_steps: int = 1000
    grad_bits: int = 8
    grad_min: int | None = None
    grad_max: int | None = None

    def __post_init__(self) -> None:
        _check_bits(self.b_min, self.b_max, self.grad_bits)
        if self.b_min > self.b_max:
            raise ValueError(f"b_min ({self.b_min}) must be <= b_max ({self.b_max})")
        if self.cycles < 1 or self.total_steps < 1:
            raise ValueError(f"cycles and total_steps must be >= 1, got {self.cycles}, {self.total_steps}")
        if self.grad_min is not None:
            _check_bits(self.grad_min, self.grad_max if self.grad_max is not None else self.grad_bits)

    def eval_bits(self, step: int) -> Bits:
        """The top of the cycle, ``B_max`` (and the top gradient bits): the precision CPT evaluates at.  The
        bits of the current step would be arbitrary -- an epoch that ends on a cycle boundary would be
        validated at ``B_min`` (a 3-8 ResNet-20 run read 14.6% there, 83.5% one epoch earlier at 8 bits)."""
        if self.grad_min is None:
            return self.b_max, self.grad_bits
        return self.b_max, self.grad_max if self.grad_max is not None else self.grad_bits

    def bits_at(self, step: int) -> Bits:
        fwd = cpt_bits(step, self.b_min, self.b_max, self.cycles, self.total_steps)
        if self.grad_min is None:
            return fwd, self.grad_bits
        g_max = self.grad_max if self.grad_max is not None else self.grad_bits
        return fwd, cpt_bits(step, self.grad_min, g_max, self.cycles, self.total_steps)


@dataclass
class PFQ(Schedule):
    """Progressive Fractional Quantization (FracTrain; Fu et al., NeurIPS 2020): training runs through
    precision stages ``forward = (3, 4, 6, 8)`` / ``backward = (6, 6, 8, 8)`` and moves to the next stage
    when a loss-based indicator falls below a threshold that decays from stage to stage.

    This implementation's explicit form (our reading of the paper; the paper states the indicator in
    words and per epoch, here it is per ``window`` steps):

    - every ``window`` finished steps, ``L_k`` = mean training loss of that window;
    - indicator ``d_k = |L_{k-1} - L_k| / |L_{k-1}|`` (relative loss change between consecutive windows);
    - if ``d_k < threshold`` and the run is not at the last stage: advance one stage and set
      ``threshold *= decay`` (stricter thresholds for the higher precisions);
    - a stage lasts at least ``min_windows`` windows (the first window of a stage only sets ``L``).

    Skipped steps (``loss=None``) are not counted.  Stateful: ``bits_at`` gives the bits of the current
    stage whatever the step; the state (stage, threshold, window sums, previous mean) is in
    :meth:`state_dict`.
    """

    forward: tuple[int, ...] = (3, 4, 6, 8)
    backward: tuple[int, ...] = (6, 6, 8, 8)
    threshold: float = 0.05
    decay: float = 0.5
    window: int = 50
    min_windows: int = 1
    stateful = True
    # --- state
    stage: int = field(default=0, init=False)
    current_threshold: float = field(default=0.0, init=False)
    window_sum: float = field(default=0.0, init=False)
    window_count: int = field(default=0, init=False)
    prev_mean: float | None = field(default=None, init=False)
    windows_in_stage: int = field(default=0, init=False)
    switch_steps: list[int] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.forward, self.backward = tuple(self.forward), tuple(self.backward)
        if len(self.forward) != len(self.backward) or not self.forward:
            raise ValueError("forward and backward stage lists must be non-empty and of equal length")
        _check_bits(*self.forward, *self.backward)
        if self.window < 1 or not self.threshold > 0 or not 0 < self.decay <= 1:
            raise ValueError("window must be >= 1, threshold > 0 and 0 < decay <= 1")
        self.current_threshold = float(self.threshold)

    def bits_at(self, step: int) -> Bits:
        return self.forward[self.stage], self.backward[self.stage]

    def observe(self, step: int, loss: float | None) -> None:
        if loss is None or not math.isfinite(loss):
            return
        self.window_sum += float(loss)
        self.window_count += 1
        if self.window_count < self.window:
            return
        mean = self.window_sum / self.window_count
        self.window_sum, self.window_count = 0.0, 0
        self.windows_in_stage += 1
        prev, self.prev_mean = self.prev_mean, mean
        if prev is None or self.stage == len(self.forward) - 1 or self.windows_in_stage <= self.min_windows:
            return
        indicator = abs(prev - mean) / max(abs(prev), 1e-12)
        if indicator < self.current_threshold:
            self.stage += 1
            self.current_threshold *= self.decay
            self.windows_in_stage = 0
            self.prev_mean = None  # the new precision's first window sets the reference again
            self.switch_steps.append(int(step))

    _STATE = ("stage", "current_threshold", "window_sum", "window_count", "prev_mean", "windows_in_stage", "switch_steps")

    def state_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self._STATE}
        d["switch_steps"] = list(self.switch_steps)
        return d

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k in self._STATE:
            setattr(self, k, list(state[k]) if k == "switch_steps" else state[k])
