"""``inttrain env``: what this machine and build can run.

Read defensively: an unreadable /proc/cpuinfo or a failing ``describe()`` is
reported as such rather than crashing the report (it exists to diagnose).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import torch

__all__ = ["cpu_flags", "collect_env"]

_INTERESTING_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, bool] | None:
    """The int8-relevant x86 flags from /proc/cpuinfo (None where unreadable)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags") and ":" in line:
            flags = set(line.split(":", 1)[1].split())
            break
    return {f: f in flags for f in _INTERESTING_FLAGS}


def collect_env() -> dict[str, Any]:
    import inttrain

    info: dict[str, Any] = {
        "inttrain": getattr(inttrain, "__version__", "unknown"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch threads": torch.get_num_threads(),
        "cpu capability (torch)": torch.backends.cpu.get_cpu_capability(),
    }
    flags = cpu_flags()
    if flags is None:
        info["cpu flags"] = "unavailable (/proc/cpuinfo unreadable)"
    else:
        for name, present in flags.items():
            info[f"cpu flag {name}"] = "yes" if present else "no"
    info["cuda available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        info["cuda device"] = torch.cuda.get_device_name(0)
        info["cuda version"] = torch.version.cuda
    from inttrain.kernels import describe

    try:
        for key, value in describe().items():
            info[f"kernel {key}"] = value
    except Exception as e:  # report, don't crash: this command is for diagnosing
        info["kernels"] = f"describe() failed: {type(e).__name__}: {e}"
    return info


def format_env(info: dict[str, Any]) -> str:
    width = max(map(len, info))
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in info.items())
