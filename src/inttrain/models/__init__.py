"""Model zoo: ``build_model(name, ...)`` for the architectures the benchmarks use.

All models are plain ``torch.nn`` modules built from ``nn.Linear`` / ``nn.Conv2d``
so that ``inttrain.prepare_(model, "int8")`` can swap every GEMM layer.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from .gpt import GPT, GPTConfig, gpt_small
from .lenet import LeNet5
from .mlp import MLP
from .mobilenet import MobileNetV2
from .resnet import RESNET_DEPTHS, CifarResNet
from .small_cnn import SmallCNN
from .vgg import VGGSmall

__all__ = [
    "MODEL_NAMES",
    "build_model",
    "MLP",
    "LeNet5",
    "SmallCNN",
    "CifarResNet",
    "VGGSmall",
    "MobileNetV2",
    "GPT",
    "GPTConfig",
    "gpt_small",
]

# name -> factory(num_classes, in_channels, image_size, **overrides)
_Factory = Callable[..., nn.Module]


def _mlp(num_classes: int, in_channels: int, image_size: int, **kw: object) -> nn.Module:
    return MLP(in_channels * image_size * image_size, num_classes, **kw)  # type: ignore[arg-type]


def _resnet(depth: int) -> _Factory:
    def build(num_classes: int, in_channels: int, image_size: int, **kw: object) -> nn.Module:
        return CifarResNet(depth, num_classes, in_channels, **kw)  # type: ignore[arg-type]

    return build


def _gpt(num_classes: int, in_channels: int, image_size: int, **kw: object) -> nn.Module:
    # For the language model the registry's arguments are reinterpreted:
    # num_classes is the vocabulary size and image_size the context length.
    return gpt_small(vocab_size=num_classes, seq_len=image_size, **kw)


_REGISTRY: dict[str, _Factory] = {
    "mlp": _mlp,
    "lenet5": lambda n, c, s, **kw: LeNet5(n, c, s, **kw),
    "small-cnn": lambda n, c, s, **kw: SmallCNN(n, c, s, **kw),
    **{name: _resnet(depth) for name, depth in RESNET_DEPTHS.items()},
    "vgg-small": lambda n, c, s, **kw: VGGSmall(n, c, s, **kw),
    # Global pooling: any image size works (stride-1 stem, tuned for 32x32).
    "mobilenetv2": lambda n, c, s, **kw: MobileNetV2(n, c, **kw),
    "gpt-small": _gpt,
}

#: Names accepted by :func:`build_model`.
MODEL_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def build_model(name: str, num_classes: int, in_channels: int, image_size: int, **overrides: object) -> nn.Module:
    """Build model ``name`` for inputs [N, in_channels, image_size, image_size].

    ``overrides`` are passed to the model's constructor (e.g. ``widths=(256,)``
    for ``mlp``, ``width_mult=0.5`` for ``mobilenetv2``, ``d_model=128`` for ``gpt-small``). For ``gpt-small``,
    ``num_classes`` is the vocabulary size and ``image_size`` the sequence length.
    Raises ValueError for an unknown name, listing the allowed ones.
    """
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODEL_NAMES)}") from None
    if num_classes < 1 or in_channels < 1 or image_size < 1:
        raise ValueError(
            f"{name}: num_classes, in_channels and image_size must be >= 1, got "
            f"{num_classes}, {in_channels}, {image_size}"
        )
    return factory(num_classes, in_channels, image_size, **overrides)
