"""``inttrain cost``: per-layer BitOPs / energy / saved-activation table of one training step, without training.

One forward + backward of the prepared model on a dummy batch of the dataset's shape, counted by
:class:`inttrain.cost.BitOpsCounter`.  BitOPs (MACs x bits x bits) is the hardware-independent measure the
low-precision training papers use; on this CPU, fewer than 8 bits run on int8 kernels and are not faster.
"""

from __future__ import annotations

import dataclasses

import typer

from .config import RunConfig
from .errors import UsageProblem

__all__ = ["run_cost"]


def run_cost(cfg: RunConfig, forward_bits: int | None, grad_bits: int | None) -> None:
    import torch

    from inttrain.cost import measure_step
    from inttrain.schedules import model_bits, prepared_layers, set_model_bits

    from .run import prepare_run

    p = prepare_run(cfg)
    if not prepared_layers(p.model):
        raise UsageProblem("--recipe", f"{cfg.recipe!r} has no integer layers to count; use an integer recipe such as int8")
    if forward_bits is not None or grad_bits is not None:
        cur = model_bits(p.model)
        try:
            set_model_bits(p.model, forward_bits if forward_bits is not None else cur[0],
                           grad_bits if grad_bits is not None else cur[1])
        except ValueError as e:
            raise UsageProblem("--forward-bits" if forward_bits is not None else "--grad-bits", str(e)) from None
    s = p.splits
    g = torch.Generator().manual_seed(cfg.seed)
    if s.task == "lm":
        x = torch.randint(0, s.num_classes, (cfg.batch_size, cfg.seq_len), generator=g)
    else:
        x = torch.randn(cfg.batch_size, s.in_channels, s.image_size, s.image_size, generator=g)
    counter = measure_step(p.model, x, measure_memory=True)
    typer.echo(f"one training step (forward + backward), batch {cfg.batch_size}, input {tuple(x.shape)}:")
    typer.echo(counter.table())


def cost_config(**values) -> RunConfig:
    return dataclasses.replace(RunConfig(), **{k: v for k, v in values.items() if v is not None})
