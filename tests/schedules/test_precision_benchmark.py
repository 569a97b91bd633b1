"""benchmarks/precision.py end to end on a tiny digits budget: table, JSON and plot are written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "precision.py"


@pytest.mark.slow  # ~10-25 s here: digits load, compile warm-up, matplotlib
def test_precision_benchmark_smoke(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("precision_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "out"
    assert mod.main(["--epochs", "1", "--train-size", "256", "--val-size", "64", "--batch-size", "64",
                     "--policies", "static8,pfq,dfq", "--pfq-window", "1", "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())
    assert [r["policy"] for r in rows] == ["static8", "pfq", "dfq"]
    assert all(len(r["bits"]) == 4 for r in rows)
    assert rows[0]["forward_cost_ratio"] == 1.0 and rows[2]["forward_cost_ratio"] < 1.0
    md = (out / "results.md").read_text()
    assert "| static8 |" in md and "| dfq |" in md and "bits.png" in md
    assert (out / "bits.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
