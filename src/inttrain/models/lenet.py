"""LeNet-5 (LeCun et al. 1998), in the usual modern form (ReLU, max-pooling).

conv 5x5 (6) -> pool -> conv 5x5 (16) -> pool -> FC 120 -> FC 84 -> FC classes.
Works for any square input >= 8 px: conv1 is padded (the MNIST 28x28 convention)
and conv2 is padded too when the input is small, so 8x8 digits still fit.
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["LeNet5"]


# ReLUs are not in-place: the integer layers' outputs come from custom autograd
# Functions, which must not be modified in place; the memory saved here is tiny.
class LeNet5(nn.Module):
    def __init__(self, num_classes: int, in_channels: int = 1, image_size: int = 28) -> None:
        super().__init__()
        if image_size < 8:
            raise ValueError(f"lenet5: image_size must be >= 8, got {image_size}")
        # Small images would shrink to nothing after the unpadded 5x5 conv2.
        pad2 = 2 if image_size < 16 else 0
        size = image_size // 2  # conv1 keeps the size (pad 2), pool halves it
        size = (size + 2 * pad2 - 4) // 2
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5, padding=pad2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * size * size, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
