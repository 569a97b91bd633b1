"""torch.autograd Functions that run a layer's forward and both backward GEMMs on integer kernels."""

from . import dataflow  # noqa: F401  (fills qactivation's op tables: the int8 versions of ReLU, add, BatchNorm...)
from .linear import GemmSeeds, int_linear

__all__ = ["GemmSeeds", "int_linear", "int_conv2d", "check_conv_precision"]


def __getattr__(name: str):
    # The conv Function pulls in the oneDNN conv kernels; import it only when asked for.
    if name in ("int_conv2d", "check_conv_precision"):
        from . import conv

        return getattr(conv, name)
    raise AttributeError(name)
