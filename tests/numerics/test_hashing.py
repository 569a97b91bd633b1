"""Seed mixing and derivation: the tensor forms used by compiled steps equal the Python forms bit for bit, the
salts are frozen, and they are written nowhere but ``SeedPurpose``."""

import ast
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
import pytest
import torch

import inttrain
from inttrain.numerics.hashing import SeedPurpose, derive_seed, mix_seed, mix_seed_tensor, uniform_from_counter

parts = st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=5)


@given(parts)
def test_mix_seed_tensor_equals_python(values):
    expected = mix_seed(*values)
    assert int(mix_seed_tensor(*values)) == expected
    # any part may be a 0-d int64 tensor (the layer's call counter)
    mixed = [torch.tensor(v, dtype=torch.int64) if i % 2 else v for i, v in enumerate(values)]
    assert int(mix_seed_tensor(*mixed)) == expected


def test_derive_seed_values_are_frozen():
    """The salts feed every stochastic-rounding result: these exact values must never change."""
    assert derive_seed(0, SeedPurpose.RHS_OPERAND) == 0x5BD1E995
    assert derive_seed(12345, SeedPurpose.GRAD_HOOK) == 12345 ^ 0x2545F491
    assert derive_seed(3, SeedPurpose.SAMPLE_GROUP, 8) == mix_seed(3, 8, 0x5E9A) == 1990658517
    assert derive_seed(7, SeedPurpose.GATE_NOISE, 100, 2) == mix_seed(7, 100, 2, 0x6A7E) == 1833896214


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_derive_seed_on_a_seed_tensor_equals_python(seed):
    """A compiled step's 0-d seed tensor derives the same seed as the eager int."""
    for purpose in (SeedPurpose.RHS_OPERAND, SeedPurpose.GRAD_HOOK):
        assert int(derive_seed(torch.tensor(seed, dtype=torch.int64), purpose)) == derive_seed(seed, purpose)


def test_no_seed_salt_outside_the_hashing_module():
    """Seed salts live in ``SeedPurpose`` only: no ``x ^ 0x...`` or ``mix_seed(..., <literal>)`` elsewhere."""
    src = Path(inttrain.__file__).parent
    found = []
    for path in src.rglob("*.py"):
        if path == src / "numerics" / "hashing.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            salted = isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor) and any(
                isinstance(v, ast.Constant) and isinstance(v.value, int) for v in (node.left, node.right))
            salted |= isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("mix_seed", "mix_seed_tensor") \
                and any(isinstance(a, ast.Constant) for a in node.args)
            if salted:
                found.append(f"{path.relative_to(src)}:{node.lineno}")
    assert found == []


def _int64_lanes(n: int, seed: int) -> torch.Tensor:
    """The hash as the compiled / non-CPU path computes it: int64 lanes masked to 32 bits."""
    from inttrain.numerics.hashing import _uniform_int64

    return _uniform_int64(n, seed)


@pytest.mark.parametrize("n", [1, 7, (1 << 16) - 1, 1 << 16, (1 << 16) + 1, 200_003])
@pytest.mark.parametrize("seed", [0, 12345, 0xFFFFFFFF, (1 << 40) + 9])
def test_eager_uniforms_equal_the_int64_lanes(n: int, seed: int) -> None:
    """Eager CPU calls hash in NumPy's uint32 lanes, chunk by chunk: the same bits as the int64 emulation that
    compiled graphs and other devices run, at every chunk boundary and for seeds past 32 bits."""
    got = uniform_from_counter((n,), seed)
    assert got.dtype == torch.float32 and torch.equal(got, _int64_lanes(n, seed))
    assert torch.equal(uniform_from_counter((n,), torch.tensor(seed, dtype=torch.int64)), got)


def test_eager_uniforms_keep_the_requested_shape() -> None:
    u = uniform_from_counter((3, 5, 7), 99)
    assert u.shape == (3, 5, 7) and torch.equal(u.reshape(-1), _int64_lanes(105, 99))
    assert uniform_from_counter((0, 4), 1).shape == (0, 4)


@pytest.mark.parametrize("seed", [0, 12345, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, (1 << 40) + 9])
def test_int32_lanes_equal_the_int64_lanes(seed: int) -> None:
    """Compiled CPU graphs hash in wrapping int32 lanes: the same bits as the int64 emulation, for seeds past 31
    and 32 bits (as Python ints and as the 0-d int64 seed tensors compiled steps carry), eager and compiled."""
    from inttrain.numerics.hashing import _uniform_int32

    n = 100_003
    want = _int64_lanes(n, seed)
    assert torch.equal(_uniform_int32(n, seed), want)
    assert torch.equal(_uniform_int32(n, torch.tensor(seed, dtype=torch.int64)), want)
    compiled = torch.compile(lambda s: uniform_from_counter((n,), s), fullgraph=True, dynamic=False)
    assert torch.equal(compiled(torch.tensor(seed, dtype=torch.int64)), want)
