"""``inttrain.load(RUN_DIR)``: the trained model of a run folder (or checkpoint) back in Python.

The model, recipe and data come from the config stored in the checkpoint, as for ``inttrain eval``: the model is
rebuilt, the recipe applied (integer layers, dataflow, swapped norms) and the checkpoint's weights loaded.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from torch import nn

from .errors import UsageProblem

__all__ = ["load", "load_run", "resolve_checkpoint"]


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


def _other_data(cfg: Any, trained: Any, state: dict) -> Any:
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


def load_run(path: str | Path, dataset: str | None = None, data_dir: Path | None = None,
             threads: int | None = None) -> tuple[Any, Path]:
    """``(Prepared, weights file)`` of a run folder or ``.safetensors`` checkpoint: model (trained weights,
    eval mode) and data splits (UsageProblem on any problem; ``dataset``/``data_dir`` point it at other data)."""
    from inttrain.trainer import CheckpointError, load_checkpoint

    from .config import RunConfig, config_from_dict
    from .run import prepare_run

    weights_path = resolve_checkpoint(Path(path))
    try:
        weights, state = load_checkpoint(weights_path)
    except CheckpointError as e:
        raise UsageProblem("CHECKPOINT", str(e)) from None
    if "integer_only" in state:
        raise UsageProblem("CHECKPOINT", f"{weights_path}: an integer-only checkpoint; load it with "
                           "inttrain.load (Python) or export it with --format micro")
    saved = config_from_dict(dict(state.get("config", {})), f"{weights_path} config")
    overrides = {k: v for k, v in dict(dataset=dataset, threads=threads).items() if v is not None}
    if data_dir is not None or dataset is not None:
        overrides["data_dir"] = str(data_dir) if data_dir is not None else None
    cfg = dataclasses.replace(RunConfig(), **{**saved, "threads": None, **overrides, "max_steps": None})
    splits = None
    if (dataset is not None or data_dir is not None) and cfg.dataset != "text":
        # other data: every example scored, normalised with the run's own training statistics
        trained = dataclasses.replace(RunConfig(), **{**saved, "threads": None, "max_steps": None})
        splits = _other_data(cfg, trained, state)
    p = prepare_run(cfg, echo=lambda s: None, splits=splits)
    try:
        p.model.load_state_dict(weights)
    except RuntimeError as e:
        raise UsageProblem(
            "--dataset", f"{cfg.dataset!r}: checkpoint {weights_path.name} does not fit the model built for it "
            f"({str(e).splitlines()[0]})"
        ) from None
    p.model.eval()
    if p.scheduler is not None:  # a loaded run is for inference: its schedule's evaluation bits (CPT: the top)
        p.scheduler.apply_eval_bits()
    p.other_data = splits is not None
    return p, weights_path


def load(run_dir: str | Path) -> nn.Module:
    """The trained model of ``run_dir`` (a run folder, its best else last checkpoint; or a ``.safetensors``
    checkpoint) with its recipe applied, in eval mode.

    Integer-only checkpoints give the :class:`inttrain.integer_only.Sequential` they were trained as.
    Problems (missing folder, damaged checkpoint, data that no longer fits) raise ``ValueError``.

    >>> model = inttrain.load("runs/small-cnn-int8")          # doctest: +SKIP
    >>> model(images).argmax(1)                                # doctest: +SKIP
    """
    try:
        return load_run(run_dir)[0].model
    except UsageProblem as e:
        if "integer-only checkpoint" not in str(e):
            raise ValueError(str(e)) from None
    from inttrain import integer_only as T

    from .export import load_checkpoint_model

    return T.Sequential.from_micro(load_checkpoint_model(resolve_checkpoint(Path(run_dir)))[0])
