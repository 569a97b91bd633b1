"""``inttrain eval RUN --dataset npz --data-dir OTHER.npz`` scores every example of OTHER, standardised with the
run's saved training statistics (issue 15), and prints the count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from inttrain.cli.app import main
from inttrain.data import load_dataset, load_eval_dataset


def _data(path: Path, n: int, seed: int, shift: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    x = np.clip(rng.integers(0, 200, (n, 8, 8)) + shift, 0, 255).astype(np.uint8)
    np.savez(path, x=x, y=rng.integers(0, 4, n))
    return path


def test_eval_scores_every_example_with_the_training_normalisation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = _data(tmp_path / "train.npz", 60, 0)
    run = tmp_path / "run"
    assert main(["train", "--model", "mlp", "--dataset", "npz", "--data-dir", str(train), "--max-steps", "2",
                 "--threads", "1", "--out", str(run)]) == 0
    other = _data(tmp_path / "other.npz", 37, 1, shift=50)  # brighter: its own statistics differ from training's
    capsys.readouterr()
    assert main(["eval", str(run), "--dataset", "npz", "--data-dir", str(other)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "scored 37 examples"
    assert "(37 images of npz, every example, with the run's training normalisation;" in out[-2]
    # A run saved before the statistics were: they are recomputed from its own training data, same result.
    for name in ("best", "last"):
        s_path = run / "checkpoints" / f"{name}.state.pt"
        if s_path.is_file():
            state = torch.load(s_path, weights_only=True)
            assert state.pop("data")["mean"] == pytest.approx(list(load_dataset("npz", train, seed=0).mean))
            torch.save(state, s_path)
    assert main(["eval", str(run), "--dataset", "npz", "--data-dir", str(other)]) == 0
    assert capsys.readouterr().out.strip().splitlines() == out

    # The tensors scored: OTHER's images standardised with the training split's mean/std, bit for bit.
    splits = load_dataset("npz", train, seed=0)
    data, what = load_eval_dataset("npz", other, splits.num_classes, (1, 8), splits.mean, splits.std)
    raw = np.load(other)
    expected = (raw["x"][:, None].astype(np.float32) / 255.0 - splits.mean[0]) / splits.std[0]
    assert what == "every example" and len(data) == 37
    torch.testing.assert_close(data.tensors[0], torch.from_numpy(expected.astype(np.float32)), rtol=0, atol=1e-6)
    assert torch.equal(data.tensors[1], torch.from_numpy(raw["y"].astype(np.int64)))
    own = (raw["x"] / 255.0).mean()
    assert abs(own - splits.mean[0]) > 0.1  # the test would notice OTHER's own statistics being used


def test_eval_on_the_run_split_unchanged_and_labels_beyond_the_model_refused(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    train = _data(tmp_path / "train.npz", 60, 0)
    run = tmp_path / "run"
    assert main(["train", "--model", "mlp", "--dataset", "npz", "--data-dir", str(train), "--max-steps", "1",
                 "--threads", "1", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    assert "(12 images of npz, held-out 0.2 of train (seed 0);" in capsys.readouterr().out
    rng = np.random.default_rng(2)
    np.savez(tmp_path / "bad.npz", x=rng.integers(0, 255, (5, 8, 8), dtype=np.uint8), y=np.array([0, 1, 2, 3, 9]))
    assert main(["eval", str(run), "--dataset", "npz", "--data-dir", str(tmp_path / "bad.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --dataset npz: bad.npz: y_train[4]: label 9 out of range [0, 4) (num_classes=4)"
