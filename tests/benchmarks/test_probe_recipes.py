"""benchmarks/probe_recipes.py: one row per variant, in the table and the JSON, on a tiny generated image set."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

SCRIPT = "probe_recipes"  # conftest.py's `bench` fixture loads benchmarks/probe_recipes.py


def test_table_and_json(bench, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = tmp_path / "tiny.npz"
    np.savez(data, x=rng.integers(0, 256, (48, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, 48))
    out = tmp_path / "out"
    assert bench.main(["--data", str(data), "--model", "small-cnn", "--batch-size", "16", "--train-size", "32",
                       "--val-size", "16", "--out", str(out)]) == 0
    md = (out / "probe_recipes.md").read_text().splitlines()
    names = [line.split(" | ")[0].strip("| ") for line in md if line.startswith("| ") and "---" not in line][1:]
    assert names == list(bench.variants())
    rows = json.loads((out / "probe_recipes.json").read_text())
    assert set(rows) == set(names)
    # small-cnn: its first conv gets no grad_input row (the images need no gradient), the others all three.
    first = [r for r in rows["int8"] if r["layer"] == rows["int8"][0]["layer"]]
    assert [r["gemm"] for r in first] == ["forward", "grad_weight"]
    assert all(r["sqnr_db"] is None or r["sqnr_db"] > 0 for v in rows.values() for r in v)


def test_sizes_below_one_get_one_error_line_and_exit_2(bench, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        bench.main(["--data", "x.npz", "--batch-size", "0"])
    assert e.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith("error: --batch-size 0: allowed: 1 or more")
