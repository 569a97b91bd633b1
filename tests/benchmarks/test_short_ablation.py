"""benchmarks/short_ablation.py: every variant of both groups trains and writes its rows; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

SCRIPT = "short_ablation"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "tiny.npz"
    np.savez(path, x=rng.integers(0, 256, (96, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, 96))
    return path


@pytest.mark.parametrize("group", ["dorefa", "wageubn"])
def test_every_variant_writes_one_row_per_epoch(bench, tiny: Path, tmp_path: Path, group: str) -> None:
    argv = ["--data", str(tiny), "--group", group, "--epochs", "1", "--train-size", "32", "--val-start", "64",
            "--val-size", "32", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["variant"] for r in rows] == list(bench.GROUPS[group])
    assert all(r["epoch"] == 1 and 0 <= r["val_accuracy"] <= 1 and np.isfinite(r["train_loss"]) for r in rows)


def test_simulated_dorefa_max_is_not_the_clip(bench) -> None:
    """The toggles reach the layers: "max" and the published clip give different outputs on inputs above 1."""
    import torch

    outs = {}
    for variant in ("dorefa", "dorefa-max", "dorefa-no-act"):
        model, _ = bench.build(variant, "dorefa", 0, [0])
        model.eval()
        outs[variant] = model(torch.full((2, 3, 32, 32), 2.0))
    assert not torch.allclose(outs["dorefa"], outs["dorefa-max"])
    assert not torch.allclose(outs["dorefa"], outs["dorefa-no-act"])


@pytest.mark.parametrize("extra,message", [
    (["--variants", "nope"], "error: --variants: nope not in group dorefa"),
    (["--epochs", "0"], "error: --epochs: 0 must be >= 1"),
    (["--train-size", "80"], "error: --train-size: 80 overlaps the validation images (at most --val-start 64)"),
    (["--train-size", "32", "--val-size", "64"], "expected >= 128 NHWC RGB images, got shape (96, 32, 32, 3)"),
])
def test_bad_input_is_one_error_line(bench, tiny: Path, tmp_path: Path, capsys, extra, message) -> None:
    argv = ["--data", str(tiny), "--group", "dorefa", "--val-start", "64", "--out", str(tmp_path / "o"), *extra]
    assert bench.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not (tmp_path / "o").exists()
