"""Prepared models train on CUDA: eager int8 layers there compute what they compute on the CPU (same codes, so
gradients equal up to float summation order), and ``torch.compile(model, fullgraph=True)`` of the int8 and
int8 + dataflow models runs as one graph with no recompiles, the integer kernels counted inside it, the loss
falling.  Skipped where no CUDA device is present."""

import copy

import pytest
import torch
import torch.nn.functional as F

import inttrain
from inttrain.kernels import int_kernel_calls, reset_kernel_calls
from inttrain.models import build_model
from inttrain.numerics.metrics import sqnr_db

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

#: Eager CUDA and eager CPU make the same integer sums, but float order differs outside them (BatchNorm
#: statistics, softmax, the loss): a few codes flip and the flips cascade through deep BN networks (ResNet-20's
#: stem weight gradient: 9 dB between the two devices, seen on an H100).  So, as for compiled against eager
#: (tests/nn/test_compiled_training.py), the bound is against float32: CUDA int8 gradients must be as close to
#: fp32 as CPU int8 gradients are (mean SQNR over parameters, within this margin).
FP32_SQNR_MARGIN_DB = 3.0


def _model(name: str):
    torch.manual_seed(0)
    if name == "gpt":
        m = build_model("gpt-small", 65, 1, 32, d_model=64, n_layers=2, n_heads=4)
        return m, torch.randint(0, 65, (8, 32)), torch.randint(0, 65, (8, 32))
    if name == "resnet20":
        return build_model("resnet20", 10, 3, 32), torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    return build_model(name, 10, 1, 28), torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))


def _loss(model, x, y):
    out = model(x)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))


@pytest.mark.parametrize("dataflow", [False, True], ids=["int8", "int8-dataflow"])
@pytest.mark.parametrize("name", ["mlp", "small-cnn", "resnet20", "gpt"])
def test_eager_cuda_matches_cpu(name, dataflow):
    cpu, x, y = _model(name)
    fp32 = copy.deepcopy(cpu)
    _loss(fp32, x, y).backward()
    gpu = copy.deepcopy(cpu).cuda()
    inttrain.prepare_(cpu, "int8", dataflow=dataflow)
    inttrain.prepare_(gpu, "int8", dataflow=dataflow)
    reset_kernel_calls()
    loss_g = _loss(gpu, x.cuda(), y.cuda())
    loss_g.backward()
    assert sum(int_kernel_calls().values()) > 0
    loss_c = _loss(cpu, x, y)
    loss_c.backward()
    assert loss_g.item() == pytest.approx(loss_c.item(), rel=1e-3)
    refs = [p.grad for p in fp32.parameters()]
    on_cpu = _mean_sqnr(refs, [p.grad for p in cpu.parameters()])
    on_gpu = _mean_sqnr(refs, [p.grad.cpu() for p in gpu.parameters()])
    assert on_gpu > on_cpu - FP32_SQNR_MARGIN_DB


def _mean_sqnr(refs, grads) -> float:
    return sum(min(sqnr_db(r, g), 100.0) for r, g in zip(refs, grads)) / len(refs)


@pytest.mark.parametrize("dataflow", [False, True], ids=["int8", "int8-dataflow"])
@pytest.mark.parametrize("name", ["mlp", "small-cnn", "resnet20", "gpt"])
def test_fullgraph_compile_trains_on_cuda(name, dataflow):
    model, x, y = _model(name)
    model = inttrain.prepare_(model.cuda(), "int8", dataflow=dataflow)
    x, y = x.cuda(), y.cuda()
    run = torch.compile(model, fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    losses = []
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(6):
            reset_kernel_calls()
            loss = _loss(run, x, y)
            loss.backward()
            assert sum(int_kernel_calls().values()) > 0  # counted inside the compiled graph
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert all(map(torch.isfinite, map(torch.tensor, losses))) and losses[-1] < losses[0]
