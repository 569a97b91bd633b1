#!/usr/bin/env python
"""Step time and memory of the NumPy integer engine ``inttrain.micro`` against PyTorch fp32 eager.

    python benchmarks/micro_speed.py                       # lenet + mlp, batch 32, ~1-2 min
    python benchmarks/micro_speed.py --models lenet --rounds 20 --steps 10
    taskset -c 1 python benchmarks/micro_speed.py          # pinned to one core (recommended)

Both engines train the same architecture (no biases; micro: int8 codes, int16 master weights, integer SGD;
torch: float32 ``nn.Sequential`` + ``F.cross_entropy`` + ``torch.optim.SGD``) on the same random batch
shape, with one thread each (``torch.set_num_threads(1)``; OMP/MKL/OpenBLAS thread variables are set to 1
before NumPy is imported). A step is forward, loss gradient, backward and the weight update.

Timing: after a warm-up, ``--rounds`` rounds each time ``--steps`` micro steps then ``--steps`` torch steps
(interleaved, so a busy shared machine slows both alike); the table gives the median ms per step and the
ratio micro / torch (< 2 is the goal of issue #7).

Memory, each engine in a fresh subprocess that imports only what it needs (micro never imports torch):
``peak RSS`` is the process's maximum resident set (``VmHWM`` of ``/proc/self/status``), ``step peak`` the largest
extra resident memory during 5 training steps over the RSS right before them (``/proc/self/statm`` is
Linux-only; elsewhere the column is empty), and for micro ``traced peak`` the peak of Python/NumPy
allocations in a step (``tracemalloc``; NumPy reports its buffers to it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import numpy as np  # noqa: E402

MODELS = {
    "lenet": {"input_shape": [1, 28, 28], "layers": [
        {"type": "conv2d", "in_channels": 1, "out_channels": 6, "kernel_size": 5, "padding": 2}, {"type": "relu"},
        {"type": "maxpool2d", "kernel_size": 2},
        {"type": "conv2d", "in_channels": 6, "out_channels": 16, "kernel_size": 5}, {"type": "relu"},
        {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"},
        {"type": "linear", "in_features": 400, "out_features": 120}, {"type": "relu"},
        {"type": "linear", "in_features": 120, "out_features": 84}, {"type": "relu"},
        {"type": "linear", "in_features": 84, "out_features": 10}]},
    "mlp": {"input_shape": [784], "layers": [
        {"type": "linear", "in_features": 784, "out_features": 256}, {"type": "relu"},
        {"type": "linear", "in_features": 256, "out_features": 128}, {"type": "relu"},
        {"type": "linear", "in_features": 128, "out_features": 10}]},
    "mlp-digits": {"input_shape": [64], "layers": [
        {"type": "linear", "in_features": 64, "out_features": 128}, {"type": "relu"},
        {"type": "linear", "in_features": 128, "out_features": 10}]},
}


def _data(desc: dict, batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 128, size=(batch, *desc["input_shape"])).astype(np.int8)
    y = rng.integers(0, 10, size=batch)
    return x, y


def micro_stepper(desc: dict, batch: int):
    """A closure running one micro training step on a fixed random batch."""
    from inttrain import micro as M

    model = M.Sequential.from_description(desc)
    opt = M.SGD(model.params(), 8)
    model.check_batch(batch)
    x, y = _data(desc, batch)

    def step():
        logits = model.forward(M.IntTensor(x, -7))
        err, _ = M.softmax_cross_entropy_grad(logits, y)
        model.backward(err)
        opt.step()
    return step


def torch_module(desc: dict):
    from torch import nn

    mods = []
    for s in desc["layers"]:
        t = s["type"]
        if t == "conv2d":
            mods.append(nn.Conv2d(s["in_channels"], s["out_channels"], s["kernel_size"], s.get("stride", 1),
                                  s.get("padding", 0), bias=False))
        elif t == "linear":
            mods.append(nn.Linear(s["in_features"], s["out_features"], bias=False))
        elif t == "relu":
            mods.append(nn.ReLU())
        elif t == "maxpool2d":
            mods.append(nn.MaxPool2d(s["kernel_size"]))
        elif t == "flatten":
            mods.append(nn.Flatten())
        else:
            raise ValueError(t)
    return nn.Sequential(*mods)


def torch_stepper(desc: dict, batch: int):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch_module(desc)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = _data(desc, batch)
    xt = torch.from_numpy(x).float() / 128
    yt = torch.from_numpy(y)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(xt), yt).backward()
        opt.step()
    return step


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _maxrss_bytes() -> int:
    """Peak RSS of this process: /proc/self/status VmHWM (reset by exec), else getrusage (which on Linux
    keeps the parent's high-water mark across fork + exec, hence not the first choice)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def memory_child(engine: str, model: str, batch: int) -> dict:
    """Run in a subprocess: peak RSS, step peak over the pre-step RSS, tracemalloc peak (micro)."""
    desc = MODELS[model]
    step = (micro_stepper if engine == "micro" else torch_stepper)(desc, batch)
    step()                                       # first step: lazy buffers (momentum, LUT, allocator pools)
    rss0 = _rss_bytes()
    out = {"torch_imported": "torch" in sys.modules}
    if engine == "micro":
        import tracemalloc

        tracemalloc.start()
        step()
        out["traced_peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    peak_step = 0
    for _ in range(5):
        step()
        r = _rss_bytes()
        if r is not None and rss0 is not None:
            peak_step = max(peak_step, r - rss0)
    out["step_peak"] = None if rss0 is None else max(peak_step, _maxrss_bytes() - rss0, 0)
    out["peak_rss"] = _maxrss_bytes()
    return out


def measure_memory(engine: str, model: str, batch: int) -> dict:
    cmd = [sys.executable, __file__, "--mem-child", engine, "--models", model, "--batch", str(batch)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def time_interleaved(model: str, batch: int, rounds: int, steps: int) -> dict:
    desc = MODELS[model]
    fns = {"micro": micro_stepper(desc, batch), "torch": torch_stepper(desc, batch)}
    for fn in fns.values():                      # warm-up
        for _ in range(3):
            fn()
    samples = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            samples[k].append((time.perf_counter() - t0) / steps * 1e3)
    return {k: statistics.median(v) for k, v in samples.items()} | {"samples": samples}


def _mib(b) -> str:
    return "" if b is None else f"{b / 2**20:.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="lenet,mlp", help=f"comma-separated: {', '.join(MODELS)}")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=10, help="steps per engine per round")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--json", default=None, help="also write every sample to this JSON file")
    ap.add_argument("--mem-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.mem_child:
        print(json.dumps(memory_child(args.mem_child, names[0], args.batch)))
        return 0
    import torch

    print(f"numpy {np.__version__}, torch {torch.__version__}, 1 thread, batch {args.batch}, "
          f"{args.rounds} rounds x {args.steps} steps per engine, affinity {sorted(os.sched_getaffinity(0))}", flush=True)
    rows, dump = [], {}
    for m in names:
        t = time_interleaved(m, args.batch, args.rounds, args.steps)
        mem = {} if args.no_memory else {e: measure_memory(e, m, args.batch) for e in ("micro", "torch")}
        dump[m] = {"times_ms": t["samples"], "memory": mem}
        rows.append((m, t["micro"], t["torch"], mem))
        print(f"{m}: micro {t['micro']:.2f} ms/step, torch fp32 {t['torch']:.2f} ms/step", flush=True)
    print()
    print("| model | micro ms/step | torch fp32 ms/step | micro / torch | micro peak RSS MiB | torch peak RSS MiB "
          "| micro step peak MiB | torch step peak MiB | micro traced peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m, tm, tt, mem in rows:
        mi, to = mem.get("micro", {}), mem.get("torch", {})
        print(f"| {m} | {tm:.2f} | {tt:.2f} | {tm / tt:.2f} | {_mib(mi.get('peak_rss'))} | {_mib(to.get('peak_rss'))} "
              f"| {_mib(mi.get('step_peak'))} | {_mib(to.get('step_peak'))} | {_mib(mi.get('traced_peak'))} |")
    if any(mem.get("micro", {}).get("torch_imported") for *_, mem in rows):
        print("warning: the micro memory child imported torch")
    if args.json:
        Path(args.json).write_text(json.dumps(dump, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
