"""benchmarks/integer_only_grad_probe.py on a small residual batch-norm model: the float twin agrees with micro."""

from __future__ import annotations

import numpy as np

from inttrain.micro import Sequential
from inttrain.micro.model import save_model
from micro_model_utils import RESIDUAL_BN

SCRIPT = "integer_only_grad_probe"
DESC = RESIDUAL_BN


def test_float_twin_matches_micro_forward_and_gradient_directions(bench, tmp_path, capsys) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.integers(-127, 128, size=(64, 3, 8, 8)).astype(np.int8), rng.integers(0, 4, 64)
    model = Sequential.from_description(DESC)
    r = bench.probe(model, x, -5, y, batches=2, batch_size=32)
    loss = r["losses"]
    assert r["batches"] == 2 and abs(loss["integer"] - loss["float_int8_views"]) < 0.05, loss
    assert abs(loss["float_master"] - loss["float_int8_views"]) < 0.05, loss
    cos = r["cosines"]
    assert list(cos) == [n for n, _ in model.named_params()]
    assert cos["layers.7.weight"] > 0.95 and all(c > 0.5 for n, c in cos.items() if n.endswith("weight")), cos
    coarse = r["cosines_int8_gemm_errors"]          # int8 error operands, float in between: close to exact
    assert list(coarse) == list(cos) and all(c > 0.8 for c in coarse.values()), coarse
    own = r["cosines_own_forward"]                  # through micro's own forward: the last layer's is nearly exact
    assert list(own) == list(cos) and own["layers.7.weight"] > 0.95, own
    save_model(model, tmp_path / "m")
    np.savez(tmp_path / "d.npz", x=x, x_exp=np.int64(-5), y=y)
    assert bench.main([str(tmp_path / "m"), str(tmp_path / "d.npz"), "--batches", "1", "--batch-size", "16"]) == 0
    out = capsys.readouterr().out
    assert "training loss, integer" in out and "layers.0.weight" in out and "8-bit errors" in out
    assert bench.main([str(tmp_path / "m"), str(tmp_path / "d.npz"), "--batches", "1", "--error-bits", "16",
                       "--trace"]) == 0
    out = capsys.readouterr().out
    assert "16-bit errors" in out and "layers.3.block.4" in out and "BatchNorm" in out


def test_error_trace_follows_the_backward_and_16_bit_errors_stay_closer(bench) -> None:
    """The trace starts at the classifier (exact up to the loss gradient's rounding) and names every layer; with
    16-bit errors the first layer's error is at least as close to float autograd's as with 8-bit ones."""
    rng = np.random.default_rng(3)
    x, y = rng.integers(-127, 128, size=(32, 3, 8, 8)).astype(np.int8), rng.integers(0, 4, 32)
    first = {}
    for bits in (8, 16):
        rows = bench.error_trace(Sequential.from_description({**DESC, "error_bits": bits}), x, -5, y)
        names = [r[0] for r in rows]
        assert names[0] == "layers.7" and rows[0][2] > 0.999 and abs(rows[0][3] - 1) < 0.01, rows[0]
        assert "layers.3.block.4" in names and names[-1] == "layers.0" and len(rows) == 13
        first[bits] = rows[-1][2]
    assert first[16] > 0.99 and first[16] >= first[8] - 0.005, first



def test_forced_float_forward_reproduces_the_integer_forward_values(bench) -> None:
    """With every layer's output forced to micro's, the float twin's logits are micro's logits exactly, and
    gradients still flow to every parameter."""
    import torch

    from inttrain.micro.ops import IntTensor

    rng = np.random.default_rng(2)
    x = rng.integers(-127, 128, size=(16, 3, 8, 8)).astype(np.int8)
    model = Sequential.from_description(DESC)
    logits, values = bench.integer_forward_values(model, IntTensor(x, -5))
    assert len(values) == 13                        # every layer, residual block layers included
    weights = {id(p): bench.real_value(p, True).requires_grad_(True) for p in model.params()}
    out = bench.float_forward(model.layers, torch.tensor(x * 2.0 ** -5), weights, forced=values)
    assert torch.equal(out.detach(), torch.tensor(logits.q.astype(np.float64) * 2.0 ** logits.exp))
    out.sum().backward()
    assert all(w.grad is not None and bool(w.grad.abs().sum() > 0) for w in weights.values())
