"""BitOPs accounting against a hand count; energy table; state round trip."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import inttrain
from inttrain.cost import BitOpsCounter, mac_energy_pj, measure_step
from inttrain.schedules import Constant, PrecisionScheduler

# Conv2d(3, 4, 3, padding=1) on 2x3x6x6 -> 2x4x6x6: 2*4*6*6 outputs x 3*3*3 MACs each = 7776 per GEMM.
# Linear(144, 5) on 2 rows: 2*144*5 = 1440 per GEMM.
CONV_MACS, LIN_MACS = 2 * 4 * 6 * 6 * 3 * 3 * 3, 2 * 144 * 5


def _net() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(144, 5))
    inttrain.prepare_(m, "int8")
    return m


def test_hand_count_all_three_gemms() -> None:
    m = _net()
    c = measure_step(m, torch.randn(2, 3, 6, 6, requires_grad=True))
    assert {(k, r.macs) for k, r in c.records.items()} == {
        (("0", g), CONV_MACS) for g in ("forward", "grad_input", "grad_weight")
    } | {(("3", g), LIN_MACS) for g in ("forward", "grad_input", "grad_weight")}
    total_macs = 3 * (CONV_MACS + LIN_MACS)
    assert c.bitops == total_macs * 8 * 8
    assert c.ratio_to_fp32 == pytest.approx(64 / 1024) and c.ratio_to_int8 == 1.0
    assert c.total("energy_pj") == pytest.approx(total_macs * (0.2 + 0.1))  # int8 mult + int32 add
    assert c.saved_bytes["0"] > 0 and c.saved_bytes["3"] > 0
    assert "grad_weight" in c.table() and "total" in c.table()


def test_hand_count_scheduled_bits_and_first_layer() -> None:
    m = _net()
    PrecisionScheduler(m, Constant(4, 6))
    # Input without grad: the first layer's grad_input GEMM is not run, so not counted.
    c = measure_step(m, torch.randn(2, 3, 6, 6))
    assert ("0", "grad_input") not in c.records
    expected = (CONV_MACS + LIN_MACS) * 4 * 4 + (CONV_MACS + 2 * LIN_MACS) * 6 * 4  # dy (6 bits) x W or x (4 bits)
    assert c.bitops == expected
    assert c.records[("3", "grad_weight")].last_bits == (6, 4)
    # Accumulates over calls; totals survive a state_dict round trip.
    with c:
        m(torch.randn(2, 3, 6, 6)).sum().backward()
    assert c.bitops == 2 * expected
    c2 = BitOpsCounter(m)
    c2.load_state_dict(c.state_dict())
    assert c2.bitops == c.bitops and c2.total("energy_pj") == c.total("energy_pj")


def test_eval_counts_forward_only_and_energy_table() -> None:
    m = _net()
    with BitOpsCounter(m) as c, torch.no_grad():
        m(torch.randn(2, 3, 6, 6))
    assert {g for _, g in c.records} == {"forward"} and c.bitops == (CONV_MACS + LIN_MACS) * 64
    assert mac_energy_pj(8, 8) == pytest.approx(0.3)
    assert mac_energy_pj(32, 32) == pytest.approx(3.3)  # 0.2 * 16 + 0.1 ~ Horowitz int32 mult 3.1 + add 0.1
    assert mac_energy_pj(32, 32, integer=False) == pytest.approx(4.6)
