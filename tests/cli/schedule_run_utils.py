"""Shared by the scheduled-training CLI tests: a digits run with a precision schedule, stopped, resumed and
compared against an uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from inttrain.cli.app import main

# digits, batch 64: 22 steps per epoch.
BASE = ["train", "--dataset", "digits", "--batch-size", "64", "--threads", "1", "--log-every", "1", "--recipe", "int8"]


def metric_rows(run: Path) -> list[tuple]:
    keys = ("kind", "step", "loss", "val_accuracy", "forward_bits", "grad_bits", "gbitops")
    return [tuple(r[k] for k in keys) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]


def resumed_equals_uninterrupted(tmp_path: Path, sched: list[str]) -> tuple[Path, list[tuple], dict]:
    """Train 9 steps, resume to the end of the epoch, and check metrics and weights equal a run without the
    stop. Returns the uninterrupted run's folder, its step rows and the weights saved at the stop."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*BASE, *sched, "--epochs", "1", "--max-steps", "9", "--out", str(a)]) == 0
    state = torch.load(a / "checkpoints/last.state.pt", weights_only=True)
    assert state["precision_scheduler"]["last_step"] == 9 and state["cost_counter"]["records"]
    stopped = load_file(a / "checkpoints/last.safetensors")
    assert main(["resume", str(a)]) == 0
    assert main([*BASE, *sched, "--epochs", "1", "--out", str(b)]) == 0
    rows_a, rows_b = metric_rows(a), metric_rows(b)
    assert [r[1] for r in rows_a if r[0] == "step"] == list(range(1, 23))
    assert rows_a == rows_b
    wa, wb = load_file(a / "checkpoints/last.safetensors"), load_file(b / "checkpoints/last.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wb)
    steps = [r for r in rows_b if r[0] == "step"]
    assert len({r[4] for r in steps}) > 1  # the (mean) forward bits changed during the run
    assert all(x[6] < y[6] for x, y in zip(steps, steps[1:]))  # cumulative GBitOPs grow
    return b, steps, stopped
