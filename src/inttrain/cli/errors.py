"""CLI error type: one ``error: ...`` line and exit code 2, no traceback."""

from __future__ import annotations

from collections.abc import Iterable

from inttrain.spec.errors import ConfigError

__all__ = ["UsageProblem", "check_choice"]


class UsageProblem(ConfigError):
    """A bad command-line value; the message names the field, value and what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def check_choice(field: str, value: str, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise UsageProblem(field, f"{value!r} is not one of: {', '.join(allowed)}")
