"""``bf16``: float training under ``torch.autocast(device_type, dtype=torch.bfloat16)``.

bf16 is not an integer recipe: the model keeps its float32 parameters and layers, and eligible ops
(matmuls, convolutions) run in bfloat16 inside an autocast region around the forward pass (the
backward follows the forward's dtypes).  So ``inttrain.prepare_(model, "bf16")`` is a documented
no-op (``converts_layers()`` is False, as for ``fp32``), and the precision comes from the context
manager :meth:`Bf16Config.autocast`:

>>> import torch, inttrain
>>> from inttrain.recipes import Bf16Config
>>> model = inttrain.prepare_(torch.nn.Linear(4, 2), "bf16")   # unchanged
>>> with Bf16Config().autocast("cpu"):
...     y = model(torch.randn(3, 4))
>>> y.dtype
torch.bfloat16

The trainer (``inttrain.trainer.recipes.autocast_for``) opens the same autocast for the name ``"bf16"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..spec import LayerPrecision
from .base import RecipeConfig

__all__ = ["Bf16Config"]


@dataclass(frozen=True)
class Bf16Config(RecipeConfig):
    """Float training under torch.autocast with bfloat16 (``prepare_`` leaves the model untouched).

    Use :meth:`autocast` around the forward pass (the trainer does this for the name ``"bf16"``).
    """

    name = "bf16"
    facts = ("none (torch.autocast)", "nothing",
             "everything; matmuls and convolutions in bfloat16 under autocast, float32 master weights")

    def precision_for(self, module: nn.Module, fqn: str) -> LayerPrecision | None:
        return None

    def converts_layers(self) -> bool:
        return False

    def autocast(self, device: str | torch.device = "cpu", enabled: bool = True):
        """``torch.autocast(device_type, dtype=torch.bfloat16)`` for ``device`` ("cpu", "cuda" or a torch.device)."""
        device_type = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
        return torch.autocast(device_type, dtype=torch.bfloat16, enabled=enabled)
