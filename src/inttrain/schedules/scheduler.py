"""Apply a :class:`~inttrain.schedules.Schedule` to the integer layers of a model, step by step.

Pure Python (no torch import): the model is walked with ``model.named_modules()`` and every module
with a :class:`~inttrain.spec.LayerPrecision` ``precision`` attribute (``QLinear``, ``QConv2d``) gets a new
precision built with :func:`dataclasses.replace`.  Only integer GEMMs are touched; float GEMMs
(``integer=False``) stay float.

As with the CPU kernels in general: bits 2..8 all run on int8 kernels here, so lower bits are not faster
on this CPU; BitOPs (:mod:`inttrain.cost`) is the hardware-independent measure of what they save.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from inttrain.spec import GemmPrecision, LayerPrecision, QuantSpec

from .schedules import Schedule

__all__ = ["PrecisionScheduler", "with_bits", "set_model_bits", "prepared_layers", "model_bits"]


def _spec(spec: QuantSpec, bits: int) -> QuantSpec:
    return spec if spec.bits == bits else dataclasses.replace(spec, fmt=dataclasses.replace(spec.fmt, bits=bits))


def with_bits(p: LayerPrecision, forward_bits: int, grad_bits: int, *,
              backward_operands: bool = True) -> LayerPrecision:
    """``p`` with the weights and activations at ``forward_bits`` wherever a GEMM reads them -- both operands of
    the forward GEMM and the other operand (rhs) of each backward GEMM (``dx = dy W``, ``dW = dy^T x``) -- and the
    output gradient (the backward GEMMs' lhs) at ``grad_bits``; float GEMMs are unchanged.

    That is the papers' "FW / BW" precision (CPT, Fu et al. 2021; FracTrain, Fu et al. 2020; after Banner et al.
    2018): the backward GEMMs multiply the gradient by the forward's quantized weights and activations, so their
    cost is ``grad_bits x forward_bits`` (an earlier version kept those operands at 8 bits, which the papers'
    BitOPs do not count).  ``backward_operands=False`` leaves the backward GEMMs' rhs as they are in ``p``: DFQ's
    per-sample widths set the forward only, so that the samples of one batch share one backward
    (:mod:`inttrain.recipes.fractrain_dfq`)."""

    def fwd(g: GemmPrecision) -> GemmPrecision:
        return dataclasses.replace(g, lhs=_spec(g.lhs, forward_bits), rhs=_spec(g.rhs, forward_bits)) if g.integer else g

    def bwd(g: GemmPrecision) -> GemmPrecision:
        if not g.integer:
            return g
        return dataclasses.replace(g, lhs=_spec(g.lhs, grad_bits),
                                   rhs=_spec(g.rhs, forward_bits) if backward_operands else g.rhs)

    return dataclasses.replace(p, forward=fwd(p.forward), grad_input=bwd(p.grad_input), grad_weight=bwd(p.grad_weight))


def prepared_layers(model: Any) -> list[tuple[str, Any]]:
    """``(name, module)`` of every module carrying a ``LayerPrecision`` (the prepared integer layers)."""
    return [(n, m) for n, m in model.named_modules() if isinstance(getattr(m, "precision", None), LayerPrecision)]


def set_model_bits(model: Any, forward_bits: int, grad_bits: int,
                   include: Callable[[str, Any], bool] | None = None) -> int:
    """Set the bits of every prepared layer (``include(name, module)`` filters); returns how many changed.

    A layer's own check (``_validate``, e.g. a per-channel activation scale on a ``QConv2d``) runs before assignment and
    raises ``ValueError`` for unsupported widths.
    """
    changed = 0
    for name, m in prepared_layers(model):
        if include is not None and not include(name, m):
            continue
        new = with_bits(m.precision, forward_bits, grad_bits)
        if new != m.precision:
            validate = getattr(type(m), "_validate", None)
            if validate is not None:
                validate(m, new)
            m.precision = new
            changed += 1
    return changed


class PrecisionScheduler:
    """Like a torch LR scheduler, for bit widths: construction applies the bits of step 0; call
    :meth:`step` once after every training step (with that step's loss; ``None`` for a skipped step) to
    move to the next step's bits.  ``state_dict()`` / ``load_state_dict()`` make resumes exact (loading
    re-applies the restored step's bits to the model).

    ``include(name, module)`` limits which prepared layers are scheduled (e.g. keep the first and last
    layer at 8 bits).
    """

    def __init__(self, model: Any, schedule: Schedule, include: Callable[[str, Any], bool] | None = None) -> None:
        self.model, self.schedule, self.include = model, schedule, include
        self.last_step = 0  # index of the step whose bits are applied now
        self._apply()

    @property
    def bits(self) -> tuple[int, int]:
        """(forward, grad) bits in force now."""
        return self.schedule.bits_at(self.last_step)

    def _apply(self) -> None:
        set_model_bits(self.model, *self.bits, include=self.include)

    def apply_eval_bits(self) -> tuple[int, int]:
        """Put the model at the schedule's evaluation bits (:meth:`Schedule.eval_bits`) until the next
        :meth:`step`: what a trained model is validated and deployed at."""
        bits = self.schedule.eval_bits(self.last_step)
        set_model_bits(self.model, *bits, include=self.include)
        return bits

    @contextmanager
    def evaluation(self) -> Iterator[tuple[int, int]]:
        """Within: the model at the schedule's evaluation bits (:meth:`apply_eval_bits`); after: the current
        step's bits again."""
        bits = self.apply_eval_bits()
        try:
            yield bits
        finally:
            self._apply()

    def step(self, loss: float | None = None) -> tuple[int, int]:
        """Finish step ``last_step`` (showing its loss to stateful schedules) and apply the next one's bits."""
        self.schedule.observe(self.last_step, loss)
        self.last_step += 1
        self._apply()
        return self.bits

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step, "schedule": self.schedule.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_step = int(state["last_step"])
        self.schedule.load_state_dict(dict(state.get("schedule", {})))
        self._apply()


def model_bits(model: Any) -> tuple[int, int] | None:
    """(forward, grad) bits of the first prepared layer's integer GEMMs (None: no prepared layer)."""
    layers = prepared_layers(model)
    if not layers:
        return None
    p = layers[0][1].precision
    fwd = p.forward.lhs.bits if p.forward.integer else 32
    grad = p.grad_input.lhs.bits if p.grad_input.integer else (p.grad_weight.lhs.bits if p.grad_weight.integer else 32)
    return fwd, grad
