#!/usr/bin/env python
"""Where a compiled int8 Linear training step spends its GPU time, next to bf16 autocast's (torch.profiler).

    python benchmarks/cuda_profile.py [TOKENS IN OUT]      # default 16384 4096 4096

Prints each variant's top CUDA kernels by total time over 10 steps.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import inttrain  # noqa: E402


def main() -> None:
    tokens, fin, fout = (int(v) for v in sys.argv[1:4]) if len(sys.argv) >= 4 else (16384, 4096, 4096)
    x = torch.randn(tokens, fin, device="cuda", requires_grad=True)
    dy = torch.randn(tokens, fout, device="cuda")
    for name in ("bf16", "int8"):
        layer = nn.Linear(fin, fout).cuda()
        if name == "int8":
            inttrain.prepare_(layer, "int8")
        run = torch.compile(layer)

        def step() -> None:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=name == "bf16"):
                y = run(x)
            y.backward(dy.to(y.dtype))
            x.grad = None
            layer.weight.grad = layer.bias.grad = None

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        print(f"== {name} compiled, Linear {tokens}x{fin}x{fout} fwd+bwd, 10 steps")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))


if __name__ == "__main__":
    main()
