"""Compare DDP communication hooks on a small problem: bytes per step, final loss, time per step.

    python -m inttrain.distributed.compare [--steps 200] [--nproc 2]

Starts ``--nproc`` gloo ranks on 127.0.0.1 (fresh interpreters whose environment names the loopback
interface; this process's environment is left alone) and trains the same MLP (synthetic 10-class problem)
with: the fp32 all-reduce, PyTorch's ``fp16_compress_hook``, PowerSGD (rank 1 and 4), and
:func:`inttrain.distributed.int8_allreduce_hook` in both integer-sum modes.  Bytes are counted by
wrapping ``torch.distributed.all_reduce`` / ``all_gather`` (what each rank puts into collectives),
so every hook is measured the same way.  Also times one 1M-element bucket: all-gather of int8
codes vs all-reduce of int32 codes.
"""

import argparse
import copy
import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from inttrain.distributed.hooks import FP32HookState, Int8HookState, fp32_allreduce_hook, int8_allreduce_hook

#: Bytes passed to the wrapped collectives so far in this process (see :func:`counting`).
sent_bytes = {"bytes": 0}


def counting(fn):
    """Wrap ``dist.all_reduce`` / ``dist.all_gather`` so the bytes of the tensor each call sends add up in
    ``sent_bytes``."""

    def wrapper(*args, **kwargs):
        t = args[1] if fn.__name__ == "all_gather" else args[0]
        sent_bytes["bytes"] += t.numel() * t.element_size()
        return fn(*args, **kwargs)

    wrapper.__name__ = fn.__name__
    return wrapper


def _problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 64, generator=g)
    teacher = torch.randn(64, 10, generator=g)
    y = (x @ teacher + 0.5 * torch.randn(512, 10, generator=g)).argmax(1)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    return x, y, model


def _hooks(world):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    return {
        "fp32 all-reduce (= default)": lambda: (FP32HookState(), fp32_allreduce_hook),
        "fp16_compress_hook": lambda: (None, dh.fp16_compress_hook),
        "PowerSGD rank 1": lambda: (ps.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2), ps.powerSGD_hook),
        "PowerSGD rank 4": lambda: (ps.PowerSGDState(None, matrix_approximation_rank=4, start_powerSGD_iter=2), ps.powerSGD_hook),
        "int8 allgather (default)": lambda: (Int8HookState(seed=0), int8_allreduce_hook),
        "int8 allreduce int32": lambda: (Int8HookState(seed=0, mode="allreduce"), int8_allreduce_hook),
        "int8 allgather, no error feedback": lambda: (Int8HookState(seed=0, error_feedback=False), int8_allreduce_hook),
    }


def _worker(rank, world, port, steps):
    """One rank (GLOO_SOCKET_IFNAME=lo comes with its environment); rank 0 prints the results as JSON."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    dist.all_reduce = counting(dist.all_reduce)
    dist.all_gather = counting(dist.all_gather)
    x, y, base = _problem()
    xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
    rows = []
    for name, make in _hooks(world).items():
        model = DDP(copy.deepcopy(base))
        state, hook = make()
        if hook is not None:
            model.register_comm_hook(state, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        per_step = []
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            before = sent_bytes["bytes"]
            opt.zero_grad()
            nn.functional.cross_entropy(model(xs), ys).backward()
            per_step.append(sent_bytes["bytes"] - before)
            opt.step()
        dt = (time.perf_counter() - t0) / steps
        with torch.no_grad():
            loss = float(nn.functional.cross_entropy(model.module(x), y))
        # steady state: PowerSGD all-reduces plainly for its first iterations
        rows.append((name, sum(per_step[-10:]) / 10, loss, dt * 1e3))
    # one 1M-element bucket: int8 all-gather + local int32 sum vs int32 all-reduce
    n = 1 << 20
    codes = torch.randint(-127, 128, (n,), dtype=torch.int8)
    micro = {}
    for label in ("allgather int8 (collective)", "allgather int8 + int32 sum", "allreduce int32 (widen + collective)"):
        times = []
        for _ in range(10):
            dist.barrier()
            t0 = time.perf_counter()
            if label.startswith("allgather"):
                out = [torch.empty_like(codes) for _ in range(world)]
                dist.all_gather(out, codes)
                if label.endswith("sum"):
                    total = out[0].to(torch.int32)
                    for o in out[1:]:
                        total.add_(o)
            else:
                wide = codes.to(torch.int32)
                dist.all_reduce(wide)
            times.append(time.perf_counter() - t0)
        micro[label] = sorted(times)[len(times) // 2] * 1e3
    if rank == 0:
        print(json.dumps([rows, micro, sum(p.numel() for p in base.parameters())]), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)  # this process is that rank
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        _worker(args.worker, args.nproc, args.port, args.steps)
        return
    rows, micro, numel = _run_ranks(args.nproc, args.steps)
    print(f"{args.nproc} ranks, gloo on 127.0.0.1, MLP with {numel} parameters, {args.steps} SGD steps")
    print("| hook | bytes/step/rank | vs fp32 | final loss | ms/step |\n|---|---:|---:|---:|---:|")
    fp32 = rows[0][1]
    for name, b, loss, ms in rows:
        print(f"| {name} | {b:,.0f} | {fp32 / b:.2f}x | {loss:.4f} | {ms:.2f} |")
    print("\n1M-element bucket (median of 10):")
    for k, v in micro.items():
        print(f"  {k}: {v:.2f} ms")


def _run_ranks(nproc, steps):
    """Start the ranks as child interpreters and return rank 0's results."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = str(Path(__file__).resolve().parents[2])  # the children import this same inttrain
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", "inttrain.distributed.compare", "--nproc", str(nproc), "--steps", str(steps),
           "--port", str(port), "--worker"]
    procs = [subprocess.Popen([*cmd, str(r)], env=env, stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                              text=True) for r in range(nproc)]
    try:
        out, _ = procs[0].communicate(timeout=600)
    finally:
        for p in procs[1:]:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
    if procs[0].returncode != 0:
        raise SystemExit(f"rank 0 failed with exit code {procs[0].returncode}")
    return json.loads(out.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
