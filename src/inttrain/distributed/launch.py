"""``inttrain train --nproc N``: start N local ranks of ``python -m inttrain`` on gloo over 127.0.0.1.

Each rank is a fresh interpreter with the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so the ``--nproc`` path and ``torchrun
--nproc-per-node N -m inttrain train ...`` run the same code. The rendezvous store is hosted by
this (parent) process on a port the OS picked (port 0: no free-port race); ranks connect to it as
clients (``TORCHELASTIC_USE_AGENT_STORE``, as under torchrun's agent).

If a rank exits with an error the others fail their next collective (gloo notices the closed
connection at once, otherwise after ``timeout_s``); whatever is still running ``timeout_s + 10``
seconds after the first failure is killed. SIGINT/SIGTERM to the parent are passed on as SIGTERM,
which the ranks treat like a single-process run does (finish the step, rank 0 saves ``last``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

__all__ = ["launch_local"]


#: Seconds a rank that failed with the generic exit code 1 waits for a peer with a specific failure to exit.
COLLATERAL_GRACE_S = 2.0


def launch_local(args: list[str], nproc: int, timeout_s: float, echo: Callable[[str], Any] = print,
                 threads_per_rank: int | None = None, max_restarts: int = 0) -> int:
    """Run ``python -m inttrain *args`` as ranks 0..nproc-1; return the exit code for the whole run.

    ``max_restarts``: after a rank fails, stop the others at once and start all ranks again (with
    ``TORCHELASTIC_RESTART_COUNT`` = 1, 2, ..., as torchrun's agent does), at most this many times;
    ``inttrain train`` then resumes from the run folder's ``checkpoints/last``. A rank exiting with
    code 2 (a usage error: bad option, taken ``--out``) is not restarted.
    """
    restart = 0
    while True:
        failure, killed, code0, signaled = _attempt(args, nproc, timeout_s, threads_per_rank, restart,
                                                    kill_at_once=restart < max_restarts)
        if failure is None:
            return code0
        rank, code = failure
        if restart < max_restarts and not signaled and code != 2:  # 2: a usage error, the same on every attempt
            restart += 1
            echo(f"error: rank {rank} of {nproc} failed (exit code {code}); restarting all ranks "
                 f"(restart {restart} of {max_restarts})")
            continue
        echo(f"error: rank {rank} of {nproc} failed (exit code {code}); the run stopped"
             + (f"; killed ranks {killed} still running {timeout_s + 10:.0f}s later" if killed else ""))
        return code if 0 < code < 128 else 1


def _attempt(args: list[str], nproc: int, timeout_s: float, threads_per_rank: int | None, restart: int,
             kill_at_once: bool) -> tuple[tuple[int, int] | None, list[int], int, bool]:
    """One attempt: (first failure (rank, code) or None, ranks killed past the deadline, rank 0's exit code,
    whether a signal was forwarded)."""
    import torch.distributed as dist

    # A new store per attempt (as torchrun's agent does): no keys left over from the failed one.
    store = dist.TCPStore("127.0.0.1", 0, world_size=nproc, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout_s))
    base = dict(os.environ)
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE=str(nproc),
                LOCAL_WORLD_SIZE=str(nproc), TORCHELASTIC_USE_AGENT_STORE="True",
                TORCHELASTIC_RESTART_COUNT=str(restart))
    base.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if threads_per_rank is not None:
        base["INTTRAIN_THREADS_PER_RANK"] = str(threads_per_rank)
    procs: list[subprocess.Popen] = []
    got: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        got.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    killed: list[int] = []
    first_failure: tuple[int, int, float] | None = None  # (rank, code, time)
    try:
        for r in range(nproc):
            env = dict(base, RANK=str(r), LOCAL_RANK=str(r))
            procs.append(subprocess.Popen([sys.executable, "-m", "inttrain", *args], env=env))
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0) and not _by_signal(c, got)]
            if bad:
                # The culprit's peers fail in a collective with the generic exit code 1, sometimes before the
                # culprit's own exit is seen: a rank with another code is named first, even a poll later.
                bad.sort(key=lambda rank_code: rank_code[1] == 1)
                if first_failure is None:
                    first_failure = (*bad[0], time.monotonic())
                elif first_failure[1] == 1 and bad[0][1] != 1:
                    first_failure = (*bad[0], first_failure[2])
            # Killing at once still leaves a generic failure (code 1) a moment for its culprit to exit.
            grace = COLLATERAL_GRACE_S if first_failure is not None and first_failure[1] == 1 else 0.0
            if first_failure is not None and (
                    (kill_at_once and time.monotonic() - first_failure[2] >= grace)
                    or time.monotonic() - first_failure[2] > timeout_s + 10):
                for r, p in enumerate(procs):
                    if p.poll() is None:
                        p.kill()
                        if not kill_at_once:
                            killed.append(r)
                for p in procs:
                    p.wait(10)
                break
            time.sleep(0.05)
    finally:
        for p in procs:  # only on an unexpected error in this loop: never leave ranks behind
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for s, h in old.items():
            signal.signal(s, h)
        del store
    codes = [p.returncode for p in procs]
    if first_failure is None:
        bad = [(r, c) for r, c in enumerate(codes) if c != 0 and not _by_signal(c, got)]
        first_failure = (*bad[0], 0.0) if bad else None
    failure = None if first_failure is None else (first_failure[0], first_failure[1])
    return failure, killed, codes[0], bool(got)


def _by_signal(code: int, got: list[int]) -> bool:
    """An exit code a rank returns after a forwarded signal (128 + signum), not a failure."""
    return bool(got) and code >= 128
