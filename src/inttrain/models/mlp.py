"""Multi-layer perceptron on flattened images.

The benchmark shape is 784-1024-1024-1024-10 (MNIST): every hidden layer is an
``nn.Linear`` followed by ReLU, so after ``inttrain.prepare_`` every GEMM in the
network runs on the integer path.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

__all__ = ["MLP", "DEFAULT_WIDTHS"]

#: Hidden widths of the benchmark MLP (784-1024-1024-1024-10).
DEFAULT_WIDTHS: tuple[int, ...] = (1024, 1024, 1024)


# ReLUs are not in-place: the integer layers' outputs come from custom autograd
# Functions, which must not be modified in place; the memory saved here is tiny.
class MLP(nn.Module):
    """Flatten -> [Linear -> ReLU] * len(widths) -> Linear."""

    def __init__(self, in_features: int, num_classes: int, widths: Sequence[int] = DEFAULT_WIDTHS) -> None:
        super().__init__()
        if in_features < 1 or num_classes < 1 or any(w < 1 for w in widths):
            raise ValueError(
                f"mlp: in_features, num_classes and widths must be >= 1, got "
                f"in_features={in_features}, num_classes={num_classes}, widths={list(widths)}"
            )
        layers: list[nn.Module] = [nn.Flatten()]
        prev = in_features
        for width in widths:
            layers += [nn.Linear(prev, width), nn.ReLU()]
            prev = width
        layers.append(nn.Linear(prev, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)
