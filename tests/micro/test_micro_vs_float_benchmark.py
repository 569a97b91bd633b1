"""benchmarks/micro_vs_float.py: a tiny digits run (the real runs need ../shared data and hours), its float32
twin's starting point, and resuming an interrupted benchmark."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from micro_utils import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "micro_vs_float.py"


@pytest.fixture(scope="module")
def bench():
    yield load_script(BENCH, "micro_vs_float_bench")
    sys.modules.pop("micro_vs_float_bench", None)


def test_float_twin_starts_from_micro_weights_and_agrees(bench):
    import torch

    from inttrain.micro import IntTensor, Sequential

    model = Sequential.from_description({**bench.DIGITS_CNN, "seed": 3})
    net = bench.float_twin(model)
    convs = [m for m in net if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    for m, p in zip(convs, model.params()):
        assert torch.equal(m.weight.detach().double(), torch.from_numpy(p.acc.astype(np.float64) * 2.0 ** p.exp))
        assert m.weight.exp0 == p.exp0
    x = np.random.default_rng(0).integers(0, 128, size=(16, 1, 8, 8)).astype(np.int8)
    zi = model.forward(IntTensor(x, -7)).to_float()
    with torch.no_grad():
        zf = net(torch.from_numpy(x.astype(np.float32) * 2.0 ** -7)).double().numpy()
    assert (zi * zf).sum() / np.linalg.norm(zi) / np.linalg.norm(zf) > 0.99      # the same network


def test_smoke_run_appends_results_and_resumes(bench, tmp_path, capsys):
    args = ["--out", str(tmp_path), "--epochs", "2", "--seeds", "0", "--only", "digits-mlp", "--limit", "128"]
    assert bench.main([*args, "--max-seconds", "0"]) == 0       # stops micro after its first step
    ck = json.loads((tmp_path / "runs" / "digits-mlp-s0-micro" / "checkpoint.json").read_text())
    assert ck["global_step"] == 1 and not (tmp_path / "results.jsonl").exists()
    assert bench.main(args) == 0                                 # resumes micro, then runs float32
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["engine"], len(r["history"])) for r in rows] == [("micro", 2), ("float32", 2)]
    assert all(0.0 <= h["val_acc"] <= 1.0 for r in rows for h in r["history"])
    table = (tmp_path / "results.md").read_text()
    assert "| digits-mlp | 0 | 2 |" in table
    assert bench.main(args) == 0                                 # everything done: nothing is appended
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2
