"""The one exception type of the data package (a member of the :mod:`inttrain.spec.errors` family)."""

from __future__ import annotations

from inttrain.spec.errors import DataError

__all__ = ["DataError"]
