"""Elastic restarts and failing ranks (issue 8): a worker killed mid-run, a hung worker, SyncBatchNorm from the CLI.

A fault is injected with ``INTTRAIN_FAULT_STEP`` (``inttrain.distributed.data_parallel``): rank 1 exits
(code 17) or hangs right after that step, on the first attempt only. Every launcher runs in its own
session with a hard timeout (killed as a group past it) and ``--dist-timeout``, so nothing can hang.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ddp_utils import free_port, run_process_group

BASE = ["--model", "small-cnn", "--dataset", "digits", "--batch-size", "64", "--log-every", "1", "--threads", "1",
        "--dist-timeout", "20", "--comm", "int8", "--save-every", "5", "--max-steps", "14"]


def _run(cmd: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return run_process_group(cmd, timeout, OMP_NUM_THREADS="1", **env)


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "inttrain", *args], **env)


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / "last.safetensors")


def _bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _steps(run: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("elastic") / "ref"
    r = _cli("train", *BASE, "--nproc", "2", "--out", str(run))
    assert r.returncode == 0, r.stderr
    return run


@pytest.mark.slow  # intermittent on a loaded 2-core machine (1 in 2-3 runs): the fault-injected rank sometimes
# dies by SIGABRT ("terminate called without an active exception") instead of exit code 17; see the closing note
def test_max_restarts_resumes_bit_exact(tmp_path: Path, uninterrupted: Path) -> None:
    run = tmp_path / "restarted"
    r = _cli("train", *BASE, "--nproc", "2", "--max-restarts", "1", "--out", str(run), INTTRAIN_FAULT_STEP="8")
    assert r.returncode == 0, r.stderr
    assert "rank 1 of 2 failed (exit code 17); restarting all ranks (restart 1 of 1)" in r.stderr
    assert "resuming" in r.stdout and "at step 5" in r.stdout
    assert "restored the error-feedback residuals of 2 ranks" in r.stdout
    # int8 communication with per-rank residuals restored: the same weights as a run never interrupted
    assert _bit_equal(_weights(run), _weights(uninterrupted))
    assert _steps(run) == list(range(1, 15))  # the rows of the lost steps 6..8 are replaced, not duplicated
    state = torch.load(run / "checkpoints" / "last.state.pt", weights_only=True)
    assert state["comm"]["world"] == 2 and len(state["comm"]["ranks"]) == 2


@pytest.mark.slow
def test_torchrun_max_restarts_resumes_bit_exact(tmp_path: Path, uninterrupted: Path) -> None:
    run = tmp_path / "torchrun"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "inttrain", "train", *BASE,
           "--out", str(run)]
    r = _run(cmd, timeout=180, INTTRAIN_FAULT_STEP="8", GLOO_SOCKET_IFNAME="lo")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "injected fault" in r.stderr
    assert "resuming" in r.stdout
    assert _bit_equal(_weights(run), _weights(uninterrupted))


@pytest.mark.slow  # several launches; the in-process tests cover the same paths fast
def test_dead_rank_is_named_and_run_stops(tmp_path: Path) -> None:
    run = tmp_path / "dead"
    t0 = time.monotonic()
    r = _cli("train", *BASE, "--nproc", "2", "--dist-timeout", "10", "--out", str(run), INTTRAIN_FAULT_STEP="3")
    assert r.returncode != 0
    assert "error: rank 1 of 2 failed (exit code 17); the run stopped" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 60  # the survivor notices the closed connection, no timeout wait


@pytest.mark.slow
def test_hung_rank_fails_peer_within_timeout_and_is_killed(tmp_path: Path) -> None:
    run = tmp_path / "hung"
    t0 = time.monotonic()
    r = _cli("train", *BASE, "--nproc", "2", "--dist-timeout", "4", "--out", str(run),
             INTTRAIN_FAULT_STEP="3", INTTRAIN_FAULT_MODE="hang")
    elapsed = time.monotonic() - t0
    assert r.returncode != 0
    # rank 0 times out in its collective (after --dist-timeout), the hung rank 1 is killed 10 s later
    assert "error: rank 0 of 2 failed (exit code 1); the run stopped; killed ranks [1] still running 14s later" in r.stderr, r.stderr
    assert elapsed < 60


@pytest.mark.slow  # several launches; the in-process tests cover the same paths fast
def test_sync_bn_from_cli_matches_single_process(tmp_path: Path) -> None:
    dp, sp = tmp_path / "dp", tmp_path / "sp"
    common = ["--model", "small-cnn", "--dataset", "digits", "--batch-size", "64", "--threads", "1",
              "--max-steps", "6", "--dist-timeout", "20"]
    r = _cli("train", *common, "--nproc", "2", "--sync-bn", "--out", str(dp))
    assert r.returncode == 0, r.stderr
    r = _cli("train", *common, "--out", str(sp))
    assert r.returncode == 0, r.stderr
    a, b = _weights(dp), _weights(sp)
    assert a.keys() == b.keys()  # a SyncBN checkpoint is a plain BatchNorm checkpoint
    assert max(float((a[k].float() - b[k].float()).abs().max()) for k in a) < 1e-4
