"""benchmarks/integer_only_precision.py on a small residual batch-norm model: view SQNRs, step sizes, batch norms."""

from __future__ import annotations

import numpy as np

from inttrain.micro import Sequential
from inttrain.micro.model import save_model
from micro_model_utils import RESIDUAL_BN

SCRIPT = "integer_only_precision"
DESC = RESIDUAL_BN


def test_fresh_weights_gain_12_db_from_their_own_shift_and_late_steps_are_smaller(bench, tmp_path, capsys) -> None:
    model = Sequential.from_description(DESC)
    for name, p in model.named_params():
        r = bench.view_report(p)
        assert r["tensor"] >= r["fixed"] - 0.1 and r["channel"] >= r["tensor"] - 0.1, (name, r)
        if p.role == "weight":       # fresh codes reach ~8191: the fixed view uses 5 bits, the tensor's own 7
            assert r["max_view"] <= 32 and r["tensor"] > r["fixed"] + 9, (name, r)
    rng = np.random.default_rng(0)
    x, y = rng.integers(-127, 128, size=(32, 3, 8, 8)).astype(np.int8), rng.integers(0, 4, 32)
    r = bench.batch_report(model, x, -5, y, {"epochs": 30, "lr_bits": 10, "bn_lr_bits": 9}, [10, 20, 29])
    assert len(r["bn_output_sqnr"]) == 3 and all(v > 15 for v in r["bn_output_sqnr"]), r
    below = [r["steps"][e]["below_1"] for e in (10, 20, 29)]
    assert below == sorted(below) and below[-1] > below[0], below     # the cosine's smaller steps
    save_model(model, tmp_path / "m")
    np.savez(tmp_path / "d.npz", x=x, x_exp=np.int64(-5), y=y)
    assert bench.main([str(tmp_path / "m"), str(tmp_path / "d.npz"), "--batch-size", "16"]) == 0
    out = capsys.readouterr().out
    assert "weight view fixed" in out and "layers.0.weight" in out and "epoch 28: multiplier" in out
    assert "batch-norm output SQNR dB:" in out
