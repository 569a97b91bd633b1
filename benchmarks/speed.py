#!/usr/bin/env python
"""Speed benchmark: fp32 eager vs bf16 autocast vs inttrain int8, fwd+bwd, on CPU.

    python benchmarks/speed.py                      # full run (< ~10 min on a 2-core VM)
    python benchmarks/speed.py --quick              # ~2 min smoke run
    python benchmarks/speed.py --only linear,gpt    # a subset: linear, conv, mlp, resnet20, gpt
    python benchmarks/speed.py --json out.json      # also dump every sample as JSON

Every row times the same work three ways, on the same input data and the same initial weights
(one model is built, the others get a copy of its state_dict):

- fp32: plain eager float32 (for convolutions both NCHW and channels_last; ratios use the faster),
- bf16: ``torch.autocast("cpu", dtype=torch.bfloat16)`` around the forward (and loss),
- int8: ``inttrain.prepare_(model, "int8")`` (int8 forward, input-gradient and weight-gradient GEMMs).

Each variant is warmed up (int8's first calls run torch.compile), then timed with
``time.perf_counter`` for N iterations, N chosen from the warm-up time so that each variant gets a
fixed time budget.  The variants of one row are timed interleaved (one iteration of each in turn),
so a slow-down of the shared machine hits all of them alike; the median is reported.  For every
int8 row the integer-kernel counters (``inttrain.kernels.int_kernel_calls``) are checked to have
increased during the timed iterations.  No environment variables are set: default allocator and
default thread count.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

try:
    import inttrain
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    import inttrain
from inttrain.kernels import int_kernel_calls, reset_kernel_calls
from inttrain.models import build_model

CL = torch.channels_last
BF16 = torch.bfloat16
CONV_UNAVAILABLE = "conv kernels not available"
SECTIONS = ("linear", "conv", "mlp", "resnet20", "gpt")


def conv_kernels_available() -> tuple[bool, str]:
    try:
        importlib.import_module("inttrain.kernels.conv")
        importlib.import_module("inttrain.autograd.conv")
    except Exception as exc:  # ImportError while the kernels are being written, or a broken module
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


# --------------------------------------------------------------------------------------------------
# Variants: a step() closure per precision/layout.


@dataclass
class Variant:
    name: str                      # "fp32", "fp32_cl", "bf16", "int8"
    step: Callable[[], None] | None
    error: str | None = None       # why it could not run (e.g. conv kernels not available)
    samples: list[float] = field(default_factory=list)
    warmup_s: float = 0.0
    kernel_calls: dict[str, int] = field(default_factory=dict)  # int8: integer-kernel launches per iter

    @property
    def median_ms(self) -> float | None:
        return 1e3 * statistics.median(self.samples) if self.samples else None


@dataclass
class Row:
    section: str
    name: str
    shape: str
    target: float | None           # required fp32/int8 ratio (vs the faster fp32 layout)
    beat_bf16: bool = False        # additionally: int8 must be faster than bf16
    variants: dict[str, Variant] = field(default_factory=dict)
    note: str = ""


def _int8(module: nn.Module) -> nn.Module:
    return inttrain.prepare_(module, "int8")


def _convert_int8(build: Callable[[], Callable[[], None]], needs_conv: bool, conv_ok: bool) -> Variant:
    if needs_conv and not conv_ok:
        return Variant("int8", None, error=CONV_UNAVAILABLE)
    try:
        return Variant("int8", build())
    except Exception as exc:  # a kernel still under construction must not kill the whole run
        return Variant("int8", None, error=f"{type(exc).__name__}: {exc}"[:200])


def _layer_step(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor, autocast: bool = False) -> Callable[[], None]:
    """fwd + bwd of a single layer with a fixed output gradient; grads are dropped each iteration."""
    params = list(layer.parameters())

    def step() -> None:
        x.grad = None
        for p in params:
            p.grad = None
        if autocast:
            with torch.autocast("cpu", dtype=BF16):
                y = layer(x)
        else:
            y = layer(x)
        y.backward(dy.to(y.dtype) if y.dtype != dy.dtype else dy)

    return step


def _train_step(model: nn.Module, x: torch.Tensor, target: torch.Tensor, autocast: bool = False) -> Callable[[], None]:
    """forward, cross-entropy loss, backward, SGD-momentum step, zero_grad."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    model.train()

    def step() -> None:
        if autocast:
            with torch.autocast("cpu", dtype=BF16):
                logits = model(x)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        else:
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _copy(model: nn.Module, base_state: dict) -> nn.Module:
    m = copy.deepcopy(model)
    m.load_state_dict(base_state)
    return m


# --------------------------------------------------------------------------------------------------
# Rows.


def linear_rows(conv_ok: bool) -> list[tuple[Row, Callable[[], dict[str, Variant]]]]:
    rows = []
    for tokens, fin, fout in ((4096, 1024, 1024), (4096, 4096, 4096), (8192, 768, 3072)):
        target = 3.8 if (tokens, fin, fout) == (4096, 4096, 4096) else 3.0
        row = Row("linear", "Linear", f"{tokens}x{fin}x{fout}", target)

        def make(tokens=tokens, fin=fin, fout=fout) -> dict[str, Variant]:
            g = torch.Generator().manual_seed(0)
            base = nn.Linear(fin, fout)
            state = copy.deepcopy(base.state_dict())
            x = torch.randn(tokens, fin, generator=g).requires_grad_(True)
            dy = torch.randn(tokens, fout, generator=g)
            return {
                "fp32": Variant("fp32", _layer_step(_copy(base, state), x, dy)),
                "bf16": Variant("bf16", _layer_step(_copy(base, state), x, dy, autocast=True)),
                "int8": _convert_int8(lambda: _layer_step(_int8(_copy(base, state)), x, dy), False, conv_ok),
            }

        rows.append((row, make))
    return rows


def conv_rows(conv_ok: bool) -> list[tuple[Row, Callable[[], dict[str, Variant]]]]:
    rows = []
    for ch, px in ((16, 32), (32, 16), (64, 8)):
        batch = 128
        row = Row("conv", "Conv2d 3x3", f"{batch}x{ch}x{px}x{px}, {ch}->{ch}", None)

        def make(ch=ch, px=px, batch=batch) -> dict[str, Variant]:
            g = torch.Generator().manual_seed(0)
            base = nn.Conv2d(ch, ch, 3, stride=1, padding=1, bias=False)
            state = copy.deepcopy(base.state_dict())
            x = torch.randn(batch, ch, px, px, generator=g)
            dy = torch.randn(batch, ch, px, px, generator=g)
            x_cl = x.contiguous(memory_format=CL).requires_grad_(True)
            dy_cl = dy.contiguous(memory_format=CL)
            x = x.requires_grad_(True)
            return {
                "fp32": Variant("fp32", _layer_step(_copy(base, state), x, dy)),
                "fp32_cl": Variant("fp32_cl", _layer_step(_copy(base, state).to(memory_format=CL), x_cl, dy_cl)),
                # bf16 and int8 both run channels_last (oneDNN's native layout for both).
                "bf16": Variant("bf16", _layer_step(_copy(base, state).to(memory_format=CL), x_cl, dy_cl,
                                                    autocast=True)),
                "int8": _convert_int8(lambda: _layer_step(_int8(_copy(base, state)), x_cl, dy_cl), True, conv_ok),
            }

        rows.append((row, make))
    return rows


def mlp_rows(conv_ok: bool) -> list[tuple[Row, Callable[[], dict[str, Variant]]]]:
    batch = 512
    row = Row("mlp", "MLP train step", f"784-1024-1024-1024-10, batch {batch}", 2.5)

    def make() -> dict[str, Variant]:
        torch.manual_seed(0)
        base = build_model("mlp", 10, 1, 28)
        state = copy.deepcopy(base.state_dict())
        g = torch.Generator().manual_seed(0)
        x = torch.randn(batch, 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        return {
            "fp32": Variant("fp32", _train_step(_copy(base, state), x, y)),
            "bf16": Variant("bf16", _train_step(_copy(base, state), x, y, autocast=True)),
            "int8": _convert_int8(lambda: _train_step(_int8(_copy(base, state)), x, y), False, conv_ok),
        }

    return [(row, make)]


def resnet_rows(conv_ok: bool) -> list[tuple[Row, Callable[[], dict[str, Variant]]]]:
    batch = 128
    row = Row("resnet20", "ResNet-20 train step", f"CIFAR 3x32x32, batch {batch}", 1.6)

    def make() -> dict[str, Variant]:
        torch.manual_seed(0)
        base = build_model("resnet20", 10, 3, 32)
        state = copy.deepcopy(base.state_dict())
        g = torch.Generator().manual_seed(0)
        x = torch.randn(batch, 3, 32, 32, generator=g)
        x_cl = x.contiguous(memory_format=CL)
        y = torch.randint(0, 10, (batch,), generator=g)
        return {
            "fp32": Variant("fp32", _train_step(_copy(base, state), x, y)),
            "fp32_cl": Variant("fp32_cl", _train_step(_copy(base, state).to(memory_format=CL), x_cl, y)),
            "bf16": Variant("bf16", _train_step(_copy(base, state).to(memory_format=CL), x_cl, y, autocast=True)),
            "int8": _convert_int8(lambda: _train_step(_int8(_copy(base, state)), x_cl, y), True, conv_ok),
        }

    return [(row, make)]


def gpt_rows(conv_ok: bool) -> list[tuple[Row, Callable[[], dict[str, Variant]]]]:
    batch, seq, vocab = 16, 256, 65
    row = Row("gpt", "GPT train step", f"d512 L4 H8, seq {seq}, batch {batch}, vocab {vocab}", 2.2, beat_bf16=True)

    def make() -> dict[str, Variant]:
        torch.manual_seed(0)
        base = build_model("gpt-small", vocab, 1, seq, d_model=512, n_layers=4, n_heads=8)
        state = copy.deepcopy(base.state_dict())
        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, vocab, (batch, seq), generator=g)
        tgt = torch.randint(0, vocab, (batch, seq), generator=g)
        return {
            "fp32": Variant("fp32", _train_step(_copy(base, state), idx, tgt)),
            "bf16": Variant("bf16", _train_step(_copy(base, state), idx, tgt, autocast=True)),
            "int8": _convert_int8(lambda: _train_step(_int8(_copy(base, state)), idx, tgt), False, conv_ok),
        }

    return [(row, make)]


BUILDERS = {"linear": linear_rows, "conv": conv_rows, "mlp": mlp_rows, "resnet20": resnet_rows, "gpt": gpt_rows}


# --------------------------------------------------------------------------------------------------
# Timing.


@dataclass(frozen=True)
class Budget:
    warmup: int        # warm-up iterations per variant (int8's first ones compile)
    seconds: float     # timed seconds per variant
    min_iters: int
    max_iters: int


# int8 gets one extra warm-up iteration (its first calls compile the fused quantize passes).
FULL = Budget(warmup=3, seconds=5.0, min_iters=5, max_iters=60)
QUICK = Budget(warmup=1, seconds=1.0, min_iters=3, max_iters=10)


def _run_variant_safely(v: Variant) -> float | None:
    """One call of v.step; returns seconds, or marks the variant failed and returns None."""
    assert v.step is not None
    try:
        t0 = time.perf_counter()
        v.step()
        return time.perf_counter() - t0
    except Exception as exc:
        v.error = f"{type(exc).__name__}: {exc}"[:200]
        v.step = None
        return None


def measure(row: Row, variants: dict[str, Variant], budget: Budget, log: Callable[[str], None]) -> None:
    row.variants = variants
    live = [v for v in variants.values() if v.step is not None]
    # Warm-up (separately per variant, so compile time is not mixed into anything).
    per_iter: dict[str, float] = {}
    for v in live:
        t0 = time.perf_counter()
        last = None
        for _ in range(budget.warmup + (v.name == "int8")):
            last = _run_variant_safely(v)
            if last is None:
                break
        v.warmup_s = time.perf_counter() - t0
        if last is not None:
            per_iter[v.name] = last
    live = [v for v in live if v.step is not None]
    if not live:
        return
    # N from the slowest variant's last warm-up iteration, the same N for all variants of the row.
    slowest = max(per_iter[v.name] for v in live)
    n = int(min(budget.max_iters, max(budget.min_iters, budget.seconds / max(slowest, 1e-6))))
    int8 = variants.get("int8")
    reset_kernel_calls()  # only int8 launches integer kernels; counted over the timed iterations
    for _ in range(n):
        for v in live:  # interleaved: one iteration of every variant in turn
            if v.step is None:
                continue
            dt = _run_variant_safely(v)
            if dt is not None:
                v.samples.append(dt)
    if int8 is not None and int8.samples:
        int8.kernel_calls = {k: c / len(int8.samples) for k, c in int_kernel_calls().items()}
    parts = [f"{v.name} {v.median_ms:.1f} ms" for v in variants.values() if v.samples]
    log(f"  {row.name} [{row.shape}]: n={n}  " + ", ".join(parts)
        + "".join(f"  ({v.name}: {v.error})" for v in variants.values() if v.error))


# --------------------------------------------------------------------------------------------------
# Report.


def _best_fp32(row: Row) -> float | None:
    times = [row.variants[k].median_ms for k in ("fp32", "fp32_cl") if k in row.variants and row.variants[k].samples]
    return min(times) if times else None


def _ratios(row: Row) -> tuple[float | None, float | None]:
    int8 = row.variants.get("int8")
    bf16 = row.variants.get("bf16")
    if int8 is None or not int8.samples:
        return None, None
    fp = _best_fp32(row)
    r_fp = fp / int8.median_ms if fp else None
    r_bf = bf16.median_ms / int8.median_ms if bf16 is not None and bf16.samples else None
    return r_fp, r_bf


def _met(row: Row) -> str:
    r_fp, r_bf = _ratios(row)
    if row.target is None:
        return "—"
    if r_fp is None:
        return "n/a"
    ok = r_fp >= row.target and (not row.beat_bf16 or (r_bf is not None and r_bf > 1.0))
    return "yes" if ok else "**no**"


def _fmt_ms(v: Variant | None) -> str:
    if v is None:
        return "—"
    if v.samples:
        return f"{v.median_ms:.1f}"
    return "n/a"


def _kernels(row: Row) -> str:
    v = row.variants.get("int8")
    if v is None:
        return "—"
    if v.error:
        return v.error if v.error == CONV_UNAVAILABLE else f"error: {v.error}"
    calls = {k: c for k, c in v.kernel_calls.items() if c > 0}
    if not calls:
        return "**NO integer kernels ran**"
    return "ok: " + ", ".join(f"{k} {c:g}/it" for k, c in sorted(calls.items()))


def markdown(rows: list[Row]) -> str:
    head = ("| case | shape | fp32 ms | fp32 CL ms | bf16 ms | int8 ms | fp32/int8 | bf16/int8 | target "
            "| met | int8 kernels |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        r_fp, r_bf = _ratios(row)
        target = "—" if row.target is None else f">= {row.target:g}x" + (" & > bf16" if row.beat_bf16 else "")
        lines.append("| " + " | ".join([
            row.name, row.shape,
            _fmt_ms(row.variants.get("fp32")), _fmt_ms(row.variants.get("fp32_cl")),
            _fmt_ms(row.variants.get("bf16")), _fmt_ms(row.variants.get("int8")),
            f"{r_fp:.2f}x" if r_fp else "n/a", f"{r_bf:.2f}x" if r_bf else "n/a",
            target, _met(row), _kernels(row),
        ]) + " |")
    return "\n".join(lines)


def environment() -> dict[str, str]:
    ok, why = conv_kernels_available()
    return {
        "torch": torch.__version__,
        "inttrain": getattr(inttrain, "__version__", "?"),
        "python": platform.python_version(),
        "cpu capability": str(torch.backends.cpu.get_cpu_capability()),
        "threads": str(torch.get_num_threads()),
        "cpu count": str(os.cpu_count()),
        "conv kernels": "available" if ok else f"{CONV_UNAVAILABLE} ({why})",
        "INTTRAIN_COMPILE": os.environ.get("INTTRAIN_COMPILE", "1 (default)"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short smoke run (~2 min)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--json", metavar="PATH", help="write all samples and results as JSON")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {unknown}; allowed: {','.join(SECTIONS)}")
    budget = QUICK if args.quick else FULL

    def log(msg: str) -> None:
        print(msg, flush=True)

    env = environment()
    log("# inttrain speed benchmark (fwd+bwd, CPU)")
    for k, v in env.items():
        log(f"- {k}: {v}")
    log(f"- mode: {'quick' if args.quick else 'full'} (warm-up {budget.warmup} it, ~{budget.seconds:g} s timed per "
        f"variant, {budget.min_iters}-{budget.max_iters} it, median)")
    log("")
    conv_ok = not env["conv kernels"].startswith(CONV_UNAVAILABLE)
    t_start = time.perf_counter()
    rows: list[Row] = []
    for section in SECTIONS:
        if section not in only:
            continue
        for row, make in BUILDERS[section](conv_ok):
            variants = make()
            measure(row, variants, budget, log)
            rows.append(row)
            del variants
    wall = time.perf_counter() - t_start
    log("")
    log(markdown(rows))
    log("")
    for row in rows:
        if row.note:
            log(f"Note: {row.note}")
    log("Times are medians of per-iteration wall time (ms). Ratios > 1 mean int8 is faster; for conv/ResNet rows "
        "fp32/int8 uses the faster of the NCHW and channels_last fp32 runs.")
    log(f"Total wall time: {wall:.0f} s")
    if args.json:
        out = {
            "environment": env,
            "mode": "quick" if args.quick else "full",
            "wall_s": wall,
            "rows": [
                {
                    "section": r.section, "name": r.name, "shape": r.shape, "target": r.target,
                    "beat_bf16": r.beat_bf16, "met": _met(r), "note": r.note,
                    "fp32_over_int8": _ratios(r)[0], "bf16_over_int8": _ratios(r)[1],
                    "variants": {
                        k: {"median_ms": v.median_ms, "samples_s": v.samples, "warmup_s": v.warmup_s,
                            "error": v.error, "int_kernel_calls_per_iter": v.kernel_calls}
                        for k, v in r.variants.items()
                    },
                }
                for r in rows
            ],
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
