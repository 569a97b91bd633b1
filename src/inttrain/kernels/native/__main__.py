"""``python -m inttrain.kernels.native``: build the native kernels now (``make setup`` does) and say where."""

import sys

from . import LIBRARY, available

if available():
    print(f"native kernels: {LIBRARY.build()}")
else:
    print(f"native kernels unavailable, the torch kernels serve: {LIBRARY.reason}", file=sys.stderr)
