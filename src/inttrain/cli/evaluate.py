"""``inttrain eval CKPT_OR_RUN_DIR``: validation accuracy (language models: loss, perplexity, accuracy) of a checkpoint.

The model, recipe and data come from the config stored in the checkpoint, so
an evaluation needs nothing but the path (``--dataset`` / ``--data-dir``
point it at other data of the same shape).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from .errors import UsageProblem
from .load import _other_data, resolve_checkpoint

__all__ = ["resolve_checkpoint", "run_eval"]


def run_eval(path: Path, dataset: str | None, data_dir: Path | None, threads: int | None) -> float:
    import math

    import torch
    from torch.utils.data import DataLoader

    from inttrain.trainer import evaluate_metrics

    from .load import load_run

    p, weights_path = load_run(path, dataset, data_dir, threads)
    cfg = p.cfg
    loss, acc = evaluate_metrics(p.model, DataLoader(p.splits.val, batch_size=256), cfg.recipe, torch.device("cpu"))
    if p.splits.task == "lm":
        ppl = math.exp(loss) if loss < 700 else math.inf  # exp overflows a float past ~709
        typer.echo(f"val_loss {loss:.4f} val_ppl {ppl:.2f} val_acc {acc:.4f} ({len(p.splits.val)} sequences of "
                   f"{p.splits.image_size} characters, {p.splits.val_source}; {weights_path})")
    else:
        typer.echo(f"val_acc {acc:.4f} ({len(p.splits.val)} images of {cfg.dataset}, {p.splits.val_source}; {weights_path})")
        if getattr(p, "other_data", False):
            typer.echo(f"scored {len(p.splits.val)} examples")
    return acc
