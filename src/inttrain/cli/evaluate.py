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

__all__ = ["resolve_checkpoint", "run_eval"]


def resolve_checkpoint(path: Path) -> Path:
    """The weights file for ``path``: a .safetensors file, or a run folder's best (else last) checkpoint."""
    if path.is_dir():
        for name in ("best", "last"):
            candidate = path / "checkpoints" / f"{name}.safetensors"
            if candidate.is_file():
                return candidate
        raise UsageProblem("CHECKPOINT", f"{str(path)!r}: no checkpoints/best.safetensors or last.safetensors in this folder")
    if path.is_file() and path.suffix != ".safetensors":
        raise UsageProblem("CHECKPOINT", f"{str(path)!r}: not a checkpoint this command reads ({path.suffix or 'no suffix'}); "
                                         "allowed: a run folder or the NAME.safetensors of a checkpoint pair (not its .state.pt)")
    if path.suffix != ".safetensors" or not path.is_file():
        raise UsageProblem("CHECKPOINT", f"{str(path)!r}: not found; expected a run folder or a .safetensors checkpoint")
    return path


def _valid_info(info: Any) -> bool:
    def numbers(v: Any) -> bool:
        return isinstance(v, list) and len(v) in (1, 3) and all(isinstance(e, float) and e == e for e in v)

    return (isinstance(info, dict) and info.get("task") == "classification"
            and all(isinstance(info.get(k), int) and info[k] > 0 for k in ("num_classes", "in_channels", "image_size"))
            and numbers(info.get("mean")) and numbers(info.get("std")) and len(info["mean"]) == info["in_channels"]
            and len(info["std"]) == info["in_channels"] and all(v > 0 for v in info["std"]))


def _other_data(cfg: RunConfig, trained: RunConfig, state: dict) -> Any:
    """Splits whose validation set is the whole of the other data, standardised like the training data.

    The statistics come from the checkpoint (runs since they are saved) or, for older runs, from the run's
    own training data loaded again exactly as training did.
    """
    from inttrain.data import DataError, DatasetSplits, load_eval_dataset

    from .run import prepare_run, run_limits

    info = state.get("data")
    if not _valid_info(info):  # older run (or a damaged record): recompute from the run's own training data
        base = prepare_run(trained, echo=lambda s: None).splits
        info = {"num_classes": base.num_classes, "in_channels": base.in_channels, "image_size": base.image_size,
                "mean": list(base.mean), "std": list(base.std)}
    try:
        data, what = load_eval_dataset(cfg.dataset, cfg.data_dir, int(info["num_classes"]),
                                       (int(info["in_channels"]), int(info["image_size"])),
                                       tuple(info["mean"]), tuple(info["std"]), run_limits(cfg))
    except DataError as e:
        raise UsageProblem(f"--dataset {cfg.dataset}", str(e)) from e
    return DatasetSplits(name=cfg.dataset, train=data, val=data, num_classes=int(info["num_classes"]),
                         in_channels=int(info["in_channels"]), image_size=int(info["image_size"]),
                         source=str(cfg.data_dir), val_source=f"{what}, with the run's training normalisation",
                         mean=tuple(info["mean"]), std=tuple(info["std"]))


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
