"""``inttrain train --schedule dfq|fractrain``: bits and GBitOPs columns, gates in the checkpoint, bit-identical
resume, and one-line errors for bad options (no run folder left behind)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inttrain.cli.app import main
from inttrain.trainer.run_folder import read_metrics

from schedule_run_utils import BASE, resumed_equals_uninterrupted


@pytest.mark.parametrize("sched", [
    ["--schedule", "dfq", "--set", "schedule_target_cost=0.4"],
    # nearest weight-gradient rounding: the run whose gates are known to split a batch across widths by step 22
    ["--schedule", "fractrain", "--set", "schedule_window=3", "--set", "schedule_threshold=0.5",
     "--weight-grad-rounding", "nearest"],
])
def test_dfq_resume_is_bit_identical(tmp_path: Path, sched: list[str]) -> None:
    b, steps, stopped = resumed_equals_uninterrupted(tmp_path, sched)
    assert any(k.endswith("dfq_gate.fc.weight") for k in stopped)
    assert all(3 <= r[4] <= 8 for r in steps)
    if "dfq" in sched:
        assert steps[-1][4] < 8 and {r[5] for r in steps} == {8}
    assert main(["eval", str(b)]) == 0  # the gates are rebuilt from the saved config and load
    # Per-sample DFQ (the default): per-layer shares of the chosen widths in every row, the same after resume.
    dists = [[r["dfq_bits"] for r in read_metrics(run) if r["kind"] == "step"] for run in (tmp_path / "a", b)]
    assert dists[0] == dists[1] and len(dists[1]) == 22
    assert all(abs(sum(s.values()) - 1) < 1e-5 for d in dists[1] for s in d.values())
    assert any(len(s) > 1 for d in dists[1] for s in d.values())  # samples of one batch at different widths
    assert main(["plot", str(b)]) == 0 and (b / "plots" / "dfq_bits.png").stat().st_size > 1000


def test_batch_level_dfq_from_the_cli(tmp_path: Path) -> None:
    """``schedule_dfq_per_sample=false``: one width per layer and batch (every share is 1.0)."""
    out = tmp_path / "r"
    assert main([*BASE, "--schedule", "dfq", "--set", "schedule_dfq_per_sample=false", "--max-steps", "4",
                 "--out", str(out)]) == 0
    rows = [r for r in read_metrics(out) if r["kind"] == "step"]
    assert len(rows) == 4 and all(list(s.values()) == [1.0] for r in rows for s in r["dfq_bits"].values())


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
