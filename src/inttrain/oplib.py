"""The ``inttrain::`` operator namespace: one ``torch.library`` fragment, owned here, and :func:`operator`.

Compiled steps call the integer kernels (and the stochastic-rounding seed counter) as opaque graph nodes.
``torch.library.custom_op`` would register them too, but its Python wrapper is paid on every call: about
19 us per call, and about 63 us for an operator that mutates an argument (measured on a 2-core Zen 5,
where a ResNet-20 step makes ~85 such calls: ~2.6 ms of a ~125 ms step).  Defining the schema and putting
the Python kernel straight on the dispatcher costs about 6 us a call; the fake (meta) kernel and
``torch.library.opcheck`` work the same.  Every layer that registers an operator imports this module, which
imports nothing of inttrain.
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["NAMESPACE", "operator"]

NAMESPACE = "inttrain"
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


def operator(schema: str, fake: Callable) -> Callable[[Callable], Callable]:
    """Register the decorated Python function as ``inttrain::<name>`` with ``schema`` and fake kernel ``fake``.

    ``schema`` is a ``torch.library`` schema without the namespace, e.g.
    ``"int8_mm(Tensor a, Tensor b) -> Tensor"``; mutated arguments are marked ``Tensor(a!)``.  The kernel runs
    for every device (``CompositeExplicitAutograd``: the kernels dispatch on the device themselves) and must
    return fresh tensors, never views of its inputs.  It has no autograd formula: inttrain calls these
    operators inside ``autograd.Function`` forward and backward, where autograd is off.
    """

    def register(kernel: Callable) -> Callable:
        name = schema.split("(", 1)[0].strip()
        _LIBRARY.define(schema)
        _LIBRARY.impl(name, kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)
        return kernel

    return register
