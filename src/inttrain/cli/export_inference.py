"""``inttrain export RUN --format onnx|torch``: a trained run -> an int8 inference model, checked on its data.

The run's model is loaded as trained (:func:`inttrain.cli.load.load_run`), turned into its int8 inference
copy (:func:`inttrain.inference.to_inference`: int8 weight codes + trained scales, run-time int8 inputs as
QuantizeLinear/DequantizeLinear) and exported with a dynamic batch dimension:

- ``onnx``: ``torch.onnx.export(..., dynamo=True)``, run back with ONNX Runtime;
- ``torch``: a ``torch.export`` program saved as ``.pt2`` (``torch.export.load`` it after
  ``inttrain.inference.register_qdq_ops()``), run back after loading.

Then every validation sample of the run goes through the exported file and the trained model, and the top-1
agreement is printed.  The file appears only after that check ran (written under a temporary name, renamed).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from .errors import UsageProblem

__all__ = ["EXPORT_FORMATS", "default_export_path", "run_export_inference"]

EXPORT_FORMATS = ("micro", "onnx", "torch")
_SUFFIX = {"onnx": ".onnx", "torch": ".pt2"}


def default_export_path(source: Path, fmt: str) -> Path:
    """``RUN/export/model.onnx`` / ``model.pt2`` / ``micro`` (RUN: the folder, or the checkpoint's run folder)."""
    run = source if source.is_dir() else source.parent.parent
    return run / "export" / ("micro" if fmt == "micro" else f"model{_SUFFIX[fmt]}")


def _batches(dataset: Any, size: int = 256) -> Iterator[torch.Tensor]:
    from torch.utils.data import DataLoader

    for x, _ in DataLoader(dataset, batch_size=size):
        yield x


def run_export_inference(source: Path, fmt: str, out: Path | None, echo: Callable[[str], Any] = print) -> dict:
    """Export the run at ``source`` as ``fmt`` (onnx or torch) to ``out``; returns the summary printed."""
    from inttrain.inference import export_onnx, export_torch, to_inference

    from .load import load_run

    p, weights_path = load_run(source)
    try:
        inference = to_inference(p.model)
    except ValueError as e:
        raise UsageProblem("--format", f"{fmt!r}: {e}") from None
    out = default_export_path(source, fmt) if out is None else out
    if out.suffix != _SUFFIX[fmt]:
        raise UsageProblem("--out", f"{str(out)!r}: a {fmt} export is written to a {_SUFFIX[fmt]} file")
    if fmt == "onnx":
        try:
            import onnxruntime  # noqa: F401
            import onnxscript  # noqa: F401
        except ImportError:
            raise UsageProblem("--format", "'onnx' needs onnx, onnxscript and onnxruntime: "
                               "pip install 'inttrain[onnx]'") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{_SUFFIX[fmt]}")
    example = next(_batches(p.splits.val, 8))
    try:
        run = (export_onnx if fmt == "onnx" else export_torch)(inference, example, tmp)
        agree = total = 0
        with torch.no_grad():
            for x in _batches(p.splits.val):
                a, b = run(x).argmax(-1), p.model(x).argmax(-1)
                agree, total = agree + int((a == b).sum()), total + a.numel()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)
    what = "tokens" if p.splits.task == "lm" else "samples"
    runner = "ONNX Runtime" if fmt == "onnx" else "torch.export"
    from inttrain.inference import Int8Conv2d, Int8Linear

    int8 = sum(isinstance(m, (Int8Linear, Int8Conv2d)) for m in inference.modules())
    echo(f"exported {p.cfg.model} (recipe {p.cfg.recipe}: {int8} layers with int8 weights and inputs) from "
         f"{weights_path} to {out}")
    echo(f"check: {runner} and the trained model agree on the top-1 prediction for {agree} of {total} validation "
         f"{what} ({agree / max(total, 1):.2%})")
    return {"out": out, "agree": agree, "total": total}
