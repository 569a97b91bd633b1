"""Smoke test of ``benchmarks/distributed.py`` on a tiny generated CIFAR-shaped .npz (no real data needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "distributed.py"


def test_distributed_benchmark_smoke(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = tmp_path / "tiny.npz"
    np.savez(data, x=rng.integers(0, 256, (96, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, 96))
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--data", str(data), "--out", str(out), "--train", "64",
                        "--val", "32", "--epochs", "1", "--batch-size", "32"], capture_output=True, text=True,
                       timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    table = (out / "results.md").read_text()
    for label in ("fp32 all-reduce", "fp16_compress_hook", "PowerSGD rank 2", "inttrain int8"):
        assert label in table
    res = json.loads((out / "results.json").read_text())
    rows = {row["hook"]: row for row in res["rows"]}
    assert all(row["steps"] == 2 and row["ranks_agree"] for row in rows.values())
    assert rows["fp32"]["bytes_per_step"] == 4 * res["numel"]
    assert rows["fp16"]["bytes_per_step"] == 2 * res["numel"]
    assert rows["fp32"]["bytes_per_step"] / rows["int8"]["bytes_per_step"] > 3.9
