"""Training-data augmentation on int8 codes (NumPy only): the CIFAR recipe's random crop and horizontal flip.

Each batch is augmented with its own generator ``default_rng((epoch_seed, step))``, so the draws are a pure
function of the run's seed and the step: a resumed run (``train --resume``) sees the same crops as an
uninterrupted one.
"""

from __future__ import annotations

import numpy as np

from .errors import MicroFormatError

#: ``--augment`` values.
AUGMENTS = ("none", "crop-flip")
#: Zero padding (in pixels) around the image before the random crop (He et al. 2016, section 4.2).
CROP_PAD = 4


def check_augment(augment: str | None, input_shape: list[int]) -> None:
    """MicroFormatError unless ``augment`` is known and fits the model's input (crop-flip needs (C, H, W))."""
    if augment not in (None, *AUGMENTS):
        raise MicroFormatError(f"--augment {augment}: allowed: {', '.join(AUGMENTS)}")
    if augment == "crop-flip" and len(input_shape) != 3:
        raise MicroFormatError(f"--augment crop-flip: needs image inputs (C, H, W), the model takes {input_shape}")


def crop_flip(x: np.ndarray, rng: np.random.Generator, pad: int = CROP_PAD) -> np.ndarray:
    """Each image of ``x`` (N, C, H, W) shifted by a random crop of its zero-padded copy (offsets 0..2*pad per
    axis) and mirrored left-right with probability 1/2.  Code 0 is the value 0, so the padding is zeros."""
    n, _, h, w = x.shape
    oy = rng.integers(0, 2 * pad + 1, n)
    ox = rng.integers(0, 2 * pad + 1, n)
    flip = rng.integers(0, 2, n).astype(bool)
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    rows = oy[:, None] + np.arange(h)[None, :]                       # (N, H)
    cols = ox[:, None] + np.arange(w)[None, :]                       # (N, W)
    cols = np.where(flip[:, None], cols[:, ::-1], cols)
    return padded[np.arange(n)[:, None, None, None], np.arange(x.shape[1])[None, :, None, None],
                  rows[:, None, :, None], cols[:, None, None, :]]


def augment_batch(x: np.ndarray, augment: str | None, epoch_seed: int, step: int) -> np.ndarray:
    """``x`` augmented as ``augment`` says (None / "none": unchanged), with the draws of (epoch_seed, step)."""
    if augment in (None, "none"):
        return x
    return crop_flip(x, np.random.default_rng((epoch_seed, step)))
