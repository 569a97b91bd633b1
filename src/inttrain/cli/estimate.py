"""How much memory a run would need, judged on the ``meta`` device before anything real is allocated.

The model is built on ``torch.device("meta")`` (shapes only, no storage) and one forward of a batch of one
is traced with hooks that add up every module's output size. That gives the exact parameter count and the
activations per example for any model in the registry, so ``--set d_model=1000000`` or a ``cost`` batch of
5*10^7 is refused in milliseconds instead of after gigabytes were allocated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MemoryEstimate", "estimate_training_memory", "BYTES_PER_PARAM", "BYTES_PER_ACTIVATION"]

#: fp32 weights + gradients + up to two optimizer moments (Adam), plus the recipe's int8 copies.
BYTES_PER_PARAM = 4 + 4 + 8 + 2
#: Each activation kept for backward (fp32) and its gradient: a generous bound for fp32 and the int8 recipes.
BYTES_PER_ACTIVATION = 4 + 4


@dataclass(frozen=True)
class MemoryEstimate:
    params: int
    activations_per_example: int  # elements output by all modules for one example

    def bytes(self, batch_size: int) -> int:
        return self.params * BYTES_PER_PARAM + self.activations_per_example * batch_size * BYTES_PER_ACTIVATION


def estimate_training_memory(build: Any, example_shape: tuple[int, ...], tokens: bool) -> MemoryEstimate:
    """Parameters and per-example activation elements of the model ``build()`` returns, without storage.

    ``example_shape``: one input without the batch dimension; ``tokens``: int64 ids instead of floats.
    If a model cannot run on ``meta`` the activations count as 0 (the parameter count still holds).
    """
    import torch

    with torch.device("meta"):
        model = build()
        params = sum(p.numel() for p in model.parameters())
        total = [0]

        def hook(_m: Any, _i: Any, out: Any) -> None:
            if isinstance(out, torch.Tensor):
                total[0] += out.numel()

        handles = [m.register_forward_hook(hook) for m in model.modules() if m is not model]
        try:
            x = torch.zeros((1, *example_shape), dtype=torch.int64 if tokens else torch.float32)
            with torch.no_grad():
                model(x)
        except Exception:  # noqa: BLE001 - an estimate only: a model meta tensors cannot run keeps its param count
            total[0] = 0
        finally:
            for h in handles:
                h.remove()
    return MemoryEstimate(int(params), int(total[0]))
