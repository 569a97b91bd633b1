"""Integer training inside a Hugging Face ``transformers.Trainer``: one ``TrainerCallback``.

>>> from transformers import Trainer                                       # doctest: +SKIP
>>> from inttrain.integrations.transformers import IntTrainCallback          # doctest: +SKIP
>>> Trainer(model, args, train_dataset=ds, callbacks=[IntTrainCallback("int8")]).train()   # doctest: +SKIP

The model is converted in place when the Trainer is built (``on_init_end``, before the optimizer exists; the
parameters are the same tensors either way): every ``nn.Linear`` and GPT-2's ``Conv1D`` runs its three GEMMs on
integer kernels; what stays in float is warned about (:class:`inttrain.FloatFallbackWarning`).  Every log
row gets ``inttrain/integer_layers``, ``inttrain/float_layers`` and the integer kernel launches since the last
row (``inttrain/int8_mm``...), in ``trainer.state.log_history`` (and so ``trainer_state.json``) and in the
logs of the callbacks after this one.  Checkpoints keep working: the weights' names and shapes do not change,
and ``checkpoint-N/inttrain_state.json`` (the recipe, stochastic-rounding counters, recipe hook state) is
written next to each checkpoint and read back by ``trainer.train(resume_from_checkpoint=...)``.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from inttrain.recipes import RecipeConfig

from ._common import RecipeSettings, KernelCounts, convert, load_recipe_state, recipe_name, recipe_state

__all__ = ["IntTrainCallback", "STATE_FILE"]

STATE_FILE = "inttrain_state.json"


def _checkpoint_dir(args: TrainingArguments, state: TrainerState) -> str:
    # The folder transformers' Trainer._save_checkpoint writes (PREFIX_CHECKPOINT_DIR-global_step).
    return os.path.join(args.output_dir, f"checkpoint-{state.global_step}")


class IntTrainCallback(RecipeSettings, TrainerCallback):
    """Convert the Trainer's model for ``recipe`` (see the module docstring).

    Arguments: see :class:`inttrain.integrations._common.RecipeSettings`.
    """

    def __init__(self, recipe: str | RecipeConfig = "int8", dataflow: bool = False, **prepare_kwargs: Any) -> None:
        RecipeSettings.__init__(self, recipe, dataflow, **prepare_kwargs)
        self._counts = KernelCounts()

    def _convert(self, model) -> None:
        if self.report is None and model is not None:
            self.report = convert(model, self.recipe, self.dataflow, self.prepare_kwargs)
            if self.name != "fp32" and self.report.num_converted == 0:
                warnings.warn(f"inttrain: recipe {self.name!r} converted no layer of {type(model).__name__}: "
                              "training runs entirely in float", stacklevel=3)

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model=None, **kw):
        self._convert(model)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model=None, **kw):
        self._convert(model)  # a callback added after the Trainer was built
        self._counts = KernelCounts()
        if state.global_step == 0:
            return
        path = os.path.join(_checkpoint_dir(args, state), STATE_FILE)
        if not os.path.isfile(path):
            warnings.warn(f"inttrain: resuming at step {state.global_step} without {path}: stochastic-rounding "
                          "counters and recipe state start afresh", stacklevel=2)
            return
        with open(path) as f:
            load_recipe_state(model, json.load(f), self.name)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model=None, **kw):
        folder = _checkpoint_dir(args, state)
        if model is None or not os.path.isdir(folder):
            return
        tmp = os.path.join(folder, f".{STATE_FILE}.tmp")
        with open(tmp, "w") as f:
            json.dump(recipe_state(model, self.name), f)
        os.replace(tmp, os.path.join(folder, STATE_FILE))

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs=None, **kw):
        if logs is None or self.report is None:
            return
        row = {"inttrain/integer_layers": self.report.num_converted,
               "inttrain/float_layers": len(self.report.left_in_float)}
        calls = self._counts.take()
        row.update({f"inttrain/{k}": v for k, v in calls.items()})
        row["inttrain/integer_kernel_calls"] = sum(calls.values())
        logs.update(row)
        if state.log_history:  # the Trainer appended its copy of the row before calling on_log
            state.log_history[-1].update(row)
