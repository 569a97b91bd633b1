"""torch.autograd Functions that run a layer's forward and both backward GEMMs on integer kernels."""

from .linear import GemmSeeds, int_linear

__all__ = ["GemmSeeds", "int_linear"]
