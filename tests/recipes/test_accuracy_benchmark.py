"""benchmarks/accuracy.py: the report's numbers (gap, skipped and alias rows, NaN-free JSON) and a tiny end-to-end run."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("accuracy_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


def test_report_rows_gap_and_files(bench, tmp_path: Path) -> None:
    R = bench.RecipeResult
    fp32 = R("fp32", val_accuracies=[0.5, 0.7, 0.65], seconds_per_epoch=10.0, step_ms=50.0, integer_fraction=0.0,
             kernels_per_step=0.0)
    int8 = R("int8", val_accuracies=[0.4, 0.6, 0.68], seconds_per_epoch=12.0, step_ms=60.0, integer_fraction=1.0,
             kernels_per_step=64.0)
    alias = R(**{**vars(int8), "recipe": "int8-mixed", "same_as": "int8"})
    skipped = R("integer-only", skipped="convert expects a torch.nn.Sequential")
    bench.write_report([fp32, int8, alias, skipped], tmp_path, "title", ["a note"], {"epochs": 3})
    md = (tmp_path / "accuracy.md").read_text().splitlines()
    assert md[0] == "# title" and md[-1] == "a note"
    rows = {line.split(" | ")[0].strip("| "): line for line in md if line.startswith("| ") and "---" not in line}
    assert rows["fp32"] == "| fp32 | 65.00% | 70.00% | - | 10.0 | 50.0 | 0.00% | 0.0 |"
    assert rows["int8"] == "| int8 | 68.00% | 68.00% | +3.00 | 12.0 | 60.0 | 100.00% | 64.0 |"  # gap of final accuracies
    assert rows["int8-mixed (= int8)"].endswith("| 68.00% | 68.00% | +3.00 | 12.0 | 60.0 | 100.00% | 64.0 |")
    assert rows["integer-only"].startswith("| integer-only | skipped: convert expects a torch.nn.Sequential |")
    assert len({line.count("|") for line in rows.values()}) == 1  # every row has the header's columns
    data = json.loads((tmp_path / "accuracy.json").read_text())  # strict JSON: NaN became null
    assert data["meta"] == {"epochs": 3} and data["results"][3]["final"] is None
    assert data["results"][1]["best"] == 0.68 and not math.isnan(data["results"][0]["step_ms"])
    assert (tmp_path / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_recipe_is_refused_with_the_allowed_names(bench, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--data", "x.npz", "--recipes", "fp32,int3"])
    err = capsys.readouterr().err
    assert "--recipes: int3: allowed fp32, bf16, int8, int8-mixed" in err and "integer-only" in err


@pytest.mark.slow  # ~10-30 s: three short trainings on digits
def test_tiny_end_to_end_run(bench, tmp_path: Path) -> None:
    from sklearn.datasets import load_digits

    d = load_digits()
    data = tmp_path / "digits.npz"
    np.savez(data, x=d.images.astype(np.float32), y=d.target.astype(np.int64))
    out = tmp_path / "out"
    results = bench.main(["--data", str(data), "--dataset", "npz", "--model", "small-cnn", "--train-size", "256",
                          "--val-size", "128", "--epochs", "2", "--batch-size", "64", "--lr", "0.05",
                          "--recipes", "fp32,int8,int8-mixed,unified-int8,integer-only", "--out", str(out)])
    by = {r.recipe: r for r in results}
    assert len(by["fp32"].val_accuracies) == 2 and by["fp32"].integer_fraction == 0.0
    assert by["int8"].integer_fraction == 1.0 and by["int8"].kernels_per_step > 0  # integer kernels really ran
    assert by["int8-mixed"].same_as == "int8" and by["int8-mixed"].val_accuracies == by["int8"].val_accuracies
    assert by["unified-int8"].val_accuracies and not by["unified-int8"].skipped
    assert "integer_only.convert cannot take small-cnn" in by["integer-only"].skipped
    md = (out / "accuracy.md").read_text()
    assert "| unified-int8 |" in md and (out / "accuracy.png").is_file() and (out / "accuracy.log").is_file()
    (out / "accuracy.md").unlink()
    bench.main(["--report-only", "--out", str(out)])  # the report again from accuracy.json alone
    assert (out / "accuracy.md").read_text() == md
