"""Command-line interface (``inttrain`` / ``python -m inttrain``); see :mod:`.app`."""
