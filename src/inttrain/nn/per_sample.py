"""Per-sample precision for the integer layers: the batch split by bit width, one integer call per width.

A per-sample precision policy (per-sample DFQ, :mod:`inttrain.recipes.fractrain_dfq`) sets a layer's
``sample_groups`` before its forward: a list of ``(rows, LayerPrecision)`` whose row-index tensors partition
``range(N)`` of the batch.  The layer then runs :func:`run_per_sample`: each group's rows are gathered, go
through the layer's integer autograd function at the group's precision (forward GEMM and, in backward, the
input- and weight-gradient GEMMs at that precision, each with its own quantization scales), and the group
outputs are scattered back into batch order.  Autograd sums the groups' weight gradients and scatters their
input gradients, so nothing else changes for the caller.

Seeds: one ``_next_seeds()`` per forward (the layer's call counter advances once, as in a plain call); a
group's three GEMM seeds are those mixed with the group's forward bits, so groups draw independent rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..numerics.hashing import mix_seed
from ..spec import LayerPrecision

__all__ = ["SampleGroups", "run_per_sample"]

#: ``[(row indices, precision), ...]``: the rows partition the batch dimension (dim 0).
SampleGroups = Sequence[tuple[torch.Tensor, LayerPrecision]]


@torch.compiler.disable  # data-dependent group sizes: runs eagerly inside a compiled model
def run_per_sample(layer, x: torch.Tensor, groups: SampleGroups,
                   call: Callable[[torch.Tensor, LayerPrecision, tuple], torch.Tensor]) -> torch.Tensor:
    """``call(x_rows, precision, seeds)`` once per group of ``groups``; outputs back in the order of ``x``'s rows."""
    seeds = layer._next_seeds()
    if len(groups) == 1:  # one width in this batch: exactly the plain layer call
        return call(x, groups[0][1], seeds)
    outs, rows = [], []
    for idx, prec in groups:
        s = tuple(mix_seed(int(seed), prec.forward.lhs.bits, 0x5E9A) for seed in seeds)
        outs.append(call(x.index_select(0, idx), prec, s))
        rows.append(idx)
    perm = torch.cat(rows)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)
    return torch.cat(outs).index_select(0, inverse)
