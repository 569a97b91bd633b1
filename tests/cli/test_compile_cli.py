"""``inttrain train --compile``: the training step runs as one compiled graph, logs its compile time, and
resumes exactly; the default follows inttrain.trainer.compiled.auto_compile."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from inttrain.cli.app import main

TRAIN = ["train", "--recipe", "int8", "--batch-size", "64", "--threads", "1", "--log-every", "5"]


@pytest.mark.parametrize("dataflow", [[], ["--dataflow"]], ids=["int8", "int8-dataflow"])
def test_train_compiled_runs_and_logs_compile_time(tmp_path: Path, dataflow: list[str]) -> None:
    out = tmp_path / "run"
    assert main([*TRAIN, *dataflow, "--compile", "--epochs", "1", "--max-steps", "6", "--out", str(out)]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["compile"] is True
    log = (out / "train.log").read_text() if (out / "train.log").exists() else "".join(
        p.read_text() for p in out.glob("*.log"))
    assert "torch.compile: forward graph built in" in log
    assert re.search(r"torch\.compile: first step took \d+\.\d s \(forward graph \d+\.\d s, backward graph and the "
                     r"step \d+\.\d s\)", log)
    assert "training eagerly" not in log
    assert json.loads((out / "summary.json").read_text())["steps"] == 6


@pytest.mark.slow
def test_compiled_training_learns_and_resumes_exactly(tmp_path: Path) -> None:
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    assert main([*TRAIN, "--compile", "--epochs", "2", "--out", str(whole)]) == 0
    summary = json.loads((whole / "summary.json").read_text())
    assert summary["val_accuracy"] > 0.85
    assert main([*TRAIN, "--compile", "--epochs", "2", "--max-steps", "23", "--out", str(halves)]) == 0
    assert main(["resume", str(halves)]) == 0
    resumed = json.loads((halves / "summary.json").read_text())
    assert resumed["val_accuracy"] == summary["val_accuracy"]
    assert resumed["val_loss"] == summary["val_loss"]


def test_compiled_run_counts_the_same_bitops_without_graph_breaks(tmp_path: Path) -> None:
    """The BitOPs counter's hooks stay out of the compiled graph (no break at every layer) and a compiled
    step is counted by replaying the eager first step's GEMMs: the metrics equal an eager run's."""
    import torch

    columns = {}
    for mode in ("--compile", "--no-compile"):
        out = tmp_path / mode.strip("-")
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        assert main([*TRAIN, mode, "--epochs", "1", "--max-steps", "12", "--log-every", "4", "--out", str(out)]) == 0
        if mode == "--compile":
            assert not torch._dynamo.utils.counters["graph_break"]
        rows = (out / "metrics.csv").read_text().splitlines()
        head = rows[0].split(",")
        columns[mode] = [(r.split(",")[head.index("step")], r.split(",")[head.index("gbitops")]) for r in rows[1:]
                         if r.startswith("step,")]
    assert len(columns["--compile"]) == 3 and columns["--compile"] == columns["--no-compile"]
