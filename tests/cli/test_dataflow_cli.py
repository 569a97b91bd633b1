"""``inttrain train --dataflow``: int8 activations between layers from the CLI, resumable, float recipes refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from inttrain.cli.app import main

TRAIN = ["train", "--recipe", "int8", "--batch-size", "64", "--threads", "1", "--log-every", "5"]


def test_train_with_dataflow_learns_and_resumes_exactly(tmp_path: Path) -> None:
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    assert main([*TRAIN, "--dataflow", "--epochs", "2", "--out", str(whole)]) == 0
    assert yaml.safe_load((whole / "config.yaml").read_text())["dataflow"] is True
    summary = json.loads((whole / "summary.json").read_text())
    assert summary["val_accuracy"] > 0.85
    assert main([*TRAIN, "--dataflow", "--epochs", "2", "--max-steps", "23", "--out", str(halves)]) == 0
    assert main(["resume", str(halves)]) == 0
    resumed = json.loads((halves / "summary.json").read_text())
    assert resumed["val_accuracy"] == summary["val_accuracy"]
    assert resumed["val_loss"] == summary["val_loss"]


def test_dataflow_with_a_float_recipe_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--recipe", "fp32", "--dataflow", "--epochs", "1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dataflow needs an integer recipe" in err[0]
