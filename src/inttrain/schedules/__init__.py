"""Precision schedules (issue 5): Constant, Steps, CPT (cyclic), PFQ (FracTrain progressive), the
:class:`PrecisionScheduler` that applies them to a prepared model, and CPT's precision range test.

Pure Python; imports only :mod:`inttrain.spec`.  On this CPU, 2..8-bit GEMMs all run on int8 kernels,
so fewer bits are not faster than 8; BitOPs (:mod:`inttrain.cost`) is the hardware-independent measure
the papers use for the savings.
"""

from .range_test import RangeTestResult, precision_range_test
from .scheduler import PrecisionScheduler, model_bits, prepared_layers, set_model_bits, with_bits
from .schedules import CPT, PFQ, Constant, Schedule, Steps, cpt_bits

#: "dfq" and "fractrain" (FracTrain's learned gates, alone and under PFQ) need torch: they live in
#: :mod:`inttrain.recipes.fractrain_dfq`.
SCHEDULE_NAMES: tuple[str, ...] = ("none", "constant", "steps", "cpt", "pfq", "dfq", "fractrain")

__all__ = [
    "CPT", "PFQ", "Constant", "Schedule", "Steps", "cpt_bits", "PrecisionScheduler", "model_bits", "prepared_layers",
    "set_model_bits", "with_bits", "RangeTestResult", "precision_range_test", "SCHEDULE_NAMES",
]
