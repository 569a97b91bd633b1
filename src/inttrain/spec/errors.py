"""The one error family of inttrain: every refused input raises an :class:`InttrainError`.

Both command lines (``inttrain`` and ``python -m inttrain.micro``) print such an error as one line,
``error: <what>: <why>; <what is allowed>``, and exit with status 2 (``--debug`` adds the traceback).
Any other exception escaping a command is a bug in inttrain, not a bad input.

The classes subclass :class:`ValueError` so that code written against the older per-package errors
(``except ValueError``) keeps working. Pure Python: the NumPy-only engine imports it too.
"""

from __future__ import annotations

__all__ = ["InttrainError", "DataError", "ConfigError", "CheckpointError", "ModelFormatError", "LimitError"]


class InttrainError(ValueError):
    """An input inttrain refuses; the message names the input, the problem and what is allowed."""

    exit_code = 2


class DataError(InttrainError):
    """A dataset is missing, malformed or inconsistent (``cifar.npz: y_train[17]: label 12 out of range [0, 10)``)."""


class ConfigError(InttrainError):
    """A configuration value (YAML file, ``--set``, command-line flag) of the wrong type or out of range."""


class CheckpointError(InttrainError):
    """A checkpoint is missing, truncated, corrupt or inconsistent; the message names the file."""


class ModelFormatError(InttrainError):
    """A model description (``model.json``), weight file or device data file is invalid."""


class LimitError(InttrainError):
    """An input is well-formed but would need more memory or time than the configured limits allow.

    Raised from headers and descriptions *before* the allocation they imply; the message names the limit
    and how to raise it.
    """
