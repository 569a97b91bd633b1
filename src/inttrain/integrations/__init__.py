"""Thin adapters for the training loops users already have.

- :mod:`inttrain.integrations.lightning`: ``IntTrainCallback`` for ``lightning.Trainer(callbacks=[...])``.
- :mod:`inttrain.integrations.transformers`: ``IntTrainCallback`` for ``transformers.Trainer(callbacks=[...])``.

Each module imports its framework on import; this package imports neither.
"""
