"""``python -m inttrain.kernels.native``: build the native kernels now (``make setup`` does) and say where."""

import sys

from . import WGRAD, available

if available():
    print(f"native kernels: {WGRAD.build()}")
else:
    print(f"native kernels unavailable, the torch kernels serve: {WGRAD.reason}", file=sys.stderr)
