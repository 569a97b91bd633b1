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


def augment_batch(x: Tensor, kind: str, seed: int, step: int) -> Tensor:
    """Augment an NCHW image batch (``kind`` in :data:`AUGMENTATIONS`); other tensors pass through."""
    if kind not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation {kind!r}; allowed: {', '.join(AUGMENTATIONS)}")
    if kind == "none" or x.dim() != 4 or x.shape[0] == 0:
        return x
    n, _, h, w = x.shape
    gen = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(step)) % (2**63))
    dy = torch.randint(0, 2 * _PAD + 1, (n,), generator=gen).tolist()
    dx = torch.randint(0, 2 * _PAD + 1, (n,), generator=gen).tolist()
    flip = (torch.rand(n, generator=gen) < 0.5).tolist()
    padded = torch.nn.functional.pad(x, (_PAD, _PAD, _PAD, _PAD))
    out = torch.empty_like(x)
    for i in range(n):
        crop = padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w]
        out[i] = crop.flip(-1) if flip[i] else crop
    return out
