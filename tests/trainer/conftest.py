"""Fixtures shared by the trainer tests."""

import pytest

from inttrain.data import DatasetSplits, load_dataset


@pytest.fixture(scope="module")
def digits() -> DatasetSplits:
    return load_dataset("digits")
