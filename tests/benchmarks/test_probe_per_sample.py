"""benchmarks/probe_per_sample.py: one row per convolution whose input gradient is used, both layouts measured."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

SCRIPT = "probe_per_sample"


def test_table_has_every_conv_and_per_sample_is_not_worse(bench, tmp_path: Path) -> None:
    from inttrain.models.resnet import CifarResNet

    torch.manual_seed(0)
    save_file(CifarResNet(20).state_dict(), str(tmp_path / "w.safetensors"))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (16, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, 16))
    bench.main([str(tmp_path / "w.safetensors"), "--data", str(tmp_path / "d.npz"), "--batch", "16",
                "--out", str(tmp_path / "t.md")])
    rows = [r for r in (tmp_path / "t.md").read_text().splitlines() if r.startswith("| layer")]
    assert len(rows) == 20  # ResNet-20's convolutions but the first (18 3x3 and 2 shortcut 1x1)
    for row in rows:
        per_tensor, per_sample = (float(v) for v in re.findall(r"\| (-?[\d.]+) dB", row))
        assert per_sample >= per_tensor - 0.5, row  # a sample's scale is never coarser than the tensor's
