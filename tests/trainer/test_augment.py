"""Crop-and-flip augmentation: shapes, pixel provenance, determinism per (seed, step), CLI validation."""

import subprocess
import sys

import pytest
import torch

from inttrain.trainer.augment import augment_batch


def test_crops_and_flips_are_pixels_of_the_padded_image():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8) + 1
    out = augment_batch(x, "crop-flip", seed=0, step=1)
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(2):
        windows = [padded[i, :, a : a + 8, b : b + 8] for a in range(9) for b in range(9)]
        assert any(torch.equal(out[i], w) or torch.equal(out[i], w.flip(-1)) for w in windows)


def test_deterministic_per_seed_and_step_and_varies_across_steps():
    x = torch.randn(16, 3, 8, 8)
    a, b = augment_batch(x, "crop-flip", 3, 10), augment_batch(x, "crop-flip", 3, 10)
    assert torch.equal(a, b)
    assert not torch.equal(a, augment_batch(x, "crop-flip", 3, 11))


def test_none_and_non_images_pass_through():
    x = torch.randn(4, 3, 8, 8)
    assert augment_batch(x, "none", 0, 1) is x
    flat = torch.randn(4, 64)
    assert augment_batch(flat, "crop-flip", 0, 1) is flat


def test_unknown_augmentation():
    with pytest.raises(ValueError, match="allowed: none, crop-flip"):
        augment_batch(torch.randn(1, 1, 4, 4), "rotate", 0, 1)


def test_cli_rejects_unknown_augmentation(tmp_path):
    r = subprocess.run([sys.executable, "-m", "inttrain", "train", "--augment", "rotate", "--out", str(tmp_path / "r")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--augment" in r.stderr and "crop-flip" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "r").exists()
