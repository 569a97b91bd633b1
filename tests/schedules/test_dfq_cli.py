"""``inttrain train --schedule dfq|fractrain``: bits and GBitOPs columns, gates in the checkpoint, bit-identical
resume, and one-line errors for bad options (no run folder left behind)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from inttrain.cli.app import main

# digits, batch 64: 22 steps per epoch.
BASE = ["train", "--dataset", "digits", "--batch-size", "64", "--threads", "1", "--log-every", "1", "--recipe", "int8"]


def _rows(run: Path) -> list[tuple]:
    keys = ("kind", "step", "loss", "val_accuracy", "forward_bits", "grad_bits", "gbitops")
    return [tuple(r[k] for k in keys) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]


@pytest.mark.parametrize("sched", [
    ["--schedule", "dfq", "--set", "schedule_target_cost=0.4"],
    ["--schedule", "fractrain", "--set", "schedule_window=3", "--set", "schedule_threshold=0.5"],
])
def test_dfq_resume_is_bit_identical(tmp_path: Path, sched: list[str]) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*BASE, *sched, "--epochs", "1", "--max-steps", "9", "--out", str(a)]) == 0
    state = torch.load(a / "checkpoints/last.state.pt", weights_only=True)
    assert state["precision_scheduler"]["last_step"] == 9 and state["cost_counter"]["records"]
    assert any(k.endswith("dfq_gate.fc.weight") for k in load_file(a / "checkpoints/last.safetensors"))
    assert main(["resume", str(a)]) == 0
    assert main([*BASE, *sched, "--epochs", "1", "--out", str(b)]) == 0
    rows_a, rows_b = _rows(a), _rows(b)
    assert [r[1] for r in rows_a if r[0] == "step"] == list(range(1, 23))
    assert rows_a == rows_b
    wa, wb = load_file(a / "checkpoints/last.safetensors"), load_file(b / "checkpoints/last.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wb)
    steps = [r for r in rows_b if r[0] == "step"]
    assert len({r[4] for r in steps}) > 1  # the (MAC-weighted mean) forward bits changed during the run
    assert all(3 <= r[4] <= 8 for r in steps)
    assert all(x[6] < y[6] for x, y in zip(steps, steps[1:]))  # cumulative GBitOPs grow
    if "dfq" in sched:
        assert steps[-1][4] < 8 and {r[5] for r in steps} == {8}
    assert main(["eval", str(b)]) == 0  # the gates are rebuilt from the saved config and load


@pytest.mark.parametrize("sets, message", [
    (["schedule_dfq_bits=4,x"], "schedule_dfq_bits: '4,x': expected comma-separated bit widths"),
    (["schedule_dfq_bits=4"], "dfq: DFQ bits must be at least two distinct ints in [2, 8]"),
    (["schedule_target_cost=2"], "dfq: DFQ target_cost must be in [0.2500, 1]"),
    (["schedule_cost_weight=-1"], "dfq: DFQ cost_weight must be a finite number >= 0"),
])
def test_bad_dfq_options(tmp_path: Path, capsys: pytest.CaptureFixture[str], sets: list[str], message: str) -> None:
    args = [x for s in sets for x in ("--set", s)]
    assert main([*BASE, "--schedule", "dfq", *args, "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_dfq_needs_an_integer_recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--dataset", "digits", "--schedule", "dfq", "--out", str(tmp_path / "y")]) == 2
    assert "recipe 'fp32' has no bit width" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()
