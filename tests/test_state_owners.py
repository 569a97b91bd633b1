"""Process-wide state lives in named owner objects, each with a ``clear()`` that really forgets it:
the fused-pass compilations, the per-thread GEMM scratch buffers, the kernel launch counts, the
dataflow fallback log and the classes made for transformers' Conv1D."""

import threading

import pytest
import torch

from inttrain.autograd.qactivation import FALLBACKS, fallback_ops_seen
from inttrain.kernels import int_kernel_calls, reset_kernel_calls
from inttrain.kernels.counters import KERNEL_CALLS, count
from inttrain.kernels.fused import FUSION, _quantize_matrix_impl, quantize_matrix
from inttrain.kernels.workspace import WORKSPACE, scratch
from inttrain.nn.hf_conv1d import QCONV1D_CLASSES, qconv1d_class
from inttrain.spec import PER_ROW, QuantSpec


def test_fusion_compiles_once_per_specialisation_and_clear_forgets(monkeypatch):
    monkeypatch.setenv("INTTRAIN_COMPILE", "1")
    spec = QuantSpec(granularity=PER_ROW)
    constants = {"spec": spec, "kept_axis": 0, "transpose": False, "zero_point": 0}
    first = FUSION.compiled(_quantize_matrix_impl, constants)
    assert FUSION.compiled(_quantize_matrix_impl, constants) is first
    assert FUSION.compiled(_quantize_matrix_impl, {**constants, "kept_axis": 1}) is not first
    FUSION.failed = True
    assert not FUSION.enabled()
    FUSION.clear()
    assert FUSION.enabled() and not FUSION.failed
    again = FUSION.compiled(_quantize_matrix_impl, constants)
    assert again is not first
    x = torch.randn(9, 7)
    q, s = quantize_matrix(x, spec, 0)
    qe, se = _quantize_matrix_impl(x, torch.tensor(0), spec, 0, False, 0)
    assert torch.equal(q, qe) and torch.equal(s, se)


def test_workspace_buffers_are_per_shape_per_thread_and_cleared():
    cpu = torch.device("cpu")
    a = scratch((3, 4), torch.int32, cpu)
    assert scratch((3, 4), torch.int32, cpu) is a
    assert scratch((4, 3), torch.int32, cpu) is not a
    other: list[torch.Tensor] = []
    t = threading.Thread(target=lambda: other.append(scratch((3, 4), torch.int32, cpu)))
    t.start()
    t.join()
    assert other[0] is not a  # another thread never gets this thread's buffer
    WORKSPACE.clear()
    assert WORKSPACE.buffers == {}
    assert scratch((3, 4), torch.int32, cpu) is not a


def test_kernel_calls_count_and_reset():
    reset_kernel_calls()
    count("probe")
    count("probe", 2)
    assert int_kernel_calls() == {"probe": 3} == dict(KERNEL_CALLS)
    reset_kernel_calls()
    assert int_kernel_calls() == {}


def test_fallback_log_notes_once_and_clears(caplog):
    FALLBACKS.clear()
    with caplog.at_level("INFO", logger="inttrain"):
        FALLBACKS.note("aten.probe.default")
        FALLBACKS.note("aten.probe.default")
    assert fallback_ops_seen() == {"aten.probe.default"}
    assert sum("aten.probe.default" in r.getMessage() for r in caplog.records) == 1
    FALLBACKS.clear()
    assert fallback_ops_seen() == set()


def test_conv1d_classes_made_once_and_cleared():
    pytorch_utils = pytest.importorskip("transformers.pytorch_utils")
    cls = qconv1d_class(pytorch_utils.Conv1D)
    assert qconv1d_class(pytorch_utils.Conv1D) is cls and issubclass(cls, pytorch_utils.Conv1D)
    QCONV1D_CLASSES.clear()
    fresh = qconv1d_class(pytorch_utils.Conv1D)
    assert fresh is not cls and fresh.__name__ == "QConv1D"
