"""FracTrain's Dynamic Fractional Quantization (DFQ) on the integer layers, and the combined FracTrain policy.

Fu et al., "FracTrain: Fractionally Squeezing Bit Savings Both Temporally and Spatially for Efficient DNN
Training", NeurIPS 2020, Sec. 3.2-3.3.  DFQ attaches a tiny gate to each layer (the SkipNet / "fractional
skipping" gates of the same authors): the gate reads the layer input and picks one of a few precisions;
the gates are trained jointly with the model under a computational-cost regulariser that pushes the
expected cost towards a target.  FracTrain combines it with PFQ (:class:`inttrain.schedules.PFQ`): PFQ's
temporal schedule raises the precision during training, DFQ decides below it.

What runs here (our design; the paper gives the idea, not these formulas):

- **gate**: per gated ``QLinear`` / ``QConv2d`` a float ``nn.Linear(C_in, K)`` on each sample's input
  averaged over its spatial positions (conv) or its other non-feature dims (Linear), detached from the
  backbone: ``K`` logits per sample, one per bit option ``b_1 < ... < b_K`` (default 4, 6, 8).
  Zero-initialised weights, biases favouring the highest option by ``init_logit`` (training starts near
  static 8-bit).
- **choice, per sample** (``per_sample=True``, the default): training draws a hard one-hot choice per sample
  with the straight-through Gumbel-softmax (``soft = softmax((logits + g) / tau)``, ``g`` Gumbel noise from a
  counter-based seed, a pure function of (seed, step, layer)); evaluation takes each sample's
  ``argmax(logits)``.  The layer gets ``sample_groups``: the batch rows grouped by chosen width, each with
  its :class:`~inttrain.spec.LayerPrecision` (forward-GEMM operands at that width via
  :func:`inttrain.schedules.with_bits`, gradient operands at ``grad_bits``, the backward GEMMs' weight and
  activation operands left at the layer's own bits, so the groups share one backward), and runs one integer GEMM /
  convolution per width present, forward and both backward GEMMs at that group's precision
  (:mod:`inttrain.nn.per_sample`; one width present: the plain single call).  Each sample's output row
  is passed on unchanged in value (factor ``1 + soft_n - stopgrad(soft_n)`` = 1.0), which sends the
  task-loss gradient ``<dL/dy_n, y_n>`` to that sample's gate output.
- **cost regulariser**: with ``MAC_l`` the layer's forward MACs and ``p_ln = softmax(logits_ln)`` (sample
  ``n``'s probabilities), the expected forward BitOPs relative to static 8-bit is
  ``E = sum_l MAC_l mean_n sum_k p_lnk b_k^2 / (64 sum_l MAC_l)`` (the expected cost is the mean over the
  samples); the objective gets ``cost_weight * (E - target_cost)^2``.  The term is added to the autograd
  graph at the model output (a function that returns the output unchanged and sends gradient 1 to the
  term), so any training loop that calls ``loss.backward()`` trains the gates with it, and the logged loss
  stays the task loss.  :class:`inttrain.cost.BitOpsCounter` counts each width's rows at their own bits.
- **distribution**: :meth:`DFQController.bit_distribution` gives, per layer, the share of the last training
  batch's samples at each width (``inttrain train`` logs it as ``dfq_bits`` in metrics.jsonl;
  ``inttrain plot`` draws it).

**Batch-level mode** (``per_sample=False``): one choice per layer per batch from features pooled over the
whole batch; the layer runs as one call.  With batches drawn from one distribution the pooled features vary
little, so it mostly learns a per-layer precision.

**Combined FracTrain policy**: pass a schedule (e.g. :class:`~inttrain.schedules.PFQ`) as ``cap``: its
forward bits at the current step cap every option (``min(b_k, cap)``), its gradient bits are used for the
backward GEMMs, and it is stepped with the loss like a :class:`~inttrain.schedules.PrecisionScheduler`.

Cost: the gate is a float Linear on pooled vectors (``C_in x K`` MACs per layer per sample), not counted in
BitOPs.  As everywhere on this CPU, fewer bits than 8 do not run faster (they use the int8 kernels); the
saving is the BitOPs measured by :class:`inttrain.cost.BitOpsCounter`.  Per-sample choices cost extra
kernel calls (one per width present, each paying the integer path's per-call overhead) and one gather and
one scatter of the layer's rows: see ``benchmarks/dfq_overhead.py`` and docs/precision.md.

>>> import torch, inttrain
>>> m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
>>> _ = inttrain.prepare_(m, "int8")
>>> dfq = attach_dfq(m, DFQConfig(bits=(4, 6, 8), target_cost=0.5))
>>> m(torch.randn(8, 16)).sum().backward()   # gates choose bits, regulariser in the graph
>>> bits, grad_bits = dfq.step(1.0)   # mean forward bits of the last batch, gradient bits
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from inttrain.numerics.hashing import SeedPurpose, derive_seed
from inttrain.schedules import Schedule, prepared_layers, with_bits

__all__ = ["DFQConfig", "BitGate", "DFQController", "attach_dfq", "forward_cost_ratio"]


def _bits_ok(b: Any) -> bool:
    return isinstance(b, int) and not isinstance(b, bool) and 2 <= b <= 8


@dataclass(frozen=True)
class DFQConfig:
    """Options of DFQ (see the module docstring).

    ``bits``: the gate's bit options (2..8, distinct; sorted ascending).  ``target_cost``: target expected
    forward BitOPs relative to static 8-bit, in ``[min(bits)^2 / 64, 1]``.  ``cost_weight``: weight of the
    squared cost regulariser (0: gates learn from the task loss only).  ``tau``: Gumbel-softmax temperature.
    ``grad_bits``: bits of the output-gradient operand of the backward GEMMs (without a ``cap`` schedule).
    ``init_logit``: initial bias of the highest option over the others.  ``seed``: of the Gumbel noise.
    ``per_sample``: each sample's gate picks its own bits (FracTrain's DFQ); False: one choice per batch.
    """

    bits: Sequence[int] = (4, 6, 8)
    target_cost: float = 0.5
    cost_weight: float = 5.0
    tau: float = 1.0
    grad_bits: int = 8
    init_logit: float = 2.0
    seed: int = 0
    per_sample: bool = True

    def __post_init__(self) -> None:
        bits = tuple(self.bits)
        if len(bits) < 2 or not all(_bits_ok(b) for b in bits) or len(set(bits)) != len(bits):
            raise ValueError(f"DFQ bits must be at least two distinct ints in [2, 8], got {self.bits!r}")
        object.__setattr__(self, "bits", tuple(sorted(bits)))
        low = min(bits) ** 2 / 64
        if not (isinstance(self.target_cost, (int, float)) and low <= self.target_cost <= 1):
            raise ValueError(f"DFQ target_cost must be in [{low:.4f}, 1] for bits {self.bits} "
                             f"(min(bits)^2/64 .. static 8-bit), got {self.target_cost!r}")
        if not (math.isfinite(self.cost_weight) and self.cost_weight >= 0):
            raise ValueError(f"DFQ cost_weight must be a finite number >= 0, got {self.cost_weight!r}")
        if not (math.isfinite(self.tau) and self.tau > 0):
            raise ValueError(f"DFQ tau must be > 0, got {self.tau!r}")
        if not (isinstance(self.grad_bits, int) and not isinstance(self.grad_bits, bool) and 2 <= self.grad_bits <= 16):
            raise ValueError(f"DFQ grad_bits must be an int in [2, 16], got {self.grad_bits!r}")
        if not math.isfinite(self.init_logit):
            raise ValueError(f"DFQ init_logit must be finite, got {self.init_logit!r}")
        if not isinstance(self.per_sample, bool):
            raise ValueError(f"DFQ per_sample must be true or false, got {self.per_sample!r}")


class BitGate(nn.Module):
    """``logits = W pool(x) + b`` over the ``K`` bit options (float; weights start at zero)."""

    def __init__(self, in_features: int, options: int, init_logit: float) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, options)
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.bias.zero_()
            self.fc.bias[-1] = init_logit

    @staticmethod
    def pool(x: torch.Tensor, per_sample: bool = False) -> torch.Tensor:
        """Features: the mean over every dim but the channel one (dim 1 of NCHW, last of Linear), and the batch
        dim too unless ``per_sample`` (then ``[N, C]``, one row per sample)."""
        x = x.detach().float()
        if per_sample:
            if x.ndim == 4:
                return x.mean(dim=(2, 3))
            return x.reshape(x.shape[0], -1, x.shape[-1]).mean(1)
        if x.ndim == 4:
            return x.mean(dim=(0, 2, 3))
        return x.reshape(-1, x.shape[-1]).mean(0)

    def forward(self, x: torch.Tensor, per_sample: bool = False) -> torch.Tensor:
        """Logits ``[K]`` (batch-level) or ``[N, K]`` (``per_sample``)."""
        return self.fc(self.pool(x, per_sample))


class _AddToLoss(torch.autograd.Function):
    """Returns ``out`` unchanged; in backward sends gradient 1 to ``term``: the graph computes
    ``d(loss + term)`` wherever ``loss`` depends on ``out``."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, torch.ones((), dtype=torch.float32, device=grad.device)


def _row_dots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``<a_n, b_n>`` per row of the batch dim, in float32.  Same layout, contiguous or channels-last: one
    batched matrix product over the memory order (no elementwise temporary); otherwise multiply and sum."""
    a, b = a.float(), b.float()
    cl = a.dim() == 4 and a.is_contiguous(memory_format=torch.channels_last)
    if a.stride() == b.stride() and (a.is_contiguous() or cl):
        rows = (lambda t: t.permute(0, 2, 3, 1).reshape(t.shape[0], 1, -1)) if cl and not a.is_contiguous() else (
            lambda t: t.reshape(t.shape[0], 1, -1))
        return torch.bmm(rows(a), rows(b).transpose(1, 2)).reshape(-1)
    return (a * b).sum(dim=tuple(range(1, a.ndim)))


class _StraightThrough(torch.autograd.Function):
    """``out * (1 + soft - stopgrad(soft))`` without the multiplies: returns ``out``'s values (the factor is
    exactly 1.0) and sends ``soft`` the gradient ``<dL/dout, out>`` (per sample when ``soft`` is ``[N]``: summed over each
    sample's row of the batch dim)."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(out)
        ctx.per_sample = soft.ndim == 1
        # A copy, not a view: a view made in a Function may not be modified in place (ReLU(inplace=True) next).
        return out.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (out,) = ctx.saved_tensors
        return grad, _row_dots(grad, out) if ctx.per_sample else _row_dots(grad, out).sum()


def _macs(layer: nn.Module, out: torch.Tensor) -> int:
    if isinstance(layer, nn.Conv2d):
        kh, kw = layer.kernel_size
        return int(out.numel() * (layer.in_channels // layer.groups) * kh * kw)
    return int(out.numel() * layer.in_features)


def forward_cost_ratio(counter: Any) -> float:
    """Measured forward-GEMM BitOPs of a :class:`inttrain.cost.BitOpsCounter` relative to static 8-bit."""
    ref = counter.total("int8_bitops", gemm="forward")
    return counter.total("bitops", gemm="forward") / ref if ref else float("nan")


class DFQController:
    """Gates on the prepared layers of ``model`` (see :func:`attach_dfq`); the scheduler of a DFQ run.

    Interface of :class:`~inttrain.schedules.PrecisionScheduler`: :meth:`step` after every training step,
    :attr:`bits`, :meth:`state_dict` / :meth:`load_state_dict` (gate weights live in the model's
    ``state_dict``, under ``<layer>.dfq_gate``).
    """

    def __init__(self, model: nn.Module, config: DFQConfig, cap: Schedule | None = None,
                 include: Callable[[str, Any], bool] | None = None) -> None:
        self.model, self.config, self.cap = model, config, cap
        self.layers = [(n, m) for n, m in prepared_layers(model) if include is None or include(n, m)]
        if not self.layers:
            raise ValueError("DFQ needs a model with prepared integer layers (inttrain.prepare_ with an integer recipe)")
        self.last_step = 0
        self.expected_cost = float("nan")  # E of the last training forward (no grad)
        self.last_bits: dict[str, float] = {}  # forward bits each layer chose in the last training forward (mean
        self.last_counts: dict[str, dict[int, int]] = {}  # over the samples when per sample) and how many each
        self._base = {n: m.precision for n, m in self.layers}
        self._cache: dict[tuple[str, int, int], Any] = {}
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor | None, int]] = {}
        self._terms: list[tuple[int, torch.Tensor]] = []
        self._macs: dict[str, int] = {}
        self._handles: list[Any] = []
        k = len(config.bits)
        for i, (name, m) in enumerate(self.layers):
            c_in = m.in_channels if isinstance(m, nn.Conv2d) else m.in_features
            if not isinstance(getattr(m, "dfq_gate", None), BitGate):
                m.dfq_gate = BitGate(c_in, k, config.init_logit)
            for b in config.bits:
                self._precision(name, m, b, self._grad_bits())  # validate the widths up front
            self._handles.append(m.register_forward_pre_hook(self._pre_hook(i, name)))
            self._handles.append(m.register_forward_hook(self._post_hook(name)))
        self._handles.append(model.register_forward_hook(self._model_hook))
        self._set_all(self._effective()[-1])

    # ------------------------------------------------------------------ bits
    def _grad_bits(self) -> int:
        return self.config.grad_bits if self.cap is None else self.cap.bits_at(self.last_step)[1]

    def _effective(self) -> tuple[int, ...]:
        """The bit options at the current step (capped by the temporal schedule)."""
        if self.cap is None:
            return tuple(self.config.bits)
        cap = self.cap.bits_at(self.last_step)[0]
        return tuple(min(b, cap) for b in self.config.bits)

    def _precision(self, name: str, m: nn.Module, fwd: int, grad: int) -> Any:
        key = (name, fwd, grad)
        p = self._cache.get(key)
        if p is None:
            p = with_bits(self._base[name], fwd, grad, backward_operands=False)  # one backward per batch
            validate = getattr(type(m), "_validate", None)
            if validate is not None:
                validate(m, p)
            self._cache[key] = p
        return p

    def _set_all(self, fwd: int) -> None:
        grad = self._grad_bits()
        for name, m in self.layers:
            m.precision = self._precision(name, m, fwd, grad)

    @property
    def bits(self) -> tuple[float, int]:
        """(MAC-weighted mean forward bits of the last training forward, gradient bits) — what metrics log."""
        grad = self._grad_bits()
        if not self.last_bits:
            return float(self._effective()[-1]), grad
        w = {n: self._macs.get(n, 1) for n in self.last_bits}
        mean = sum(w[n] * b for n, b in self.last_bits.items()) / sum(w.values())
        return round(mean, 3), grad

    # ------------------------------------------------------------------ hooks
    def _choose(self, index: int, logits: torch.Tensor, training: bool) -> tuple[torch.Tensor, Any, Any]:
        """(chosen option index per row of ``logits`` [..., K], probabilities or None, the chosen options' soft
        values (for the straight-through factor) or None).  Training: hard straight-through Gumbel-softmax with noise a pure function of (seed, step, layer)."""
        if not training:
            return logits.argmax(-1), None, None
        seed = derive_seed(self.config.seed, SeedPurpose.GATE_NOISE, self.last_step, index)
        gen = torch.Generator().manual_seed(seed)
        u = torch.rand(logits.shape, generator=gen).clamp_(1e-10, 1 - 1e-7).to(logits.device)
        soft = torch.softmax((logits - torch.log(-torch.log(u))) / self.config.tau, dim=-1)
        k = soft.argmax(-1)
        picked = soft.gather(-1, k.unsqueeze(-1)).squeeze(-1)
        return k, torch.softmax(logits, dim=-1), picked

    def _pre_hook(self, index: int, name: str) -> Callable[..., None]:
        def hook(m: nn.Module, args: tuple) -> None:
            per_sample = self.config.per_sample
            logits = m.dfq_gate(args[0], per_sample)
            options = self._effective()
            training = m.training and torch.is_grad_enabled()
            k, probs, scale = self._choose(index, logits, training)
            grad = self._grad_bits()
            if not per_sample:
                bits = options[int(k)]
                m.precision = self._precision(name, m, bits, grad)
                self._pending[id(m)] = (probs, scale, {bits: 1})
                return
            chosen = torch.tensor(options, device=k.device)[k]  # [N]: capped options may coincide
            widths = torch.unique(chosen).tolist()  # ascending
            counts: dict[int, int] = {}
            groups = []
            for b in widths:
                rows = (chosen == b).nonzero().squeeze(1)
                counts[int(b)] = int(rows.numel())
                groups.append((rows, self._precision(name, m, int(b), grad)))
            m.precision = groups[-1][1]  # the widest width present (what a reader of .precision sees)
            # One width: the plain layer call (bit-identical to a batch-level choice of that width).
            m.sample_groups = groups if len(groups) > 1 else None
            self._pending[id(m)] = (probs, scale, counts)

        return hook

    def _post_hook(self, name: str) -> Callable[..., Any]:
        def hook(m: nn.Module, args: tuple, out: torch.Tensor) -> Any:
            probs, scale, counts = self._pending.pop(id(m), (None, None, {}))
            if probs is None:
                return None
            macs = _macs(m, out)
            self._macs[name] = macs
            n = sum(counts.values())
            self.last_bits[name] = sum(b * c for b, c in counts.items()) / n
            self.last_counts[name] = dict(counts)
            self._terms.append((macs, probs))
            if type(out) is torch.Tensor:
                return _StraightThrough.apply(out, scale)
            factor = 1 + (scale - scale.detach())  # an int8 (dataflow) output: the plain multiply by 1.0
            return out * (factor.reshape(-1, *([1] * (out.ndim - 1))) if factor.ndim else factor)

        return hook

    def _model_hook(self, model: nn.Module, args: tuple, out: Any) -> Any:
        terms, self._terms = self._terms, []
        if not terms or not isinstance(out, torch.Tensor):
            return None
        cost = torch.tensor([b * b / 64 for b in self._effective()], dtype=torch.float32)
        total = sum(macs for macs, _ in terms)
        # Per sample: a layer's expected cost is the mean over the samples of each sample's expected cost.
        expected = sum(macs * (p * cost.to(p.device)).sum(-1).mean() for macs, p in terms) / total
        self.expected_cost = float(expected.detach())
        term = self.config.cost_weight * (expected - self.config.target_cost) ** 2
        return _AddToLoss.apply(out, term)

    def bit_distribution(self) -> dict[str, dict[int, float]]:
        """Per layer, the fraction of the last training batch's samples that ran at each forward width."""
        out = {}
        for name, counts in self.last_counts.items():
            n = sum(counts.values())
            out[name] = {b: round(c / n, 6) for b, c in sorted(counts.items())}
        return out

    # ------------------------------------------------------------------ schedule interface
    def apply_eval_bits(self) -> None:
        """Nothing to apply: the gates pick each sample's width at evaluation too."""

    @contextmanager
    def evaluation(self) -> Iterator[None]:
        """Validation as in training: the gates pick each sample's width at evaluation too."""
        yield

    def step(self, loss: float | None = None) -> tuple[float, int]:
        """Finish step ``last_step`` (shows its loss to the ``cap`` schedule) and move to the next."""
        if self.cap is not None:
            self.cap.observe(self.last_step, loss)
        self.last_step += 1
        return self.bits

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step, "expected_cost": self.expected_cost, "last_bits": dict(self.last_bits),
                "last_counts": {n: dict(c) for n, c in self.last_counts.items()},
                "macs": dict(self._macs), "schedule": {} if self.cap is None else self.cap.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_step = int(state["last_step"])
        self.expected_cost = float(state.get("expected_cost", float("nan")))
        self.last_bits = {str(k): float(v) for k, v in dict(state.get("last_bits", {})).items()}
        self.last_counts = {str(n): {int(b): int(c) for b, c in dict(cs).items()}
                            for n, cs in dict(state.get("last_counts", {})).items()}
        self._macs = {str(k): int(v) for k, v in dict(state.get("macs", {})).items()}
        if self.cap is not None:
            self.cap.load_state_dict(dict(state.get("schedule", {})))

    def detach(self) -> None:
        """Remove the hooks (the gates stay in the model; the layers keep their last precision)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for _, m in self.layers:
            m.sample_groups = None


def attach_dfq(model: nn.Module, config: DFQConfig | None = None, cap: Schedule | None = None,
               include: Callable[[str, Any], bool] | None = None) -> DFQController:
    """Add a :class:`BitGate` (``<layer>.dfq_gate``) to every prepared layer of ``model`` (``include(name,
    module)`` filters) and return the controller.  Call before building the optimizer, so it holds the gate
    parameters.  ``cap``: a temporal schedule (e.g. ``PFQ()``) giving the maximum bits: FracTrain = PFQ + DFQ.
    """
    return DFQController(model, config or DFQConfig(), cap, include)
