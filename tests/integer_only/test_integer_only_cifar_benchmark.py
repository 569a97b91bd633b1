"""benchmarks/integer_only_cifar.py: a tiny end-to-end run on generated CIFAR-shaped data (the real run needs
../shared data and ~35 minutes), and the integer twin starts from the fp32 model's weights."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "integer_only_cifar.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("integer_only_cifar_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


def test_integer_twin_has_the_fp32_initial_weights(bench):
    from inttrain.recipes.integer_only import IntegerOnlyConfig, float_to_codes

    torch.manual_seed(0)
    f = bench.build_float(4)
    m = bench.to_integer(f, IntegerOnlyConfig())
    types = [s["type"] for s in m.desc["layers"]]
    assert types.count("batchnorm") == 5 and types[-1] == "linear"
    weights = [mod.weight for mod in f if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear))]
    ints = [p for n, p in m.named_params() if n.endswith(".weight")]
    assert len(weights) == len(ints) == 6
    for w, p in zip(weights, ints):
        codes, exp = float_to_codes(w.detach().double().numpy(), 16)
        assert p.exp == exp and np.array_equal(p.acc.numpy(), codes)


def test_tiny_run_writes_the_table(bench, tmp_path, capsys):
    rng = np.random.default_rng(0)
    data = tmp_path / "c.npz"
    np.savez(data, x=rng.integers(0, 256, size=(32, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, size=32))
    out = tmp_path / "out"
    assert bench.main(["--data", str(data), "--out", str(out), "--train", "16", "--val", "16", "--epochs", "1",
                       "--batch", "16", "--width", "4", "--backward-rounding", "rne"]) == 0
    md = (out / "results.md").read_text()
    assert "| 1 | " in md and "Final (epoch 1): integer-only" in md and "rounding rne/rne/pstoch" in md
    res = json.loads((out / "results.json").read_text())
    assert set(res["epochs"][0]) == {"epoch", "int", "fp32"} and 0 <= res["epochs"][0]["int"]["val_acc"] <= 1
    with pytest.raises(SystemExit, match="--train"):
        bench.main(["--data", str(data), "--out", str(out), "--train", "24", "--val", "16"])
