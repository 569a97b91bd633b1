"""The one exception type of the data package."""

from __future__ import annotations

__all__ = ["DataError"]


class DataError(ValueError):
    """A dataset is missing, malformed or inconsistent.

    Messages name the source (file or loader), the offending array and index
    when there is one, and the rule that was broken, e.g.
    ``cifar.npz: y_train[17]: label 12 out of range [0, 10)``.
    """
