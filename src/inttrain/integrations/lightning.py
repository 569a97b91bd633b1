"""Integer training inside a Lightning ``Trainer``: one callback.

>>> import lightning as L                                                  # doctest: +SKIP
>>> from inttrain.integrations.lightning import IntTrainCallback            # doctest: +SKIP
>>> L.Trainer(callbacks=[IntTrainCallback("int8")]).fit(lit_module, dm)   # doctest: +SKIP

The callback converts the LightningModule in place in ``setup`` (before ``configure_optimizers``; the
parameters are the same tensors either way), logs the recipe and the converted / float layer counts to the
Trainer's loggers as hyperparameters, and the integer kernel launches of each epoch as metrics
(``inttrain/int8_mm`` ...: proof that integer arithmetic ran).  Lightning checkpoints keep working: the
``state_dict`` keys do not change, and the callback's own state (the recipe, stochastic-rounding counters,
recipe hook state) is saved with the checkpoint and put back on ``fit(ckpt_path=...)``, so a resumed run
continues as the uninterrupted one would.
"""

from __future__ import annotations

import warnings
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from inttrain.recipes import RecipeConfig

from ._common import RecipeSettings, KernelCounts, convert, load_recipe_state, recipe_name, recipe_state

__all__ = ["IntTrainCallback"]


class IntTrainCallback(RecipeSettings, Callback):
    """Convert the LightningModule for ``recipe`` before training (see the module docstring).

    Arguments: see :class:`inttrain.integrations._common.RecipeSettings`.
    """

    def __init__(self, recipe: str | RecipeConfig = "int8", dataflow: bool = False, **prepare_kwargs: Any) -> None:
        RecipeSettings.__init__(self, recipe, dataflow, **prepare_kwargs)
        self._pending: dict[str, Any] | None = None
        self._counts: KernelCounts | None = None
        self._module: L.LightningModule | None = None  # Lightning gives state_dict() no module: the converted one
        self.last_epoch_kernel_calls: dict[str, float] = {}

    @property
    def state_key(self) -> str:
        # One key whatever the recipe, so that resuming under another recipe is seen (and refused).
        return "IntTrainCallback"

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.report is not None:  # fit then test/validate: convert once
            return
        self.report = convert(pl_module, self.recipe, self.dataflow, self.prepare_kwargs)
        self._module = pl_module
        if self._pending is not None:
            load_recipe_state(pl_module, self._pending, self.name)
            self._pending = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        report = self.report
        floats = len(report.left_in_float)
        for logger in trainer.loggers:
            logger.log_hyperparams({"inttrain/recipe": self.name, "inttrain/dataflow": self.dataflow,
                                    "inttrain/integer_layers": report.num_converted, "inttrain/float_layers": floats})
        if self.name != "fp32" and report.num_converted == 0:
            warnings.warn(f"inttrain: recipe {self.name!r} converted no layer of {type(pl_module).__name__}: "
                          "training runs entirely in float", stacklevel=2)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._counts = KernelCounts()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._counts is None:
            return
        metrics = {f"inttrain/{k}": float(v) for k, v in self._counts.take().items()}
        metrics["inttrain/integer_kernel_calls"] = float(sum(metrics.values()))
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        self.last_epoch_kernel_calls = metrics

    def state_dict(self) -> dict[str, Any]:
        return {} if self._module is None else recipe_state(self._module, self.name)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self._module is None:  # restored before setup: applied once the model is converted
            self._pending = state_dict
        else:
            load_recipe_state(self._module, state_dict, self.name)
