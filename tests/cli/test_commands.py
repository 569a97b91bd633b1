"""``inttrain eval``, ``recipes``, ``plot`` and ``compare``."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from inttrain.cli.app import main
from inttrain.cli.compare import _rows, format_markdown


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cmds") / "run"
    assert main(["train", "--batch-size", "64", "--epochs", "2", "--threads", "1", "--log-every", "5", "--out", str(out)]) == 0
    return out


def test_eval_run_dir_and_file(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    summary = json.loads((run / "summary.json").read_text())
    assert main(["eval", str(run)]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"val_acc {summary['best_val_accuracy']:.4f} (359 images of digits") and "best.safetensors" in out
    assert main(["eval", str(run / "checkpoints" / "last.safetensors")]) == 0
    assert capsys.readouterr().out.startswith(f"val_acc {summary['val_accuracy']:.4f}")


def test_eval_errors(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "x.safetensors")]) == 2
    assert capsys.readouterr().err.startswith(f"error: CHECKPOINT: '{tmp_path / 'x.safetensors'}': not found")
    bad = tmp_path / "c.safetensors"
    bad.write_bytes(b"garbage")
    (tmp_path / "c.state.pt").write_bytes(b"garbage")
    assert main(["eval", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: CHECKPOINT: ") and "c.state.pt: not a readable checkpoint state file" in err
    assert main(["eval", str(run), "--dataset", "mnist"]) == 2
    assert capsys.readouterr().err.startswith("error: --dataset mnist: mnist: data_dir: required")


def test_recipes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipes"]) == 0
    names = capsys.readouterr().out.split()
    assert names[:2] == ["fp32", "bf16"]
    assert "int8" in names
    assert main(["recipes", "show", "int8"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].strip() == "int8 / int8-mixed: the practical default — all three GEMMs in int8, float master weights."
    assert "  bits                  8" in out and "per_channel" in out and "weight_grad_rounding  stochastic" in out
    assert main(["recipes", "show", "int3"]) == 2
    assert capsys.readouterr().err.startswith("error: NAME: 'int3' is not one of: fp32, bf16, int8")


def test_plot(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(run)]) == 0
    for name in ("loss", "accuracy", "lr"):
        assert (run / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["plot", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: RUN_DIR: '{tmp_path}': no metrics.jsonl")


def test_plot_overlays_runs(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Several runs: one set of plots with a line per run, in --out (or plots/ of the common parent); a bad
    run folder among them is refused before anything is written."""
    import shutil

    other = tmp_path / "runs" / "b"
    shutil.copytree(run, tmp_path / "runs" / "a")
    shutil.copytree(run, other)
    assert main(["plot", str(tmp_path / "runs" / "a"), str(other)]) == 0
    names = sorted(p.name for p in (tmp_path / "runs" / "plots").iterdir())
    assert names == ["accuracy.png", "loss.png", "lr.png", "val_loss.png"]
    assert main(["plot", str(run), str(other), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["plot", str(run), str(tmp_path / "none"), "--out", str(tmp_path / "p")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err and not (tmp_path / "p").exists()


def test_compare_table_math() -> None:
    rows = _rows({
        "fp32": {"val_accuracy": 0.9, "seconds_per_epoch": 2.0, "time_per_step": 0.01, "peak_rss_mb": 400.0},
        "int8": {"val_accuracy": 0.85, "seconds_per_epoch": 1.0, "time_per_step": 0.005, "peak_rss_mb": 380.0},
        "bf16": None,
    })
    assert rows[1]["gap_to_fp32"] == pytest.approx(-0.05) and rows[1]["speed_vs_fp32"] == 2.0
    md = format_markdown(rows, "t")
    assert "| int8 | 0.8500 | -0.0500 | 1.00 | 2.00x | 5.00 | 380 |" in md
    assert "| bf16 | - | - | - | - | - | - |" in md


def test_compare_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    r = subprocess.run(
        [sys.executable, "-m", "inttrain", "compare", "--recipes", "fp32", "--batch-size", "64", "--epochs", "1",
         "--out", str(out)], capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    with open(out / "compare.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["recipe"] for row in rows] == ["fp32"] and float(rows[0]["peak_rss_mb"]) > 10
    assert float(rows[0]["val_accuracy"]) > 0.5 and float(rows[0]["speed_vs_fp32"]) == 1.0
    assert "| fp32 |" in (out / "compare.md").read_text() and (out / "compare.png").is_file()
    assert (out / "fp32" / "checkpoints" / "last.safetensors").is_file()
    # Progress while it runs: the run's epoch line is echoed before the final table.
    lines = r.stdout.splitlines()
    assert lines[0] == "== [1/1] fp32"
    epoch = next(i for i, line in enumerate(lines) if line.startswith("  fp32: epoch 1/1  train_loss"))
    table = lines.index("| recipe | val acc | gap to fp32 | s/epoch | speed vs fp32 | ms/step | peak RSS MiB |")
    assert 0 < epoch < table


def test_compare_validates_all_recipes_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--recipes", "fp32,int3", "--out", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err.startswith("error: --recipes: 'int3' is not one of")
    assert not (tmp_path / "c").exists()
