"""The one error a corrupt, truncated or inconsistent model/data file raises."""

from inttrain.spec.errors import ModelFormatError


class MicroFormatError(ModelFormatError):
    """A model description, weight file or data file is invalid (message says what and where)."""
