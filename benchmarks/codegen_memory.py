#!/usr/bin/env python
"""Static RAM and flash of the generated C training code (``python -m inttrain.micro codegen``), and MNIST
training in that C code.

    python benchmarks/codegen_memory.py                                   # memory table only (~20 s)
    python benchmarks/codegen_memory.py --data ../shared/data/mnist_train.npz --epochs 1   # + MNIST runs (~5 min)

Memory: for an MNIST MLP (784-128-10) and a LeNet-5-sized CNN (conv5x5x6 pad 2, relu, maxpool 2, conv5x5x16,
relu, maxpool 2, linear 400-120, relu, linear 120-84, relu, linear 84-10), int16 and int8 master weights, batch 1
and 8, with and without ``--low-ram``: the generated model and runtime are compiled (host gcc, ``-Os``, the
check's warning flags; also for armhf, Thumb-2, when arm-linux-gnueabihf-gcc is installed) and measured with
``size``: RAM = .data + .bss (every buffer is static: there is no heap
and the stack holds a few scalars per call), flash = .text (code + const tables, including the initial weight
codes) + .data. The ``buffers`` column is the generator's own count of activation/error/scratch bytes.

MNIST (with ``--data``): pixel -> min(pixel >> 1, 127) at x_exp = -7, first 50 000 images for training and the
last 10 000 held out (as docs/integer-training.md §10). In configurations under 256 KB of RAM (MLP: int16
weights, batch 8; LeNet-5: int8 weights, batch 8, --low-ram; LeNet-5: int16 weights, batch 1, --low-ram):
``codegen-check`` on 20 MNIST steps, then ``--epochs`` epochs in C (train's batch order) and held-out accuracy
from the C ``model_predict``; with ``--micro`` the same epochs in micro, and the final weights compared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import numpy as np  # noqa: E402

from inttrain.micro import SGD, IntTensor, Sequential, softmax_cross_entropy_grad  # noqa: E402
from inttrain.micro.codegen import find_cc, generate, run_check  # noqa: E402
from inttrain.micro.codegen.check import CFLAGS, SOURCES, batches  # noqa: E402

L = lambda i, o: {"type": "linear", "in_features": i, "out_features": o}  # noqa: E731
C = lambda i, o, p: {"type": "conv2d", "in_channels": i, "out_channels": o, "kernel_size": 5, "padding": p}  # noqa: E731
R, MP = {"type": "relu"}, {"type": "maxpool2d", "kernel_size": 2}
MODELS = {
    "mlp": {"input_shape": [784], "layers": [L(784, 128), R, L(128, 10)]},
    "lenet5": {"input_shape": [1, 28, 28], "layers": [C(1, 6, 2), R, MP, C(6, 16, 0), R, MP, {"type": "flatten"},
                                                      L(400, 120), R, L(120, 84), R, L(84, 10)]},
}
LR_SHIFT = {"mlp": 8, "lenet5": 8}
# the MNIST runs, each in a configuration that fits the 256 KB of tiny-training: (model, weight bits, --low-ram, batch)
RUNS = [("mlp", 16, False, 8), ("lenet5", 8, True, 8), ("lenet5", 16, True, 1)]

TRAIN_HARNESS = r"""/* benchmark harness: train on a file of batches, then predict a held-out set */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "model.h"

static int8_t x[MODEL_BATCH * MODEL_INPUT_SIZE];
static int32_t y[MODEL_BATCH], pred[MODEL_BATCH];

static void rd(FILE *f, void *p, size_t n)
{
    if (fread(p, 1, n, f) != n)
        exit(3);
}

int main(int argc, char **argv)
{
    FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
    int32_t hdr[4], n, s, i;
    clock_t t0;
    double train_s = 0;
    if (argc != 3 || !in || !out)
        return 3;
    rd(in, hdr, sizeof hdr);                  /* train steps, eval chunks, x_exp, lr_shift */
    model_init();
    model_set_lr_shift(hdr[3]);
    t0 = clock();
    for (s = 0; s < hdr[0] + hdr[1]; s++) {
        if (s == hdr[0])
            train_s = (double)(clock() - t0) / CLOCKS_PER_SEC;
        rd(in, &n, sizeof n);
        rd(in, y, sizeof(int32_t) * (size_t)n);
        rd(in, x, (size_t)n * MODEL_INPUT_SIZE);
        if (s < hdr[0]) {
            if (model_train_step(x, hdr[2], y, (uint32_t)n) != 0)
                return 4;
        } else {
            if (model_predict(x, hdr[2], (uint32_t)n, pred) != 0)
                return 4;
            fwrite(pred, sizeof(int32_t), (size_t)n, out);
        }
    }
    if (hdr[1] == 0)
        train_s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    for (i = 0; i < MODEL_NUM_PARAMS; i++)
        fwrite(model_params[i].codes, (size_t)model_params[i].bits / 8, model_params[i].count, out);
    fprintf(stderr, "%.3f\n", train_s);
    return fclose(out) == 0 ? 0 : 3;
}
"""


ARM_CC = "arm-linux-gnueabihf-gcc"     # Thumb-2 (armv7-a) by default on Debian: the closest at hand to a Cortex-M


def sizes(cc: str, d: Path) -> dict:
    objs = []
    for f in SOURCES:
        obj = d / (f[:-2] + f".{Path(cc).name}.o")
        subprocess.run([cc, *CFLAGS[:-1], "-Os", "-c", "-o", str(obj), str(d / f)], check=True)
        objs.append(str(obj))
    size = shutil.which(cc[:-3] + "size") if cc.endswith("-gcc") else None
    out = subprocess.run([size or "size", *objs], capture_output=True, text=True, check=True).stdout
    tot = dict.fromkeys(("text", "data", "bss"), 0)
    for line in out.splitlines()[1:]:
        for k, v in zip(("text", "data", "bss"), line.split()[:3]):
            tot[k] += int(v)
    return tot


def memory_table(cc: str) -> list[dict]:
    rows = []
    for name, desc in MODELS.items():
        for bits in (16, 8):
            for batch in (1, 8):
                for low in (False, True):
                    model = Sequential.from_description({**desc, "weight_bits": bits})
                    gen = generate(model, batch, LR_SHIFT[name], low_ram=low)
                    with tempfile.TemporaryDirectory() as tmp:
                        gen.write(tmp)
                        z = sizes(cc, Path(tmp))
                        arm = sizes(ARM_CC, Path(tmp)) if shutil.which(ARM_CC) else None
                    rows.append({"model": name, "weight_bits": bits, "batch": batch, "low_ram": low,
                                 "ram": z["data"] + z["bss"], "flash": z["text"] + z["data"], "buffers": gen.buffer_bytes,
                                 "master_codes": gen.param_bytes, "initial_codes": gen.init_bytes, **z})
                    r = rows[-1]
                    if arm:
                        r.update(ram_armhf=arm["data"] + arm["bss"], flash_armhf=arm["text"] + arm["data"])
                    print(f"{name} int{bits} batch {batch} {'low-ram' if low else 'default'}: RAM {r['ram']} B, "
                          f"flash {r['flash']} B" + (f"; armhf RAM {r['ram_armhf']} B, flash {r['flash_armhf']} B"
                                                      if arm else ""), flush=True)
    return rows


def mnist(path: str) -> tuple[np.ndarray, np.ndarray]:
    d = np.load(path, allow_pickle=False)
    x = np.minimum(d["x"] >> 1, 127).astype(np.int8).reshape(len(d["x"]), -1)
    return x, d["y"].astype(np.int64)


def _write(path: Path, x, y, idx, evals, lr_shift):
    with open(path, "wb") as f:
        f.write(np.array([len(idx), len(evals), -7, lr_shift], dtype="<i4").tobytes())
        for b in [*idx, *evals]:
            f.write(np.array([len(b)], dtype="<i4").tobytes())
            f.write(y[b].astype("<i4").tobytes())
            f.write(np.ascontiguousarray(x[b]).tobytes())


def train_run(cc: str, name: str, x, y, epochs: int, batch: int, bits: int, low: bool, with_micro: bool) -> dict:
    desc = {**MODELS[name], "weight_bits": bits}
    shape = tuple(desc["input_shape"])
    xs = x.reshape(len(x), *shape)
    xtr, ytr, xte, yte = xs[:50000], y[:50000], xs[50000:], y[50000:]
    t0 = time.perf_counter()
    chk = run_check(lambda: Sequential.from_description(desc), xtr, -7, ytr, 20, batch, LR_SHIFT[name], low_ram=low)
    print(f"{name}: codegen-check on 20 MNIST steps: {'OK' if chk.ok else 'MISMATCH'}: {chk.message}", flush=True)
    steps = epochs * -(-len(xtr) // batch)
    idx = batches(len(xtr), batch, steps, 0)
    evals = [np.arange(i, min(len(xte), i + batch)) for i in range(0, len(xte), batch)]
    gen = generate(Sequential.from_description(desc), batch, LR_SHIFT[name], low_ram=low)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        gen.write(d)
        (d / "train_main.c").write_text(TRAIN_HARNESS)
        subprocess.run([cc, *CFLAGS, "-o", str(d / "train"), *[str(d / f) for f in [*SOURCES, "train_main.c"]]], check=True)
        _write(d / "in.bin", np.concatenate([xtr, xte]), np.concatenate([ytr, yte]),
               idx, [e + 50000 for e in evals], LR_SHIFT[name])
        r = subprocess.run([str(d / "train"), str(d / "in.bin"), str(d / "out.bin")], capture_output=True, text=True, check=True)
        raw = (d / "out.bin").read_bytes()
    pred = np.frombuffer(raw, dtype="<i4", count=len(xte))
    row = {"model": name, "weight_bits": bits, "batch": batch, "low_ram": low, "epochs": epochs, "steps": steps,
           "check_20_steps": chk.ok, "c_accuracy": float((pred == yte).mean()),
           "c_ms_per_step": 1000 * float(r.stderr.split()[-1]) / steps}
    print(f"{name}: C: {steps} steps, held-out accuracy {row['c_accuracy']:.4f}, {row['c_ms_per_step']:.2f} ms/step", flush=True)
    if with_micro:
        model = Sequential.from_description(desc)
        opt = SGD(model.params(), LR_SHIFT[name])
        t1 = time.perf_counter()
        for b in idx:
            logits = model.forward(IntTensor(xtr[b], -7))
            model.backward(softmax_cross_entropy_grad(logits, ytr[b])[0])
            opt.step()
        row["micro_ms_per_step"] = 1000 * (time.perf_counter() - t1) / steps
        mp = np.concatenate([model.forward(IntTensor(xte[e], -7)).q.argmax(axis=1) for e in evals])
        row["micro_accuracy"] = float((mp == yte).mean())
        pos, same = len(xte) * 4, True
        for _, p in model.named_params():
            c = np.frombuffer(raw, dtype=np.dtype(p.acc.dtype).newbyteorder("<"), count=p.acc.size, offset=pos)
            pos += c.nbytes
            same &= bool(np.array_equal(c.reshape(p.acc.shape), p.acc))
        row["final_weights_identical"] = same and bool(np.array_equal(mp, pred))
        print(f"{name}: micro: held-out accuracy {row['micro_accuracy']:.4f}, {row['micro_ms_per_step']:.2f} ms/step; "
              f"final weights and predictions identical to C: {row['final_weights_identical']}", flush=True)
    row["seconds"] = time.perf_counter() - t0
    return row


def markdown(mem: list[dict], runs: list[dict]) -> str:
    out = []
    if mem:
        out += ["| model | weights | batch | mode | RAM (B) | of which master codes | buffers | flash (B) | "
                "of which initial codes | armhf Thumb-2 RAM (B) | armhf flash (B) |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in mem:
        out.append(f"| {r['model']} | int{r['weight_bits']} | {r['batch']} | {'--low-ram' if r['low_ram'] else 'default'} | "
                   f"{r['ram']:,} | {r['master_codes']:,} | {r['buffers']:,} | {r['flash']:,} | {r['initial_codes']:,} | "
                   f"{r.get('ram_armhf', 0):,} | {r.get('flash_armhf', 0):,} |")
    if runs:
        out += ["", "| model | weights | batch | mode | epochs | 20-step codegen-check | C held-out acc | C ms/step | "
                    "micro held-out acc | micro ms/step | final weights C == micro |", "|---|---|---|---|---:|---|---:|---:|---:|---:|---|"]
        for r in runs:
            out.append(f"| {r['model']} | int{r['weight_bits']} | {r['batch']} | {'--low-ram' if r['low_ram'] else 'default'} | "
                       f"{r['epochs']} | {'identical' if r['check_20_steps'] else 'DIFFERS'} | {r['c_accuracy']:.4f} | "
                       f"{r['c_ms_per_step']:.2f} | {r.get('micro_accuracy', float('nan')):.4f} | "
                       f"{r.get('micro_ms_per_step', float('nan')):.2f} | {r.get('final_weights_identical', '-')} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="mnist_train.npz (x uint8 (60000, 28, 28), y); omit: memory only")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--micro", action="store_true", help="also train in micro and compare the final weights")
    ap.add_argument("--models", default="mlp,lenet5")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory table")
    ap.add_argument("--out", default=None, help="directory for results.json and results.md")
    args = ap.parse_args()
    cc = find_cc()
    if cc is None or shutil.which("size") is None:
        print("error: needs a C compiler and binutils' size on PATH", file=sys.stderr)
        return 2
    mem = [] if args.no_memory else memory_table(cc)
    runs = []
    if args.data:
        x, y = mnist(args.data)
        for name, bits, low, batch in RUNS:
            if name in args.models.split(","):
                runs.append(train_run(cc, name, x, y, args.epochs, batch, bits, low, args.micro))
    md = markdown(mem, runs)
    print(md)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for part, rows in (("memory", mem), ("mnist", runs)):    # a memory-only run keeps the MNIST results
            if rows:
                (out / f"{part}.json").write_text(json.dumps(rows, indent=1))
                (out / f"{part}.md").write_text(markdown(*((rows, []) if part == "memory" else ([], rows))) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
