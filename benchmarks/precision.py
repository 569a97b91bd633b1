"""Precision policies on the integer kernels: static 8-bit, CPT 3-8, FracTrain PFQ, DFQ (and PFQ + DFQ).

Every policy trains the same model from the same initialisation on the same data order and budget (int8
recipe: forward, input-gradient and weight-gradient GEMMs on int8 kernels), and the table reports final /
best validation accuracy, training GBitOPs (all three GEMMs, measured by ``inttrain.cost.BitOpsCounter``
from the bits each layer actually ran), the ratio to static 8-bit, the Horowitz (ISSCC 2014, 45 nm) energy
estimate of the GEMM MACs and wall time.  Fewer bits than 8 do *not* run faster on this CPU (they use the
same int8 kernels): BitOPs and energy are the hardware-independent measures; wall time only shows overhead.

    python benchmarks/precision.py --data ../shared/data/cifar10_train20k.npz --train-size 10000 \\
        --val-size 2000 --epochs 3 --threads 1 --out benchmarks/results/precision

Writes ``OUT/results.md`` (the table and the command), ``OUT/results.json`` and ``OUT/bits.png`` (forward
bits per step of every policy; for DFQ the MAC-weighted mean over the layers).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

import inttrain
from inttrain.cost import BitOpsCounter
from inttrain.data import load_dataset
from inttrain.models import build_model
from inttrain.recipes.fractrain_dfq import DFQConfig, attach_dfq, forward_cost_ratio
from inttrain.schedules import CPT, PFQ, PrecisionScheduler, model_bits
from inttrain.trainer import TrainHooks, train

POLICIES = ("static8", "cpt", "pfq", "dfq", "fractrain", "dfq-batch", "fractrain-batch")


class BitsLog(TrainHooks):
    """Records the forward bits in force at every step."""

    def __init__(self, model: Any, scheduler: Any) -> None:
        self.model, self.scheduler, self.bits = model, scheduler, []

    def on_step(self, state: Any, loss: float | None, lr: float, seconds: float) -> None:
        bits = self.scheduler.bits if self.scheduler is not None else model_bits(self.model)
        self.bits.append(float(bits[0]))


def subset(ds: TensorDataset, n: int | None) -> TensorDataset:
    return ds if n is None or n >= len(ds) else TensorDataset(*(t[:n] for t in ds.tensors))


def make_scheduler(policy: str, model: Any, args: argparse.Namespace, total: int) -> Any:
    # dfq / fractrain: per-sample gates (the default); *-batch: one decision per layer and batch.
    dfq = DFQConfig(target_cost=args.target_cost, cost_weight=args.cost_weight, seed=args.seed,
                    per_sample=not policy.endswith("-batch"))
    policy = policy.removesuffix("-batch")
    if policy == "static8":
        return None
    if policy == "cpt":
        return PrecisionScheduler(model, CPT(3, 8, args.cpt_cycles, total, grad_bits=8))
    if policy == "pfq":
        return PrecisionScheduler(model, PFQ(threshold=args.pfq_threshold, window=args.pfq_window))
    if policy == "dfq":
        return attach_dfq(model, dfq)
    return attach_dfq(model, dfq, cap=PFQ(threshold=args.pfq_threshold, window=args.pfq_window))


def run_policy(policy: str, splits: Any, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    model = build_model(args.model, splits.num_classes, splits.in_channels, splits.image_size)
    inttrain.prepare_(model, "int8")
    steps_per_epoch = max(1, len(splits.train) // args.batch_size)
    sched = make_scheduler(policy, model, args, steps_per_epoch * args.epochs)
    counter = BitOpsCounter(model)
    hooks = BitsLog(model, sched)
    t0 = time.perf_counter()
    result = train(model, splits, "int8", epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                   seed=args.seed, log=log, prepared=True, hooks=hooks, precision_scheduler=sched,
                   cost_counter=counter, augment=args.augment, progress=False)
    wall = time.perf_counter() - t0
    counter.detach()
    return {
        "policy": policy, "final_val_acc": result.val_accuracy, "best_val_acc": max(result.val_accuracies),
        "gbitops": counter.bitops / 1e9, "energy_mj": counter.total("energy_pj") / 1e9,
        "forward_cost_ratio": forward_cost_ratio(counter), "wall_s": wall, "steps": result.steps,
        "ms_per_step": result.time_per_step * 1e3, "bits": hooks.bits,
        "switch_steps": list(getattr(getattr(sched, "schedule", getattr(sched, "cap", None)), "switch_steps", []) or []),
    }


def table(rows: list[dict[str, Any]]) -> str:
    ref = next((r["gbitops"] for r in rows if r["policy"] == "static8"), float("nan"))
    ref_e = next((r["energy_mj"] for r in rows if r["policy"] == "static8"), float("nan"))
    lines = ["| policy | final val acc | best val acc | GBitOPs | / static 8-bit | fwd BitOPs / 8-bit | energy mJ "
             "| energy / static 8-bit | wall s | ms/step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {100 * r['final_val_acc']:.2f}% | {100 * r['best_val_acc']:.2f}% | {r['gbitops']:.1f} "
            f"| {r['gbitops'] / ref:.3f} | {r['forward_cost_ratio']:.3f} | {r['energy_mj']:.2f} | {r['energy_mj'] / ref_e:.3f} "
            f"| {r['wall_s']:.0f} | {r['ms_per_step']:.1f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for r in rows:
        ax.plot(range(1, len(r["bits"]) + 1), r["bits"], label=r["policy"], linewidth=1)
    ax.set_xlabel("training step")
    ax.set_ylabel("forward bits (DFQ: MAC-weighted mean)")
    ax.set_ylim(2, 8.5)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help=".npz file (CIFAR-style); without it: scikit-learn digits")
    ap.add_argument("--dataset", default=None, help="inttrain dataset name (default: cifar10 with --data, else digits)")
    ap.add_argument("--model", default="small-cnn")
    ap.add_argument("--train-size", type=int, default=None, help="first N training images (default: all)")
    ap.add_argument("--val-size", type=int, default=None, help="first N held-out images (default: all)")
    ap.add_argument("--val-fraction", type=float, default=0.1, help="held out of the training file")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--augment", default="none")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--policies", default="static8,cpt,pfq,dfq", help=f"comma-separated, of {', '.join(POLICIES)}")
    ap.add_argument("--cpt-cycles", type=int, default=8)
    ap.add_argument("--pfq-window", type=int, default=20)
    ap.add_argument("--pfq-threshold", type=float, default=0.05)
    ap.add_argument("--target-cost", type=float, default=0.5, help="DFQ: target forward BitOPs / static 8-bit")
    ap.add_argument("--cost-weight", type=float, default=5.0, help="DFQ: weight of the cost regulariser")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/precision"))
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        ap.error(f"--policies: {bad or policies!r} not in {', '.join(POLICIES)}")
    torch.set_num_threads(args.threads)
    dataset = args.dataset or ("cifar10" if args.data else "digits")
    splits = load_dataset(dataset, args.data, args.val_fraction, seed=args.seed)
    splits = dataclasses.replace(splits, train=subset(splits.train, args.train_size), val=subset(splits.val, args.val_size))
    args.out.mkdir(parents=True, exist_ok=True)
    logf = open(args.out / "log.txt", "w")

    def log(line: str) -> None:
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    log(f"{args.model} on {dataset} ({args.data or 'built in'}): {len(splits.train)} train / {len(splits.val)} val, "
        f"{args.epochs} epochs, batch {args.batch_size}, lr {args.lr}, seed {args.seed}, {args.threads} thread(s)")
    # Warm-up (torch.compile of the fused quantize passes) so that the first policy's wall time is not inflated.
    warm = build_model(args.model, splits.num_classes, splits.in_channels, splits.image_size)
    inttrain.prepare_(warm, "int8")
    train(warm, splits, "int8", epochs=1, batch_size=args.batch_size, lr=args.lr, seed=args.seed, log=lambda s: None,
          prepared=True, max_steps=3, progress=False)
    rows = []
    for policy in policies:
        log(f"== {policy}")
        rows.append(run_policy(policy, splits, args, log))
        r = rows[-1]
        log(f"   {policy}: final {r['final_val_acc']:.4f} best {r['best_val_acc']:.4f} GBitOPs {r['gbitops']:.1f} "
            f"fwd ratio {r['forward_cost_ratio']:.3f} wall {r['wall_s']:.0f} s")
        (args.out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    md = [
        "# Precision policies on the integer kernels", "",
        f"`python benchmarks/precision.py {' '.join(sys.argv[1:] if argv is None else argv)}`", "",
        f"{args.model} on {dataset}: {len(splits.train)} train / {len(splits.val)} held-out val images, "
        f"{args.epochs} epochs, batch {args.batch_size}, SGD lr {args.lr} momentum 0.9, seed {args.seed}, "
        f"{args.threads} thread(s), torch {torch.__version__}.  Same init, data order and budget for every policy.", "",
        table(rows), "",
        "GBitOPs: all three GEMMs of every integer layer (MACs x bits_a x bits_b), from the bits each layer ran. "
        "fwd BitOPs / 8-bit: forward GEMMs only (what the DFQ target refers to). Energy: Horowitz ISSCC 2014 "
        "(45 nm) per MAC, GEMMs only. On this CPU fewer bits than 8 run on the same int8 kernels, so wall time "
        "does not drop; DFQ adds the gates and an elementwise multiply of each gated layer's output. Wall times "
        "come from one run on a shared CPU and vary with the load of other processes: compare GBitOPs, not times.",
        "",
        "CPT: 3-8 forward bits, 8 gradient bits, "
        f"{args.cpt_cycles} cycles. PFQ: stages 3/4/6/8 forward, 6/6/8/8 gradient, window {args.pfq_window} steps, "
        f"threshold {args.pfq_threshold}"
        + "".join(f" ({r['policy']}: stage switches at steps {r['switch_steps']})" for r in rows
                  if r["policy"] in ("pfq", "fractrain"))
        + f". DFQ: gate options 4/6/8, 8 gradient bits, target {args.target_cost}, cost weight {args.cost_weight}; "
        "dfq / fractrain decide per input sample (each gated layer runs one integer call per width present), "
        "dfq-batch / fractrain-batch one decision per layer per batch; sampled (straight-through Gumbel-softmax) "
        "while training, so the mean bits in the plot jump from step to step. fractrain: PFQ's stage caps the DFQ options and sets the "
        "gradient bits. One seed, one run each: accuracy differences of a few points are within run-to-run noise "
        "at this budget.",
        "", "![bits per step](bits.png)", "",
    ]
    (args.out / "results.md").write_text("\n".join(md))
    plot(rows, args.out / "bits.png")
    log(table(rows))
    logf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
