"""Light image augmentation for training batches: random crop after zero padding, horizontal flip.

The standard CIFAR recipe (He et al. 2016: pad 4, random 32x32 crop, flip with p = 0.5).  The
randomness is a pure function of ``(seed, step)``, so a resumed run draws exactly the crops and
flips the uninterrupted run drew, with no generator state to checkpoint.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["AUGMENTATIONS", "augment_batch"]

AUGMENTATIONS: tuple[str, ...] = ("none", "crop-flip")
_PAD = 4


def _draws(n: int, seed: int, step: int) -> tuple[Tensor, Tensor, Tensor]:
    """Row offsets, column offsets (0..2*pad) and flips of ``n`` images: a pure function of ``(seed, step)``."""
    gen = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(step)) % (2**63))
    dy = torch.randint(0, 2 * _PAD + 1, (n,), generator=gen)
    dx = torch.randint(0, 2 * _PAD + 1, (n,), generator=gen)
    flip = torch.rand(n, generator=gen) < 0.5
    return dy, dx, flip


def augment_batch(x: Tensor, kind: str, seed: int, step: int) -> Tensor:
    """Augment an NCHW image batch (``kind`` in :data:`AUGMENTATIONS`); other tensors pass through.

    Vectorised: one gather from the zero-padded batch with per-image window indices (the column index runs
    backwards for a flipped image).  Same draws and the same pixels as cropping image by image.
    """
    if kind not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation {kind!r}; allowed: {', '.join(AUGMENTATIONS)}")
    if kind == "none" or x.dim() != 4 or x.shape[0] == 0:
        return x
    n, c, h, w = x.shape
    dy, dx, flip = (t.to(x.device) for t in _draws(n, seed, step))
    padded = torch.nn.functional.pad(x, (_PAD, _PAD, _PAD, _PAD))
    wp = w + 2 * _PAD
    i = torch.arange(h, device=x.device)
    j = torch.arange(w, device=x.device)
    cols = dx[:, None] + torch.where(flip[:, None], w - 1 - j, j)  # [n, w]
    index = ((dy[:, None] + i) * wp)[:, :, None] + cols[:, None, :]  # [n, h, w] into the padded h x w plane
    out = padded.reshape(n, c, -1).gather(2, index.reshape(n, 1, h * w).expand(n, c, h * w))
    return out.reshape(n, c, h, w)
