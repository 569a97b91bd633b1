"""Data-parallel CIFAR training with different gradient communication: accuracy, bytes, step time.

    python benchmarks/distributed.py --data PATH.npz --out results/dist [--train 6000 --val 2000
        --epochs 2 --batch-size 64 --lr 0.005 --model small-cnn --recipe fp32 --hooks fp32,fp16,powersgd,int8]

Two (``--nproc``) gloo ranks on 127.0.0.1, one thread each, train the same model from the same
initial weights on the same data order once per communication hook:

* ``fp32``     -- the default all-reduce (``inttrain.distributed.fp32_allreduce_hook``, same result),
* ``fp16``     -- PyTorch's ``fp16_compress_hook``,
* ``powersgd`` -- PyTorch's PowerSGD (rank ``--powersgd-rank``, plain all-reduce for the first 10 steps),
* ``int8``     -- ``inttrain.distributed.int8_allreduce_hook`` (all-gather of int8 codes, error feedback).

``--data`` is an .npz with ``x`` uint8 (N, 32, 32, 3) or (N, 3, 32, 32) and ``y`` int64 (N,) (e.g. the
first 20k CIFAR-10 training images); a seeded split takes ``--train`` samples for training and a
disjoint ``--val`` for validation. The global batch is ``--batch-size``; each rank trains on its
half. Bytes per step are what one rank puts into collectives during backward (measured by
wrapping ``torch.distributed.all_reduce``/``all_gather``; the mean over all steps, so PowerSGD's
warm-up counts). Step time is forward + backward (with communication) + optimizer step, median
over steps, rank 0. Writes ``results.md`` (the table) and ``results.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

try:
    import inttrain  # noqa: F401
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

HOOKS = ("fp32", "fp16", "powersgd", "int8")
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)

def load_data(path: str, n_train: int, n_val: int, seed: int):
    d = np.load(path)
    x, y = d["x"], d["y"].astype(np.int64)
    if x.ndim != 4:
        raise SystemExit(f"{path}: x must be 4-d images, got shape {x.shape}")
    if x.shape[-1] in (1, 3):  # NHWC -> NCHW
        x = x.transpose(0, 3, 1, 2)
    if n_train + n_val > len(x):
        raise SystemExit(f"{path}: {len(x)} samples, fewer than --train {n_train} + --val {n_val}")
    perm = np.random.default_rng(seed).permutation(len(x))
    x = torch.from_numpy(np.ascontiguousarray(x)).float().div_(255)
    c = x.shape[1]
    mean = torch.tensor(MEAN[:c]).view(1, c, 1, 1) if c == 3 else x.mean()
    std = torch.tensor(STD[:c]).view(1, c, 1, 1) if c == 3 else x.std()
    x = (x - mean) / std
    y = torch.from_numpy(y)
    tr, va = torch.from_numpy(perm[:n_train]), torch.from_numpy(perm[n_train:n_train + n_val])
    return x[tr].contiguous(), y[tr].contiguous(), x[va].contiguous(), y[va].contiguous()


def make_hook(name: str, powersgd_rank: int):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    from inttrain.distributed import FP32HookState, Int8HookState, fp32_allreduce_hook, int8_allreduce_hook

    if name == "fp32":
        return FP32HookState(), fp32_allreduce_hook
    if name == "fp16":
        return None, dh.fp16_compress_hook
    if name == "powersgd":
        return ps.PowerSGDState(None, matrix_approximation_rank=powersgd_rank, start_powerSGD_iter=10), ps.powerSGD_hook
    if name == "int8":
        return Int8HookState(seed=0), int8_allreduce_hook
    raise ValueError(name)


@torch.no_grad()
def accuracy(model, x, y, batch=500) -> float:
    model.eval()
    correct = sum(int((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum()) for i in range(0, len(x), batch))
    model.train()
    return correct / len(x)


def worker(rank: int, world: int, port: int, args: argparse.Namespace, queue) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    import inttrain
    from inttrain.distributed.compare import counting, sent_bytes
    from inttrain.models import build_model
    from torch.nn.parallel import DistributedDataParallel as DDP

    xt, yt, xv, yv = load_data(args.data, args.train, args.val, args.seed)
    torch.manual_seed(args.seed)
    base = build_model(args.model, 10, xt.shape[1], xt.shape[2])
    if args.recipe != "fp32":
        inttrain.prepare_(base, args.recipe)
    all_reduce, all_gather = dist.all_reduce, dist.all_gather
    local = args.batch_size // world
    steps_per_epoch = len(xt) // args.batch_size
    rows = []
    for name in args.hooks:
        torch.manual_seed(args.seed)
        model = copy.deepcopy(base)
        ddp = DDP(model)
        state, hook = make_hook(name, args.powersgd_rank)
        if name == "int8":
            state.bind(model)  # per-parameter chunks and residuals, as `inttrain train --comm int8` does
        ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9, weight_decay=args.weight_decay)
        gen = torch.Generator().manual_seed(args.seed)
        step_times, step_bytes, losses, epoch_acc = [], [], [], []
        dist.barrier()
        t_start = time.perf_counter()
        for _epoch in range(args.epochs):
            perm = torch.randperm(len(xt), generator=gen)
            for b in range(steps_per_epoch):
                idx = perm[b * args.batch_size:(b + 1) * args.batch_size][rank * local:(rank + 1) * local]
                x, y = xt[idx], yt[idx]
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(ddp(x), y)
                dist.all_reduce, dist.all_gather = counting(all_reduce), counting(all_gather)
                before = sent_bytes["bytes"]
                loss.backward()
                step_bytes.append(sent_bytes["bytes"] - before)
                dist.all_reduce, dist.all_gather = all_reduce, all_gather
                opt.step()
                step_times.append(time.perf_counter() - t0)
                losses.append(float(loss.detach()))
            epoch_acc.append(accuracy(model, xv, yv) if rank == 0 else float("nan"))
        wall = time.perf_counter() - t_start
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        ref = params.clone()
        dist.broadcast(ref, 0)
        rows.append({
            "hook": name,
            "val_accuracy": epoch_acc[-1],
            "val_accuracy_per_epoch": epoch_acc,
            "train_loss_last_epoch": statistics.mean(losses[-steps_per_epoch:]),
            "bytes_per_step": statistics.mean(step_bytes),
            "bytes_per_step_last": step_bytes[-1],
            "ms_per_step": statistics.median(step_times) * 1e3,
            "wall_s": wall,
            "steps": len(step_times),
            "ranks_agree": float((params - ref).abs().max()) == 0.0,
        })
        if rank == 0:
            print(f"[rank 0] {name}: val_acc {epoch_acc[-1]:.4f}  {rows[-1]['bytes_per_step']:,.0f} B/step  "
                  f"{rows[-1]['ms_per_step']:.1f} ms/step  ({wall:.0f}s)", flush=True)
    if rank == 0:
        queue.put({"rows": rows, "numel": sum(p.numel() for p in base.parameters()),
                   "steps_per_epoch": steps_per_epoch})
    dist.barrier()
    dist.destroy_process_group()


def table(res: dict, args: argparse.Namespace) -> str:
    fp32 = next((r["bytes_per_step"] for r in res["rows"] if r["hook"] == "fp32"), None)
    label = {"fp32": "fp32 all-reduce", "fp16": "`fp16_compress_hook`",
             "powersgd": f"PowerSGD rank {args.powersgd_rank}", "int8": "inttrain int8 (all-gather, error feedback)"}
    lines = [
        f"{args.nproc} ranks (gloo, 127.0.0.1, {args.threads} thread each), model `{args.model}` "
        f"({res['numel']:,} parameters, recipe {args.recipe}), `{Path(args.data).name}`: {args.train} train / "
        f"{args.val} val samples, {args.epochs} epochs x {res['steps_per_epoch']} steps, global batch "
        f"{args.batch_size}, SGD lr {args.lr} momentum 0.9 wd {args.weight_decay}, seed {args.seed}; "
        f"torch {torch.__version__}, {platform.machine()}.",
        "",
        "| communication | final val acc | val acc per epoch | train loss (last epoch) | bytes/step/rank | vs fp32 | ms/step | ranks agree |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in res["rows"]:
        ratio = f"{fp32 / r['bytes_per_step']:.2f}x" if fp32 else "-"
        per_epoch = ", ".join(f"{a:.4f}" for a in r["val_accuracy_per_epoch"])
        lines.append(f"| {label[r['hook']]} | {r['val_accuracy']:.4f} | {per_epoch} | {r['train_loss_last_epoch']:.4f} | "
                     f"{r['bytes_per_step']:,.0f} | {ratio} | {r['ms_per_step']:.1f} | "
                     f"{'yes' if r['ranks_agree'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help=".npz with x (N,32,32,3 uint8) and y (N,)")
    ap.add_argument("--out", required=True, help="output folder (results.md, results.json)")
    ap.add_argument("--train", type=int, default=6000)
    ap.add_argument("--val", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="global batch")
    ap.add_argument("--lr", type=float, default=0.005)
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--model", default="small-cnn")
    ap.add_argument("--recipe", default="fp32", help="fp32 or an inttrain.prepare_ recipe (e.g. int8)")
    ap.add_argument("--hooks", default=",".join(HOOKS), help=f"comma-separated subset of {','.join(HOOKS)}")
    ap.add_argument("--powersgd-rank", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.hooks = [h.strip() for h in args.hooks.split(",") if h.strip()]
    bad = [h for h in args.hooks if h not in HOOKS]
    if bad or not args.hooks:
        ap.error(f"--hooks: unknown {bad}; allowed: {', '.join(HOOKS)}")
    if args.batch_size % args.nproc:
        ap.error("--batch-size must be divisible by --nproc")
    if not Path(args.data).is_file():
        ap.error(f"--data {args.data!r} is not a file")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.nproc, port, args, queue)) for r in range(args.nproc)]
    for p in procs:
        p.start()
    try:
        res = None
        while res is None:
            try:
                res = queue.get(timeout=5)
            except Exception:  # noqa: BLE001 - queue.Empty: check the ranks are still alive
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    raise SystemExit(f"rank {dead[0]} failed (exit code {procs[dead[0]].exitcode})") from None
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    md = table(res, args)
    (out / "results.md").write_text(md)
    (out / "results.json").write_text(json.dumps({"args": vars(args), **res}, indent=2) + "\n")
    print(md)
    print(f"wrote {out / 'results.md'}")


if __name__ == "__main__":
    main()
