"""prepare_ makes its float fallback visible: one FloatFallbackWarning per layer, and a summary table."""

import logging
import warnings

import pytest
import torch
from torch import nn

import inttrain


def _mixed_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Conv1d(8, 8, 1), nn.LSTM(8, 8), nn.Linear(8, 8), nn.Linear(8, 2))


def test_each_unsupported_layer_warns_once_with_its_reason():
    model = _mixed_model()
    with pytest.warns(inttrain.FloatFallbackWarning) as record:
        inttrain.prepare_(model, "int8")
    assert [str(w.message) for w in record] == [
        "inttrain: 1 (Conv1d) stays in float: no integer kernel for Conv1d (integer convolutions: Conv2d only)",
        "inttrain: 2 (LSTM) stays in float: LSTM: its GEMMs run inside torch's fused recurrent kernel",
    ]
    assert all(w.filename == __file__ for w in record)  # the warning points at the caller's line


def test_layers_left_in_float_on_purpose_do_not_warn():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inttrain.prepare_(model, "int8", filter_fn=lambda m, fqn: fqn != "2")
    assert inttrain.conversion_report(model).left_in_float == [("2", "Linear", "excluded by filter_fn or the recipe")]


def test_summary_table_counts_per_type(caplog):
    model = _mixed_model()
    with caplog.at_level(logging.INFO, logger="inttrain"), pytest.warns(inttrain.FloatFallbackWarning):
        inttrain.prepare_(model, "int8")
    report = inttrain.conversion_report(model)
    assert report.converted == {"Linear": 3} and report.num_converted == 3
    assert report.table().splitlines()[:5] == [
        "layer type  integer  float",
        "Linear            3      0",
        "Conv1d            0      1",
        "LSTM              0      1",
        "total             3      2",
    ]
    assert report.table() in caplog.text  # prepare_ logs the same table
    inttrain.restore_(model)
    assert inttrain.conversion_report(model).num_converted == 0
