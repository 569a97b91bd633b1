"""codegen-check: compile the generated C, train N steps in C and in micro on the same batches, compare.

The C side runs a small stdio harness (``check_main.c``, not part of the model) that reads the batches from a
binary file and writes, after every step, the logits of that step's forward (codes and exponent) and every
master code; then the predictions on evaluation chunks of the batch size. Python runs micro's own Sequential
and SGD on the same batches (the order ``train`` uses: one ``default_rng(seed + epoch)`` permutation per
epoch, a shorter last batch) and reads the C results back; the first difference names the tensor and step.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..loss import softmax_cross_entropy_grad
from ..model import Sequential
from ..ops import IntTensor
from ..optim import SGD
from .generate import GeneratedModel, generate

CFLAGS = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-O2"]
SOURCES = ["model.c", "inttrain_rt.c"]

HARNESS = r"""/* codegen-check harness: stdio lives here only, never in the model */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model.h"

static int8_t x[MODEL_BATCH * MODEL_INPUT_SIZE];
static int32_t y[MODEL_BATCH], pred[MODEL_BATCH];

static void rd(FILE *f, void *p, size_t n)
{
    if (fread(p, 1, n, f) != n) {
        fprintf(stderr, "harness: truncated input\n");
        exit(3);
    }
}

int main(int argc, char **argv)
{
    FILE *in, *out;
    int32_t hdr[4], n, e, s, i;
    if (argc != 3 || !(in = fopen(argv[1], "rb")) || !(out = fopen(argv[2], "wb")))
        return 3;
    rd(in, hdr, sizeof hdr);                  /* steps, eval chunks, x_exp, lr_shift */
    model_init();
    model_set_lr_shift(hdr[3]);
    for (s = 0; s < hdr[0] + hdr[1]; s++) {
        rd(in, &n, sizeof n);
        rd(in, y, sizeof(int32_t) * (size_t)n);
        rd(in, x, (size_t)n * MODEL_INPUT_SIZE);
        if (s < hdr[0]) {
            const int8_t *logits;
            if (model_train_step(x, hdr[2], y, (uint32_t)n) != 0)
                return 4;
            logits = model_logits(&e);
            fwrite(&e, sizeof e, 1, out);
            fwrite(logits, 1, (size_t)n * MODEL_NUM_CLASSES, out);
            for (i = 0; i < MODEL_NUM_PARAMS; i++)
                fwrite(model_params[i].codes, (size_t)model_params[i].bits / 8, model_params[i].count, out);
        } else {
            if (model_predict(x, hdr[2], (uint32_t)n, pred) != 0)
                return 4;
            fwrite(pred, sizeof(int32_t), (size_t)n, out);
        }
    }
    return fclose(out) == 0 ? 0 : 3;
}
"""


class ToolchainError(RuntimeError):
    """No C compiler, or it rejected the generated code (the message is its first line of complaint)."""


@dataclass
class CheckResult:
    ok: bool
    message: str                      # the first difference, or a summary of what matched
    sizes: dict                       # text/data/bss of the model objects (bytes), {} if ``size`` is missing
    m32: str                          # what -m32 did: "identical", "not available (...)", or a difference
    changed: int = 0                  # master codes that differ from their initial values after the last step
    cc: str = ""                      # the compiler used


def find_cc() -> str | None:
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


def batches(n: int, batch_size: int, steps: int, seed: int) -> list[np.ndarray]:
    """Sample indices of ``steps`` batches in ``train``'s order: a permutation per epoch (seed + epoch)."""
    out: list[np.ndarray] = []
    epoch = 0
    while len(out) < steps:
        order = np.random.default_rng(seed + epoch).permutation(n)
        out += [order[i:i + batch_size] for i in range(0, n, batch_size)]
        epoch += 1
    return out[:steps]


def _compile(cc: str, src: Path, exe: Path, extra: list[str]) -> subprocess.CompletedProcess:
    """Compile each source to ``<name>.<exe name>.o`` (the model's objects are measured by ``object_sizes``),
    then link; the first failure is returned."""
    objs = []
    for f in [*SOURCES, "check_main.c"]:
        obj = src / f"{f[:-2]}.{exe.name}.o"
        r = subprocess.run([cc, *CFLAGS, *extra, "-c", "-o", str(obj), str(src / f)], capture_output=True, text=True)
        if r.returncode != 0:
            return r
        objs.append(str(obj))
    return subprocess.run([cc, *extra, "-o", str(exe), *objs], capture_output=True, text=True)


def object_sizes(cc: str, objs: list[Path]) -> dict:
    """Berkeley ``size`` of the model's objects: text (code + const tables), data, bss; {} when unavailable."""
    name = Path(cc).name
    cross = name[:-3] + "size" if name.endswith("-gcc") else None    # aarch64-linux-gnu-gcc -> aarch64-linux-gnu-size
    size = (cross and shutil.which(cross)) or shutil.which("size")
    if not size:
        return {}
    r = subprocess.run([size, *map(str, objs)], capture_output=True, text=True, check=True)
    tot = {"text": 0, "data": 0, "bss": 0}
    for line in r.stdout.splitlines()[1:]:
        for key, v in zip(("text", "data", "bss"), line.split()[:3]):
            tot[key] += int(v)
    return tot


def _write_input(path: Path, x: np.ndarray, x_exp: int, y: np.ndarray, idx: list[np.ndarray], evals: list[np.ndarray],
                 lr_shift: int) -> None:
    with open(path, "wb") as f:
        f.write(np.array([len(idx), len(evals), x_exp, lr_shift], dtype="<i4").tobytes())
        for b in [*idx, *evals]:
            f.write(np.array([len(b)], dtype="<i4").tobytes())
            f.write(y[b].astype("<i4").tobytes())
            f.write(np.ascontiguousarray(x[b]).tobytes())


def _first_diff(name: str, c: np.ndarray, m: np.ndarray) -> str:
    at = tuple(int(i) for i in np.argwhere(c != m)[0])
    return f"{name} differs first at index {at}: C {int(c[at])}, micro {int(m[at])}"


def _compare(raw: bytes, model: Sequential, opt: SGD, x: np.ndarray, x_exp: int, y: np.ndarray,
             idx: list[np.ndarray], evals: list[np.ndarray], stats: dict) -> str | None:
    """Run micro step by step against the C output; the first difference as text, or None. ``stats["changed"]``:
    how many master codes training moved away from their initial values."""
    classes = model.desc["num_classes"]
    named = model.named_params()
    stats["initial"] = [p.acc.copy() for _, p in named]
    pos = 0

    def take(dtype, count):
        nonlocal pos
        a = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"), count=count, offset=pos)
        pos += a.nbytes
        return a

    try:
        for step, b in enumerate(idx, 1):
            logits = model.forward(IntTensor(x[b], x_exp))
            err, _ = softmax_cross_entropy_grad(logits, y[b], bits=model.err_bits)
            model.backward(err)
            opt.step()
            ce = int(take("i4", 1)[0])
            cl = take("i1", len(b) * classes).reshape(len(b), classes)
            if ce != logits.exp:
                return f"step {step}: logits exponent differs: C {ce}, micro {logits.exp}"
            if not np.array_equal(cl, logits.q):
                return f"step {step}: " + _first_diff("logits", cl, logits.q)
            for name, p in named:
                cw = take(p.acc.dtype, p.acc.size).reshape(p.acc.shape)
                if not np.array_equal(cw, p.acc):
                    return f"step {step}: " + _first_diff(name, cw, p.acc)
        stats["changed"] = sum(int((p.acc != p0).sum()) for (_, p), p0 in zip(named, stats["initial"]))
        for b in evals:
            pred = model.forward(IntTensor(x[b], x_exp)).q.argmax(axis=1)
            cp = take("i4", len(b))
            if not np.array_equal(cp, pred):
                return f"predict after step {len(idx)}: " + _first_diff("prediction", cp, pred)
    except ValueError:
        return f"the C program wrote {len(raw)} bytes, fewer than expected"
    if pos != len(raw):
        return f"the C program wrote {len(raw) - pos} bytes more than expected"
    return None


def _first_error(stderr: str, fallback: str) -> str:
    lines = stderr.strip().splitlines()
    return next((ln for ln in lines if "error" in ln), lines[0] if lines else fallback).strip()


def run_check(load_model, x: np.ndarray, x_exp: int, y: np.ndarray, steps: int, batch_size: int, lr_shift: int,
              momentum_shift: int | None = None, seed: int = 0, work_dir: str | None = None,
              cc: str | None = None, source: str = "", low_ram: bool = False, cflags: list[str] | None = None,
              runner: list[str] | None = None) -> CheckResult:
    """Generate, compile and run the C for ``steps`` steps and compare with micro (``load_model()`` gives a
    fresh model each call: one is generated from, one trained in micro). ``cc``/``cflags``/``runner``: a cross
    compiler, its extra flags and the emulator that runs its programs (e.g. ``aarch64-linux-gnu-gcc``,
    ``["-static"]``, ``["qemu-aarch64"]``); natively, a ``-m32`` build is tried too. Raises ToolchainError when
    no C compiler is found or compilation fails, ValueError for bad arguments."""
    cc = cc or find_cc()
    if cc is None:
        raise ToolchainError("no C compiler (cc, gcc or clang) on PATH")
    if steps < 1:
        raise ValueError(f"--steps {steps}: must be >= 1")
    model0 = load_model()
    want = tuple(model0.desc["input_shape"])
    if tuple(x.shape[1:]) != want:
        raise ValueError(f"data: x has sample shape {tuple(x.shape[1:])}, model wants {want}")
    gen: GeneratedModel = generate(model0, batch_size, lr_shift, momentum_shift, source, low_ram)
    idx = batches(len(x), batch_size, steps, seed)
    n_eval = min(len(x), 4 * batch_size)
    evals = [np.arange(i, min(n_eval, i + batch_size)) for i in range(0, n_eval, batch_size)]
    extra = list(cflags or [])
    with tempfile.TemporaryDirectory(prefix="inttrain-codegen-") as tmp:
        src = Path(work_dir) if work_dir else Path(tmp)
        gen.write(src)
        (src / "check_main.c").write_text(HARNESS)
        _write_input(src / "batches.bin", x, x_exp, y, idx, evals, lr_shift)
        r = _compile(cc, src, src / "check", extra)
        if r.returncode != 0:
            raise ToolchainError(f"{Path(cc).name} {' '.join(CFLAGS + extra)} failed: "
                                 f"{_first_error(r.stderr, f'exit {r.returncode}')}")
        sizes = object_sizes(cc, [src / f"{f[:-2]}.check.o" for f in SOURCES])
        results, stats = {}, {"changed": 0}
        builds = [("native", src / "check")]
        m32 = None if runner else _compile(cc, src, src / "check32", [*extra, "-m32"])
        if m32 is not None and m32.returncode == 0:
            builds.append(("m32", src / "check32"))
        for tag, exe in builds:
            out = src / f"out_{tag}.bin"
            run = subprocess.run([*(runner or []), str(exe), str(src / "batches.bin"), str(out)], capture_output=True, text=True)
            if run.returncode != 0:
                results[tag] = f"the C program ({tag}) exited with status {run.returncode}"
                continue
            model = load_model()
            opt = SGD(model.params(), lr_shift, momentum_shift, model.desc["rounding"]["update"])
            results[tag] = _compare(out.read_bytes(), model, opt, x, x_exp, y, idx, evals, stats)
    if m32 is None:
        m32_text = "not tried (cross build)"
    elif m32.returncode != 0:
        m32_text = f"not available ({_first_error(m32.stderr, f'exit {m32.returncode}')})"
    else:
        m32_text = "identical" if results["m32"] is None else results["m32"]
    native, m32_diff = results["native"], results.get("m32")
    msg = native or (f"-m32 build: {m32_diff}" if m32_diff else
                     f"C and micro identical: every logit and weight code after each of {steps} steps, "
                     f"{sum(len(b) for b in evals)} predictions")
    return CheckResult(native is None and m32_diff is None, msg, {**sizes, "buffers": gen.buffer_bytes,
                       "params": gen.param_bytes, "init": gen.init_bytes}, m32_text, stats["changed"], cc)
