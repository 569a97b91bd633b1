"""A tiny CNN for the 8x8 digits dataset: the model behind ``inttrain demo``.

conv 3x3 (16) - BN - ReLU - conv 3x3 (32) - BN - ReLU - maxpool 2 - linear.
Small enough that a few epochs on 1.4k images take seconds on a laptop CPU.
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["SmallCNN"]


# ReLUs are not in-place: the integer layers' outputs come from custom autograd
# Functions, which must not be modified in place; the memory saved here is tiny.
class SmallCNN(nn.Module):
    def __init__(self, num_classes: int, in_channels: int = 1, image_size: int = 8) -> None:
        super().__init__()
        if image_size < 2:
            raise ValueError(f"small-cnn: image_size must be >= 2, got {image_size}")
        self.features = nn.Sequential(
            # No conv bias: the following BatchNorm has its own shift.
            nn.Conv2d(in_channels, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        side = image_size // 2
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * side * side, num_classes))

    def as_sequential(self) -> nn.Sequential:
        """The same modules (shared) as one ``nn.Sequential`` that computes ``forward``."""
        return nn.Sequential(*self.features, *self.classifier)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
