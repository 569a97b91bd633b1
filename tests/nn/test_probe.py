"""Numerics probe: SQNR per layer and GEMM (inttrain.nn.probe), its run-folder log and plot (`--probe-every`)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import torch
from torch import nn

import inttrain
from inttrain.cli.app import main
from inttrain.nn.probe import probe_gemms


def _mlp(bits: int) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    cfg = inttrain.get_config("int8")
    import dataclasses

    return inttrain.prepare_(m, dataclasses.replace(cfg, bits=bits))


def _by_key(rows) -> dict:
    return {(r.layer, r.gemm): r.sqnr_db for r in rows}


def test_eight_bits_beat_four_bits_on_every_gemm() -> None:
    torch.manual_seed(1)
    x, y = torch.randn(64, 32), torch.randint(0, 10, (64,))
    s8, s4 = _by_key(probe_gemms(_mlp(8), x, y)), _by_key(probe_gemms(_mlp(4), x, y))
    # Layer "0" gets no grad_input row: the batch needs no gradient.
    assert sorted(s8) == sorted(s4) == sorted(
        [("0", "forward"), ("0", "grad_weight")] + [(n, g) for n in ("2", "4") for g in ("forward", "grad_input", "grad_weight")])
    for key in s8:
        # Each bit is worth ~6 dB of SQNR: 4 bits fewer must cost far more than 12 dB.
        assert s8[key] > s4[key] + 12, (key, s8[key], s4[key])
        assert 20 < s8[key] < 60, (key, s8[key])


def test_exactly_representable_operands_give_infinite_sqnr() -> None:
    # Every row and column of x, W and dy holds a +-127, so every per-tensor, per-row and per-column int8 scale
    # is exactly 1: the codes are the values, and all three integer GEMMs are exact.
    g = torch.Generator().manual_seed(0)
    small = lambda *shape: torch.randint(-40, 41, shape, generator=g).float()  # noqa: E731
    x = small(4, 4).fill_diagonal_(127)
    w = small(3, 4)
    w[0, 0] = w[1, 1] = w[2, 2] = w[2, 3] = 127
    dy = small(4, 3)
    dy[0, 0] = dy[1, 1] = dy[2, 2] = -127
    dy[3, 0] = 127
    layer = nn.Linear(4, 3, bias=False)
    with torch.no_grad():
        layer.weight.copy_(w)
    model = inttrain.prepare_(nn.Sequential(layer), "int8")
    rows = probe_gemms(model, x.requires_grad_(True), loss_fn=lambda out: (out * dy).sum())
    assert [(r.gemm, r.bits, r.sqnr_db) for r in rows] == [
        ("forward", "8x8", math.inf), ("grad_input", "8x8", math.inf), ("grad_weight", "8x8", math.inf)]
    # One off-grid input value: the forward is no longer exact, and its SQNR is finite.
    x2 = x.detach().clone()
    x2[0, 1] += 0.3
    fwd = probe_gemms(model, x2, loss_fn=lambda out: (out * dy).sum())[0]
    assert fwd.gemm == "forward" and 20 < fwd.sqnr_db < math.inf


def test_probe_leaves_the_model_untouched() -> None:
    model = _mlp(8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = [m.calls for m in model.modules() if hasattr(m, "sr_calls")]
    probe_gemms(model, torch.randn(8, 32), torch.randint(0, 10, (8,)))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert [m.calls for m in model.modules() if hasattr(m, "sr_calls")] == calls
    assert all(p.grad is None for p in model.parameters())


BASE = ["train", "--dataset", "digits", "--batch-size", "64", "--threads", "1", "--log-every", "1", "--no-compile",
        "--recipe", "int8", "--max-steps", "12"]


def test_cli_probe_file_plot_and_unchanged_training(tmp_path: Path, capsys) -> None:
    assert main([*BASE, "--out", str(tmp_path / "plain")]) == 0
    assert main([*BASE, "--out", str(tmp_path / "probed"), "--probe-every", "5"]) == 0
    losses = [[r["loss"] for r in map(json.loads, (tmp_path / run / "metrics.jsonl").read_text().splitlines())]
              for run in ("plain", "probed")]
    assert losses[0] == losses[1]  # the probe works on a copy: training is bit-identical
    with open(tmp_path / "probed" / "probe.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted({int(r["step"]) for r in rows}) == [5, 10]
    assert {r["gemm"] for r in rows} == {"forward", "grad_input", "grad_weight"}
    assert all(float(r["sqnr_db"]) > 3 and r["bits"] == "8x8" for r in rows)
    assert main(["plot", str(tmp_path / "probed")]) == 0
    assert (tmp_path / "probed" / "plots" / "probe.png").stat().st_size > 0
    capsys.readouterr()
    assert main([*BASE[:-4], "--recipe", "fp32", "--probe-every", "5", "--out", str(tmp_path / "f")]) == 2
    assert capsys.readouterr().err.strip() == ("error: --probe-every: 5: recipe 'fp32' has no integer layers to probe; "
                                               "use an integer recipe such as int8")


def test_resume_drops_probe_rows_after_the_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main([*BASE, "--out", str(run), "--probe-every", "5"]) == 0  # stops resumably at step 12
    with open(run / "probe.csv", "a", newline="") as f:  # as if a killed leg had probed past its checkpoint
        csv.writer(f).writerow([15, "features.0", "Conv2d", "forward", 1, "8x8", "-99.0000"])
    assert main(["resume", str(run), "--max-steps", "20"]) == 0
    with open(run / "probe.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted({int(r["step"]) for r in rows}) == [5, 10, 15, 20]
    assert all(float(r["sqnr_db"]) > 0 for r in rows)  # the stale step-15 row is gone, the real ones are there
