"""VGG-small, the CIFAR baseline of the integer/low-bit training papers
(WAGE, LQ-Nets, ...): 2x128C3-MP2-2x256C3-MP2-2x512C3-MP2-FC1024-FC classes.

Each 3x3 conv is followed by BN and ReLU. ``hidden=None`` drops the FC1024
layer (the "or 10" variant: classifier straight from the conv features).
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["VGGSmall"]

_STAGES: tuple[tuple[int, int], ...] = ((128, 2), (256, 2), (512, 2))


# ReLUs are not in-place: the integer layers' outputs come from custom autograd
# Functions, which must not be modified in place; the memory saved here is tiny.
class VGGSmall(nn.Module):
    def __init__(
        self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32, hidden: int | None = 1024
    ) -> None:
        super().__init__()
        if image_size < 8:
            raise ValueError(f"vgg-small: image_size must be >= 8 (three 2x poolings), got {image_size}")
        layers: list[nn.Module] = []
        prev = in_channels
        for channels, repeats in _STAGES:
            for _ in range(repeats):
                layers += [
                    nn.Conv2d(prev, channels, 3, padding=1, bias=False),
                    nn.BatchNorm2d(channels),
                    nn.ReLU(),
                ]
                prev = channels
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        side = image_size // 8
        flat = prev * side * side
        head: list[nn.Module] = [nn.Flatten()]
        if hidden:
            head += [nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)]
        else:
            head.append(nn.Linear(flat, num_classes))
        self.classifier = nn.Sequential(*head)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
