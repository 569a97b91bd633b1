"""benchmarks/text_quality.py: the by-file split and a tiny end-to-end run (rows, paired gap, report)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCRIPT = "text_quality"  # conftest.py's `bench` fixture loads benchmarks/text_quality.py


def test_split_is_by_file_and_missing_files_are_named(bench, tmp_path: Path) -> None:
    assert not set(bench.TRAIN_FILES) & set(bench.VAL_FILES)
    (tmp_path / "a.py").write_text("x = 1\n")
    with pytest.raises(SystemExit, match=r"missing b\.py; this benchmark reads a fixed list"):
        bench.read_corpus(tmp_path, ("a.py", "b.py"))
    text, info = bench.read_corpus(tmp_path, ("a.py", "a.py"))
    assert text == "x = 1\n\n\nx = 1\n\n\n" and info[0]["bytes"] == 6


def test_tiny_run_rows_and_report(bench, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["--out", str(out), "--max-chars", "3000", "--seq-len", "16", "--d-model", "16", "--n-layers", "1",
            "--n-heads", "1", "--epochs", "1", "--batch-size", "16", "--seeds", "1", "--compile", "off",
            "--variants", "fp32,int8"]
    assert bench.main(args) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["variant"], r["seed"], r["status"]) for r in rows] == [("fp32", 0, "done"), ("int8", 0, "done")]
    assert rows[0]["corpus"]["val_chars"] == 3000 and rows[0]["steps"] == 11  # 3000 // 17 windows // 16
    assert rows[0]["val_losses"] == [rows[0]["final_val_loss"]]
    bench.main(["--out", str(out), "--report"])
    md = (out / "text_quality.md").read_text()
    gap = 100 * (rows[1]["final_val_loss"] / rows[0]["final_val_loss"] - 1)
    assert f"| int8 | 1 | {rows[1]['final_val_loss']:.4f} ± - |" in md and f"| {gap:+.2f}% |" in md
    assert (out / "text_quality.png").stat().st_size > 0
