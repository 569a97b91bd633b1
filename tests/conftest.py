"""Test defaults: eager quantize passes unless a test turns torch.compile on (compiling costs seconds).

Tests of the fused (compiled) path set INTTRAIN_COMPILE=1 themselves and compare against eager.
"""

import os

os.environ.setdefault("INTTRAIN_COMPILE", "0")
