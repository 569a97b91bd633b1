"""``python -m inttrain.kernels.native``: build the native kernels now (``make setup`` does) and say where."""

import sys

from . import (BATCH_NORM_LIBRARY, CONV_AMX_LIBRARY, CONV_AVX2_LIBRARY, GEMM_AVX2_LIBRARY, GEMM_LIBRARY, LIBRARY,
               QUANTIZE_LIBRARY)

for library in (LIBRARY, QUANTIZE_LIBRARY, GEMM_LIBRARY, CONV_AMX_LIBRARY, GEMM_AVX2_LIBRARY, CONV_AVX2_LIBRARY,
                BATCH_NORM_LIBRARY):
    if library.load() is not None:
        print(f"native kernels: {library.build()}")
    else:
        print(f"native kernels from {library.source.name} unavailable, the torch kernels serve: {library.reason}",
              file=sys.stderr)
