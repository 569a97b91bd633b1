"""``inttrain train --model gpt-small --dataset text``: end to end, bit-identical resume, eval, pairing errors."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from inttrain.cli.app import main

# A tiny model so a run takes seconds on one core; sizes go through --set like any config key.
TINY = ["--seq-len", "16", "--set", "d_model=32", "--set", "n_layers=1", "--set", "n_heads=2",
        "--batch-size", "16", "--lr", "0.003", "--optimizer", "adam", "--threads", "1", "--log-every", "1"]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    words = "the quick brown fox jumps over a lazy dog and runs far away".split()
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text(" ".join(rng.choice(words) for _ in range(700)), encoding="utf-8")
    return path


def _train(out: Path, text: Path, *extra: str) -> int:
    return main(["train", "--model", "gpt-small", "--dataset", "text", "--data-dir", str(text), *TINY,
                 "--out", str(out), *extra])


def _rows(run: Path) -> list[tuple]:
    keys = ("kind", "step", "epoch", "loss", "val_accuracy", "lr", "val_loss", "val_perplexity")
    return [tuple(r[k] for k in keys) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]


def test_train_reports_loss_perplexity_accuracy(tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert _train(run, text_file, "--epochs", "2") == 0
    out = capsys.readouterr().out
    assert "vocabulary 28, sequences of 16" in out
    assert "epoch 2/2" in out and "val_ppl" in out and "done: val_loss" in out
    epochs = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "epoch"]
    assert len(epochs) == 2
    for r in epochs:
        assert r["val_perplexity"] == pytest.approx(math.exp(r["val_loss"]))
        assert 0.0 <= r["val_accuracy"] <= 1.0
    assert epochs[1]["val_loss"] < epochs[0]["val_loss"] < math.log(28) + 0.5  # it learns
    summary = json.loads((run / "summary.json").read_text())
    assert summary["val_loss"] == epochs[-1]["val_loss"] and summary["val_perplexity"] == epochs[-1]["val_perplexity"]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert (cfg["model"], cfg["dataset"], cfg["seq_len"], cfg["d_model"]) == ("gpt-small", "text", 16, 32)
    assert sorted(load_file(run / "checkpoints/best.safetensors"))  # best = lowest val loss, written

    assert main(["eval", str(run)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"val_loss {epochs[-1]['val_loss']:.4f} val_ppl ") and "sequences of 16 characters" in line


@pytest.mark.parametrize("recipe", ["fp32", "int8"])
def test_resume_is_bit_identical(tmp_path: Path, text_file: Path, recipe: str) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    # 11 steps per epoch: stop mid-epoch 2 at step 17 (batch 6).
    assert _train(a, text_file, "--recipe", recipe, "--epochs", "2", "--max-steps", "17") == 0
    assert torch.load(a / "checkpoints/last.state.pt", weights_only=True)["train_state"]["position"] == 6
    assert main(["resume", str(a)]) == 0
    assert _train(b, text_file, "--recipe", recipe, "--epochs", "2") == 0
    rows_a, rows_b = _rows(a), _rows(b)
    assert [r[1] for r in rows_a if r[0] == "step"] == list(range(1, 23))
    assert rows_a == rows_b
    wa, wb = load_file(a / "checkpoints/last.safetensors"), load_file(b / "checkpoints/last.safetensors")
    assert sorted(wa) == sorted(wb) and all(torch.equal(wa[k], wb[k]) for k in wb)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "gpt-small"], "error: --dataset: 'digits': model 'gpt-small' is a language model and needs --dataset text"),
        (["--dataset", "text"], "error: --model: 'small-cnn': dataset 'text' is token sequences; use --model gpt-small"),
        (["--model", "gpt-small", "--dataset", "text", "--seq-len", "0"], "error: --seq-len: 0 must be > 0"),
        (["--model", "gpt-small", "--dataset", "text", "--set", "n_heads=0"], "error: --set n_heads: 0 must be > 0"),
    ],
)
def test_pairing_and_size_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], expected: str) -> None:
    assert main(["train", *args, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(expected) and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_short_file_names_file_and_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    short = tmp_path / "short.txt"
    short.write_text("hello world")
    assert main(["train", "--model", "gpt-small", "--dataset", "text", "--data-path", str(short),
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --dataset text: {short}: text: 11 characters is too short; with seq_len=64")
    assert not (tmp_path / "run").exists()
