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

from ..numerics.hashing import SeedPurpose, derive_seed
from ..spec import LayerPrecision

__all__ = ["SampleGroups", "run_per_sample", "shares_backward"]

#: ``[(row indices, precision), ...]``: the rows partition the batch dimension (dim 0).
SampleGroups = Sequence[tuple[torch.Tensor, LayerPrecision]]


def _empty_rows(like: torch.Tensor, n: int) -> torch.Tensor:
    """An uninitialised ``[n, *like.shape[1:]]`` tensor in ``like``'s layout (channels-last stays channels-last:
    the integer convolutions' layout, so no op downstream pays a layout copy)."""
    cl = like.dim() == 4 and not like.is_contiguous() and like.is_contiguous(memory_format=torch.channels_last)
    return torch.empty((n, *like.shape[1:]), dtype=like.dtype, device=like.device,
                       memory_format=torch.channels_last if cl else torch.contiguous_format)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 2-D ``[N, rest]`` view (channels-last 4-D tensors through their NHWC order), copying only
    for other layouts: row gathers and scatters on it are plain row copies."""
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        return t.permute(0, 2, 3, 1).reshape(t.shape[0], -1)
    return t.reshape(t.shape[0], -1)


class _SplitRows(torch.autograd.Function):
    """``(x[rows_1], x[rows_2], ...)`` for row sets that partition the batch; backward writes each group's
    gradient into its rows of one new tensor (autograd's index_select backward would zero-fill a full-size
    tensor per group and scatter-add into it)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, *rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.rows, ctx.like = rows, x
        x2 = _rows(x)
        outs = []
        for idx in rows:
            out = _empty_rows(x, int(idx.numel()))
            torch.index_select(x2, 0, idx, out=_rows(out))
            outs.append(out)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        dx = _empty_rows(grads[0], int(ctx.like.shape[0]))
        dx2 = _rows(dx)
        for idx, g in zip(ctx.rows, grads):
            dx2.index_copy_(0, idx, _rows(g))
        return (dx, *(None for _ in ctx.rows))


class _MergeRows(torch.autograd.Function):
    """The inverse of :class:`_SplitRows`: group outputs written into their rows of one tensor."""

    @staticmethod
    def forward(ctx, rows: tuple[torch.Tensor, ...], *ys: torch.Tensor) -> torch.Tensor:
        ctx.rows = rows
        out = _empty_rows(ys[0], sum(int(idx.numel()) for idx in rows))
        out2 = _rows(out)
        for idx, y in zip(rows, ys):
            out2.index_copy_(0, idx, _rows(y))
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        g2 = _rows(g)
        grads = []
        for idx in ctx.rows:
            gi = _empty_rows(g, int(idx.numel()))
            torch.index_select(g2, 0, idx, out=_rows(gi))
            grads.append(gi)
        return (None, *grads)


class _ReplaceRows(torch.autograd.Function):
    """``y`` with ``rows_i`` overwritten by ``ys[i]`` (in place); the gradient goes to ``y`` unchanged: the
    replacing rows are forward values only (computed without autograd), their backward is ``y``'s."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, rows: tuple[torch.Tensor, ...], *ys: torch.Tensor) -> torch.Tensor:
        ctx.mark_dirty(y)
        ctx.n = len(ys)
        y2 = _rows(y)  # a view: the caller passes a contiguous or channels-last y
        for idx, yg in zip(rows, ys):
            y2.index_copy_(0, idx, _rows(yg))
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return (g, None, *(None for _ in range(ctx.n)))


def _rowable(t: torch.Tensor) -> bool:
    return t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last))


def shares_backward(groups: SampleGroups) -> bool:
    """Whether every group has the same input-gradient and weight-gradient GEMM precision (DFQ's groups do:
    its widths set the forward GEMM only), so one backward call over the whole batch serves them all."""
    p0 = groups[0][1]
    return all(p.grad_input == p0.grad_input and p.grad_weight == p0.grad_weight for _, p in groups[1:])


@torch.compiler.disable  # data-dependent group sizes: runs eagerly inside a compiled model
def run_per_sample(layer, x: torch.Tensor, groups: SampleGroups,
                   call: Callable[[torch.Tensor, LayerPrecision, tuple], torch.Tensor]) -> torch.Tensor:
    """``call(x_rows, precision, seeds)`` per group of ``groups``; outputs back in the order of ``x``'s rows.

    Training with a backward precision shared by all groups (:func:`shares_backward`): the largest group's
    precision runs over the whole batch with autograd — its forward gives that group's rows, its backward
    (one input-gradient and one weight-gradient GEMM at the shared precision) serves every row — and each
    other width runs its forward GEMM on its own rows without autograd, replacing those rows' values.  One
    backward call instead of one per width: the integer path's per-call cost dominated the grouped backward
    (``benchmarks/dfq_overhead.py``), at the price of the main width's forward MACs on the other rows, which
    the BitOPs count leaves out (on hardware the widths would be dispatched separately).
    Otherwise (evaluation, or per-group backward precisions): one autograd call per group, rows gathered
    once and written back once in each direction.
    """
    seeds = layer._next_seeds()
    if len(groups) == 1:  # one width in this batch: exactly the plain layer call
        return call(x, groups[0][1], seeds)

    def group_seeds(prec: LayerPrecision) -> tuple:
        return tuple(derive_seed(int(seed), SeedPurpose.SAMPLE_GROUP, prec.forward.lhs.bits) for seed in seeds)

    if torch.is_grad_enabled() and shares_backward(groups):
        main = max(range(len(groups)), key=lambda i: int(groups[i][0].numel()))
        y = call(x, groups[main][1], seeds)
        if not _rowable(y):
            y = y.contiguous()
        others = [g for i, g in enumerate(groups) if i != main]
        with torch.no_grad():
            x2 = _rows(x)
            ys = []
            for idx, prec in others:
                xg = _empty_rows(x, int(idx.numel()))
                torch.index_select(x2, 0, idx, out=_rows(xg))
                ys.append(call(xg, prec, group_seeds(prec)))
        return _ReplaceRows.apply(y, tuple(idx for idx, _ in others), *ys)
    rows = tuple(idx for idx, _ in groups)
    outs = [call(xg, prec, group_seeds(prec)) for xg, (_, prec) in zip(_SplitRows.apply(x, *rows), groups)]
    return _MergeRows.apply(rows, *outs)
