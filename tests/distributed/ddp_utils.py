"""Harness for the distributed tests: run a function on N gloo ranks over loopback, never hang.

Worker functions live here (not in the test modules) so that spawned processes can import them by
name (tests are collected with ``--import-mode=importlib``; the spawn start method passes sys.path).
"""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def run_process_group(cmd: list[str], timeout: float, **env: str) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own session, without this process's RANK / WORLD_SIZE / LOCAL_RANK (plus ``env``);
    on timeout kill the whole group (a launcher and its ranks) and re-raise."""
    full = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    full.update(env)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, outdir, pg_timeout, args):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    out = Path(outdir) / f"rank{rank}.pt"
    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
            timeout=timedelta(seconds=pg_timeout),
        )
        result = fn(rank, world, *args)
        torch.save({"ok": True, "result": result}, out)
    except BaseException:  # noqa: BLE001 - report everything to the parent
        torch.save({"ok": False, "error": traceback.format_exc()}, out)
        os._exit(1)  # do not wait on a group whose peers may be gone
    dist.destroy_process_group()


def run_ranks(fn, tmp_path, *args, world_size=2, timeout=20.0, pg_timeout=10.0, allow_failure=False):
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned gloo ranks; return their results.

    Every process is joined against one deadline (``timeout`` seconds) and killed past it, so a
    hung collective fails the test instead of hanging it.  With ``allow_failure`` the per-rank
    records ``{"ok", "result"|"error", "exitcode"}`` are returned as they are.
    """
    if isinstance(fn, str):
        fn = globals()[fn]
    ctx = mp.get_context("spawn")
    port = free_port()
    outdir = Path(tmp_path)
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, fn, str(outdir), pg_timeout, args))
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    if hung:
        raise TimeoutError(f"ranks {hung} still running after {timeout}s")
    records = []
    for r, p in enumerate(procs):
        f = outdir / f"rank{r}.pt"
        rec = torch.load(f, weights_only=False) if f.exists() else {"ok": False, "error": "no result file"}
        rec["exitcode"] = p.exitcode
        records.append(rec)
    if allow_failure:
        return records
    errors = [f"rank {r}: {rec.get('error')} (exit {rec['exitcode']})" for r, rec in enumerate(records) if not rec["ok"]]
    if errors:
        raise RuntimeError("\n".join(errors))
    return [rec["result"] for rec in records]


# ----------------------------------------------------------------------------- problems

def regression_data(n=64, d=16, k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, k, generator=g)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(n, k, generator=g)
    return x, y


def mlp(d=16, h=32, k=4, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, h), nn.Tanh(), nn.Linear(h, k))


def shard(t, rank, world):
    return t.chunk(world)[rank]


def max_param_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def ranks_agree(model: nn.Module) -> float:
    """Max difference of the flat parameters between this rank and rank 0."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    return float((flat - ref).abs().max())


# ----------------------------------------------------------------------------- workers

def worker_fp32_matches_single(rank, world, steps):
    """DDP (default hook) on shards of the global batch vs one process on the whole batch."""
    x, y = regression_data()
    ref = mlp()
    model = DDP(copy.deepcopy(ref))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    xs, ys = shard(x, rank, world), shard(y, rank, world)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(xs), ys).backward()
        opt.step()
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    return {"diff": max_param_diff(model.module, ref), "agree": ranks_agree(model.module)}


def worker_int8_vs_fp32(rank, world, steps, lr, error_feedback, chunk_size=2048, mode="allgather"):
    """Train the same model twice in lock step, fp32 all-reduce vs the int8 hook; record the gap."""
    from inttrain.distributed import FP32HookState, Int8HookState, fp32_allreduce_hook, int8_allreduce_hook

    x, y = regression_data(n=128)
    xs, ys = shard(x, rank, world), shard(y, rank, world)
    base = mlp()
    m32 = DDP(copy.deepcopy(base))
    m8 = DDP(copy.deepcopy(base))
    s32 = FP32HookState()
    s8 = Int8HookState(seed=1234, error_feedback=error_feedback, chunk_size=chunk_size, mode=mode)
    m32.register_comm_hook(s32, fp32_allreduce_hook)
    m8.register_comm_hook(s8, int8_allreduce_hook)
    o32 = torch.optim.SGD(m32.parameters(), lr=lr)
    o8 = torch.optim.SGD(m8.parameters(), lr=lr)
    diffs, l32, l8 = [], [], []
    for _ in range(steps):
        for m, o, log in ((m32, o32, l32), (m8, o8, l8)):
            o.zero_grad()
            loss = nn.functional.mse_loss(m(xs), ys)
            loss.backward()
            o.step()
            log.append(float(loss.detach()))
        diffs.append(max_param_diff(m32.module, m8.module))
    with torch.no_grad():
        f32 = float(nn.functional.mse_loss(m32.module(x), y))
        f8 = float(nn.functional.mse_loss(m8.module(x), y))
    return {
        "diffs": diffs, "scales": s8.max_scale_per_step, "loss32": l32, "loss8": l8,
        "final32": f32, "final8": f8, "bytes8": s8.bytes_per_step, "bytes32": s32.bytes_per_step,
        "fp32_equiv": s8.fp32_bytes_per_step, "agree": ranks_agree(m8.module),
        "numel": sum(p.numel() for p in base.parameters()),
    }


def worker_bytes(rank, world, steps, mode):
    """Bytes put into collectives per step: int8 hook vs fp32 all-reduce on a ~100k-parameter MLP."""
    from inttrain.distributed import FP32HookState, Int8HookState, fp32_allreduce_hook, int8_allreduce_hook

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    x = torch.randn(32, 256)
    y = torch.randint(0, 10, (32,))
    m32, m8 = DDP(copy.deepcopy(base), bucket_cap_mb=0.25), DDP(copy.deepcopy(base), bucket_cap_mb=0.25)
    s32, s8 = FP32HookState(), Int8HookState(mode=mode)
    m32.register_comm_hook(s32, fp32_allreduce_hook)
    m8.register_comm_hook(s8, int8_allreduce_hook)
    for _ in range(steps):
        for m in (m32, m8):
            nn.functional.cross_entropy(m(shard(x, rank, world)), shard(y, rank, world)).backward()
    return {"bytes8": s8.bytes_per_step, "bytes32": s32.bytes_per_step, "fp32_equiv": s8.fp32_bytes_per_step,
            "numel": sum(p.numel() for p in base.parameters())}


def worker_prepared_int8(rank, world, steps):
    """A model converted by ``inttrain.prepare_(model, "int8")`` trains under DDP with the int8 hook."""
    import inttrain
    from inttrain.distributed import Int8HookState, int8_allreduce_hook

    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 32, generator=g)
    y = (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:8].sum(1) > 0).long()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    inttrain.prepare_(model, "int8")
    kinds = sorted({type(m).__name__ for m in model.modules()})
    ddp = DDP(model)
    state = Int8HookState(seed=7)
    ddp.register_comm_hook(state, int8_allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    xs, ys = shard(x, rank, world), shard(y, rank, world)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(xs), ys)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return {"losses": losses, "kinds": kinds, "agree": ranks_agree(model), "bytes": state.bytes_per_step}


def worker_all_ranks_finite_plain(rank, world):
    """The helper alone: one rank with a NaN gradient makes every rank see False."""
    from inttrain.distributed import all_ranks_finite

    model = mlp()
    nn.functional.mse_loss(model(torch.randn(4, 16)), torch.zeros(4, 4)).backward()
    first = all_ranks_finite(model)
    if rank == world - 1:
        next(model.parameters()).grad[0, 0] = float("nan")
    second = all_ranks_finite(model)
    return {"first": first, "second": second}


def worker_skip_nonfinite(rank, world, steps, bad_step, mode):
    """DDP + int8 hook; rank 1 gets an inf input at ``bad_step``: every rank skips that step."""
    from inttrain.distributed import Int8HookState, all_ranks_finite, int8_allreduce_hook

    x, y = regression_data()
    xs, ys = shard(x, rank, world), shard(y, rank, world)
    model = mlp()
    ddp = DDP(model)
    state = Int8HookState(seed=3, mode=mode)
    ddp.register_comm_hook(state, int8_allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    skipped, residuals_finite = [], True
    for step in range(steps):
        inp = xs.clone()
        if step == bad_step and rank == 1:
            inp[0, 0] = float("inf")
        opt.zero_grad()
        nn.functional.mse_loss(ddp(inp), ys).backward()
        if all_ranks_finite(ddp):
            opt.step()
        else:
            skipped.append(step)
        residuals_finite &= all(bool(torch.isfinite(r).all()) for r in state.residuals.values())
    params_finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return {"skipped": skipped, "hook_skipped": state.skipped_steps, "agree": ranks_agree(model),
            "params_finite": params_finite, "residuals_finite": residuals_finite}


def worker_dead_peer(rank, world, die_after):
    """Rank ``world-1`` dies after a barrier; the others must get an error, not hang."""
    dist.barrier()
    if rank == world - 1:
        os._exit(3)
    time.sleep(die_after)
    t0 = time.monotonic()
    try:
        for _ in range(100):
            dist.all_reduce(torch.ones(1000))
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"[:500], "elapsed": time.monotonic() - t0}
    return {"error": None, "elapsed": time.monotonic() - t0}


def worker_many(rank, world, scenarios):
    """Run several ``(name, worker_name, args)`` scenarios in one group (spawning costs seconds)."""
    out = {}
    for name, worker, args in scenarios:
        t0 = time.monotonic()
        try:
            out[name] = {"ok": True, "result": globals()[worker](rank, world, *args)}
        except Exception:  # noqa: BLE001
            out[name] = {"ok": False, "error": traceback.format_exc()}
        out[name]["seconds"] = time.monotonic() - t0
        dist.barrier()
    return out


def bn_cnn(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 6 * 6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def worker_sync_bn(rank, world, steps, recipe):
    """DDP + CPUSyncBatchNorm on shards vs one process with plain BN on the global batch."""
    import inttrain
    from inttrain.distributed.sync_bn import CPUSyncBatchNorm, convert_sync_batchnorm_

    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, 6, 6, generator=g) * 2 + 1
    y = torch.randint(0, 4, (32,), generator=g)
    ref = bn_cnn()
    if recipe != "fp32":
        inttrain.prepare_(ref, recipe)
    model = copy.deepcopy(ref)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # built before the conversion
    converted = convert_sync_batchnorm_(model)
    ddp = DDP(model)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    xs, ys = shard(x, rank, world), shard(y, rank, world)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(xs), ys).backward()
        opt.step()
        ref_opt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    stats = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    ref_stats = {k: v for k, v in ref.state_dict().items() if "running" in k}
    flat = torch.cat([v.reshape(-1) for v in stats.values()])
    rank0 = flat.clone()
    dist.broadcast(rank0, 0)
    model.eval()
    ref.eval()
    with torch.no_grad():
        eval_diff = float((model(x) - ref(x)).abs().max())
    return {
        "converted": converted,
        "kinds": sorted({type(m).__name__ for m in model.modules()}),
        "stats_vs_rank0": float((flat - rank0).abs().max()),
        "stats_vs_single": max(float((stats[k] - ref_stats[k]).abs().max()) for k in stats),
        "stats_scale": max(float(v.abs().max()) for v in ref_stats.values()),
        "param_diff": max_param_diff(model, ref),
        "eval_diff": eval_diff,
        "same_keys": sorted(model.state_dict()) == sorted(ref.state_dict()),
        "is_sync": all(isinstance(m, CPUSyncBatchNorm) for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)),
    }


def worker_hook_state_resume(rank, world, steps, cut):
    """int8 hook: train ``steps``; or ``cut`` steps, save weights+optimizer+hook state, rebuild DDP, load, go on."""
    from inttrain.distributed import Int8HookState, int8_allreduce_hook

    x, y = regression_data(n=128)
    xs, ys = shard(x, rank, world), shard(y, rank, world)

    def fresh(state_dict=None, opt_state=None, hook_state=None):
        model = mlp()
        if state_dict is not None:
            model.load_state_dict(state_dict)
        ddp = DDP(model)
        hs = Int8HookState(seed=5, chunk_size=64).bind(model)
        if hook_state is not None:
            hs.load_state_dict(hook_state)
        ddp.register_comm_hook(hs, int8_allreduce_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        if opt_state is not None:
            opt.load_state_dict(opt_state)
        return model, ddp, hs, opt

    def run(ddp, opt, n):
        for _ in range(n):
            opt.zero_grad()
            nn.functional.mse_loss(ddp(xs), ys).backward()
            opt.step()

    m1, d1, _, o1 = fresh()
    run(d1, o1, steps)
    m2, d2, h2, o2 = fresh()
    run(d2, o2, cut)
    saved = (copy.deepcopy(m2.state_dict()), copy.deepcopy(o2.state_dict()), h2.state_dict())
    residual_norm = sum(float(r.abs().sum()) for r in h2.residuals.values())
    m3, d3, _, o3 = fresh(*saved)
    run(d3, o3, steps - cut)
    m4, d4, _, o4 = fresh(saved[0], saved[1], None)  # residuals dropped: not equal
    run(d4, o4, steps - cut)
    return {"exact": max_param_diff(m1, m3), "without_residuals": max_param_diff(m1, m4),
            "residual_norm": residual_norm, "keys": sorted(saved[2]["residuals"])}
