"""The int8 recipe trains to fp32's accuracy on real data (scikit-learn digits), same seed and budget."""

import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import inttrain
from inttrain.kernels import int_kernel_calls, reset_kernel_calls

MAX_GAP_POINTS = 1.0  # issue bar: int8 within 1 accuracy point of fp32


def _digits(image: bool):
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    x = (x - x.mean()) / x.std()
    y = torch.tensor(d.target)
    if image:
        x = x.reshape(-1, 1, 8, 8)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    return (x[:1437], y[:1437]), (x[1437:], y[1437:])  # 80 / 20 split


def _mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def _cnn():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * 16, 10),
    )


def _train(make_model, recipe: str, image: bool, epochs: int, lr: float) -> float:
    (xtr, ytr), (xva, yva) = _digits(image)
    torch.manual_seed(0)
    model = make_model()
    inttrain.prepare_(model, recipe)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    order = torch.Generator().manual_seed(1)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(ytr), generator=order).split(32):
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        return 100.0 * float((model(xva).argmax(1) == yva).float().mean())


@pytest.mark.parametrize("name,make_model,image,epochs,lr", [
    ("mlp", _mlp, False, 8, 0.05),
    ("cnn", _cnn, True, 6, 0.05),
])
def test_int8_matches_fp32_accuracy_on_digits(name, make_model, image, epochs, lr):
    fp32 = _train(make_model, "fp32", image, epochs, lr)
    reset_kernel_calls()
    int8 = _train(make_model, "int8", image, epochs, lr)
    calls = int_kernel_calls()
    assert sum(calls.values()) > 0, "integer kernels never ran"
    assert fp32 > 94.0, f"fp32 baseline too weak to compare against: {fp32:.2f}%"
    assert int8 >= fp32 - MAX_GAP_POINTS, f"{name}: int8 {int8:.2f}% vs fp32 {fp32:.2f}% (gap > {MAX_GAP_POINTS})"
