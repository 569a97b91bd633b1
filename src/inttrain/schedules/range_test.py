"""CPT's precision range test (Fu et al., ICLR 2021, Sec. 3.3): find the lower precision bound.

"Start from the lowest possible precision and gradually increase it while monitoring the training
accuracy; ``B_min`` is the first precision at which the accuracy rises past a threshold" (``B_max`` is
the final target precision of the model).  Here the monitoring is a callback ``probe(bits) ->
accuracy`` (e.g. a short training run at that forward precision), so the search is testable without
training.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["RangeTestResult", "precision_range_test"]


@dataclass
class RangeTestResult:
    b_min: int | None  # None: no probed precision passed the threshold
    accuracies: dict[int, float] = field(default_factory=dict)  # bits -> probed accuracy, in probe order


def precision_range_test(
    probe: Callable[[int], float],
    threshold: float,
    bits: Iterable[int] = range(2, 9),
    relative: bool = False,
) -> RangeTestResult:
    """Probe ``bits`` from low to high and stop at the first precision whose accuracy exceeds ``threshold``.

    ``relative=False``: the accuracy itself must be ``> threshold``.  ``relative=True``: the accuracy must
    rise by more than ``threshold`` over the previous (lower) precision's accuracy — the "accuracy takes
    off" reading of the paper for curves whose absolute level is not known in advance.  Precisions above
    the found one are not probed (each probe is a training run).
    """
    result = RangeTestResult(None)
    prev: float | None = None
    for b in sorted(bits):
        acc = float(probe(b))
        result.accuracies[b] = acc
        if relative:
            passed = prev is not None and acc - prev > threshold
        else:
            passed = acc > threshold
        if passed:
            result.b_min = b
            return result
        prev = acc
    return result
