"""The one integer engine runs on two array namespaces: NumpyOps (micro) and TorchOps (integer_only).
Both must offer every primitive, agree value for value, and the torch engine's shared layers must be micro's."""

import numpy as np
import pytest
import torch

from inttrain import integer_only as T
from inttrain import micro as M
from inttrain.integer_only.ops import DEVICE_TABLES, TorchOps
from inttrain.micro import layers as ML
from inttrain.micro.loss import EXP2_LUT
from inttrain.micro.ops import NumpyOps


def _names(ns: type) -> set[str]:
    return {n for n in vars(ns) if not n.startswith("_")}


def test_both_namespaces_offer_the_same_primitives():
    assert _names(NumpyOps) == _names(TorchOps)
    # the arithmetic every shared layer is written in (the full set is whatever both offer, equally)
    assert {"shift_round", "shift", "requantize", "saturate", "rdiv", "bitlen", "amax", "sum", "where", "wide",
            "weight_grad", "check_int32", "table"} <= _names(NumpyOps)


def test_shared_layers_are_micros_code_on_torch():
    for torch_cls, micro_cls in ((T.BatchNorm, ML.BatchNorm), (T.Residual, ML.Residual),
                                 (T.AvgPool2d, ML.AvgPool2d), (T.Flatten, ML.Flatten), (T.Sequential, ML.SequentialCore)):
        assert issubclass(torch_cls, micro_cls), torch_cls
        for method in ("forward", "backward"):
            assert getattr(torch_cls, method) is getattr(micro_cls, method), (torch_cls, method)
    assert T.Linear.OPS is TorchOps and M.Linear.OPS is NumpyOps


@pytest.mark.parametrize("name,args", [
    ("rdiv", ([-7, -6, -5, 5, 6, 7, 1000], 4)), ("bitlen", ([0, 1, 2, 3, 255, 256, 1023],)),
    ("amax", ([[3, -9, 4], [0, 2, -1]], 1)), ("amin", ([[3, -9, 4], [0, 2, -1]], 1)),
    ("sum", ([[3, -9, 4], [0, 2, -1]], 1))
])
def test_primitives_agree(name, args):
    a = np.array(args[0], dtype=np.int64)
    got_np = getattr(NumpyOps, name)(a, *args[1:])
    got_t = getattr(TorchOps, name)(torch.from_numpy(a), *args[1:])
    assert np.array_equal(np.asarray(got_np), got_t.numpy()) and got_t.dtype == torch.int64


def test_device_tables_copy_once_per_device_and_clear():
    DEVICE_TABLES.clear()
    like = torch.zeros(3, dtype=torch.int64)
    first = TorchOps.table(EXP2_LUT, like)
    assert TorchOps.table(EXP2_LUT, like) is first and np.array_equal(first.numpy(), EXP2_LUT)
    assert NumpyOps.table(EXP2_LUT, np.zeros(3)) is EXP2_LUT
    DEVICE_TABLES.clear()
    assert TorchOps.table(EXP2_LUT, like) is not first
