"""The ``inttrain`` command line, run as a user would (subprocess) plus a few
in-process checks of error formatting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inttrain.cli.app import main
from inttrain.cli.demo import bf16_is_native


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inttrain", *args], capture_output=True, text=True, timeout=timeout
    )


def test_help() -> None:
    r = _cli("--help")
    assert r.returncode == 0, r.stderr
    for command in ("demo", "env", "train"):
        assert command in r.stdout


def test_env() -> None:
    r = _cli("env")
    assert r.returncode == 0, r.stderr
    assert "torch" in r.stdout and "cuda available" in r.stdout
    assert "avx512_vnni" in r.stdout or "cpu flags" in r.stdout
    assert "kernel linear (cpu)" in r.stdout  # inttrain.kernels.describe() is always there


def test_bad_model_exits_2_without_traceback() -> None:
    r = _cli("train", "--model", "resnet18")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr + r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --model: 'resnet18' is not one of: mlp,")


def test_train_help_lists_names() -> None:
    from inttrain.data import DATASET_NAMES
    from inttrain.models import MODEL_NAMES

    r = _cli("train", "--help")
    text = " ".join(r.stdout.split())  # help text may wrap
    for name in (*DATASET_NAMES, *(n for n in MODEL_NAMES if n != "gpt-small")):
        assert name in text, name


def test_debug_shows_traceback() -> None:
    r = _cli("train", "--model", "resnet18", "--debug")
    assert r.returncode == 2 and "Traceback" in r.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train", "--dataset", "imagenet"], "error: --dataset: 'imagenet' is not one of: digits, synthetic, npz"),
        (["train", "--optimizer", "lbfgs"], "error: --optimizer: 'lbfgs' is not one of: sgd, adam, adamw"),
        (["train", "--recipe", "int3"], "error: --recipe: 'int3' is not one of: fp32, bf16"),
        (["train", "--lr", "0"], "error: --lr: 0.0 must be > 0"),
        (["train", "--dataset", "npz", "--data-dir", "/no/such.npz"], "error: --data-dir: '/no/such.npz' does not exist"),
        (["train", "--dataset", "mnist"], "error: --dataset mnist: mnist: data_dir: required"),
        (["train", "--no-such-flag"], "error: No such option: --no-such-flag"),
        (["demo", "--recipes", " , "], "error: --recipes:"),
    ],
)
def test_usage_errors_in_process(args: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(expected) and err.count("\n") == 1 and "Traceback" not in err


def test_bad_npz_names_file_index_and_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "bad.npz"
    np.savez(p, x=np.zeros((10, 8, 8), np.float32), y=np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 99]), num_classes=np.array(10))
    assert main(["train", "--dataset", "npz", "--data-dir", str(p)]) == 2
    assert "bad.npz: y_train[9]: label 99 out of range [0, 10)" in capsys.readouterr().err


def test_train_prints_epoch_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--epochs", "1", "--dataset", "synthetic", "--threads", "1", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "epoch 1/1" in out and "val_acc" in out and out.rstrip().splitlines()[-1].startswith("done:")


def test_demo() -> None:
    # Short budget: the first int8 steps pay the kernels' compile time.
    r = _cli("demo", "--epochs", "1", "--batch-size", "128", "--layer-check", "256", timeout=300)
    assert r.returncode == 0, r.stderr
    table = r.stdout[r.stdout.index("recipe"):]
    assert "fp32" in table and "int8" in table and "speed vs fp32" in table
    int8_row = next(line for line in table.splitlines() if line.startswith("int8"))
    assert "yes (" in int8_row  # integer kernels really ran
    fp32_row = next(line for line in table.splitlines() if line.startswith("fp32"))
    assert fp32_row.rstrip().endswith("no")
    layer_line = next(line for line in r.stdout.splitlines() if line.startswith("one Linear layer, 256 tokens"))
    assert "fp32" in layer_line and "bf16" in layer_line and "int8" in layer_line
    assert ("bf16 not timed" in layer_line) == (not bf16_is_native())
