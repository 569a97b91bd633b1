"""Test defaults: eager quantize passes unless a test turns torch.compile on (compiling costs seconds).

Tests of the fused (compiled) path set INTTRAIN_COMPILE=1 themselves and compare against eager.
"""

import os

os.environ.setdefault("INTTRAIN_COMPILE", "0")

# Helper modules next to the tests (e.g. tests/autograd/grad_utils.py) are imported by name.
import sys
from pathlib import Path

for folder in Path(__file__).parent.iterdir():
    if folder.is_dir() and any(folder.glob("*_utils.py")):
        sys.path.insert(0, str(folder))


import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def one_thread():
    """Tiny models and batches: one thread is as fast, and immune to thread pools spinning against other
    processes on a busy CI machine.  Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
