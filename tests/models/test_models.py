"""Every registered model builds, runs forward+backward on a tiny batch, and
has the expected output shape; unknown names fail with the allowed list."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inttrain.models import MODEL_NAMES, build_model

pytestmark = pytest.mark.usefixtures("one_thread")


# name -> (num_classes, in_channels, image_size) small enough to be fast
_IMAGE_CASES = {
    "mlp": (10, 1, 8),
    "lenet5": (10, 1, 28),
    "small-cnn": (10, 1, 8),
    "resnet20": (10, 3, 32),
    "resnet32": (10, 3, 16),
    "resnet56": (10, 3, 8),
    "vgg-small": (10, 3, 8),
    "mobilenetv2": (10, 3, 8),
}


def test_registry_covers_all_names() -> None:
    assert set(MODEL_NAMES) == set(_IMAGE_CASES) | {"gpt-small"}


@pytest.mark.parametrize("name", sorted(_IMAGE_CASES))
def test_image_model_forward_backward(name: str) -> None:
    torch.manual_seed(0)
    classes, channels, size = _IMAGE_CASES[name]
    model = build_model(name, classes, channels, size)
    x = torch.randn(2, channels, size, size)
    out = model(x)
    assert out.shape == (2, classes)
    out.sum().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


def test_lenet5_small_inputs() -> None:
    out = build_model("lenet5", 10, 1, 8)(torch.randn(3, 1, 8, 8))
    assert out.shape == (3, 10)


def test_mlp_widths_override() -> None:
    model = build_model("mlp", 10, 1, 28, widths=(1024, 1024, 1024))
    dims = [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)]
    assert dims == [(784, 1024), (1024, 1024), (1024, 1024), (1024, 10)]


def test_resnet_gemms_are_all_conv_or_linear() -> None:
    # Option-B shortcuts: no parameter-free padding shortcut, every GEMM a layer.
    model = build_model("resnet20", 10, 3, 32)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 1 + 18 + 2  # stem + 9 blocks x 2 + two 1x1 shortcuts


def test_gpt_small_forward_backward() -> None:
    torch.manual_seed(0)
    model = build_model("gpt-small", 65, 1, 16, d_model=32, n_layers=2, n_heads=4)
    idx = torch.randint(0, 65, (2, 16))
    logits = model(idx)
    assert logits.shape == (2, 16, 65)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten())
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    # Every projection is an nn.Linear: 4 per block + LM head.
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) == 2 * 4 + 1


def test_gpt_is_causal() -> None:
    torch.manual_seed(0)
    model = build_model("gpt-small", 16, 1, 8, d_model=16, n_layers=1, n_heads=2).eval()
    idx = torch.randint(0, 16, (1, 8))
    changed = idx.clone()
    changed[0, -1] = (idx[0, -1] + 1) % 16
    # Changing the last token must not affect earlier positions.
    torch.testing.assert_close(model(idx)[:, :-1], model(changed)[:, :-1])


def test_gpt_benchmark_config_defaults() -> None:
    model = build_model("gpt-small", 256, 1, 256)
    assert model.cfg.d_model == 512 and model.cfg.n_layers == 4 and model.cfg.seq_len == 256


def test_unknown_model_lists_allowed_names() -> None:
    with pytest.raises(ValueError) as exc:
        build_model("resnet18", 10, 3, 32)
    msg = str(exc.value)
    assert "resnet18" in msg
    for name in MODEL_NAMES:
        assert name in msg


def test_bad_sizes_rejected() -> None:
    with pytest.raises(ValueError, match="divisible"):
        build_model("gpt-small", 10, 1, 8, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="image_size"):
        build_model("vgg-small", 10, 3, 4)


@pytest.mark.parametrize("name", ["mlp", "lenet5", "small-cnn", "resnet20", "vgg-small", "gpt-small"])
def test_models_run_under_int8(name: str) -> None:
    """Every GEMM layer converts and the model still trains (forward + backward)."""
    import inttrain

    prepare = inttrain.prepare_
    torch.manual_seed(0)
    if name == "gpt-small":
        model = build_model(name, 32, 1, 8, d_model=32, n_layers=1, n_heads=2)
        x: torch.Tensor = torch.randint(0, 32, (2, 8))
    elif name == "mlp":
        model, x = build_model(name, 10, 1, 8, widths=(32, 32)), torch.randn(4, 1, 8, 8)
    else:
        model, x = build_model(name, 10, 1, 8), torch.randn(4, 1, 8, 8)
    prepare(model, "int8")
    out = model(x)
    out.float().sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_mobilenetv2_structure() -> None:
    model = build_model("mobilenetv2", 10, 3, 32)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    depthwise = [m for m in convs if m.groups > 1]
    # 17 inverted residual blocks, each with one depthwise 3x3 conv over all its channels.
    assert len(depthwise) == 17
    assert all(m.groups == m.in_channels == m.out_channels and m.kernel_size == (3, 3) for m in depthwise)
    assert convs[0].stride == (1, 1)  # CIFAR stem: no downsampling of 32x32 inputs
    assert sum(isinstance(m, nn.ReLU6) for m in model.modules()) == 1 + 2 * 17 - 1 + 1  # first block has no expansion
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == len(convs)
    assert model.classifier.in_features == 1280


def test_mobilenetv2_forward_backward_int8() -> None:
    """Forward/backward shapes in float, then the same after prepare_ with the int8 conv kernels counted."""
    import inttrain
    from inttrain.kernels import int_kernel_calls, reset_kernel_calls

    torch.manual_seed(0)
    model = build_model("mobilenetv2", 10, 3, 8, width_mult=0.25)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    out = model(x)
    assert out.shape == (2, 10)
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())

    inttrain.prepare_(model, "int8")
    model.zero_grad(set_to_none=True)
    reset_kernel_calls()
    out = model(x)
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    out.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    calls = int_kernel_calls()
    n_convs = sum(1 for m in model.modules() if type(m).__name__ == "QConv2d")
    assert n_convs == 1 + 17 * 3 - 1 + 1  # every conv converted, depthwise ones included
    assert calls.get("conv_fwd", 0) >= n_convs and calls.get("conv_wgrad", 0) >= n_convs, calls
