"""BitOPs, energy and saved-activation memory of the integer layers, measured from actual shapes at run time.

A GEMM (or convolution) with ``MACs`` multiply-accumulates on ``a``-bit x ``b``-bit operands costs
``BitOPs = MACs * a * b``: the hardware-independent cost measure of the low-precision training papers
(CPT, Fu et al. ICLR 2021; FracTrain, Fu et al. NeurIPS 2020).  On this CPU, 2..8-bit operands all run
on int8 kernels, so fewer bits are *not* faster than 8 here; BitOPs is what fewer bits would save on
hardware whose multipliers scale with operand width.

:class:`BitOpsCounter` hooks every ``QLinear`` / ``QConv2d`` (forward hooks; the backward GEMMs through a
gradient hook on the layer output) and accumulates, per layer and per GEMM (``forward``, ``grad_input``,
``grad_weight``), the MACs and BitOPs of every call, with the bits of the layer's precision at the time of
the forward; a layer run per sample (``sample_groups``, per-sample DFQ) counts each width's rows at their own
bits (expected cost = mean over the samples).  The input-gradient GEMM is counted only when the layer input requires a gradient (the
autograd functions skip it otherwise, e.g. for the first layer), the weight-gradient GEMM only when the
weight does.  Float GEMMs (``integer=False``) count as 32 x 32.

MAC counts: Linear ``N * in * out`` per GEMM (``N`` = input rows); Conv2d
``B * C_out * H_out * W_out * (C_in / groups) * k_h * k_w`` per GEMM (the transposed convolution of
``grad_input`` and the correlation of ``grad_weight`` do the same number of MACs as the forward).

Energy (:func:`mac_energy_pj`) uses Horowitz, "Computing's energy problem (and what we can do about it)",
ISSCC 2014, 45 nm, per operation: int8 add 0.03 pJ, int8 mult 0.2 pJ, int32 add 0.1 pJ, int32 mult 3.1 pJ,
fp32 add 0.9 pJ, fp32 mult 3.7 pJ.  An integer MAC is one ``a x b``-bit multiply plus one int32
accumulate: ``0.2 pJ * (a * b / 64) + 0.1 pJ`` (an array multiplier's energy scales with ``a * b``; the
same scaling gives 3.2 pJ for 32 x 32 against the table's 3.1 pJ); a float MAC is ``3.7 + 0.9 = 4.6 pJ``.

Saved-activation memory is measured, not estimated: ``torch.autograd.graph.saved_tensors_hooks`` around
each layer's forward records the bytes of every tensor its autograd node saves for backward
(quantized codes and scales; the layer's own parameters are not counted).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from inttrain.nn import QConv2d, QLinear
from inttrain.spec import GemmPrecision, LayerPrecision

__all__ = [
    "HOROWITZ_45NM_PJ", "GEMMS", "GemmCount", "BitOpsCounter", "mac_energy_pj", "gemm_macs", "measure_step",
]

#: Horowitz, ISSCC 2014, 45 nm, energy per operation in picojoules.
HOROWITZ_45NM_PJ: dict[str, float] = {
    "int8_add": 0.03, "int8_mult": 0.2, "int32_add": 0.1, "int32_mult": 3.1, "fp32_add": 0.9, "fp32_mult": 3.7,
}
GEMMS: tuple[str, ...] = ("forward", "grad_input", "grad_weight")


def mac_energy_pj(bits_a: int, bits_b: int, integer: bool = True) -> float:
    """Energy of one MAC (see module docstring): integer ``0.2 * a*b/64 + 0.1`` pJ, float32 ``4.6`` pJ."""
    t = HOROWITZ_45NM_PJ
    if not integer:
        return t["fp32_mult"] + t["fp32_add"]
    return t["int8_mult"] * bits_a * bits_b / 64 + t["int32_add"]


def _gemm_bits(g: GemmPrecision) -> tuple[int, int, bool]:
    return (g.lhs.bits, g.rhs.bits, True) if g.integer else (32, 32, False)


def gemm_macs(layer: nn.Module, x_shape: torch.Size, out_shape: torch.Size) -> int:
    """MACs of one of the layer's three GEMMs for this input / output shape (all three are equal)."""
    if isinstance(layer, nn.Conv2d):
        b, c_out, h, w = out_shape
        kh, kw = layer.kernel_size
        return int(b * c_out * h * w * (layer.in_channels // layer.groups) * kh * kw)
    if isinstance(layer, nn.Linear):
        rows = 1
        for d in x_shape[:-1]:
            rows *= int(d)
        return rows * layer.in_features * layer.out_features
    raise TypeError(f"no MAC count for {type(layer).__name__}")


@dataclass
class GemmCount:
    """Totals of one GEMM of one layer over the counted calls."""

    layer: str
    kind: str  # "Linear" / "Conv2d"
    gemm: str  # forward / grad_input / grad_weight
    macs: int = 0
    bitops: int = 0
    fp32_bitops: int = 0  # the same MACs at 32 x 32
    int8_bitops: int = 0  # the same MACs at 8 x 8
    energy_pj: float = 0.0
    calls: int = 0
    last_bits: tuple[int, int] = (0, 0)

    def add(self, macs: int, bits: tuple[int, int, bool]) -> None:
        a, b, integer = bits
        self.macs += macs
        self.bitops += macs * a * b
        self.fp32_bitops += macs * 32 * 32
        self.int8_bitops += macs * 8 * 8
        self.energy_pj += macs * mac_energy_pj(a, b, integer)
        self.calls += 1
        self.last_bits = (a, b)


class BitOpsCounter:
    """Accumulates BitOPs per layer and GEMM while attached (``attach()`` / ``detach()`` or ``with``).

    ``training_only``: layers in eval mode (validation passes) are not counted.
    ``saved_bytes`` maps a layer name to the bytes its last forward saved for backward.
    ``state_dict()`` / ``load_state_dict()`` carry the running totals across a resume.

    Compiled steps: the hooks are Python side effects that would split a ``torch.compile`` graph at every
    layer, so inside a compiled graph they do nothing.  Between :meth:`begin_step` and :meth:`end_step`
    the GEMMs an eager step counted are kept as a template; a step in which no hook fired (it ran
    compiled) is counted by replaying that template with each layer's current bit widths (the shapes
    of a step do not change without a recompile; a precision schedule changes the bits, which are read
    anew).  :attr:`has_template` says whether an eager step has been seen (the trainer runs the first
    step eagerly when it has not).
    """

    def __init__(self, model: nn.Module, measure_memory: bool = False, training_only: bool = True) -> None:
        self.model, self.measure_memory, self.training_only = model, measure_memory, training_only
        self.records: dict[tuple[str, str], GemmCount] = {}
        self.saved_bytes: dict[str, int] = {}
        self._handles: list[Any] = []
        self._ctx: dict[str, Any] = {}
        self._template: list[tuple[str, str, int]] = []  # (layer, gemm, MACs) of the last eager step
        self._recording: list[tuple[str, str, int]] = []
        self._in_step = False

    # ------------------------------------------------------------------ hooks
    def layers(self) -> Iterator[tuple[str, nn.Module]]:
        for name, m in self.model.named_modules():
            if isinstance(m, (QLinear, QConv2d)):
                yield name or type(m).__name__, m

    def attach(self) -> BitOpsCounter:
        if not self._handles:
            for name, m in self.layers():
                self._handles.append(m.register_forward_hook(self._forward_hook(name)))
                if self.measure_memory:
                    self._handles.append(m.register_forward_pre_hook(self._pre_hook(name)))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self) -> BitOpsCounter:
        return self.attach()

    def __exit__(self, *exc: Any) -> None:
        self.detach()

    @property
    def has_template(self) -> bool:
        return bool(self._template)

    def begin_step(self) -> None:
        self._recording, self._in_step = [], True

    def end_step(self) -> None:
        """Keep this step's GEMMs as the template, or (a compiled step: nothing recorded) replay the template.

        Reading a total before ``end_step`` (the trainer logs its metrics row first) settles the step early.
        """
        if not self._in_step:
            return
        self._in_step = False
        if self._recording:
            self._template, self._recording = self._recording, []
            return
        layers = dict(self.layers())
        for name, gemm, macs in self._template:
            layer = layers[name]
            self._record(name, layer, gemm).add(macs, _gemm_bits(getattr(layer.precision, gemm)))

    def _count(self, name: str, layer: nn.Module, gemm: str, macs: int, bits: tuple[int, int]) -> None:
        self._record(name, layer, gemm).add(macs, bits)
        self._recording.append((name, gemm, macs))

    def _record(self, name: str, layer: nn.Module, gemm: str) -> GemmCount:
        key = (name, gemm)
        if key not in self.records:
            self.records[key] = GemmCount(name, type(layer).float_class.__name__, gemm)
        return self.records[key]

    def _pre_hook(self, name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            params = {id(p) for p in module.parameters(recurse=False)}
            total = [0]

            def pack(t: torch.Tensor) -> torch.Tensor:
                if id(t) not in params:
                    total[0] += t.numel() * t.element_size()
                return t

            ctx = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            ctx.__enter__()
            self._ctx[name] = (ctx, total)

        return hook

    def _forward_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            if torch.compiler.is_compiling():  # counted by end_step's replay (see the class docstring)
                return
            if name in self._ctx:
                ctx, total = self._ctx.pop(name)
                ctx.__exit__(None, None, None)
                self.saved_bytes[name] = total[0]
            if self.training_only and not module.training:  # evaluation passes are not training cost
                return
            x = args[0]
            macs = gemm_macs(module, x.shape, output.shape)
            # Per-sample precision: each group of rows counts its share of the MACs at its own bits.
            groups = getattr(module, "sample_groups", None)
            n = int(x.shape[0]) if x.dim() else 1
            parts: list[tuple[int, LayerPrecision]] = (
                [(macs, module.precision)] if groups is None else [(macs * int(idx.numel()) // n, p) for idx, p in groups])
            for m, p in parts:
                self._count(name, module, "forward", m, _gemm_bits(p.forward))
            if not (torch.is_grad_enabled() and output.requires_grad):
                return
            need_dx = bool(x.requires_grad)
            need_dw = bool(module.weight.requires_grad)

            def on_grad(g: torch.Tensor) -> None:
                for m, p in parts:
                    if need_dx:
                        self._count(name, module, "grad_input", m, _gemm_bits(p.grad_input))
                    if need_dw:
                        self._count(name, module, "grad_weight", m, _gemm_bits(p.grad_weight))

            output.register_hook(on_grad)

        return hook

    # ------------------------------------------------------------------ totals
    def total(self, field: str = "bitops", gemm: str | None = None) -> float:
        self.end_step()
        return sum(getattr(r, field) for r in self.records.values() if gemm is None or r.gemm == gemm)

    @property
    def bitops(self) -> int:
        return int(self.total("bitops"))

    @property
    def ratio_to_fp32(self) -> float:
        ref = self.total("fp32_bitops")
        return self.total("bitops") / ref if ref else float("nan")

    @property
    def ratio_to_int8(self) -> float:
        ref = self.total("int8_bitops")
        return self.total("bitops") / ref if ref else float("nan")

    def reset(self) -> None:
        self.records.clear()
        self.saved_bytes.clear()

    def state_dict(self) -> dict[str, Any]:
        self.end_step()
        return {"records": [
            [r.layer, r.kind, r.gemm, r.macs, r.bitops, r.fp32_bitops, r.int8_bitops, r.energy_pj, r.calls, list(r.last_bits)]
            for r in self.records.values()
        ], "template": [list(t) for t in self._template]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.records = {}
        for layer, kind, gemm, macs, bitops, fp32, int8, energy, calls, last in state["records"]:
            self.records[(layer, gemm)] = GemmCount(layer, kind, gemm, int(macs), int(bitops), int(fp32), int(int8),
                                                    float(energy), int(calls), (int(last[0]), int(last[1])))
        self._template = [(str(n), str(g), int(m)) for n, g, m in state.get("template", [])]

    def table(self) -> str:
        """Per-layer, per-GEMM table with totals, ratios, energy and saved-activation memory."""
        self.end_step()
        head = f"{'layer':<24} {'type':<7} {'gemm':<11} {'MACs':>12} {'bits':>6} {'GBitOPs':>10} {'energy uJ':>10} {'saved KiB':>10}"
        lines = [head, "-" * len(head)]
        order = list(dict.fromkeys(r.layer for r in self.records.values()))
        for r in sorted(self.records.values(), key=lambda r: (order.index(r.layer), GEMMS.index(r.gemm))):
            saved = self.saved_bytes.get(r.layer) if r.gemm == "forward" else None
            lines.append(
                f"{r.layer:<24} {r.kind:<7} {r.gemm:<11} {r.macs:>12,d} {f'{r.last_bits[0]}x{r.last_bits[1]}':>6} "
                f"{r.bitops / 1e9:>10.4f} {r.energy_pj / 1e6:>10.4f} {'' if saved is None else f'{saved / 1024:.1f}':>10}"
            )
        lines.append("-" * len(head))
        total_saved = sum(self.saved_bytes.values())
        lines.append(
            f"{'total':<24} {'':<7} {'':<11} {int(self.total('macs')):>12,d} {'':>6} {self.bitops / 1e9:>10.4f} "
            f"{self.total('energy_pj') / 1e6:>10.4f} {total_saved / 1024 if self.saved_bytes else 0:>10.1f}"
        )
        fp32_energy = self.total("macs") * mac_energy_pj(32, 32, integer=False)
        lines.append(
            f"BitOPs / fp32 (32x32): {self.ratio_to_fp32:.4f}   BitOPs / static int8 (8x8): {self.ratio_to_int8:.4f}   "
            f"energy / fp32: {self.total('energy_pj') / fp32_energy if fp32_energy else float('nan'):.4f}"
            "  (Horowitz ISSCC 2014, 45 nm)"
        )
        return "\n".join(lines)


def measure_step(model: nn.Module, x: torch.Tensor, measure_memory: bool = True) -> BitOpsCounter:
    """Count one forward + backward of ``model`` on ``x`` (loss: mean square of the float output)."""
    counter = BitOpsCounter(model, measure_memory=measure_memory)
    was_training = model.training
    model.train()
    try:
        with counter:
            out = model(x)
            out.float().square().mean().backward()
    finally:
        model.train(was_training)
        model.zero_grad(set_to_none=True)
    return counter
