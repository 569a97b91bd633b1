"""transformers' GPT-2 Conv1D is converted by prepare_ and runs the same integer GEMMs as QLinear."""

import pickle

import pytest
import torch

import inttrain
from inttrain.kernels import int_kernel_calls, reset_kernel_calls

pytorch_utils = pytest.importorskip("transformers.pytorch_utils")
Conv1D = pytorch_utils.Conv1D


def test_conv1d_matches_qlinear_on_the_transposed_weight_bit_for_bit():
    torch.manual_seed(0)
    conv, lin = Conv1D(6, 5), torch.nn.Linear(5, 6)
    with torch.no_grad():
        lin.weight.copy_(conv.weight.t())
        lin.bias.copy_(conv.bias)
    key_shapes = {k: v.shape for k, v in conv.state_dict().items()}
    inttrain.prepare_(conv, "int8")
    inttrain.prepare_(lin, "int8")
    assert isinstance(conv, Conv1D) and type(conv).__name__ == "QConv1D"
    assert {k: v.shape for k, v in conv.state_dict().items()} == key_shapes  # same keys, weight still [in, out]
    x = torch.randn(3, 4, 5, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    reset_kernel_calls()
    y = conv(x)
    assert int_kernel_calls()["int8_mm"] == 1
    y2 = lin(x2)
    assert torch.equal(y, y2)
    y.pow(2).sum().backward()
    y2.pow(2).sum().backward()
    assert torch.equal(x.grad, x2.grad)
    assert torch.equal(conv.weight.grad, lin.weight.grad.t()) and torch.equal(conv.bias.grad, lin.bias.grad)


def test_conv1d_restores_and_pickles():
    conv = inttrain.prepare_(Conv1D(4, 3), "int8")
    back = pickle.loads(pickle.dumps(conv))
    assert type(back) is type(conv) and torch.equal(back.weight, conv.weight)
    inttrain.restore_(conv)
    assert type(conv) is Conv1D and inttrain.conversion_report(conv).converted == {}
