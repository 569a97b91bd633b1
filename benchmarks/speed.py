#!/usr/bin/env python
"""Speed benchmark: fp32 vs bf16 autocast vs inttrain int8 (and int8 dataflow), each eager and compiled, on CPU or CUDA.

    python benchmarks/speed.py                      # full run (~15 min on a 2-core VM)
    python benchmarks/speed.py --threads 1          # the same at one thread
    python benchmarks/speed.py --quick              # smoke run
    python benchmarks/speed.py --only linear,gpt    # a subset: linear, conv, mlp, resnet20, gpt
    python benchmarks/speed.py --json out.json      # also dump every sample as JSON
    python benchmarks/speed.py --device cuda        # on a GPU: GPU-sized shapes, bf16 autocast on CUDA

Every row times the same work in several variants, on the same input data and the same initial weights
(one model is built, the others get a copy of its state_dict):

- ``fp32``: plain float32 (for convolutions also channels_last, ``fp32_cl``),
- ``bf16``: ``torch.autocast("cpu", dtype=torch.bfloat16)`` around the forward (and loss),
- ``int8``: ``inttrain.prepare_(model, "int8")`` (int8 forward, input-gradient and weight-gradient GEMMs),
- ``int8_df``: ``inttrain.prepare_(model, "int8", dataflow=True)`` (whole models only),
- ``int8_bf16``: the int8 recipe with ``bf16_activations=True`` (whole models only): the same int8 layers, the
  forward under bf16 autocast, so the activations between them are bfloat16 (the "int8 bf16-activations" column,
  with its ratio to bf16; the int8 columns and targets are the float32-activation ``int8``'s),
- ``int8_pt``: the int8 recipe with ``per_sample_grad=False`` (whole models only): one scale per tensor for the
  convolutions' output gradient in the grad-input GEMM, the recipe's former default (``inttrain train
  --no-per-sample-grad``), against ``int8``'s one per sample: what the per-sample scales cost (opt in with
  ``--families``),

and each of them once more compiled (suffix ``+c``): ``torch.compile(model)`` around the layer or model
(forward and backward in one graph; the optimizer step stays eager for every variant alike).  A family's
figure is its best variant (eager or compiled); ratios compare int8 at its best with fp32 and bf16 at their
best.  Compile time is the first iteration's time and is reported separately.

Each variant is warmed up, then timed with ``time.perf_counter``; the variants of one row are timed
interleaved (one iteration of each in turn), so a slow-down of the shared machine hits all of them alike;
the median is reported.  For every int8 variant the integer-kernel counters
(``inttrain.kernels.int_kernel_calls``) are checked to have increased during its timed iterations.
No environment variables are set: default allocator; ``--threads`` (default: the machine's) is the only
setting.

``--device cuda`` runs the same variants on the GPU (int8 GEMMs on ``torch._int_mm``, i.e. cuBLASLt's int8
tensor-core GEMM; convolutions as im2col + that GEMM), each step timed between ``torch.cuda.synchronize()``
calls, with shapes sized for a GPU (:data:`GPU_SHAPES`: a CPU-sized GEMM is launch-bound on a GPU).  fp32 there
is true float32 (TF32 left off, PyTorch's default).
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
from inttrain.kernels import int_kernel_calls, reset_kernel_calls  # noqa: E402
from inttrain.kernels.workspace import keep_freed_memory  # noqa: E402
from inttrain.models import build_model  # noqa: E402

CL = torch.channels_last
BF16 = torch.bfloat16
SECTIONS = ("linear", "conv", "mlp", "resnet20", "gpt")
FAMILIES = ("fp32", "bf16", "int8", "int8_df", "int8_bf16", "int8_pt")  # int8_bf16: int8 layers, bf16 autocast
DEFAULT_FAMILIES = FAMILIES[:-1]  # int8_pt only when asked for


@dataclass(frozen=True)
class Shapes:
    """The problem sizes of every row, per device kind."""
    linear: tuple[tuple[int, int, int], ...]   # (tokens, in, out)
    mlp_batch: int
    mlp_widths: tuple[int, ...]
    resnet_batch: int
    gpt: tuple[int, int, int, int, int]        # (batch, seq, d_model, layers, heads)


CPU_SHAPES = Shapes(linear=((4096, 1024, 1024), (4096, 4096, 4096), (8192, 768, 3072)), mlp_batch=512,
                    mlp_widths=(1024, 1024, 1024), resnet_batch=128, gpt=(16, 256, 512, 4, 8))
# GPU: Llama-sized GEMMs (a 8B model's attention and FFN projections at 16k tokens), a wide MLP, a larger GPT.
GPU_SHAPES = Shapes(linear=((16384, 4096, 4096), (16384, 4096, 14336), (16384, 8192, 8192)), mlp_batch=8192,
                    mlp_widths=(4096, 4096, 4096), resnet_batch=512, gpt=(16, 1024, 1024, 8, 16))


@dataclass(frozen=True)
class Setup:
    device: torch.device
    shapes: Shapes

    @property
    def kind(self) -> str:
        return self.device.type

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


SETUP = Setup(torch.device("cpu"), CPU_SHAPES)  # main() replaces it for --device
MODEL_FAMILIES = DEFAULT_FAMILIES  # main() narrows it for --families


# --------------------------------------------------------------------------------------------------
# Variants: a step() closure per precision, layout and mode (eager / compiled).


@dataclass
class Variant:
    name: str                      # e.g. "fp32", "fp32_cl", "bf16+c", "int8", "int8_df+c"
    step: Callable[[], None] | None
    error: str | None = None       # why it could not run
    samples: list[float] = field(default_factory=list)
    first_s: float = 0.0           # the first iteration (compiles, for "+c" variants)
    kernel_calls: dict[str, float] = field(default_factory=dict)  # int8: integer-kernel launches per iter

    @property
    def family(self) -> str:
        return self.name.split("+")[0].replace("_nchw", "")

    @property
    def median_ms(self) -> float | None:
        return 1e3 * statistics.median(self.samples) if self.samples else None


@dataclass
class Row:
    section: str
    name: str
    shape: str
    targets: dict[str, float]      # e.g. {"bf16": 1.6, "fp32": 2.0}: required ratio of int8 (best) over each
    variants: dict[str, Variant] = field(default_factory=dict)

    def best(self, family: str) -> Variant | None:
        done = [v for v in self.variants.values() if v.family == family and v.samples]
        return min(done, key=lambda v: v.median_ms) if done else None


def _variant(name: str, build: Callable[[], Callable[[], None]]) -> Variant:
    try:
        return Variant(name, build())
    except Exception as exc:  # a variant that cannot be built must not kill the whole run
        return Variant(name, None, error=f"{type(exc).__name__}: {exc}"[:200])


def _prepared(module: nn.Module, family: str) -> nn.Module:
    if family == "int8":
        return inttrain.prepare_(module, "int8")
    if family == "int8_df":
        return inttrain.prepare_(module, "int8", dataflow=True)
    if family == "int8_bf16":  # the int8 recipe's bf16_activations: the step runs it under bf16 autocast
        return inttrain.prepare_(module, inttrain.recipes.Int8MixedConfig(bf16_activations=True))
    if family == "int8_pt":  # one scale per tensor for the conv output gradient in the grad-input GEMM
        return inttrain.prepare_(module, inttrain.recipes.Int8MixedConfig(per_sample_grad=False))
    return module


def _layer_step(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor, autocast: bool, compiled: bool):
    """fwd + bwd of a single layer with a fixed output gradient; grads are dropped each iteration."""
    params = list(layer.parameters())
    run = torch.compile(layer) if compiled else layer

    def step() -> None:
        x.grad = None
        for p in params:
            p.grad = None
        with torch.autocast(SETUP.kind, dtype=BF16, enabled=autocast):
            y = run(x)
        y.backward(dy.to(y.dtype) if y.dtype != dy.dtype else dy)

    return step


def _train_step(model: nn.Module, x: torch.Tensor, target: torch.Tensor, autocast: bool, compiled: bool):
    """forward, cross-entropy loss, backward, SGD-momentum step, zero_grad."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    model.train()
    run = torch.compile(model) if compiled else model

    def step() -> None:
        with torch.autocast(SETUP.kind, dtype=BF16, enabled=autocast):
            logits = run(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _copy(model: nn.Module, base_state: dict) -> nn.Module:
    m = copy.deepcopy(model)
    m.load_state_dict(base_state)
    return m.to(SETUP.device)


def _all_variants(families, base: nn.Module, make_step, channels_last: bool = False,
                  nchw_fp32: bool = False) -> dict[str, Variant]:
    """Every family in eager and compiled form; ``make_step(module, autocast, compiled)`` builds the closure."""
    state = copy.deepcopy(base.state_dict())
    out: dict[str, Variant] = {}

    def fresh(family: str) -> nn.Module:
        m = _copy(base, state)
        if channels_last:
            m = m.to(memory_format=CL)
        return _prepared(m, family)

    if nchw_fp32:  # convolutions: fp32 NCHW as well as channels-last (the faster one counts)
        out["fp32_nchw"] = _variant("fp32_nchw", lambda: make_step(_copy(base, state), False, False, False))
    for family in families:
        for compiled in (False, True):
            name = family + ("+c" if compiled else "")
            out[name] = _variant(name, lambda f=family, c=compiled: make_step(fresh(f), f in ("bf16", "int8_bf16"), c,
                                                                              True))
    return out


# --------------------------------------------------------------------------------------------------
# Rows.


def linear_rows() -> list[tuple[Row, Callable[[], dict[str, Variant]]]]:
    rows = []
    for tokens, fin, fout in SETUP.shapes.linear:
        target = 1.8 if (tokens, fin, fout) == (4096, 4096, 4096) else 1.6
        row = Row("linear", "Linear fwd+bwd", f"{tokens}x{fin}x{fout}", {"bf16": target} if SETUP.kind == "cpu" else {})

        def make(tokens=tokens, fin=fin, fout=fout) -> dict[str, Variant]:
            g = torch.Generator().manual_seed(0)
            base = nn.Linear(fin, fout)
            x = torch.randn(tokens, fin, generator=g).to(SETUP.device).requires_grad_(True)
            dy = torch.randn(tokens, fout, generator=g).to(SETUP.device)
            return _all_variants(("fp32", "bf16", "int8"), base,
                                 lambda m, ac, c, _cl: _layer_step(m, x, dy, ac, c))

        rows.append((row, make))
    return rows


def conv_rows() -> list[tuple[Row, Callable[[], dict[str, Variant]]]]:
    rows = []
    for ch, px in ((16, 32), (32, 16), (64, 8)):
        batch = 128
        row = Row("conv", "Conv2d 3x3 fwd+bwd", f"{batch}x{ch}x{px}x{px}, {ch}->{ch}", {})

        def make(ch=ch, px=px, batch=batch) -> dict[str, Variant]:
            g = torch.Generator().manual_seed(0)
            base = nn.Conv2d(ch, ch, 3, stride=1, padding=1, bias=False)
            x = torch.randn(batch, ch, px, px, generator=g).to(SETUP.device)
            dy = torch.randn(batch, ch, px, px, generator=g).to(SETUP.device)
            x_cl = x.contiguous(memory_format=CL).requires_grad_(True)
            dy_cl = dy.contiguous(memory_format=CL)
            x = x.requires_grad_(True)
            return _all_variants(("fp32", "bf16", "int8"), base,
                                 lambda m, ac, c, cl: _layer_step(m, x_cl if cl else x, dy_cl if cl else dy, ac, c),
                                 channels_last=True, nchw_fp32=True)

        rows.append((row, make))
    return rows


def mlp_rows() -> list[tuple[Row, Callable[[], dict[str, Variant]]]]:
    batch, widths = SETUP.shapes.mlp_batch, SETUP.shapes.mlp_widths
    row = Row("mlp", "MLP train step", f"784-{'-'.join(map(str, widths))}-10, batch {batch}",
              {"bf16": 1.5} if SETUP.kind == "cpu" else {})

    def make() -> dict[str, Variant]:
        torch.manual_seed(0)
        base = build_model("mlp", 10, 1, 28, widths=widths)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(batch, 1, 28, 28, generator=g).to(SETUP.device)
        y = torch.randint(0, 10, (batch,), generator=g).to(SETUP.device)
        return _all_variants(MODEL_FAMILIES, base, lambda m, ac, c, _cl: _train_step(m, x, y, ac, c))

    return [(row, make)]


def resnet_rows() -> list[tuple[Row, Callable[[], dict[str, Variant]]]]:
    batch = SETUP.shapes.resnet_batch
    row = Row("resnet20", "ResNet-20 train step", f"CIFAR 3x32x32, batch {batch}",
              {"bf16": 1.1, "fp32": 2.0} if SETUP.kind == "cpu" else {})

    def make() -> dict[str, Variant]:
        torch.manual_seed(0)
        base = build_model("resnet20", 10, 3, 32)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(batch, 3, 32, 32, generator=g).to(SETUP.device)
        x_cl = x.contiguous(memory_format=CL)
        y = torch.randint(0, 10, (batch,), generator=g).to(SETUP.device)
        return _all_variants(MODEL_FAMILIES, base, lambda m, ac, c, cl: _train_step(m, x_cl if cl else x, y, ac, c),
                             channels_last=True, nchw_fp32=True)

    return [(row, make)]


def gpt_rows() -> list[tuple[Row, Callable[[], dict[str, Variant]]]]:
    (batch, seq, d_model, layers, heads), vocab = SETUP.shapes.gpt, 65
    row = Row("gpt", "GPT train step", f"d{d_model} L{layers} H{heads}, seq {seq}, batch {batch}, vocab {vocab}",
              {"bf16": 1.4} if SETUP.kind == "cpu" else {})

    def make() -> dict[str, Variant]:
        torch.manual_seed(0)
        base = build_model("gpt-small", vocab, 1, seq, d_model=d_model, n_layers=layers, n_heads=heads)
        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, vocab, (batch, seq), generator=g).to(SETUP.device)
        tgt = torch.randint(0, vocab, (batch, seq), generator=g).to(SETUP.device)
        return _all_variants(MODEL_FAMILIES, base, lambda m, ac, c, _cl: _train_step(m, idx, tgt, ac, c))

    return [(row, make)]


BUILDERS = {"linear": linear_rows, "conv": conv_rows, "mlp": mlp_rows, "resnet20": resnet_rows, "gpt": gpt_rows}


# --------------------------------------------------------------------------------------------------
# Timing.


@dataclass(frozen=True)
class Budget:
    warmup: int        # warm-up iterations per variant (compiled variants compile in the first ones)
    seconds: float     # timed seconds per variant
    min_iters: int
    max_iters: int


FULL = Budget(warmup=3, seconds=3.0, min_iters=5, max_iters=40)
QUICK = Budget(warmup=2, seconds=0.5, min_iters=2, max_iters=5)


def _run_variant_safely(v: Variant) -> float | None:
    """One call of v.step; returns seconds, or marks the variant failed and returns None."""
    assert v.step is not None
    try:
        SETUP.sync()
        t0 = time.perf_counter()
        v.step()
        SETUP.sync()  # device work is asynchronous: the step ends when the device is done
        return time.perf_counter() - t0
    except Exception as exc:
        v.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
        v.step = None
        return None


def measure(row: Row, variants: dict[str, Variant], budget: Budget, log: Callable[[str], None]) -> None:
    row.variants = variants
    live = [v for v in variants.values() if v.step is not None]
    per_iter: dict[str, float] = {}
    for v in live:  # warm-up, separately per variant, so compile time is not mixed into anything
        for i in range(budget.warmup):
            dt = _run_variant_safely(v)
            if dt is None:
                break
            if i == 0:
                v.first_s = dt
            per_iter[v.name] = dt
    live = [v for v in live if v.step is not None]
    if not live:
        return
    # N from the slowest variant's last warm-up iteration, the same N for all variants of the row.
    slowest = max(per_iter[v.name] for v in live)
    n = int(min(budget.max_iters, max(budget.min_iters, budget.seconds / max(slowest, 1e-6))))
    calls: dict[str, dict[str, int]] = {v.name: {} for v in live}
    for _ in range(n):
        for v in live:  # interleaved: one iteration of every variant in turn
            if v.step is None:
                continue
            reset_kernel_calls()
            dt = _run_variant_safely(v)
            if dt is not None:
                v.samples.append(dt)
                for k, c in int_kernel_calls().items():
                    calls[v.name][k] = calls[v.name].get(k, 0) + c
    for v in live:
        if v.samples:
            v.kernel_calls = {k: c / len(v.samples) for k, c in calls[v.name].items()}
    parts = [f"{v.name} {v.median_ms:.1f}" for v in variants.values() if v.samples]
    log(f"  {row.name} [{row.shape}]: n={n} ms: " + ", ".join(parts)
        + "".join(f"  ({v.name}: {v.error})" for v in variants.values() if v.error))


# --------------------------------------------------------------------------------------------------
# Report.


def ratio(row: Row, over: str, family: str = "int8") -> float | None:
    """How many times faster ``family`` (at its best) is than ``over`` (at its best)."""
    a, b = row.best(family), row.best(over)
    return b.median_ms / a.median_ms if a is not None and b is not None else None


def _met(row: Row) -> str:
    if not row.targets:
        return "—"
    got = [ratio(row, over) for over in row.targets]
    if any(r is None for r in got):
        return "n/a"
    ok = all(r >= t for r, t in zip(got, row.targets.values()))
    return "yes" if ok else "**no**"


def _cell(v: Variant | None) -> str:
    if v is None:
        return "—"
    return f"{v.median_ms:.1f} ({'c' if v.name.endswith('+c') else 'e'})"


def _kernels(row: Row) -> str:
    bad = []
    for v in row.variants.values():
        if v.family.startswith("int8") and v.samples and not any(c > 0 for c in v.kernel_calls.values()):
            bad.append(v.name)
    if bad:
        return "**NO integer kernels ran in " + ", ".join(bad) + "**"
    v = row.best("int8")
    if v is None:
        return "—"
    return ", ".join(f"{k} {c:g}" for k, c in sorted(v.kernel_calls.items()) if c > 0)


def markdown(rows: list[Row]) -> str:
    head = ("| case | shape | fp32 ms | bf16 ms | int8 ms | int8 dataflow ms | int8 bf16-activations ms "
            "| int8 vs fp32 | int8 vs bf16 | target | met | int8 kernels / step |")
    pt = any(row.best("int8_pt") is not None for row in rows)
    if pt:  # the opt-in int8_pt family gets a column only when it ran
        head = head.replace("| int8 vs fp32", "| int8 per-tensor-grad ms | int8 vs fp32")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        r_fp, r_bf = ratio(row, "fp32"), ratio(row, "bf16")
        df = row.best("int8_df")
        df_cell = "—" if df is None else _cell(df)
        if df is not None and ratio(row, "int8", "int8_df") is not None:
            df_cell += f" = {ratio(row, 'int8', 'int8_df'):.2f}x int8"
        ba = row.best("int8_bf16")
        ba_cell = "—" if ba is None else _cell(ba)
        if ba is not None and ratio(row, "bf16", "int8_bf16") is not None:
            ba_cell += f" = {ratio(row, 'bf16', 'int8_bf16'):.2f}x bf16"
        extra = [_family_cell(row, "int8_pt", "int8")] if pt else []
        target = ", ".join(f">= {t:g}x {k}" for k, t in row.targets.items()) or "—"
        lines.append("| " + " | ".join([
            row.name, row.shape, _cell(row.best("fp32")), _cell(row.best("bf16")), _cell(row.best("int8")), df_cell,
            ba_cell, *extra,
            f"{r_fp:.2f}x" if r_fp else "n/a", f"{r_bf:.2f}x" if r_bf else "n/a", target, _met(row), _kernels(row),
        ]) + " |")
    return "\n".join(lines)


def _family_cell(row: Row, family: str, against: str) -> str:
    """``family``'s best time and its speed ratio to ``against`` (> 1: ``family`` is faster)."""
    v = row.best(family)
    if v is None:
        return "—"
    r = ratio(row, against, family)
    return _cell(v) + (f" = {r:.2f}x {against}" if r is not None else "")


def details(rows: list[Row]) -> str:
    """Every variant's median and first-iteration (compile) time, and any error."""
    lines = ["| case | shape | variant | median ms | first iteration s | error |", "|---|---|---|---|---|---|"]
    for row in rows:
        for v in row.variants.values():
            med = f"{v.median_ms:.1f}" if v.samples else "—"
            lines.append(f"| {row.name} | {row.shape} | {v.name} | {med} | {v.first_s:.1f} | {v.error or ''} |")
    return "\n".join(lines)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    wanted = ("avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16", "amx_tile")
    have = [w for w in wanted if w in flags]
    return " ".join(have) or "none of " + ", ".join(wanted)


def environment() -> dict[str, str]:
    flags = cpu_flags()
    gpu = {}
    if SETUP.kind == "cuda":
        gpu = {"gpu": torch.cuda.get_device_name(SETUP.device), "cuda": str(torch.version.cuda),
               "tf32 matmul": str(torch.backends.cuda.matmul.allow_tf32)}
    return {
        **gpu,
        "cpu": cpu_model(),
        "int8/bf16 flags": flags + ("  (AMX: bf16 autocast also runs on AMX tiles)" if "amx_bf16" in flags else ""),
        "threads": str(torch.get_num_threads()),
        "cpu count": str(os.cpu_count()),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu capability": str(torch.backends.cpu.get_cpu_capability()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short smoke run")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the machine's default)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="where the steps run (cuda: GPU-sized shapes, bf16 autocast on CUDA)")
    ap.add_argument("--families", default=",".join(DEFAULT_FAMILIES),
                    help=f"comma-separated subset of {','.join(FAMILIES)} for the whole-model rows (fp32, bf16 and "
                         f"int8 always run) [{','.join(DEFAULT_FAMILIES)}]")
    ap.add_argument("--json", metavar="PATH", help="write all samples and results as JSON")
    ap.add_argument("--seconds", type=float, default=None,
                    help="timed seconds per variant (default: 3, or 0.5 with --quick)")
    ap.add_argument("--default-allocator", action="store_true",
                    help="leave glibc's malloc as it is (default: keep_freed_memory(), as the inttrain CLI does, "
                         "for every variant alike)")
    args = ap.parse_args(argv)
    if args.seconds is not None and not 0 < args.seconds < 3600:
        ap.error(f"--seconds must be in (0, 3600), got {args.seconds}")
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {unknown}; allowed: {','.join(SECTIONS)}")
    asked = {f.strip() for f in args.families.split(",") if f.strip()}
    if asked - set(FAMILIES):
        ap.error(f"unknown famil(ies) {sorted(asked - set(FAMILIES))}; allowed: {','.join(FAMILIES)}")
    families = tuple(f for f in FAMILIES if f in asked | {"fp32", "bf16", "int8"})
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available")
    global SETUP, MODEL_FAMILIES
    SETUP = Setup(torch.device(args.device), GPU_SHAPES if args.device == "cuda" else CPU_SHAPES)
    MODEL_FAMILIES = families
    if args.threads:
        torch.set_num_threads(args.threads)
    tuned = not args.default_allocator and keep_freed_memory()
    budget = QUICK if args.quick else FULL
    if args.seconds is not None:
        budget = Budget(budget.warmup, args.seconds, budget.min_iters, budget.max_iters)

    def log(msg: str) -> None:
        print(msg, flush=True)

    env = environment()
    env["allocator"] = ("glibc malloc keeps freed memory (inttrain.kernels.workspace.keep_freed_memory), all variants"
                        if tuned else "default")
    log(f"# inttrain speed benchmark (fwd+bwd, {SETUP.kind.upper()})")
    for k, v in env.items():
        log(f"- {k}: {v}")
    log(f"- mode: {'quick' if args.quick else 'full'} (warm-up {budget.warmup} it, ~{budget.seconds:g} s timed per "
        f"variant, {budget.min_iters}-{budget.max_iters} it, median)")
    log("")
    t_start = time.perf_counter()
    rows: list[Row] = []
    for section in dict.fromkeys(only):  # in the order asked for (a run cut short keeps the first sections)
        for row, make in BUILDERS[section]():
            variants = make()
            measure(row, variants, budget, log)
            rows.append(row)
            del variants
            torch._dynamo.reset()  # compiled graphs of one row are not reused by the next
    wall = time.perf_counter() - t_start
    log("")
    log(markdown(rows))
    log("")
    log("Times: median ms per iteration, (e) eager or (c) torch.compile, whichever is faster for that family. "
        "Ratios > 1 mean int8 is faster.")
    log("")
    log(details(rows))
    log(f"Total wall time: {wall:.0f} s")
    if args.json:
        out = {
            "environment": env,
            "mode": "quick" if args.quick else "full",
            "wall_s": wall,
            "rows": [
                {
                    "section": r.section, "name": r.name, "shape": r.shape, "targets": r.targets, "met": _met(r),
                    "int8_over": {f: ratio(r, f) for f in ("fp32", "bf16")},
                    "int8_df_over_int8": ratio(r, "int8", "int8_df"),
                    "int8_bf16_over_bf16": ratio(r, "bf16", "int8_bf16"),
                    "int8_pt_over_int8": ratio(r, "int8", "int8_pt"),
                    "variants": {
                        k: {"median_ms": v.median_ms, "samples_s": v.samples, "first_iteration_s": v.first_s,
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
