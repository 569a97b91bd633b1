"""Which quantizer costs a recipe its accuracy: short paired runs, one transform toggled at a time (issue 16).

    python benchmarks/short_ablation.py --data ../shared/data/cifar10_train20k.npz --group dorefa --epochs 6
    python benchmarks/short_ablation.py --data ../shared/data/cifar10_train20k.npz --group wageubn --epochs 5

ResNet-20 (seed-``--seed`` initial weights, the same for every variant) on the first ``--train-size`` images of a
seed-0 permutation of the file, normalised by the channel statistics of its first ``--val-start`` (16000);
validated on the ``--val-size`` (1000) images from there on; batch 128, SGD momentum 0.9, weight decay 5e-4,
OneCycle to a peak of 0.1, crop-flip, the same batches and crops for every variant.  One JSON row per variant
and epoch is appended to ``OUT/results.jsonl``.

Groups:

- ``dorefa`` (SGD nesterov, OneCycle cycling the momentum as torch's default): ``fp32``, and DoReFa-8's
  quantizers in float simulation (``F.conv2d`` on the quantized values: the recipe's integer GEMMs multiply the
  same values exactly, see :mod:`inttrain.recipes.dorefa`), first and last layer float: ``dorefa`` (as
  published: the input clipped to [0, 1] before Eq. 11), ``dorefa-max`` (divided by its maximum instead),
  ``dorefa-no-act`` (no activation quantizer), ``dorefa-no-grad`` (no gradient quantizer).
- ``wageubn`` (SGD without nesterov and momentum not cycled, as WageubnSGD): ``fp32``, ``wageubn-gsr`` (the
  recipe with stochastic errors and weight gradients, on its integer kernels) and ``wageubn-gsr-float-bn`` (the
  same with float batch norm).

Short runs only say where a gap opens early, not how large it is after a full budget.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import accuracy_full  # noqa: E402,F401 - puts src/ on the path when needed

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

GROUPS = {"dorefa": ("fp32", "dorefa", "dorefa-max", "dorefa-no-act", "dorefa-no-grad"),
          "wageubn": ("fp32", "wageubn-gsr", "wageubn-gsr-float-bn")}


def load(path: str, train_size: int, val_start: int, val_size: int) -> tuple[torch.Tensor, ...]:
    from inttrain.data.npz import load_npz_arrays

    arrays = load_npz_arrays(Path(path))  # the library's judgement of the file (DataError names what is wrong)
    x, y = arrays.x_train, arrays.y_train
    if len(x) < val_start + val_size or x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"--data {path}: expected >= {val_start + val_size} NHWC RGB images, got shape {x.shape}")
    perm = np.random.default_rng(0).permutation(len(x))
    xt = torch.tensor(x[perm]).permute(0, 3, 1, 2).float() / 255
    stats = xt[:val_start]
    xt = (xt - stats.mean((0, 2, 3), keepdim=True)) / stats.std((0, 2, 3), keepdim=True)
    yt = torch.tensor(y[perm])
    val = slice(val_start, val_start + val_size)
    return xt[:train_size], yt[:train_size], xt[val], yt[val]


class _DoReFaGrad(torch.autograd.Function):
    """Identity forward; Eq. 12 on the output gradient (per-tensor maximum, as the recipe)."""

    @staticmethod
    def forward(ctx, t, seed):
        ctx.seed = seed
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        from inttrain.recipes.dorefa import dorefa_gradient

        return dorefa_gradient(g, 8, ctx.seed), None


def simulate_dorefa(model: nn.Module, activation: str | None, gradients: bool, step: list[int]) -> None:
    """DoReFa-8 in float on every Conv2d/Linear but the first and last (``activation``: None, "clip" or "max")."""
    from inttrain.recipes.dorefa import dorefa_activation, dorefa_weight

    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    for m in layers[1:-1]:
        plain = m.forward

        def forward(x, m=m, plain=plain):
            a = x if activation is None else dorefa_activation(x, 8, activation)
            w = dorefa_weight(m.weight, 8)
            out = (F.conv2d(a, w, m.bias, m.stride, m.padding, m.dilation, m.groups) if isinstance(m, nn.Conv2d)
                   else F.linear(a, w, m.bias))
            return _DoReFaGrad.apply(out, step[0]) if gradients else out

        m.forward = forward


def build(variant: str, group: str, seed: int, step: list[int]) -> tuple[nn.Module, torch.optim.Optimizer]:
    import inttrain
    from inttrain.models import build_model
    from inttrain.recipes import WageubnConfig
    from inttrain.spec import Rounding

    torch.manual_seed(seed)
    model = build_model("resnet20", 10, 3, 32)
    if variant.startswith("dorefa"):
        activation = {"dorefa-max": "max", "dorefa-no-act": None}.get(variant, "clip")
        simulate_dorefa(model, activation, variant != "dorefa-no-grad", step)
    if variant.startswith("wageubn"):
        cfg = WageubnConfig(e_rounding=Rounding.STOCHASTIC, g_rounding=Rounding.STOCHASTIC)
        if variant.endswith("float-bn"):
            @dataclasses.dataclass(frozen=True)
            class FloatBnWageubn(WageubnConfig):
                def convert_norms_(self, model: nn.Module) -> nn.Module:
                    return model  # keep torch's BatchNorm2d

            cfg = FloatBnWageubn(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
        inttrain.prepare_(model, cfg)
        return model, cfg.optimizer_for(model, "sgd", 0.1, momentum=0.9, weight_decay=5e-4)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4,
                                  nesterov=group == "dorefa")


def run(variant: str, group: str, data: tuple[torch.Tensor, ...], seed: int, epochs: int) -> list[dict[str, Any]]:
    from inttrain.trainer.augment import augment_batch

    xtr, ytr, xva, yva = data
    step = [0]  # the global step: the crops' and the gradient noise's seed
    model, opt = build(variant, group, seed, step)
    steps_per = math.ceil(len(xtr) / 128)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, total_steps=steps_per * epochs,
                                                cycle_momentum=group == "dorefa")
    order_gen, rows, t0 = torch.Generator().manual_seed(seed), [], time.time()
    for epoch in range(epochs):
        model.train()
        order, total = torch.randperm(len(xtr), generator=order_gen), 0.0
        for i in range(steps_per):
            idx = order[i * 128:(i + 1) * 128]
            loss = F.cross_entropy(model(augment_batch(xtr[idx], "crop-flip", seed, step[0])), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step[0] += 1
            total += loss.item()
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(xva[j:j + 250]).argmax(1) == yva[j:j + 250]).sum())
                          for j in range(0, len(xva), 250))
        rows.append({"group": group, "variant": variant, "seed": seed, "epoch": epoch + 1,
                     "train_loss": round(total / steps_per, 4), "val_accuracy": correct / len(xva),
                     "seconds": round(time.time() - t0)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="cifar10_train20k.npz (x uint8 NHWC, y).")
    p.add_argument("--group", choices=tuple(GROUPS), required=True)
    p.add_argument("--variants", help="Comma-separated subset of the group's variants. [all]")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--train-size", type=int, default=4000)
    p.add_argument("--val-start", type=int, default=16000)
    p.add_argument("--val-size", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="benchmarks/results/short_ablation")
    args = p.parse_args(argv)
    names = GROUPS[args.group] if not args.variants else tuple(args.variants.split(","))
    unknown = [v for v in names if v not in GROUPS[args.group]]
    sizes = ("epochs", "train_size", "threads", "val_start", "val_size")
    problem = (f"--variants: {', '.join(unknown)} not in group {args.group} ({', '.join(GROUPS[args.group])})"
               if unknown else next((f"--{k.replace('_', '-')}: {getattr(args, k)} must be >= 1"
                                     for k in sizes if getattr(args, k) < 1), None))
    if problem is None and args.seed < 0:
        problem = f"--seed: {args.seed} must be >= 0"
    try:
        if problem is not None:
            raise ValueError(problem)
        if args.train_size > args.val_start:
            raise ValueError(f"--train-size: {args.train_size} overlaps the validation images (at most --val-start "
                             f"{args.val_start})")
        data = load(args.data, args.train_size, args.val_start, args.val_size)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for variant in names:
        rows = run(variant, args.group, data, args.seed, args.epochs)
        with open(out / "results.jsonl", "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
