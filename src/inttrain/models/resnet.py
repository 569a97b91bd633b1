"""CIFAR-style ResNets (He et al. 2016, section 4.2): resnet20/32/56.

Three stages of ``n`` basic blocks with 16/32/64 channels; depth = 6n + 2.
Shortcuts that change shape use a 1x1 conv + BN (option B) instead of the
paper's zero-padding (option A) so that every GEMM in the network is an
``nn.Conv2d`` (or the final ``nn.Linear``) and runs on the integer path.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["BasicBlock", "CifarResNet", "RESNET_DEPTHS"]

#: Model name -> depth (6n + 2).
RESNET_DEPTHS: dict[str, int] = {"resnet20": 20, "resnet32": 32, "resnet56": 56}


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )
        # A module (not F.relu), so that prepare_ can give compiled graphs its int8-mask ReLU.
        self.relu = nn.ReLU()

    def residual_parts(self) -> tuple[list[nn.Module], list[nn.Module], list[nn.Module]]:
        """(block, shortcut, after): ``forward(x) = after(block(x) + shortcut(x))``, each a list of modules run in
        order (an empty shortcut is the identity).  Converters that rebuild the block read it from here
        (``inttrain.recipes.integer_only.convert``)."""
        shortcut = list(self.shortcut) if isinstance(self.shortcut, nn.Sequential) else []
        return [self.conv1, self.bn1, self.relu, self.conv2, self.bn2], shortcut, [self.relu]

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    def __init__(self, depth: int, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(f"resnet: depth must be 6n+2 with n >= 1, got {depth}")
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        stages: list[nn.Module] = []
        in_planes = 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = []
            for i in range(n):
                blocks.append(BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        # Global average pooling makes the head independent of the input size.
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)
        self.relu = nn.ReLU()
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def as_sequential(self) -> nn.Sequential:
        """The same modules (shared, not copied) as one ``nn.Sequential`` that computes ``forward``: stem, the
        basic blocks, global pooling, flatten, classifier."""
        return nn.Sequential(self.conv1, self.bn1, self.relu, *self.layer1, *self.layer2, *self.layer3, self.pool,
                             nn.Flatten(), self.fc)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return self.fc(self.pool(out).flatten(1))
