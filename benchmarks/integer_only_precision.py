"""Where an integer-only model's forward loses precision, on a saved micro model or run (docs/integer-training.md §1).

    python benchmarks/integer_only_precision.py RUN_OR_MODEL_DIR DATA.npz [--epochs-at 20,24,28] [--batch-size 128]

For every master tensor: how often adapt_exp raised its exponent, its largest and median int8 view code, and the
SQNR of its int8 view against its master codes with the fixed shift of 8, the tensor's own shift (``weight_view``
"tensor") and a shift per output channel (what neither engine does; the bound per-channel scales would reach).  For
one batch: the norm rule's step (before rounding) in master codes at the cosine schedule's multiplier of the given
epochs, as the fraction of steps below one code (the steps the forward cannot see until they add up), and each batch
norm's output SQNR (its int8 codes against its exact accumulator).  A run folder (``python -m inttrain.micro train
--out``) supplies its step settings from checkpoint.json; a bare model folder uses micro's defaults and ``--epochs``.

The README's and the docs' figures on integer-only-bngain-bn16 (ResNet-20, seed 1, after 22 epochs) come from this
script on that run's folder and its train.npz.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from inttrain.micro import layers as L
from inttrain.micro.augment import augment_batch
from inttrain.micro.loss import softmax_cross_entropy_grad
from inttrain.micro.model import load_data, load_model
from inttrain.micro.ops import IntTensor
from inttrain.micro.optim import COS_Q8, SGD, default_bn_lr_bits


def sqnr_db(ref: np.ndarray, approx: np.ndarray) -> float:
    """10 log10(|ref|^2 / |ref - approx|^2) (inf where they are equal)."""
    noise = float(((ref - approx) ** 2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float((ref ** 2).sum()) / noise)


def _view(codes: np.ndarray, shift: np.ndarray | int) -> np.ndarray:
    """sat8(rne(codes / 2**shift)) * 2**shift: the view in master-code units (shift per row or one)."""
    scale = np.power(2.0, shift)
    return np.clip(np.rint(codes / scale), -127, 127) * scale


def view_report(p: L.Param) -> dict[str, Any]:
    """The int8 view of one master tensor: its codes' statistics and SQNR under each shift rule."""
    w = np.asarray(p.acc, dtype=np.float64)
    view = p.int8().q.astype(np.float64)
    out = {"shape": tuple(w.shape), "role": p.role, "raised": p.exp - p.exp0, "max_view": int(np.abs(view).max()),
           "median_view": float(np.median(np.abs(view)))}
    if p.bits == 8:
        return {**out, "fixed": math.inf, "tensor": math.inf, "channel": math.inf}
    rows = w.reshape(w.shape[0], -1)
    per_row = np.array([L.view_shift(int(np.abs(r).max()), 16, "tensor") for r in rows])[:, None]
    return {**out, "fixed": sqnr_db(w, _view(w, 8)),
            "tensor": sqnr_db(w, _view(w, L.view_shift(int(np.abs(w).max()), 16, "tensor"))),
            "channel": sqnr_db(rows, _view(rows, per_row))}


def _batch_norms(layers: list) -> list[L.BatchNorm]:
    out = []
    for layer in layers:
        if isinstance(layer, L.BatchNorm):
            out.append(layer)
        elif isinstance(layer, L.Residual):
            out += _batch_norms(layer.block) + _batch_norms(layer.shortcut)
    return out


def batch_report(model: Any, x: np.ndarray, x_exp: int, y: np.ndarray, settings: dict[str, Any],
                 epochs_at: list[int]) -> dict[str, Any]:
    """One forward / backward on (x, y): each batch norm's output SQNR, and the fraction of the norm rule's steps
    below one (and one half) master code at the cosine multiplier of each epoch in ``epochs_at``."""
    bn_sqnr = []
    for bn in _batch_norms(model.layers):
        def forward(xin, bn=bn, f=bn.forward):
            out = f(xin)
            g8 = bn.saved[5]
            shift = out.exp - (g8.exp - 7 + bn.gain_shift)       # the requantization's shift from the accumulator
            acc = np.asarray(bn.last_acc, dtype=np.float64)
            bn_sqnr.append(sqnr_db(acc, out.q.astype(np.float64) * 2.0 ** shift))
            return out
        bn.forward = forward
    logits = model.forward(IntTensor(x, x_exp))
    err, _ = softmax_cross_entropy_grad(logits, y, bits=model.err_bits)
    model.backward(err)
    opt = SGD(model.params(), settings.get("lr_shift", 8), None, lr_mode="norm", lr_bits=settings["lr_bits"],
              bn_lr_bits=settings["bn_lr_bits"], adapt_exp=True)
    steps = {}
    for epoch in epochs_at:
        mult = COS_Q8[min(256, int(256 * (epoch - 0.5) / settings["epochs"]))]
        sizes = []
        for p in model.params():
            g = opt.gradient(p)
            s = opt.step_shift(p, g)
            if s is not None:
                sizes.append(np.abs(np.asarray(g, dtype=np.float64)).ravel() * mult / 2.0 ** (s + 8))
        u = np.concatenate(sizes)
        steps[epoch] = {"multiplier": mult, "below_1": float((u < 1).mean()), "below_half": float((u < 0.5).mean())}
    return {"bn_output_sqnr": bn_sqnr, "steps": steps}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path, help="a micro run folder (train --out) or saved model folder")
    p.add_argument("data", type=Path, help="DATA.npz (int8 codes x, x_exp, y): one batch is drawn from it")
    p.add_argument("--epochs-at", default="20,24,28", help="epochs whose schedule multiplier sizes the steps")
    p.add_argument("--epochs", type=int, default=30, help="the schedule's length when the folder has no checkpoint")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--seed", type=int, default=0, help="which batch (and crop-flip draw)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    checkpoint = args.model / "checkpoint.json"
    if checkpoint.is_file():
        settings = json.loads(checkpoint.read_text())["settings"]
    else:
        settings = {"epochs": args.epochs, "lr_bits": 10, "bn_lr_bits": default_bn_lr_bits(10),
                    "augment": "none"}
    model = load_model(args.model)
    x, x_exp, y = load_data(args.data)
    idx = np.random.default_rng(args.seed).permutation(len(x))[:args.batch_size]
    xb = augment_batch(x[idx], settings.get("augment") or "none", args.seed, 0)
    print(f"{args.model}: weight view {model.desc.get('weight_view', 'fixed')}, {model.err_bits}-bit errors")
    print("tensor                         shape            role   raised  max|view|  median|view|  "
          "SQNR dB: fixed  tensor  channel")
    for name, p in model.named_params():
        r = view_report(p)
        print(f"{name:30s} {str(r['shape']):16s} {r['role']:6s} {r['raised']:6d}  {r['max_view']:9d}  "
              f"{r['median_view']:12.1f}  {r['fixed']:13.1f}  {r['tensor']:6.1f}  {r['channel']:7.1f}")
    r = batch_report(model, xb, x_exp, y[idx], settings, [int(e) for e in args.epochs_at.split(",")])
    for epoch, s in r["steps"].items():
        print(f"epoch {epoch}: multiplier {s['multiplier']}/256, steps below one master code "
              f"{s['below_1']:.3f}, below half a code {s['below_half']:.3f}")
    print("batch-norm output SQNR dB: " + " ".join(f"{v:.1f}" for v in r["bn_output_sqnr"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
