"""Cost accounting of integer training (issue 5): BitOPs per layer and GEMM from run-time shapes, ratios to
fp32 and static int8, a Horowitz (ISSCC 2014, 45 nm) energy estimate and measured saved-activation memory.

On this CPU, fewer bits than 8 do not run faster (they run on int8 kernels); BitOPs is the
hardware-independent measure the low-precision training papers report.
"""

from .bitops import GEMMS, HOROWITZ_45NM_PJ, BitOpsCounter, GemmCount, gemm_macs, mac_energy_pj, measure_step
from .memory import saved_activation_bytes

__all__ = ["GEMMS", "HOROWITZ_45NM_PJ", "BitOpsCounter", "GemmCount", "gemm_macs", "mac_energy_pj", "measure_step",
           "saved_activation_bytes"]
