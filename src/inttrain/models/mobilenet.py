"""MobileNetV2 (Sandler et al. 2018), CIFAR variant: ``mobilenetv2``.

Inverted residual blocks: 1x1 expansion -> depthwise 3x3 -> 1x1 linear
projection, each followed by BatchNorm, ReLU6 after the first two only (the
projection is linear: a ReLU on the narrow bottleneck would destroy
information, section 3.2 of the paper). For 32x32 inputs the stem has stride 1
and the second stage too (as in the common CIFAR ports), so the feature map is
4x4 rather than 1x1 before pooling. Every GEMM, the depthwise convs included
(``groups == channels``), is an ``nn.Conv2d`` / ``nn.Linear`` so
``inttrain.prepare_`` moves all of them onto the integer path.
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["InvertedResidual", "MobileNetV2", "MOBILENETV2_CIFAR_SETTINGS"]

#: (expansion t, output channels c, repeats n, first stride s) per stage; the
#: ImageNet table with stage 2's stride reduced to 1 for 32x32 images.
MOBILENETV2_CIFAR_SETTINGS: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 1),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def _scaled(channels: int, width_mult: float, divisor: int = 8) -> int:
    """Channels scaled by ``width_mult``, rounded to a multiple of ``divisor`` (never below 90% of the target)."""
    target = channels * width_mult
    rounded = max(divisor, int(target + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * target else rounded


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, relu6: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if relu6:
        layers.append(nn.ReLU6())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """Expand (1x1) -> depthwise 3x3 -> project (1x1, linear); identity shortcut when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expansion: int) -> None:
        super().__init__()
        hidden = cin * expansion
        layers: list[nn.Module] = []
        if expansion != 1:  # t = 1: the depthwise conv works on the input directly
            layers.append(_conv_bn(cin, hidden, 1))
        layers.append(_conv_bn(hidden, hidden, 3, stride=stride, groups=hidden))
        layers.append(_conv_bn(hidden, cout, 1, relu6=False))
        self.block = nn.Sequential(*layers)
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        out = self.block(x)
        return x + out if self.use_residual else out


class MobileNetV2(nn.Module):
    """Images [N, in_channels, H, W] -> logits [N, num_classes]; ``width_mult`` scales every stage."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, width_mult: float = 1.0, dropout: float = 0.0) -> None:
        super().__init__()
        if not width_mult > 0:
            raise ValueError(f"mobilenetv2: width_mult must be > 0, got {width_mult}")
        stem = _scaled(32, width_mult)
        last = _scaled(1280, max(1.0, width_mult))  # the paper keeps the head wide for width < 1
        layers: list[nn.Module] = [_conv_bn(in_channels, stem, 3, stride=1)]
        cin = stem
        for t, c, n, s in MOBILENETV2_CIFAR_SETTINGS:
            cout = _scaled(c, width_mult)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        layers.append(_conv_bn(cin, last, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)  # any input size
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(last, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.dropout(self.pool(self.features(x)).flatten(1)))
