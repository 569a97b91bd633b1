"""Drop-in layers for integer training."""

from .layers import IntLayerMixin, QConv2d, QLinear, restore_module

__all__ = ["IntLayerMixin", "QConv2d", "QLinear", "restore_module"]
