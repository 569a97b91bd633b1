"""Turn validated arrays into train/val ``TensorDataset``s.

Images become float32 NCHW, standardised per channel with statistics of the
*training* split only (so no information leaks from validation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import TensorDataset

from .arrays import RawArrays
from .errors import DataError
from .validate import ImageLayout

__all__ = ["DatasetSplits", "make_splits", "normalise"]


@dataclass
class DatasetSplits:
    """Train/val datasets of (image float32 [C,H,W], label int64) pairs.

    For ``task == "lm"`` (the text dataset) the pairs are (ids [T], next ids [T]),
    ``num_classes`` is the vocabulary size, ``image_size`` the sequence length
    and ``vocab`` the characters by id.
    """

    name: str
    train: TensorDataset
    val: TensorDataset
    num_classes: int
    in_channels: int
    image_size: int
    source: str = ""
    val_source: str = ""  # "test split" or "held-out fraction of train"
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    task: str = "classification"  # or "lm": next-token prediction, scored per token
    vocab: str = ""


def _to_nchw_float(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
        if x.ndim == 4:
            x = x.transpose(0, 3, 1, 2)  # NHWC -> NCHW
    else:
        x = x.astype(np.float32)
    if x.ndim == 3:
        x = x[:, None]
    return np.ascontiguousarray(x)


def make_splits(
    raw: RawArrays, name: str, num_classes: int, layout: ImageLayout, val_fraction: float, seed: int
) -> DatasetSplits:
    """Build :class:`DatasetSplits` from arrays already checked by ``validate``.

    With a test split in ``raw`` it becomes the validation set (what the
    integer-training papers report); otherwise a seeded ``val_fraction`` of
    the training images is held out.
    """
    x = _to_nchw_float(raw.x_train)
    y = raw.y_train.astype(np.int64)
    if raw.x_test is not None and raw.y_test is not None:
        x_tr, y_tr = x, y
        x_va, y_va = _to_nchw_float(raw.x_test), raw.y_test.astype(np.int64)
        val_source = "test split"
    else:
        if not 0.0 < val_fraction < 1.0:
            raise DataError(f"{raw.source}: val_fraction: {val_fraction} must be strictly between 0 and 1")
        n_val = int(round(len(x) * val_fraction))
        if n_val == 0 or n_val == len(x):
            raise DataError(
                f"{raw.source}: x_train: val_fraction={val_fraction} of {len(x)} samples "
                f"leaves an empty {'val' if n_val == 0 else 'train'} split"
            )
        perm = np.random.default_rng(seed).permutation(len(x))
        va, tr = perm[:n_val], perm[n_val:]
        x_tr, y_tr, x_va, y_va = x[tr], y[tr], x[va], y[va]
        val_source = f"held-out {val_fraction:g} of train (seed {seed})"

    mean = x_tr.mean(axis=(0, 2, 3), dtype=np.float64)
    std = x_tr.std(axis=(0, 2, 3), dtype=np.float64)
    std = np.where(std > 1e-8, std, 1.0)  # constant channels: centre only

    def norm(a: np.ndarray) -> torch.Tensor:
        out = (a - mean[None, :, None, None]) / std[None, :, None, None]
        return torch.from_numpy(out.astype(np.float32))

    channels, size = layout
    return DatasetSplits(
        name=name,
        train=TensorDataset(norm(x_tr), torch.from_numpy(y_tr)),
        val=TensorDataset(norm(x_va), torch.from_numpy(y_va)),
        num_classes=num_classes,
        in_channels=channels,
        image_size=size,
        source=raw.source,
        val_source=val_source,
        mean=tuple(float(m) for m in mean),
        std=tuple(float(s) for s in std),
    )


def normalise(x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """Images (uint8 NHW/NHWC or float NHW/NCHW) -> float32 NCHW standardised with *given* statistics.

    Evaluation uses the statistics the model was trained with, never the evaluated data's own.
    """
    a = _to_nchw_float(x)
    m, s = np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
    if a.shape[1] != len(m) or len(m) != len(s):
        raise DataError(f"images: {a.shape[1]} channels; the model was trained on {len(m)}")
    return torch.from_numpy(((a - m[None, :, None, None]) / s[None, :, None, None]).astype(np.float32))
