"""``unified-int8``: Zhu et al., "Towards Unified INT8 Training for Convolutional Neural Network", CVPR 2020.

All three GEMMs of every converted Linear/Conv2d run as int8 x int8 -> int32 products on integer
kernels (weights per output channel, activations as in the ``int8`` recipe, output gradients one scale
per tensor), plus the paper's two gradient techniques:

- **Direction-Sensitive Gradient Clipping** (Sec. 4.1, Eq. 7-8).  The direction deviation of a
  quantized gradient is ``d = 1 - cos(g, q_c(g))`` where ``q_c`` clips to ``[-c, c]`` and quantizes with
  scale ``c / 127``.  Per layer, every ``search_every`` backward passes (the paper's periodic update, k),
  the output gradient ``g`` of that step is searched over the clip values ``c = r * max|g|`` for ``r`` in
  ``clip_ratios`` (a grid search where the paper uses a 1-D line search); the best ``c`` is kept and
  ``g`` is clamped to ``[-r max|g|, r max|g|]`` with the chosen ratio ``r`` (re-applied to each step's
  amax) before it is quantized for the ``dx`` and ``dW`` GEMMs until the next search.  The cost is recorded per layer (``layer.hooks.searches``, ``.search_seconds``;
  :func:`search_cost` sums them): one clamp + quantize + dot product per candidate ratio.
- **Deviation Counteractive Learning Rate scaling** (Sec. 4.2, Eq. 10): each layer's learning rate is
  multiplied by ``lr_scale = max(exp(-alpha d), beta)`` (alpha 20, beta 0.1 as in the paper), with ``d``
  the deviation measured at the layer's last search.  Build the optimizer from
  :func:`dclr_param_groups` and call :meth:`DeviationCounteractiveLR.step` before every
  ``optimizer.step()`` (``inttrain.trainer.train`` and ``inttrain train --recipe unified-int8`` do this;
  ``--no-dclr`` turns it off).  The DSGC state (:meth:`DSGCState.state_dict`) goes into the trainer's
  checkpoints, so a resumed run clips, searches and scales the LR exactly as an uninterrupted one.

What is integer arithmetic: the three GEMM products.  The clip search, the clamp, the cosine and the
LR scaling are float32 bookkeeping outside the GEMMs.

Differences from the paper: grid search over a fixed ratio grid instead of the paper's search; what is
kept between searches is the clip *ratio* of the amax, not an absolute clip value (an absolute value
gone stale clipped growing gradients and cost ~2 points on the digits MLP); clipping is per tensor;
``d`` for the LR scale is the one measured at the last search (not recomputed every step); the paper
quantizes activations/weights per tensor, here weights are per channel as in the ``int8`` recipe.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import torch
from torch import nn

from ..spec import LayerPrecision, PerTensor, Rounding, UnsupportedFormatError
from ..spec.formats import MIN_BITS, IntFormat
from ..optim import DEFAULT_MOMENTUM, build_optimizer
from .base import BASE_LR_KEY, LayerHooks, RecipeConfig
from .int8_mixed import Int8MixedConfig

__all__ = [
    "UnifiedInt8Config",
    "DSGCState",
    "direction_deviation",
    "clip_quantize",
    "deviation_lr_scale",
    "dclr_param_groups",
    "DeviationCounteractiveLR",
    "search_cost",
]

DEFAULT_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03)


def clip_quantize(g: torch.Tensor, c: float, bits: int = 8) -> torch.Tensor:
    """``q_c(g)``: clamp to ``[-c, c]``, round to nearest on the grid ``c / qmax``, dequantize."""
    qmax = IntFormat(bits).qmax
    s = c / qmax
    return torch.round(g.clamp(-c, c) / s).clamp(-qmax, qmax) * s


def direction_deviation(g: torch.Tensor, q: torch.Tensor) -> float:
    """``d = 1 - cos(g, q)`` (Eq. 7)."""
    g, q = g.flatten().double(), q.flatten().double()
    denom = float(g.norm() * q.norm())
    return 1.0 if denom == 0.0 else 1.0 - float(g @ q) / denom


def deviation_lr_scale(d: float, alpha: float = 20.0, beta: float = 0.1) -> float:
    """Eq. 10: ``max(exp(-alpha d), beta)``."""
    return max(math.exp(-alpha * d), beta)


class DSGCState(LayerHooks):
    """Per-layer DSGC state: the current clip value, the last deviation and the search cost."""

    def __init__(self, bits: int = 8, ratios: tuple[float, ...] = DEFAULT_RATIOS, every: int = 100):
        self.bits, self.ratios, self.every = bits, tuple(ratios), int(every)
        self.clip: float | None = None
        self.ratio: float = 1.0
        self.deviation = 0.0
        self.unclipped_deviation = 0.0
        self.steps = self.searches = 0
        self.search_seconds = 0.0

    def search(self, g: torch.Tensor) -> float:
        """Set ``clip`` to the candidate ``r * max|g|`` of least deviation; returns it."""
        t0 = time.perf_counter()
        g = g.detach().float().flatten()
        m = float(g.abs().max())
        best = (math.inf, 1.0)
        for r in self.ratios:
            d = direction_deviation(g, clip_quantize(g, r * m, self.bits))
            if r == 1.0:
                self.unclipped_deviation = d
            best = min(best, (d, r))
        self.deviation, self.ratio = best
        self.clip = self.ratio * m
        self.searches += 1
        self.search_seconds += time.perf_counter() - t0
        return self.clip

    def grad_output(self, dy: torch.Tensor, seed: int) -> torch.Tensor:
        m = dy.abs().amax()
        if not torch.isfinite(m) or m == 0:
            return dy  # NaN/inf reach the layer's guard (the step is skipped); zeros need no clip
        if self.steps % self.every == 0:
            self.search(dy)
        self.steps += 1
        if self.ratio >= 1.0:
            return dy
        self.clip = self.ratio * float(m)  # the searched ratio applied to this step's amax
        return dy.clamp(-self.clip, self.clip)

    def state_dict(self) -> dict[str, float | int | None]:
        """What a resumed run needs to clip, search and scale the LR exactly as an uninterrupted one would."""
        return {"clip": self.clip, "ratio": self.ratio, "deviation": self.deviation,
                "unclipped_deviation": self.unclipped_deviation, "steps": self.steps, "searches": self.searches,
                "search_seconds": self.search_seconds}

    def load_state_dict(self, state: dict[str, float | int | None]) -> None:
        self.clip = None if state["clip"] is None else float(state["clip"])
        self.ratio, self.deviation = float(state["ratio"]), float(state["deviation"])
        self.unclipped_deviation = float(state["unclipped_deviation"])
        self.steps, self.searches = int(state["steps"]), int(state["searches"])
        self.search_seconds = float(state["search_seconds"])


def search_cost(model: nn.Module) -> dict[str, float]:
    """Total DSGC searches and seconds spent in them over ``model``'s layers."""
    states = [m.hooks for m in model.modules() if isinstance(getattr(m, "hooks", None), DSGCState)]
    return {"layers": len(states), "searches": sum(s.searches for s in states),
            "seconds": sum(s.search_seconds for s in states)}


def dclr_param_groups(model: nn.Module, **group_options) -> list[dict]:
    """Parameter groups for any torch optimizer: one per DSGC layer (tagged with its state), one for the rest."""
    groups, seen = [], set()
    for module in model.modules():
        state = getattr(module, "hooks", None)
        if isinstance(state, DSGCState):
            params = [p for p in module.parameters(recurse=False) if p.requires_grad]
            seen.update(id(p) for p in params)
            groups.append({"params": params, "dsgc": state, **group_options})
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in seen]
    if rest:
        groups.append({"params": rest, **group_options})
    return groups


class DeviationCounteractiveLR:
    """Sets each DSGC group's ``lr`` to ``base_lr * max(exp(-alpha d), beta)``; call ``step()`` before ``optimizer.step()``.

    ``base_lr`` is the group's lr when this object is built (stored in the group as ``dclr_base_lr``;
    a schedule that changes the base should write that key).  The groups' ``dsgc`` entries are moved into
    this object, so ``optimizer.state_dict()`` holds plain numbers only (checkpoints load with
    ``weights_only=True``; the layer states are saved with the model's layers, see
    :meth:`DSGCState.state_dict`).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, alpha: float = 20.0, beta: float = 0.1):
        self.optimizer, self.alpha, self.beta = optimizer, alpha, beta
        self.states: list[DSGCState | None] = [group.pop("dsgc", None) for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group.setdefault(BASE_LR_KEY, group["lr"])

    def step(self) -> None:
        for group, state in zip(self.optimizer.param_groups, self.states):
            if state is not None:
                group["lr"] = group[BASE_LR_KEY] * deviation_lr_scale(state.deviation, self.alpha, self.beta)


@dataclass(frozen=True)
class UnifiedInt8Config(RecipeConfig):
    """Config of the ``unified-int8`` recipe.

    Args:
        bits: code width of all GEMM operands (the paper: 8; 2..8 allowed, the conv kernels' range).
        clip_ratios: candidate clip values as fractions of the gradient's amax, each in (0, 1].
        search_every: recompute each layer's clip every this many backward passes (the paper's k).
        alpha, beta: the DCLR constants of Eq. 10 (used by :class:`DeviationCounteractiveLR`).
        grad_rounding: rounding of the output-gradient codes (stochastic: unbiased; per-tensor gradient
            scales with round-to-nearest measured ~1-2 points lower on the digits MLP).
    """

    name = "unified-int8"
    facts = ("Zhu et al., Towards Unified INT8 Training for Convolutional Neural Network, CVPR 2020",
             "the three GEMMs (int8 x int8 -> int32)",
             "direction-sensitive gradient clipping search, deviation-counteractive LR scaling, master weights")
    bits: int = 8
    clip_ratios: tuple[float, ...] = DEFAULT_RATIOS
    search_every: int = 100
    alpha: float = 20.0
    beta: float = 0.1
    grad_rounding: Rounding = Rounding.STOCHASTIC

    def __post_init__(self) -> None:
        if not isinstance(self.bits, int) or not MIN_BITS <= self.bits <= 8:
            raise UnsupportedFormatError(f"unified-int8 bits={self.bits!r}: allowed {MIN_BITS} to 8")
        if not self.clip_ratios or not all(0 < r <= 1 for r in self.clip_ratios):
            raise ValueError(f"unified-int8 clip_ratios={self.clip_ratios!r}: allowed a non-empty tuple of values in (0, 1]")
        if not isinstance(self.search_every, int) or self.search_every < 1:
            raise ValueError(f"unified-int8 search_every={self.search_every!r}: allowed an int >= 1")
        if self.alpha < 0 or not 0 < self.beta <= 1:
            raise ValueError(f"unified-int8 alpha={self.alpha}, beta={self.beta}: allowed alpha >= 0, 0 < beta <= 1")

    def precision_for(self, module: nn.Module, fqn: str) -> LayerPrecision | None:
        base = Int8MixedConfig(bits=self.bits, grad_rounding=self.grad_rounding,
                               weight_grad_rounding=None).precision_for(module, fqn)  # its own rounding for all
        per_tensor = lambda gemm: dataclasses.replace(gemm, lhs=dataclasses.replace(gemm.lhs, granularity=PerTensor()))  # noqa: E731
        return dataclasses.replace(base, grad_input=per_tensor(base.grad_input), grad_weight=per_tensor(base.grad_weight))

    def hooks_for(self, module: nn.Module, fqn: str) -> DSGCState:
        return DSGCState(self.bits, self.clip_ratios, self.search_every)

    def compiles(self) -> bool:
        return False  # DSGC branches on each gradient's amax and searches in Python (per-layer graph breaks)

    def optimizer_for(self, model: nn.Module, optimizer: str = "sgd", lr: float = 0.05, *,
                      momentum: float = DEFAULT_MOMENTUM, weight_decay: float = 0.0, nesterov: bool = False,
                      lr_scaling: bool = True) -> torch.optim.Optimizer:
        """DCLR's parameter groups (one per DSGC layer, the unscaled rest first) unless ``lr_scaling=False``."""
        options = dict(momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
        groups = dclr_param_groups(model) if lr_scaling else []
        groups.sort(key=lambda g: "dsgc" in g)  # the unscaled rest first (stable: layer order kept)
        if not any("dsgc" in g for g in groups):
            return build_optimizer(optimizer, model.parameters(), lr, **options)
        return build_optimizer(optimizer, groups, lr, **options)

    def step_hook(self, optimizer: torch.optim.Optimizer):
        """DCLR (Eq. 10) for an optimizer with DSGC groups (from :meth:`optimizer_for`); else nothing."""
        if not any("dsgc" in g for g in optimizer.param_groups):
            return super().step_hook(optimizer)
        return DeviationCounteractiveLR(optimizer, self.alpha, self.beta).step

    def report(self, model: nn.Module) -> dict[str, float]:
        """The DSGC search cost (:func:`search_cost`)."""
        return {f"dsgc_{k}": v for k, v in search_cost(model).items()}
