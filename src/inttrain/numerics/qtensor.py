"""The quantized-tensor container: integer codes + scale + the spec that made them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..spec import QuantSpec

__all__ = ["QTensor"]


@dataclass(frozen=True)
class QTensor:
    """Integer ``data`` (int8 or int16 storage) with a float32 ``scale`` broadcastable to it.

    The real value it stands for is ``data * scale`` (see :meth:`dequantize`).
    """

    data: torch.Tensor
    scale: torch.Tensor
    spec: QuantSpec

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.data.to(torch.float32) * self.scale).to(dtype)

    def __repr__(self) -> str:
        return f"QTensor(shape={tuple(self.data.shape)}, dtype={self.data.dtype}, spec={self.spec})"
