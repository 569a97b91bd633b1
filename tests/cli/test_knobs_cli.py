"""``inttrain train`` knobs: optimizer options, lr schedules, clipping, --train-limit; config.yaml records them,
YAML sets them, bad values get one error line, and --max-steps ends with a validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from inttrain.cli.app import main
from inttrain.schedules.lr import LrSchedule

BASE = ["train", "--dataset", "digits", "--batch-size", "64", "--threads", "1", "--log-every", "1", "--model", "mlp"]
KNOBS = ["--weight-decay", "0.0001", "--momentum", "0.8", "--nesterov", "--lr-schedule", "cosine",
         "--warmup-epochs", "0.5", "--clip-grad-norm", "5", "--train-limit", "300"]


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_flags_reach_the_run_and_its_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main([*BASE, *KNOBS, "--epochs", "2", "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert "digits: 300 train (--train-limit: first 300 of 1438) / " in out
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert {k: cfg[k] for k in ("weight_decay", "momentum", "nesterov", "lr_schedule", "warmup_epochs",
                                "clip_grad_norm", "train_limit")} == {
        "weight_decay": 0.0001, "momentum": 0.8, "nesterov": True, "lr_schedule": "cosine", "warmup_epochs": 0.5,
        "clip_grad_norm": 5.0, "train_limit": 300}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 9))  # 300 // 64 = 4 steps per epoch
    schedule = LrSchedule("cosine", total_steps=8, warmup_steps=2)
    assert [r["lr"] for r in steps] == [schedule.lr_at(t, 0.05) for t in range(8)]
    state = torch.load(run / "checkpoints/last.state.pt", weights_only=True)
    group = state["optimizer"]["param_groups"][0]
    assert (group["momentum"], group["weight_decay"], group["nesterov"]) == (0.8, 0.0001, True)


def test_yaml_and_set_take_the_same_keys(tmp_path: Path) -> None:
    conf = tmp_path / "run.yaml"
    conf.write_text("lr_schedule: step\ntrain_limit: 200\nweight_decay: 0.01\nmomentum: 0.5\n")
    run = tmp_path / "run"
    assert main([*BASE, "--config", str(conf), "--set", "clip_grad_norm=2", "--max-steps", "2", "--out", str(run)]) == 0
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert (cfg["lr_schedule"], cfg["train_limit"], cfg["weight_decay"], cfg["momentum"], cfg["clip_grad_norm"],
            cfg["nesterov"], cfg["warmup_epochs"]) == ("step", 200, 0.01, 0.5, 2.0, False, 0.0)


def test_resume_with_a_schedule_is_bit_identical(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    knobs = ["--lr-schedule", "onecycle", "--warmup-epochs", "0.3", "--train-limit", "640", "--epochs", "2"]
    assert main([*BASE, *knobs, "--max-steps", "13", "--out", str(a)]) == 0
    assert main(["resume", str(a)]) == 0
    assert main([*BASE, *knobs, "--out", str(b)]) == 0

    def rows(run: Path) -> list[tuple]:
        return [(r["kind"], r["step"], r["loss"], r["val_accuracy"], r["lr"])
                for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]

    assert [r[1] for r in rows(a) if r[0] == "step"] == list(range(1, 21))
    assert rows(a) == rows(b)


def test_max_steps_ends_with_a_validation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main([*BASE, "--max-steps", "3", "--out", str(run)]) == 0
    out = capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"] == "max_steps" and 0 < summary["val_accuracy"] <= 1
    assert f"validation at step 3: val_acc {summary['val_accuracy']:.4f}" in out
    assert f"done: val_acc {summary['val_accuracy']:.4f}," in out and "nan" not in out


@pytest.mark.parametrize("args,expected", [
    (["--lr-schedule", "linear"], "error: --lr-schedule: 'linear' is not one of: constant, step, cosine, onecycle"),
    (["--momentum", "1.5"], "error: --momentum: 1.5: allowed 0 <= momentum < 1"),
    (["--weight-decay", "-1"], "error: --weight-decay: -1.0 must be >= 0"),
    (["--warmup-epochs", "-0.5"], "error: --warmup-epochs: -0.5 must be >= 0"),
    (["--clip-grad-norm", "0"], "error: --clip-grad-norm: 0.0 must be > 0"),
    (["--train-limit", "0"], "error: --train-limit: 0 must be > 0"),
    (["--optimizer", "adam", "--nesterov"], "error: --nesterov: nesterov applies to sgd only; optimizer 'adam' uses its "
                                            "betas (leave momentum at 0.9 and nesterov off, or use sgd)"),
    (["--recipe", "wageubn", "--optimizer", "adam"], "error: --optimizer: 'adam': recipe 'wageubn' trains with "
                                                     "its own quantized SGD; allowed: sgd"),
])
def test_bad_knobs_are_one_error_line(args: list[str], expected: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main([*BASE, *args, "--out", str(run)]) == 2
    assert _err(capsys) == expected
    assert not run.exists()


def test_help_names_the_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--weight-decay", "--momentum", "--nesterov", "--no-nesterov", "--lr-schedule", "--warmup-epochs",
                 "--clip-grad-norm", "--train-limit"):
        assert flag in out, flag
