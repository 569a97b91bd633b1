"""benchmarks/arm_check.py: the generated C cross-compiled for arm64/armhf under qemu-user, and micro in a cached
Debian arm64 root, each bit-exact with x86. Slow; skipped when the cross tools or qemu are missing."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "arm_check.py"
TOOLS = ["aarch64-linux-gnu-gcc", "qemu-aarch64", "arm-linux-gnueabihf-gcc", "qemu-arm"]
ROOT_READY = Path.home() / ".cache" / "inttrain-arm" / "bookworm-arm64" / ".inttrain-ready"


@pytest.mark.slow
@pytest.mark.skipif(any(shutil.which(t) is None for t in TOOLS), reason="needs aarch64/armhf cross gcc and qemu-user")
def test_arm_check_bit_exact():
    # micro under emulation only when the Debian root is already built (the test downloads nothing)
    if ROOT_READY.exists():
        runs = [["--arch", "arm64"], ["--arch", "armhf", "--no-micro"]]
    else:
        runs = [["--arch", "arm64,armhf", "--no-micro"]]
    lines = []
    for extra in runs:
        r = subprocess.run([sys.executable, str(SCRIPT), "--steps", "6", *extra], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        lines += r.stdout.splitlines()
    c_lines = [ln for ln in lines if " C " in ln]
    assert len(c_lines) == 6 and all(": bit-exact: C and micro identical" in ln for ln in c_lines)
    if ROOT_READY.exists():
        assert any(ln.startswith("arm64 micro (aarch64") and "bit-exact with x86" in ln for ln in lines)
