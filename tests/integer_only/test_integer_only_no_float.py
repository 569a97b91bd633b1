"""A training step of inttrain.integer_only never creates a floating-point tensor."""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from inttrain import integer_only as T
from inttrain.kernels import int_kernel_calls, reset_kernel_calls

MLP = {"input_shape": [64], "layers": [
    {"type": "linear", "in_features": 64, "out_features": 32}, {"type": "relu"},
    {"type": "linear", "in_features": 32, "out_features": 10}]}
CNN = {"input_shape": [1, 8, 8], "layers": [
    {"type": "conv2d", "in_channels": 1, "out_channels": 4, "kernel_size": 3, "stride": 2, "padding": 1},
    {"type": "relu"}, {"type": "conv2d", "in_channels": 4, "out_channels": 4, "kernel_size": 3, "padding": 1},
    {"type": "relu"}, {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"},
    {"type": "linear", "in_features": 16, "out_features": 10}]}


class DtypeRecorder(TorchDispatchMode):
    """Records (op, dtype) of every tensor every aten op returns."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.seen.append((str(func), t.dtype))
        return out


@pytest.mark.parametrize("desc,bits,momentum", [(MLP, 16, None), (MLP, 8, 2), (CNN, 16, 3)])
def test_training_step_creates_only_integer_tensors(desc, bits, momentum):
    model = T.Sequential.from_description({**desc, "weight_bits": bits})
    opt = T.SGD(model.params(), 5, momentum)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.integers(0, 128, size=(8, *desc["input_shape"])).astype(np.int8))
    y = torch.from_numpy(rng.integers(0, 10, size=8))
    T.train_step(model, opt, T.IntTensor(x, -7), y)          # warm-up (lazy buffers, LUT placement)
    rec = DtypeRecorder()
    reset_kernel_calls()
    with rec:
        T.train_step(model, opt, T.IntTensor(x, -7), y)
        T.train_step(model, opt, T.IntTensor(x, -7), y)
    assert len(rec.seen) > 50
    bad = [(op, dt) for op, dt in rec.seen if dt.is_floating_point or dt.is_complex]
    assert not bad, bad[:10]
    dtypes = {dt for _, dt in rec.seen}
    assert dtypes <= {torch.int8, torch.int16, torch.int32, torch.int64, torch.bool}, dtypes
    # the GEMMs are the integer kernel: torch._int_mm, or the native AMX GEMM (no aten op) where the CPU has AMX
    assert int_kernel_calls().get("int8_mm", 0) > 0


def test_recorder_catches_floats():
    rec = DtypeRecorder()
    with rec:
        torch.ones(3, dtype=torch.int8).to(torch.float32)
    assert any(dt.is_floating_point for _, dt in rec.seen)
