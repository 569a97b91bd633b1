"""TensorBoard scalars: one message without tensorboard; mirror metrics.jsonl when a writer exists."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from inttrain.cli.app import main
from inttrain.trainer import tensorboard

ARGS = ["train", "--dataset", "digits", "--batch-size", "64", "--threads", "1", "--log-every", "5", "--epochs", "1"]


class FakeWriter:
    """Records what a SummaryWriter would be asked to write."""

    instances: list[FakeWriter] = []

    def __init__(self, log_dir: str, purge_step: int | None = None) -> None:
        self.log_dir, self.purge_step = log_dir, purge_step
        self.scalars: list[tuple[str, float, int]] = []
        self.closed = False
        FakeWriter.instances.append(self)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_missing_tensorboard_says_so_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # None in sys.modules makes `import torch.utils.tensorboard` raise ImportError, installed or not.
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    assert tensorboard.summary_writer_class() is None
    run = tmp_path / "run"
    assert main([*ARGS, "--max-steps", "3", "--out", str(run)]) == 0
    out = capsys.readouterr()
    assert not (run / "tb").exists()
    lines = [l for l in (out.out + out.err).replace(str(tmp_path), "").splitlines() if "tensorboard" in l.lower()]
    assert lines == ["tensorboard: not installed (optional extra), so no tb/ curves; metrics.csv and metrics.jsonl "
                     "hold every number. Add it with: pip install 'inttrain[tensorboard]'"]
    assert lines[0] in (run / "train.log").read_text()


def test_scalars_mirror_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FakeWriter.instances = []
    monkeypatch.setattr(tensorboard, "summary_writer_class", lambda: FakeWriter)
    run = tmp_path / "run"
    assert main([*ARGS, "--max-steps", "12", "--out", str(run)]) == 0
    assert main(["resume", str(run)]) == 0
    first, second = FakeWriter.instances
    assert first.log_dir == second.log_dir == str(run / "tb")
    assert (first.purge_step, second.purge_step) == (None, 13)  # resume purges what came after the checkpoint
    assert first.closed and second.closed
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    expected: list[tuple[str, Any, int]] = []
    for r in rows:
        for key in ("loss", "val_accuracy", "lr", "time_per_step", "val_loss", "val_perplexity"):
            if r[key] is not None:
                expected.append((f"{r['kind']}/{key}", r[key], r["step"]))
    assert first.scalars + second.scalars == expected
    tags = {t for t, _, _ in expected}
    assert {"step/loss", "step/lr", "epoch/val_accuracy", "epoch/val_loss"} <= tags
