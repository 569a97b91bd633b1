"""benchmarks/dfq_overhead.py on a tiny model: every policy timed, ratios to static 8-bit, per-sample policies
split the batch (more than one width per layer and step), the batch-level one never does."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

SCRIPT = "dfq_overhead"


def test_dfq_overhead_benchmark_smoke(bench: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert bench.main(["--model", "small-cnn", "--image-size", "8", "--batch-size", "32", "--steps", "3",
                       "--warmup", "1", "--out", str(out)]) == 0
    rows = {r["policy"]: r for r in json.loads((out / "results.json").read_text())}
    assert list(rows) == ["static8", "dfq-batch", "dfq", "dfq-uniform"]
    assert rows["static8"]["ratio_to_static8"] == 1.0 and all(len(r["times_ms"]) == 3 for r in rows.values())
    assert rows["dfq-batch"]["widths_per_layer"] == 1.0
    assert rows["dfq"]["widths_per_layer"] > 1.5 and rows["dfq-uniform"]["widths_per_layer"] > 1.5
    assert "| dfq |" in (out / "results.md").read_text()
