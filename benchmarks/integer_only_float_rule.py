"""An integer-only model's update rule in float: is integer-only's gap the arithmetic or the optimizer?

    python benchmarks/integer_only_float_rule.py INIT_DIR TRAIN.npz VAL.npz --out DIR [--rule norm|sgd]
        [--epochs 30] [--batch-size 128] [--seed 0] [--augment crop-flip]

INIT_DIR is a saved ``inttrain.micro`` model before training (an ``init/`` folder of a ``benchmarks/accuracy_full.py``
integer-only job), TRAIN.npz / VAL.npz micro's data files of that job.  The model's float32 twin (the same
layers, standard batch norm, initialized with the dequantized master weights; ``micro_vs_float.float_twin``) is
trained on the same batches in the same order with the same crops as ``python -m inttrain.micro train --seed SEED
--augment crop-flip`` (order ``default_rng(seed + epoch)``, crops ``default_rng((seed + epoch, step))``), on the
inputs' real values (codes * 2**x_exp), with

* ``--rule norm``: micro's update rule in float (docs/integer-training.md §7, the device CLI's defaults): each
  tensor's step is its gradient scaled so the largest element moves ``2**lr_bits`` codes at the tensor's initial
  exponent (``2**(bn_lr_bits)`` for batch-norm gamma / beta), times micro's cosine multiplier with a quarter-epoch
  warm-up; no momentum, no weight decay (``--momentum-shift``, ``--l2-shift``: micro's options), no rounding;
* ``--rule frozen``: the norm rule with each tensor's normalizer ``max|g|`` taken from its first step and kept, so
  later steps scale with the gradient as SGD's do (a per-tensor learning rate calibrated once);
* ``--rule relative``: each weight matrix / kernel's step scaled so its largest element moves ``2**-rel_bits`` of
  the tensor's *current* largest weight (rounded up to a power of two, as an integer ``bitlen`` gives), times the
  multiplier; batch-norm gamma / beta and biases keep the norm rule.  A constant angular step for the
  scale-invariant weights ahead of a batch norm, as SGD with weight decay settles into, where the norm rule's
  fixed step shrinks relative to weights that grow (LARS, You et al. 2017, Eq. 2, with max-norms and powers of two);
* ``--rule sgd``: SGD momentum 0.9 nesterov, weight decay 5e-4 (``--momentum``, ``--weight-decay``), lr ``--lr``
  times the same multiplier (the accuracy benchmark's fp32 optimizer on micro's schedule).

``--bn range`` swaps the twin's batch norm for micro's normalizer (docs/integer-training.md §4.2): each channel
divided by its batch range over ``2**gain_shift`` (micro's gain), the whole batch as one chunk, with the backward of
a standard batch norm (micro's: the range's value, the derivative of a standard deviation); ``std`` (default) keeps
torch's.

Against the integer-only job's row at the same seed it splits the gap: float with micro's rule vs integer
(the arithmetic), float with micro's rule vs float with SGD (the update rule).  The run folder holds
``state.pt`` (resumed after an interruption: rerun the same command) and ``history.json`` (loss, training and
held-out accuracy per epoch; held-out both with the batch norms' running statistics, ``val_acc``, and with each
256-image batch's own, ``val_acc_batch``, as micro evaluates).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

try:
    import inttrain  # noqa: F401
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from inttrain.micro.augment import augment_batch  # noqa: E402
from inttrain.micro.model import load_data, load_model  # noqa: E402
from inttrain.micro.optim import Schedule, default_bn_lr_bits  # noqa: E402
from micro_vs_float import float_twin  # noqa: E402

RULES = ("norm", "frozen", "relative", "sgd")
NORMS = ("std", "range")
NO_E = -(1 << 20)       # state.pt's "no frozen exponent yet"


def norm_rule_step(params: list[tuple[torch.nn.Parameter, int]], multiplier: int, l2: float = 0.0,
                   momentum_shift: int | None = None, momenta: dict[int, torch.Tensor] | None = None,
                   frozen: dict[int, int] | None = None, rel_bits: int | None = None) -> None:
    """micro's norm rule in float: ``p -= g * 2**(bits + exp0 - e) * m / 256`` with ``2**(e-1) <= max|g| < 2**e``
    (micro's ``bitlen`` of the integer gradient, in real units), per tensor; an all-zero gradient takes no step.
    ``l2``: ``g = grad + l2 * p`` first (micro's ``l2_shift``); ``momentum_shift`` M: the step is micro's momentum
    ``v = v - v * 2**-M + u`` (``momenta``: id(p) -> v, filled here).  ``frozen`` (id(p) -> e, filled here): each
    tensor keeps the ``e`` of its first non-zero gradient, so the rule is SGD with a per-tensor learning rate
    calibrated on the first step, and later steps shrink with the gradient as SGD's do.  ``rel_bits`` K: a tensor
    of two or more dimensions steps ``g * 2**(ew - K - e) * m / 256`` instead, ``2**(ew-1) <= max|p| < 2**ew``."""
    with torch.no_grad():
        for p, bits in params:
            g = p.grad + l2 * p if l2 else p.grad
            top = float(g.abs().max())
            if top == 0:
                continue
            e = math.frexp(top)[1] if frozen is None else frozen.setdefault(id(p), math.frexp(top)[1])
            if rel_bits is not None and p.dim() > 1:
                u = g * (2.0 ** (math.frexp(float(p.abs().max()))[1] - rel_bits - e) * multiplier / 256)
            else:
                u = g * (2.0 ** (bits + p.exp0 - e) * multiplier / 256)
            if momentum_shift is not None:
                v = momenta.setdefault(id(p), torch.zeros_like(p))
                v.sub_(v * 2.0 ** -momentum_shift).add_(u)
                u = v
            p.sub_(u)


class RangeValueBatchNorm2d(torch.nn.BatchNorm2d):
    """Batch norm normalised by ``range / 2**gain_shift`` (micro's value) with a standard batch norm's backward:
    the standard-deviation normalisation times the detached ratio std / (range / 2**gain_shift).  In training the
    running statistics track the mean and that normaliser squared, so eval mode uses the same normaliser."""

    gain_shift: int = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        mean = x.mean((0, 2, 3), keepdim=True)
        std = torch.sqrt(x.var((0, 2, 3), unbiased=False, keepdim=True) + self.eps)
        with torch.no_grad():
            norm = ((x.amax((0, 2, 3), keepdim=True) - x.amin((0, 2, 3), keepdim=True)) * 2.0 ** -self.gain_shift
                    ).clamp_min(self.eps)
            self.running_mean.lerp_(mean.flatten(), self.momentum)
            self.running_var.lerp_((norm * norm).flatten(), self.momentum)
        y = (x - mean) / std * (std / norm).detach()
        return y * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)


def micro_gain_shifts(layers: list) -> list[int]:
    """The ``gain_shift`` of every micro batch norm, in the twin's module order (a residual's block, then its
    shortcut)."""
    out = []
    for layer in layers:
        if hasattr(layer, "block"):
            out += micro_gain_shifts(layer.block) + micro_gain_shifts(layer.shortcut)
        elif hasattr(layer, "gain_shift"):
            out.append(int(layer.gain_shift))
    return out


def use_range_value_bn_(net: torch.nn.Module, gain_shifts: list[int]) -> None:
    """Swap ``net``'s BatchNorm2d modules (in order) for :class:`RangeValueBatchNorm2d` with ``gain_shifts``."""
    bns = [m for m in net.modules() if type(m) is torch.nn.BatchNorm2d]
    if len(bns) != len(gain_shifts):
        raise ValueError(f"{len(bns)} batch norms in the twin, {len(gain_shifts)} in the micro model")
    for m, s in zip(bns, gain_shifts):
        m.__class__ = RangeValueBatchNorm2d
        m.gain_shift = s


def accuracy(net: torch.nn.Module, x: np.ndarray, x_exp: int, y: np.ndarray, batch_statistics: bool) -> float:
    """Held-out accuracy with the batch norms' running statistics, or (``batch_statistics``) with each 256-image
    batch's own, as ``inttrain.micro`` evaluates (its batch norm keeps no running averages); the latter on a copy,
    so the running statistics stay the training's."""
    model = copy.deepcopy(net) if batch_statistics else net
    model.train(batch_statistics)
    with torch.no_grad():
        pred = torch.cat([model(torch.from_numpy(x[i:i + 256].astype(np.float32) * 2.0 ** x_exp)).argmax(1)
                          for i in range(0, len(x), 256)])
    return float((pred == torch.from_numpy(y)).float().mean())


def train(args: argparse.Namespace) -> list[dict[str, Any]]:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    model = load_model(args.init)
    net = float_twin(model).float()
    if args.bn == "range":
        use_range_value_bn_(net, micro_gain_shifts(model.layers))
    x, x_exp, y = load_data(args.train, model.desc["num_classes"])
    xv, xv_exp, yv = load_data(args.val, model.desc["num_classes"])
    n, bs = len(x), args.batch_size
    spe = -(-n // bs)
    sched = Schedule("cosine", args.epochs * spe, int(round(0.25 * spe)))
    bn_bits = default_bn_lr_bits(args.lr_bits) if args.bn_lr_bits is None else args.bn_lr_bits
    norm_params = []
    for m in net.modules():
        for p in m.parameters(recurse=False):
            norm_params.append((p, bn_bits if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) else args.lr_bits))
    l2 = 0.0 if args.l2_shift is None else 2.0 ** -args.l2_shift / bs    # micro's lambda is on the summed loss
    momenta: dict[int, torch.Tensor] = {}
    frozen: dict[int, int] | None = {} if args.rule == "frozen" else None
    sgd = (torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum, nesterov=args.momentum > 0,
                           weight_decay=args.weight_decay)
           if args.rule == "sgd" else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state_path, rows, start = out / "state.pt", [], 0
    if state_path.exists():
        st = torch.load(state_path, weights_only=True)
        net.load_state_dict(st["net"])
        if sgd is not None:
            sgd.load_state_dict(st["opt"])
        momenta = {id(p): v for (p, _), v in zip(norm_params, st.get("momenta", [])) if v.numel()}
        if frozen is not None:
            frozen = {id(p): int(e) for (p, _), e in zip(norm_params, st["frozen"].tolist()) if e != NO_E}
        start = int(st["epoch"])
        rows = json.loads((out / "history.json").read_text())[:start]   # a kill between the two writes below
    stop = args.epochs if args.stop_after is None else min(args.epochs, start + args.stop_after)
    for ep in range(start, stop):
        t0 = time.perf_counter()
        net.train()
        order = np.random.default_rng(args.seed + ep).permutation(n)
        loss_sum, correct = 0.0, 0
        for step in range(spe):
            idx = order[step * bs:(step + 1) * bs]
            xb = augment_batch(x[idx], args.augment, args.seed + ep, step)
            logits = net(torch.from_numpy(xb.astype(np.float32) * 2.0 ** x_exp))
            loss = F.cross_entropy(logits, torch.from_numpy(y[idx]))
            net.zero_grad(set_to_none=True)
            loss.backward()
            m = sched.multiplier(ep * spe + step)
            if sgd is not None:
                for g in sgd.param_groups:
                    g["lr"] = args.lr * m / 256
                sgd.step()
            else:
                norm_rule_step(norm_params, m, l2, args.momentum_shift, momenta, frozen,
                               args.rel_bits if args.rule == "relative" else None)
            loss_sum += float(loss.detach()) * len(idx)
            correct += int((logits.detach().argmax(1) == torch.from_numpy(y[idx])).sum())
        rows.append({"epoch": ep + 1, "loss": loss_sum / n, "train_acc": correct / n,
                     "val_acc": accuracy(net, xv, xv_exp, yv, batch_statistics=False),
                     "val_acc_batch": accuracy(net, xv, xv_exp, yv, batch_statistics=True),
                     "seconds": time.perf_counter() - t0})
        print(f"epoch {ep + 1}/{args.epochs} loss {rows[-1]['loss']:.4f} train_acc {rows[-1]['train_acc']:.4f} "
              f"val_acc {rows[-1]['val_acc']:.4f} (batch statistics {rows[-1]['val_acc_batch']:.4f}) "
              f"time {rows[-1]['seconds']:.1f}s", flush=True)
        tmp = out / "history.json.tmp"
        tmp.write_text(json.dumps(rows, indent=1))
        torch.save({"net": net.state_dict(), "opt": sgd.state_dict() if sgd else {}, "epoch": ep + 1,
                    "momenta": [momenta.get(id(p), torch.zeros(0)) for p, _ in norm_params],
                    "frozen": torch.tensor([(frozen or {}).get(id(p), NO_E) for p, _ in norm_params])},
                   out / "state.pt.tmp")
        os.replace(tmp, out / "history.json")          # history first: a kill between the two replays one epoch,
                                                        # whose row the resume drops
        os.replace(out / "state.pt.tmp", state_path)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("init", help="the integer-only job's init/ model folder")
    ap.add_argument("train", help="its train.npz")
    ap.add_argument("val", help="its val.npz")
    ap.add_argument("--out", required=True, help="run folder (state.pt, history.json); an existing one is resumed")
    ap.add_argument("--rule", choices=RULES, default="norm", help="norm: micro's rule in float; frozen: its "
                    "normalizer from the first step, kept; relative: steps relative to each weight's size; sgd: SGD momentum "
                    "0.9 nesterov, weight decay 5e-4 (default: norm)")
    ap.add_argument("--bn", choices=NORMS, default="std", help="std: torch's batch norm; range: micro's normaliser "
                    "(range / 2**gain_shift) with a standard batch norm's backward (default: std)")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0, help="the job's seed: data order and crops (default: 0)")
    ap.add_argument("--augment", choices=("none", "crop-flip"), default="crop-flip")
    ap.add_argument("--lr-bits", type=int, default=10, help="norm rule: largest step 2**LR_BITS codes (default: 10)")
    ap.add_argument("--bn-lr-bits", type=int, default=None, help="norm rule, batch-norm gamma / beta (default: "
                    "LR_BITS - 1)")
    ap.add_argument("--momentum-shift", type=int, default=None, help="norm rule: micro's momentum, beta = 1 - "
                    "2**-M (default: off, as micro's default)")
    ap.add_argument("--l2-shift", type=int, default=None, help="norm rule: micro's L2 decay, 2**-L * W on the summed "
                    "batch gradient (default: off)")
    ap.add_argument("--rel-bits", type=int, default=6, help="relative rule: largest step 2**-REL_BITS of the "
                    "tensor's largest weight (default: 6)")
    ap.add_argument("--lr", type=float, default=0.1, help="sgd rule: peak learning rate (default: 0.1)")
    ap.add_argument("--momentum", type=float, default=0.9, help="sgd rule: nesterov momentum (default: 0.9; 0.875 "
                    "is micro's --momentum-shift 3)")
    ap.add_argument("--weight-decay", type=float, default=5e-4, help="sgd rule: weight decay (default: 5e-4; "
                    "2**-4 / batch is micro's --l2-shift 4)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--stop-after", type=int, default=None, help="train at most this many epochs in this invocation "
                    "(rerun the command to continue)")
    args = ap.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or (args.stop_after is not None and args.stop_after < 1):
        ap.error("--epochs, --batch-size and --stop-after must be >= 1")
    train(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
