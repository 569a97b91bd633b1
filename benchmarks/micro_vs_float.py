#!/usr/bin/env python
"""inttrain.micro with its documented defaults against its float32 PyTorch twin, at real budgets (issue 20 item 4).

    OMP_NUM_THREADS=1 python benchmarks/micro_vs_float.py --out benchmarks/results/micro_vs_float \\
        --mnist ../shared/data/mnist_train.npz --cifar ../shared/data/cifar10_train20k.npz \\
        --epochs 20 --seeds 0,1                                   # hours on one core; resumable
    python benchmarks/micro_vs_float.py --out /tmp/smoke --epochs 1 --seeds 0 --only digits-mlp --limit 256  # smoke

Runs (``--only`` picks a subset): ``digits-mlp`` (64-128-10) and ``digits-cnn`` on scikit-learn digits (1437
train / 360 held out, pixel 0..16 -> min(8 p, 127) at x_exp -7); ``mnist-lenet5`` (LeNet-5 of docs §10 on the
first 50 000 / last 10 000 of ``--mnist``); ``cifar-bncnn`` (VGG-small-like, a batch norm after each of 5 convs,
on the first ``--cifar-train`` / next ``--cifar-val`` images of ``--cifar``). Image pixels follow the documented
``convert`` rule (min(p >> 1, 127) at x_exp -7).

Each (run, seed) trains twice from the same initial weights, the same inputs and the same batches in the same order:

* **micro**: ``python -m inttrain.micro train`` with the documented defaults (no sweep: norm rule, lr bits 10,
  cosine schedule with a quarter-epoch warm-up, adapted exponents, rounding rne/rne/pstoch) and ``--val``; its
  folder ``OUT/runs/NAME-sSEED-micro`` is resumed with ``--resume`` when the script is run again.
* **float32**: the same layers in torch (float batch norm), the micro model's initial master weights dequantized,
  inputs ``codes * 2**x_exp``, mean cross-entropy, SGD with momentum 0.9 at lr 0.05 times micro's Q8 schedule
  multiplier (the same cosine and warm-up). ``--float-opt norm`` instead uses micro's step rule in float (per
  tensor ``grad / 2**e * 2**(lr_bits + E0) * m / 256``, ``2**e`` the power of two above max|grad|, ``E0`` the
  micro tensor's initial exponent): unlike micro's, whose int8 activations and logits are rescaled every step,
  float weights then grow without bound, and LeNet-5 on MNIST went to NaN in epochs 4-7 (both seeds), so it is
  not the default. Its state is saved after each epoch in ``OUT/runs/NAME-sSEED-float-OPT.pt`` and resumed.

Each finished run appends one JSON line (per-epoch held-out accuracy, loss, seconds) to ``OUT/results.jsonl``
and rewrites ``OUT/results.md`` (best and final held-out accuracy per engine, mean over seeds, the micro - float
gap, and micro's final minus best). ``--max-seconds`` bounds one invocation (micro stops with a checkpoint).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from inttrain.micro import Sequential  # noqa: E402
from inttrain.micro.__main__ import TRAIN_DEFAULTS, main as micro_main  # noqa: E402
from inttrain.micro.convert import pixels_to_codes, to_nchw  # noqa: E402
from inttrain.micro.optim import Schedule  # noqa: E402

RELU, POOL, FLAT = {"type": "relu"}, {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"}


def lin(i: int, o: int) -> dict:
    return {"type": "linear", "in_features": i, "out_features": o}


def conv(ci: int, co: int, k: int, pad: int = 0) -> dict:
    return {"type": "conv2d", "in_channels": ci, "out_channels": co, "kernel_size": k, "padding": pad}


def bn_block(ci: int, co: int) -> list[dict]:
    return [conv(ci, co, 3, 1), {"type": "batchnorm", "num_features": co}, RELU]


MLP = {"input_shape": [64], "layers": [lin(64, 128), RELU, lin(128, 10)]}
DIGITS_CNN = {"input_shape": [1, 8, 8], "layers": [conv(1, 16, 3, 1), RELU, POOL, FLAT, lin(256, 10)]}
LENET5 = {"input_shape": [1, 28, 28], "layers": [conv(1, 6, 5, 2), RELU, POOL, conv(6, 16, 5), RELU, POOL, FLAT,
                                                  lin(400, 120), RELU, lin(120, 84), RELU, lin(84, 10)]}
BNCNN = {"input_shape": [3, 32, 32], "layers": [*bn_block(3, 16), *bn_block(16, 16), POOL, *bn_block(16, 32),
                                                *bn_block(32, 32), POOL, *bn_block(32, 64), POOL, FLAT, lin(1024, 10)]}
RUNS = {"digits-mlp": ("digits", MLP), "digits-cnn": ("digits", DIGITS_CNN), "mnist-lenet5": ("mnist", LENET5),
        "cifar-bncnn": ("cifar", BNCNN)}


def load_dataset(name: str, args) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_val, y_val): int8 codes at x_exp -7."""
    if name == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        x = np.minimum(d.data * 8, 127).astype(np.int8).reshape(-1, 1, 8, 8)
        perm = np.random.default_rng(0).permutation(len(x))
        tr, va = perm[:1437], perm[1437:]
        return x[tr], d.target[tr], x[va], d.target[va]
    path = args.mnist if name == "mnist" else args.cifar
    if not path:
        raise SystemExit(f"error: the {name} runs need --{name} PATH")
    with np.load(path) as f:
        x, y = to_nchw(pixels_to_codes(f["x"]), path), f["y"].astype(np.int64)
    if name == "mnist":
        return x[:50000], y[:50000], x[50000:], y[50000:]
    n, v = args.cifar_train, args.cifar_val
    return x[:n], y[:n], x[n:n + v], y[n:n + v]


def _shape(x: np.ndarray, desc: dict) -> np.ndarray:
    return x.reshape((len(x), *desc["input_shape"]))


# ------------------------------------------------------------------------------------------- float32 twin


def float_twin(model: Sequential):
    """The micro model's layers in torch, initialized with its master weights (dequantized)."""
    import torch
    from torch import nn

    class Res(nn.Module):
        def __init__(self, block, short):
            super().__init__()
            self.block, self.short = block, short

        def forward(self, x):
            return self.block(x) + self.short(x)

    def build(specs, mlayers, shape):
        mods = []
        for s, ml in zip(specs, mlayers):
            t = s["type"]
            if t == "linear":
                m = nn.Linear(s["in_features"], s["out_features"], bias=False)
            elif t == "conv2d":
                m = nn.Conv2d(s["in_channels"], s["out_channels"], s["kernel_size"], s["stride"], s["padding"], bias=False)
            elif t == "relu":
                m = nn.ReLU()
            elif t == "maxpool2d":
                m = nn.MaxPool2d(s["kernel_size"])
            elif t == "avgpool2d":
                m = nn.AvgPool2d(s["kernel_size"])
            elif t == "globalavgpool2d":
                m = nn.AdaptiveAvgPool2d(1)
            elif t == "flatten":
                m = nn.Flatten()
            elif t == "batchnorm":
                m = (nn.BatchNorm2d if len(shape) == 3 else nn.BatchNorm1d)(s["num_features"])
            else:
                m = Res(build(s["layers"], ml.block, shape), build(s["shortcut"], ml.shortcut, shape))
            if hasattr(ml, "weight") and t in ("linear", "conv2d"):
                with torch.no_grad():
                    m.weight.copy_(torch.from_numpy(ml.weight.acc.astype(np.float64) * 2.0 ** ml.weight.exp))
                m.weight.exp0 = ml.weight.exp0
            if t == "batchnorm":            # gamma 1, beta 0 in both; the float BN divides by the std, not the range
                m.weight.exp0, m.bias.exp0 = ml.gamma.exp0, ml.beta.exp0
            mods.append(m)
            shape = ml.out_shape(shape) if hasattr(ml, "out_shape") else shape
        return nn.Sequential(*mods)

    return build(model.desc["layers"], model.layers, tuple(model.desc["input_shape"]))


def run_float(net, args, data, desc, seed: int, state_path: Path, log) -> list[dict]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    xtr, ytr, xva, yva = data
    xf = torch.from_numpy(_shape(xtr, desc).astype(np.float32) * 2.0 ** -7)
    xv = torch.from_numpy(_shape(xva, desc).astype(np.float32) * 2.0 ** -7)
    yt, yv = torch.from_numpy(ytr), torch.from_numpy(yva)
    bs, epochs = TRAIN_DEFAULTS["batch_size"], args.epochs
    spe = -(-len(xf) // bs)
    sched = Schedule(TRAIN_DEFAULTS["schedule"], epochs * spe, int(round(TRAIN_DEFAULTS["warmup_epochs"] * spe)),
                     max(1, epochs // 3) * spe)
    params = [p for p in net.parameters()]
    sgd = torch.optim.SGD(params, lr=0.05, momentum=0.9) if args.float_opt == "sgd" else None
    rows, start = [], 0
    if state_path.exists():
        st = torch.load(state_path, weights_only=False)
        net.load_state_dict(st["net"])
        if sgd is not None:
            sgd.load_state_dict(st["opt"])
        rows, start = st["rows"], st["epoch"]
    for ep in range(start, epochs):
        t0 = time.perf_counter()
        net.train()
        order = torch.from_numpy(np.random.default_rng(seed + ep).permutation(len(xf)))
        loss_sum = 0.0
        for i in range(spe):
            idx = order[i * bs:(i + 1) * bs]
            m = sched.multiplier(ep * spe + i)
            loss = F.cross_entropy(net(xf[idx]), yt[idx])
            net.zero_grad(set_to_none=True)
            loss.backward()
            loss_sum += float(loss.detach())
            with torch.no_grad():
                if sgd is not None:
                    for g in sgd.param_groups:
                        g["lr"] = 0.05 * m / 256
                    sgd.step()
                    continue
                for p in params:
                    top = float(p.grad.abs().max())
                    if top == 0:
                        continue
                    e = math.frexp(top)[1]                          # 2**e > max|grad| >= 2**(e-1), as bitlen
                    p.sub_(p.grad * (2.0 ** (TRAIN_DEFAULTS["lr_bits"] + p.exp0 - e) * m / 256))
        net.eval()
        with torch.no_grad():
            pred = torch.cat([net(xv[i:i + 256]).argmax(1) for i in range(0, len(xv), 256)])
        rows.append({"epoch": ep + 1, "loss": loss_sum / spe, "val_acc": float((pred == yv).float().mean()),
                     "seconds": time.perf_counter() - t0})
        log(f"  float32 epoch {ep + 1}/{epochs} loss {rows[-1]['loss']:.4f} val_acc {rows[-1]['val_acc']:.4f}")
        torch.save({"net": net.state_dict(), "opt": sgd.state_dict() if sgd else None, "rows": rows, "epoch": ep + 1},
                   state_path)
    return rows


# ------------------------------------------------------------------------------------------- runs and tables


def run_micro(args, name: str, data, desc, seed: int, runs: Path, deadline: float) -> list[dict] | None:
    folder = runs / f"{name}-s{seed}-micro"
    ck = folder / "checkpoint.json"
    left = ["--max-seconds", str(max(0.0, deadline - time.time()))] if math.isfinite(deadline) else []
    if ck.exists():
        if json.loads(ck.read_text())["epoch"] < args.epochs:
            if micro_main(["train", "--resume", str(folder), "--log-every", "0", *left]) != 0:
                raise SystemExit(f"error: micro resume of {folder} failed")
    else:
        xtr, ytr, xva, yva = data
        np.savez(runs / f"{name}-train.npz", x=_shape(xtr, desc), x_exp=np.int64(-7), y=ytr)
        np.savez(runs / f"{name}-val.npz", x=_shape(xva, desc), x_exp=np.int64(-7), y=yva)
        (runs / f"{name}-s{seed}.json").write_text(json.dumps({**desc, "seed": seed}))
        code = micro_main(["train", str(runs / f"{name}-s{seed}.json"), str(runs / f"{name}-train.npz"), "--val",
                           str(runs / f"{name}-val.npz"), "--epochs", str(args.epochs), "--seed", str(seed),
                           "--out", str(folder), "--log-every", "0", *left])
        if code != 0:
            raise SystemExit(f"error: micro training of {name} failed")
    st = json.loads(ck.read_text())
    return st["history"] if st["epoch"] >= args.epochs else None


def write_table(out: Path) -> None:
    """One table per float32 optimizer (rows written before ``float_opt`` was recorded used ``norm``)."""
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    text = "# micro (documented defaults) vs its float32 twin\n\nHeld-out accuracy, mean over seeds " \
           "(benchmarks/micro_vs_float.py).\n"
    for opt in sorted({r.get("float_opt", "norm") for r in rows if r["engine"] == "float32"} or {"sgd"}, reverse=True):
        sel = [r for r in rows if r["engine"] == "micro" or r.get("float_opt", "norm") == opt]
        text += f"\n## float32 optimizer: {opt}\n\n" + _table(sel) + "\n"
    (out / "results.md").write_text(text)


def _table(rows: list[dict]) -> str:
    lines = ["| run | seeds | epochs | micro best | micro final | float32 best | float32 final | final gap (micro - "
             "float) | micro final - best | micro max saturated |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in sorted({r["run"] for r in rows}):
        rs = [r for r in rows if r["run"] == name]
        seeds = sorted({r["seed"] for r in rs})
        def stat(engine, f):  # noqa: E306
            v = [f([h["val_acc"] for h in r["history"]]) for r in rs if r["engine"] == engine]
            return float(np.mean(v)) if v else float("nan")
        mb, mf = stat("micro", max), stat("micro", lambda h: h[-1])
        fb, ff = stat("float32", max), stat("float32", lambda h: h[-1])
        sat = max((h.get("saturated", 0) for r in rs if r["engine"] == "micro" for h in r["history"]), default=0)
        ep = max(len(r["history"]) for r in rs)
        lines.append(f"| {name} | {','.join(map(str, seeds))} | {ep} | {mb:.4f} | {mf:.4f} | {fb:.4f} | {ff:.4f} | "
                     f"{100 * (mf - ff):+.2f} pt | {100 * (mf - mb):+.2f} pt | {sat} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example:\n  python benchmarks/micro_vs_float.py --out results --mnist "
                                        "../shared/data/mnist_train.npz --epochs 20 --seeds 0,1 --only mnist-lenet5")
    ap.add_argument("--out", required=True, help="results folder (runs/, results.jsonl, results.md)")
    ap.add_argument("--mnist", help="mnist_train.npz (uint8 x (60000, 28, 28), y)")
    ap.add_argument("--cifar", help="cifar10_train20k.npz (uint8 x NHWC, y)")
    ap.add_argument("--cifar-train", type=int, default=8000, help="(default: 8000)")
    ap.add_argument("--cifar-val", type=int, default=2000, help="(default: 2000)")
    ap.add_argument("--epochs", type=int, default=20, help="(default: 20)")
    ap.add_argument("--seeds", default="0,1", help="init and shuffle seeds (default: 0,1)")
    ap.add_argument("--only", default=None, help=f"comma list of {', '.join(RUNS)} (default: those whose data is given)")
    ap.add_argument("--float-opt", choices=("sgd", "norm"), default="sgd",
                    help="float32 twin's update: SGD lr 0.05 momentum 0.9 with micro's schedule, or micro's rule in "
                         "float (default: sgd)")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N training images (smoke runs)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="stop this invocation after about this long (it always advances one run)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    names = args.only.split(",") if args.only else [n for n, (d, _) in RUNS.items()
                                                    if d == "digits" or getattr(args, d)]
    deadline = time.time() + args.max_seconds if args.max_seconds is not None else math.inf
    started = False
    done = set()
    if (out / "results.jsonl").exists():
        done = {(r["run"], r["seed"], r["engine"] if r["engine"] == "micro" else f"float32-{r.get('float_opt', 'norm')}")
                for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    for name in names:
        dname, desc = RUNS[name]
        data = load_dataset(dname, args)
        if args.limit:
            data = (data[0][:args.limit], data[1][:args.limit], data[2], data[3])
        for seed in map(int, args.seeds.split(",")):
            for engine in ("micro", "float32"):
                key = engine if engine == "micro" else f"float32-{args.float_opt}"
                if (name, seed, key) in done or (started and time.time() >= deadline):
                    continue                            # (each invocation makes progress on one run at least)
                started = True
                print(f"{name} seed {seed} {engine}", flush=True)
                if engine == "micro":
                    hist = run_micro(args, name, data, desc, seed, runs, deadline)
                else:
                    net = float_twin(Sequential.from_description({**desc, "seed": seed}))
                    hist = run_float(net, args, data, desc, seed, runs / f"{name}-s{seed}-float-{args.float_opt}.pt",
                                     lambda s: print(s, flush=True))
                if hist is None:
                    continue
                with open(out / "results.jsonl", "a") as f:
                    row = {"run": name, "seed": seed, "engine": engine, "epochs": args.epochs, "history": hist}
                    if engine == "float32":
                        row["float_opt"] = args.float_opt
                    f.write(json.dumps(row) + "\n")
                write_table(out)
    if (out / "results.jsonl").exists():
        print((out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
