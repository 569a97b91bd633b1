"""``benchmarks/dataflow.py`` runs end to end and its tables show the dataflow memory claim (>= 3x below fp32)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "dataflow.py"


def test_dataflow_benchmark_quick(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "INTTRAIN_COMPILE": "0"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--iters", "1", "--out", str(tmp_path),
                        "--variants", "fp32,int8,int8 + dataflow"],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    table = (tmp_path / "dataflow.md").read_text()
    ratios = [float(m) for m in re.findall(r"^\| int8 \+ dataflow \| [\d.]+ \| ([\d.]+)x \|", table, flags=re.M)]
    assert len(ratios) == 2 and min(ratios) >= 3.0, table
