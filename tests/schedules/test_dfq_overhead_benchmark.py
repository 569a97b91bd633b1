"""benchmarks/dfq_overhead.py on a tiny model: every policy timed, ratios to static 8-bit, per-sample policies
split the batch (more than one width per layer and step), the batch-level one never does."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "dfq_overhead.py"


def test_dfq_overhead_benchmark_smoke(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("dfq_overhead_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "out"
    assert mod.main(["--model", "small-cnn", "--image-size", "8", "--batch-size", "32", "--steps", "3",
                     "--warmup", "1", "--out", str(out)]) == 0
    rows = {r["policy"]: r for r in json.loads((out / "results.json").read_text())}
    assert list(rows) == ["static8", "dfq-batch", "dfq", "dfq-uniform"]
    assert rows["static8"]["ratio_to_static8"] == 1.0 and all(len(r["times_ms"]) == 3 for r in rows.values())
    assert rows["dfq-batch"]["widths_per_layer"] == 1.0
    assert rows["dfq"]["widths_per_layer"] > 1.5 and rows["dfq-uniform"]["widths_per_layer"] > 1.5
    assert "| dfq |" in (out / "results.md").read_text()
