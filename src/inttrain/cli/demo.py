"""``inttrain demo``: the same small CNN on digits in fp32 and int8, compared.

Each recipe gets a fresh model from the same seed, the same data order and the
same step budget, so differences in accuracy and step time are the recipe's.
Whether integer kernels really ran is read from the kernel call counters
(``inttrain.kernels.int_kernel_calls()``) before and after each run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from inttrain.data import DatasetSplits, load_dataset
from inttrain.kernels import int_kernel_calls
from inttrain.models import build_model
from inttrain.trainer import train

__all__ = ["DemoRow", "run_demo", "format_table", "time_linear_layer", "format_layer_times", "bf16_is_native"]

MODEL = "small-cnn"
DATASET = "digits"


@dataclass
class DemoRow:
    recipe: str
    val_accuracy: float = math.nan
    time_per_step: float = math.nan  # seconds (median)
    int_calls: int = 0  # integer kernel launches during this recipe's run


def _total_calls() -> int:
    return sum(int_kernel_calls().values())


def run_demo(
    recipes: Sequence[str] = ("fp32", "int8"),
    epochs: int = 4,
    batch_size: int = 32,
    lr: float = 0.05,
    seed: int = 0,
    log: Callable[[str], Any] = print,
    splits: DatasetSplits | None = None,
) -> list[DemoRow]:
    splits = splits or load_dataset(DATASET, seed=seed)
    steps = len(splits.train) // batch_size
    log(
        f"inttrain demo: {MODEL} on {DATASET} ({len(splits.train)} train / {len(splits.val)} val), "
        f"{epochs} epochs x {steps} steps, batch {batch_size}, lr {lr}, seed {seed}, "
        f"{torch.get_num_threads()} thread(s)"
    )
    rows = []
    for recipe in recipes:
        row = DemoRow(recipe)
        rows.append(row)
        torch.manual_seed(seed)
        model = build_model(MODEL, splits.num_classes, splits.in_channels, splits.image_size)
        before = _total_calls()
        result = train(model, splits, recipe, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, log=lambda s: None)
        after = _total_calls()
        row.val_accuracy, row.time_per_step = result.val_accuracy, result.time_per_step
        # Someone may reset the counters mid-run; then `after` alone is the count.
        row.int_calls = after - before if after >= before else after
        log(f"  {recipe}: val_acc {row.val_accuracy:.4f}, {row.time_per_step * 1e3:.2f} ms/step")
    return rows


def _kernels_cell(row: DemoRow) -> str:
    return f"yes ({row.int_calls} calls)" if row.int_calls > 0 else "no"


def format_table(rows: Sequence[DemoRow]) -> str:
    base = next((r.time_per_step for r in rows if r.recipe == "fp32"), math.nan)
    header = ("recipe", "val acc", "ms/step", "speed vs fp32", "integer kernels ran")
    body = []
    for r in rows:
        ran = not math.isnan(r.time_per_step)
        body.append(
            (
                r.recipe,
                f"{r.val_accuracy:.4f}" if ran else "-",
                f"{r.time_per_step * 1e3:.2f}" if ran else "-",
                f"{base / r.time_per_step:.2f}x" if ran and not math.isnan(base) else "-",
                _kernels_cell(r),
            )
        )
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in (header, *body)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("speed vs fp32 = fp32 time per step / recipe time per step (>1 is faster)")
    return "\n".join(lines)


def time_linear_layer(size: int = 2048, iters: int = 3) -> dict[str, float]:
    """Median fwd+bwd seconds of one ``nn.Linear(size, size)`` on ``size`` tokens: fp32, bf16 autocast, int8.

    The digits CNN above is far too small for int8 kernels to pay off (fixed per-call costs dominate);
    this shows the same comparison where the GEMMs dominate.  ``benchmarks/speed.py`` is the full benchmark.
    bf16 is left out where oneDNN has no bf16 kernels for this CPU (an AVX2-only CPU: it emulates them, 20-30x
    slower than fp32 -- minutes at the default size, for a figure nobody would train with).
    """
    import statistics
    import time

    import inttrain

    torch.manual_seed(0)
    x = torch.randn(size, size)
    dy = torch.randn(size, size)
    times: dict[str, float] = {}
    for recipe in ("fp32", "bf16", "int8") if bf16_is_native() else ("fp32", "int8"):
        layer = torch.nn.Linear(size, size)
        if recipe == "int8":
            inttrain.prepare_(layer, "int8")
        xr = x.clone().requires_grad_()

        def step() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe == "bf16"):
                y = layer(xr)
            y.backward(dy.to(y.dtype))

        step()  # warm-up (compiles int8's fused quantize passes on first use)
        samples = []
        for _ in range(iters):
            t0 = time.perf_counter()
            step()
            samples.append(time.perf_counter() - t0)
        times[recipe] = statistics.median(samples)
    return times


def bf16_is_native() -> bool:
    """Whether oneDNN has bf16 kernels for this CPU (else bf16 autocast runs emulated, far slower than fp32)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def format_layer_times(times: dict[str, float], size: int) -> str:
    fp32 = times["fp32"]
    cells = ", ".join(f"{r} {t * 1e3:.0f} ms ({fp32 / t:.2f}x)" for r, t in times.items())
    if "bf16" not in times:
        cells += ", bf16 not timed (no bf16 kernels for this CPU)"
    return f"one Linear layer, {size} tokens x {size} -> {size}, fwd+bwd: {cells}  (ratio vs fp32, >1 is faster)"

