"""docs/integer-training.md states constants and examples; keep them in sync with the engine."""

from pathlib import Path

import numpy as np

from inttrain.micro.layers import MAX_K
from inttrain.micro.loss import EXP2_LUT, LOG2E_Q8
from inttrain.micro.ops import shift_round

DOC = (Path(__file__).resolve().parents[2] / "docs" / "integer-training.md").read_text()


def test_constants_in_docs():
    assert f"`LOG2E_Q8 = {LOG2E_Q8}`" in DOC
    assert f"sum of all 256 entries `{int(EXP2_LUT.sum())}`" in DOC
    assert f"`EXP2_LUT[128] = {EXP2_LUT[128]}`" in DOC and f"`EXP2_LUT[255] = {EXP2_LUT[255]}`" in DOC
    assert f"`K <= {MAX_K}`" in DOC and MAX_K == (2**31 - 1) // 16129


def test_pstoch_example_in_docs():
    assert "`x = 0b1011_0110`" in DOC
    assert shift_round(np.array([0b1011_0110]), 4, "pstoch").tolist() == [0b1011]


def test_readme_example_description_trains():
    import json
    import re

    from inttrain.micro import SGD, Sequential, train_epoch

    block = re.search(r"```json\n(.*?)```", DOC, re.S).group(1)
    m = Sequential.from_description(json.loads(block))
    x = np.random.default_rng(0).integers(-127, 128, size=(64, 64)).astype(np.int8)
    train_epoch(m, SGD(m.params(), 6), x, -7, np.arange(64) % 10, 32)


def test_residual_add_example_in_docs():
    from inttrain.micro import IntTensor, add_aligned

    assert "`A = [100, -3, 127]` at `-5`, `B = [64, 7, 127]` at `-3`" in DOC and "`[44, 3, 80]` at exponent `-2`" in DOC
    out = add_aligned(IntTensor(np.array([100, -3, 127], np.int8), -5), IntTensor(np.array([64, 7, 127], np.int8), -3))
    assert out.q.tolist() == [44, 3, 80] and out.exp == -2
    assert "`M <= 132104`" in DOC
