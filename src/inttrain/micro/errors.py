"""The one error a corrupt, truncated or inconsistent model/data file raises."""


class MicroFormatError(ValueError):
    """A model description, weight file or data file is invalid (message says what and where)."""
