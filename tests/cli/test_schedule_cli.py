"""``inttrain train --schedule``: bits and GBitOPs columns, exact resume with the scheduler state; ``inttrain cost``."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import inttrain
from inttrain.cli.app import main
from inttrain.cli.load import load_run
from inttrain.schedules import cpt_bits, model_bits, set_model_bits
from inttrain.trainer import evaluate_metrics

from schedule_run_utils import BASE, metric_rows as _rows, resumed_equals_uninterrupted


@pytest.mark.parametrize("sched", [
    ["--schedule", "cpt", "--set", "schedule_cycles=3", "--set", "schedule_min_bits=4"],
    ["--schedule", "pfq", "--set", "schedule_window=3", "--set", "schedule_threshold=0.5"],
])
def test_scheduled_resume_is_bit_identical(tmp_path: Path, sched: list[str]) -> None:
    _, steps, _ = resumed_equals_uninterrupted(tmp_path, sched)
    if "cpt" in sched:
        assert [r[4] for r in steps] == [cpt_bits(t, 4, 8, 3, 22) for t in range(22)]
        assert {r[5] for r in steps} == {8}


def test_columns_without_schedule_and_bad_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main([*BASE, "--max-steps", "2", "--out", str(run)]) == 0
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[-3:] == ["forward_bits", "grad_bits", "gbitops"]
    assert (rows[0]["forward_bits"], rows[0]["grad_bits"]) == ("8", "8") and float(rows[1]["gbitops"]) > float(rows[0]["gbitops"]) > 0
    capsys.readouterr()
    assert main([*BASE, "--schedule", "cyclic", "--out", str(tmp_path / "x")]) == 2
    assert "--schedule: 'cyclic' is not one of: none, constant, steps, cpt, pfq, dfq, fractrain" in capsys.readouterr().err
    assert main(["train", "--dataset", "digits", "--schedule", "cpt", "--out", str(tmp_path / "y")]) == 2
    assert "recipe 'fp32' has no bit width" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_steps_schedule(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main([*BASE, "--schedule", "steps", "--set", "schedule_steps=0:4/6,3:6", "--max-steps", "4", "--out", str(run)]) == 0
    rows = [r for r in _rows(run) if r[0] == "step"]
    assert [(r[4], r[5]) for r in rows] == [(4, 6), (4, 6), (4, 6), (6, 6)]


def test_cost_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--model", "lenet5", "--recipe", "int8", "--batch-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "classifier.5" in out and "grad_weight" in out and "saved KiB" in out
    assert "BitOPs / fp32 (32x32): 0.0625" in out and "BitOPs / static int8 (8x8): 1.0000" in out
    assert main(["cost", "--model", "lenet5", "--batch-size", "8", "--forward-bits", "4", "--grad-bits", "8"]) == 0
    assert "4x4" in capsys.readouterr().out
    assert main(["cost", "--recipe", "fp32"]) == 2
    assert "no integer layers" in capsys.readouterr().err
    assert main(["cost", "--forward-bits", "12"]) == 0  # convolutions take 9..16 bits too (int16 split)
    assert "12x" in capsys.readouterr().out
    assert main(["cost", "--forward-bits", "17"]) == 2


def test_cpt_validates_at_the_top_of_its_cycle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """22 steps in 2 cycles: the epoch ends where the next cycle starts at B_min, yet validation (and ``inttrain
    eval`` of the saved run) uses B_max, and both agree."""
    run = tmp_path / "run"
    assert main([*BASE, "--schedule", "cpt", "--set", "schedule_cycles=2", "--epochs", "1", "--out", str(run)]) == 0
    epoch = [r for r in _rows(run) if r[0] == "epoch"][-1]
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    assert f"val_acc {epoch[3]:.4f}" in capsys.readouterr().out
    p, _ = load_run(run)
    loader = DataLoader(p.splits.val, batch_size=256)
    at = {}
    for bits in (3, 8):
        set_model_bits(p.model, bits, 8)
        at[bits] = evaluate_metrics(p.model, loader, "int8", torch.device("cpu"))[1]
    assert epoch[3] == pytest.approx(at[8], abs=1e-9) and at[3] != at[8]
    assert model_bits(inttrain.load(run)) == (8, 8)  # loaded for inference (eval, export): at the top too
