"""Accuracy of every recipe against fp32 and bf16 on a CNN over a real dataset: same seed, data and budget.

    python benchmarks/accuracy.py --data ../shared/data/cifar10_train20k.npz --train-size 8000 --val-size 2000 \\
        --epochs 4 --out benchmarks/results/accuracy

Each recipe trains a freshly built model (same seed: same initial weights, same data order and augmentation)
with the trainer's own ``inttrain.trainer.train`` (so ``unified-int8`` gets DCLR, ``wageubn`` WageubnSGD and
8-bit BN, ``sbm`` Range BN, exactly as ``inttrain train --recipe R`` does).  ``--val-size`` images are held
out of the file (seeded), the first ``--train-size`` of the rest are trained on.  Writes into ``--out``:

- ``accuracy.md``: final and best val accuracy, gap to fp32, training seconds per epoch, the fraction of one
  training step's GEMM multiply-accumulates that run on integer kernels (forward, input-gradient and
  weight-gradient GEMMs of every Linear/Conv2d, counted from their run-time shapes with
  ``inttrain.cost.gemm_macs``), and the integer kernel launches per step (``inttrain.kernels`` counters);
- ``accuracy.png``: val accuracy per epoch per recipe; ``accuracy.json``: every number.

The report is rewritten after every recipe, so an interrupted run leaves the finished rows behind.
Recipes with an identical config (``int8`` and its alias ``int8-mixed``) train once and share the row.
``dorefa`` runs with k = 7 by default: a k-bit DoReFa value is a (k+1)-bit signed GEMM code, and k = 7 keeps
the convolutions on the int8 kernels (``--dorefa-bits``; wider codes run exactly, split into int8 halves).  ``integer-only`` (NITI-style, its own engine and
optimizer) is attempted with ``inttrain.recipes.integer_only.convert``; a model it cannot convert is skipped
with the converter's reason.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

try:
    import inttrain
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    import inttrain
from inttrain.cost import gemm_macs
from inttrain.data import DatasetSplits, load_dataset
from inttrain.kernels import int_kernel_calls, reset_kernel_calls
from inttrain.models import MODEL_NAMES, build_model
from inttrain.nn import QConv2d, QLinear
from inttrain.trainer import apply_recipe, train

DEFAULT_RECIPES = (*dict.fromkeys(("fp32", "bf16", *inttrain.recipe_names())), "integer-only")


@dataclass
class RecipeResult:
    """One row of the report (``skipped`` holds the reason when the recipe did not train)."""

    recipe: str
    config: str = ""
    val_accuracies: list[float] = field(default_factory=list)
    train_losses: list[float] = field(default_factory=list)
    seconds_per_epoch: float = math.nan  # training steps only (evaluation excluded), mean over epochs
    step_ms: float = math.nan  # median seconds per step
    integer_fraction: float = math.nan  # integer MACs / all GEMM MACs of one training step
    kernels_per_step: float = math.nan
    skipped: str = ""
    same_as: str = ""  # trained once under this name (identical config)

    @property
    def final(self) -> float:
        return self.val_accuracies[-1] if self.val_accuracies else math.nan

    @property
    def best(self) -> float:
        return max(self.val_accuracies) if self.val_accuracies else math.nan


def is_float(name: str) -> bool:
    """A float baseline (fp32, bf16): the recipe converts no layer."""
    return not inttrain.get_config(name).converts_layers()


def recipe_config(name: str, dorefa_bits: int) -> Any:
    """What the trainer gets for ``name`` (None: the name itself)."""
    if is_float(name):
        return None
    if name == "dorefa":
        from inttrain.recipes import DoReFaConfig

        return DoReFaConfig(w_bits=dorefa_bits, a_bits=dorefa_bits, g_bits=dorefa_bits)
    return inttrain.get_config(name)


def integer_gemm_fraction(model: nn.Module, x: torch.Tensor) -> float:
    """Fraction of the GEMM MACs of one forward + backward on ``x`` that run on integer kernels.

    Every Linear/Conv2d counts its forward GEMM, its input-gradient GEMM when its input needs a gradient and
    its weight-gradient GEMM when its weight does (``gemm_macs``: the three have equal MACs); a GEMM is
    integer when the layer is a QLinear/QConv2d whose precision marks that GEMM ``integer``.
    """
    totals = {"int": 0, "all": 0}
    handles = []

    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        macs = gemm_macs(module, args[0].shape, output.shape)
        prec = module.precision if isinstance(module, (QLinear, QConv2d)) else None
        gemms = [("forward", True)]
        if output.requires_grad:
            gemms += [("grad_input", args[0].requires_grad), ("grad_weight", module.weight.requires_grad)]
        for gemm, runs in gemms:
            if runs:
                totals["all"] += macs
                totals["int"] += macs if prec is not None and getattr(prec, gemm).integer else 0

    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            handles.append(m.register_forward_hook(hook))
    try:
        model.train()
        model(x).float().square().mean().backward()
    finally:
        for h in handles:
            h.remove()
    return totals["int"] / totals["all"] if totals["all"] else math.nan


def fail(message: str) -> None:
    """One ``error:`` line on stderr and exit status 2 (a benchmark's bad input: no traceback)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def load_splits(dataset: str, data: str, train_size: int, val_size: int, seed: int) -> DatasetSplits:
    """Hold ``val_size`` images out of the file (seeded), keep the first ``train_size`` of the rest.  A file the
    library's loader refuses (missing, not an .npz, malformed) or sizes that do not fit end in :func:`fail`."""
    from inttrain.data.npz import load_npz_arrays
    from inttrain.spec.errors import InttrainError

    try:
        total = len(load_npz_arrays(Path(data)).x_train)  # judged (headers, sizes) before any array is read
        if val_size < 1 or train_size < 1 or val_size + train_size > total:
            fail(f"--train-size {train_size} + --val-size {val_size} must be >= 1 each and fit the "
                 f"{total} images of {data}")
        splits = load_dataset(dataset, data, val_fraction=val_size / total, seed=seed)
    except InttrainError as e:
        fail(f"--data {data}: {e}")
    xt, yt = splits.train.tensors
    xv, yv = splits.val.tensors
    splits.train = TensorDataset(xt[:train_size], yt[:train_size])
    splits.val = TensorDataset(xv[:val_size], yv[:val_size])
    return splits


def integer_only_reason(model_name: str, splits: DatasetSplits) -> str:
    """Why ``integer-only`` is not run on this model (it has its own engine; see the module docstring)."""
    from inttrain.recipes.integer_only import convert

    model = build_model(model_name, splits.num_classes, splits.in_channels, splits.image_size)
    try:
        convert(model, input_shape=[splits.in_channels, splits.image_size, splits.image_size])
    except (TypeError, ValueError) as e:
        return f"integer_only.convert cannot take {model_name}: {e}"
    return (f"{model_name} converts, but integer-only trains with its own integer SGD and loop "
            "(inttrain.integer_only), not the trainer this benchmark compares; not run here")


def run_recipe(name: str, args: argparse.Namespace, splits: DatasetSplits, log: Any) -> RecipeResult:
    cfg = recipe_config(name, args.dorefa_bits)
    res = RecipeResult(name, config=repr(cfg) if cfg is not None else name)
    # The integer fraction, measured on a separate model so the trained one's counters stay untouched.
    torch.manual_seed(args.seed)
    probe = build_model(args.model, splits.num_classes, splits.in_channels, splits.image_size)
    apply_recipe(probe, cfg if cfg is not None else name)
    res.integer_fraction = 0.0 if is_float(name) else integer_gemm_fraction(probe, splits.train.tensors[0][:8])
    torch.manual_seed(args.seed)
    model = build_model(args.model, splits.num_classes, splits.in_channels, splits.image_size)
    reset_kernel_calls()
    result = train(model, splits, name, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                   log=log, progress=False, recipe_config=cfg, augment=args.augment)
    res.val_accuracies = [float(a) for a in result.val_accuracies]
    res.train_losses = [float(v) for v in result.train_losses]
    res.seconds_per_epoch = statistics.mean(e.seconds for e in result.epochs)
    res.step_ms = result.time_per_step * 1e3
    res.kernels_per_step = sum(int_kernel_calls().values()) / max(result.steps, 1)
    return res


def _pct(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{100 * v:.2f}%"


def format_table(results: list[RecipeResult], title: str, notes: list[str]) -> str:
    """The markdown report: one row per recipe, gap = final accuracy - fp32 final accuracy (points)."""
    base = next((r for r in results if r.recipe == "fp32" and not r.skipped), None)
    head = ("recipe", "final val acc", "best val acc", "gap to fp32 (final)", "s/epoch (train)", "ms/step",
            "integer GEMM MACs", "int kernels/step")
    lines = [f"# {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if r.skipped:
            lines.append(f"| {r.recipe} | skipped: {r.skipped} |" + " |" * (len(head) - 2))
            continue
        gap = "-" if base is None or r.recipe == "fp32" else f"{100 * (r.final - base.final):+.2f}"
        name = r.recipe + (f" (= {r.same_as})" if r.same_as else "")
        lines.append(
            f"| {name} | {_pct(r.final)} | {_pct(r.best)} | {gap} | {r.seconds_per_epoch:.1f} | {r.step_ms:.1f} | "
            f"{_pct(r.integer_fraction) if math.isfinite(r.integer_fraction) else '-'} | {r.kernels_per_step:.1f} |"
        )
    lines += ["", *notes]
    return "\n".join(lines) + "\n"


def plot(results: list[RecipeResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        if r.val_accuracies and not r.same_as:
            ax.plot(range(1, len(r.val_accuracies) + 1), [100 * a for a in r.val_accuracies], marker="o", label=r.recipe)
    ax.set(xlabel="epoch", ylabel="val accuracy (%)")
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(results: list[RecipeResult], out: Path, title: str, notes: list[str], meta: dict[str, Any]) -> None:
    """accuracy.md, accuracy.png and accuracy.json in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "accuracy.md").write_text(format_table(results, title, notes))
    plot(results, out / "accuracy.png", title)
    rows = [{**vars(r), "final": r.final, "best": r.best} for r in results]
    clean = json.loads(json.dumps({"meta": meta, "results": rows}, default=str).replace("NaN", "null"))
    (out / "accuracy.json").write_text(json.dumps(clean, indent=1) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", help="Data file (e.g. ../shared/data/cifar10_train20k.npz); required unless --report-only.")
    p.add_argument("--dataset", default="cifar10", help="Loader for --data (inttrain.data names). [cifar10]")
    p.add_argument("--model", default="resnet20", choices=MODEL_NAMES, help="Model. [resnet20]")
    p.add_argument("--train-size", type=int, default=8000)
    p.add_argument("--val-size", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--augment", default="crop-flip", help="none or crop-flip. [crop-flip]")
    p.add_argument("--recipes", default=",".join(DEFAULT_RECIPES), help="Comma-separated. [all]")
    p.add_argument("--dorefa-bits", type=int, default=7, help="DoReFa k for weights/activations/gradients. [7]")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/accuracy")
    p.add_argument("--report-only", action="store_true",
                   help="Rewrite accuracy.md/.png from --out's accuracy.json (no training); --data is ignored.")
    args = p.parse_args(argv)
    if not args.data and not args.report_only:
        p.error("--data is required (a data file such as ../shared/data/cifar10_train20k.npz)")
    args.recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    from inttrain.cli.checks import allowed_recipes

    allowed = (*allowed_recipes(), *inttrain.recipes.OTHER_ENGINES)
    bad = [r for r in args.recipes if r not in allowed]
    if bad or not args.recipes:
        p.error(f"--recipes: {', '.join(bad) or 'none given'}: allowed {', '.join(allowed)}")
    return args


def rerender(out: Path) -> list[RecipeResult]:
    """Rewrite the report from ``out/accuracy.json`` with this script's current notes (no training)."""
    data = json.loads((out / "accuracy.json").read_text())
    names = {f for f in RecipeResult.__dataclass_fields__}
    nan = lambda v: math.nan if v is None else v  # noqa: E731
    results = [RecipeResult(**{k: nan(v) for k, v in row.items() if k in names}) for row in data["results"]]
    meta = data["meta"]
    title, notes = _title_and_notes(argparse.Namespace(**meta), len_train=meta["train_size"], len_val=meta["val_size"])
    write_report(results, out, title, notes, meta)
    return results


def _title_and_notes(args: argparse.Namespace, len_train: int, len_val: int) -> tuple[str, list[str]]:
    title = (f"{args.model} on {Path(args.data).name}: {len_train} train / {len_val} val, "
             f"{args.epochs} epochs, batch {args.batch_size}, lr {args.lr}")
    notes = [
        f"Same seed ({args.seed}), initial weights, data order and augmentation ({args.augment}) for every recipe; "
        f"SGD momentum 0.9, constant lr; {args.threads} thread(s), torch {torch.__version__}.",
        "Each recipe trains as `inttrain train --recipe R` would (inttrain.trainer.train): unified-int8 with DCLR, "
        "wageubn with WageubnSGD and 8-bit BN, sbm with Range BN.",
        f"dorefa: k = {args.dorefa_bits} for weights, activations and gradients (8-bit signed GEMM codes), first "
        "and last layer float as in the paper.",
        "s/epoch: training steps only (evaluation excluded), mean over epochs (the first includes kernel "
        "compilation); ms/step: median step.",
        "integer GEMM MACs: share of one training step's forward, input-gradient and weight-gradient "
        "multiply-accumulates (all Linear/Conv2d) that run on integer kernels.",
        "Single runs at a small budget: differences of about a point are within seed noise.",
        "Recipes train one after another: on a shared machine each row's times also reflect the load of the "
        "moment (accuracy.log has every epoch's timestamps); compare times only from runs on an idle machine.",
    ]
    return title, notes


def main(argv: list[str] | None = None) -> list[RecipeResult]:
    args = parse_args(argv)
    if args.report_only:
        return rerender(Path(args.out))
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    splits = load_splits(args.dataset, args.data, args.train_size, args.val_size, args.seed)
    title, notes = _title_and_notes(args, len(splits.train), len(splits.val))
    meta = {k: v for k, v in vars(args).items()}
    out.mkdir(parents=True, exist_ok=True)
    log_file = open(out / "accuracy.log", "a")

    def log(line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(f"{stamp} {line}", flush=True)
        log_file.write(f"{stamp} {line}\n")
        log_file.flush()

    log(title)
    results: list[RecipeResult] = []
    trained: dict[str, RecipeResult] = {}
    for name in args.recipes:
        if name == "integer-only":
            res = RecipeResult(name, skipped=integer_only_reason(args.model, splits))
            log(f"== {name}: {res.skipped}")
        else:
            key = repr(recipe_config(name, args.dorefa_bits)) if not is_float(name) else name
            if key in trained:
                res = RecipeResult(**{**vars(trained[key]), "recipe": name, "same_as": trained[key].recipe})
                log(f"== {name}: same config as {trained[key].recipe}, not retrained")
            else:
                log(f"== {name}")
                t0 = time.perf_counter()
                try:
                    res = run_recipe(name, args, splits, lambda s: log(f"  {s}"))
                except Exception as e:  # noqa: BLE001 - one failing recipe must not lose the others' rows
                    res = RecipeResult(name, skipped=f"failed: {type(e).__name__}: {e}")
                trained[key] = res
                log(f"   {name}: final {_pct(res.final)}, best {_pct(res.best)}, {time.perf_counter() - t0:.0f} s in all")
        results.append(res)
        write_report(results, out, title, notes, meta)
    log(f"wrote {out / 'accuracy.md'}, {out / 'accuracy.png'}, {out / 'accuracy.json'}")
    log_file.close()
    print(format_table(results, title, notes))
    return results


if __name__ == "__main__":
    main()
