"""Seed mixing: the tensor form used by compiled steps equals the Python form bit for bit."""

from hypothesis import given
from hypothesis import strategies as st
import torch

from inttrain.numerics.hashing import mix_seed, mix_seed_tensor

parts = st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=5)


@given(parts)
def test_mix_seed_tensor_equals_python(values):
    expected = mix_seed(*values)
    assert int(mix_seed_tensor(*values)) == expected
    # any part may be a 0-d int64 tensor (the layer's call counter)
    mixed = [torch.tensor(v, dtype=torch.int64) if i % 2 else v for i, v in enumerate(values)]
    assert int(mix_seed_tensor(*mixed)) == expected
