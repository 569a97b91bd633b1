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

import contextlib
import logging
import os
import warnings
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


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The ONNX exporter logs optional-library notes (torchvision...) as warnings: keep the CLI's output readable."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # pytree deprecation notes from inside torch.export
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _onnx_translations() -> dict:
    """Per-tensor QDQ with a run-time scale: torchlib's own version wants the zero point as a constant."""
    import onnxscript
    from onnxscript import opset18 as op

    int8 = onnxscript.ir.DataType.INT8

    def quantize(x, scale, zero_point, quant_min: int, quant_max: int, dtype: int):
        return op.QuantizeLinear(x, scale, op.Cast(zero_point, to=int8))

    def dequantize(x, scale, zero_point, quant_min: int, quant_max: int, dtype: int, out_dtype: int = -1):
        return op.DequantizeLinear(x, scale, op.Cast(zero_point, to=int8))

    def amax(x, dim=(), keepdim: bool = False):  # torchlib requires dim; the whole-tensor amax (8-bit BN) has none
        keep = 1 if keepdim else 0
        if not dim:
            return op.ReduceMax(x, keepdims=keep)
        return op.ReduceMax(x, op.Constant(value_ints=list(dim)), keepdims=keep)

    qd = torch.ops.quantized_decomposed
    return {qd.quantize_per_tensor.tensor: quantize, qd.dequantize_per_tensor.tensor: dequantize,
            torch.ops.aten.amax.default: amax}


def _export_onnx(model: torch.nn.Module, example: torch.Tensor, path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        import onnxruntime as ort
    except ImportError:
        raise UsageProblem("--format", "'onnx' needs onnx, onnxscript and onnxruntime: pip install 'inttrain[onnx]'") from None
    dims = ({0: torch.export.Dim("batch")},)
    with _quiet_exporter():
        program = torch.onnx.export(model, (example,), dynamic_shapes=dims, dynamo=True, verbose=False,
                                    custom_translation_table=_onnx_translations())
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: torch.from_numpy(session.run(None, {name: x.numpy()})[0])


def _export_torch(model: torch.nn.Module, example: torch.Tensor, path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    with _quiet_exporter():
        program = torch.export.export(model, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
        torch.export.save(program, str(path))
        return torch.export.load(str(path)).module()


def run_export_inference(source: Path, fmt: str, out: Path | None, echo: Callable[[str], Any] = print) -> dict:
    """Export the run at ``source`` as ``fmt`` (onnx or torch) to ``out``; returns the summary printed."""
    from inttrain.inference import to_inference

    from .load import load_run

    p, weights_path = load_run(source)
    try:
        inference = to_inference(p.model)
    except ValueError as e:
        raise UsageProblem("--format", f"{fmt!r}: {e}") from None
    out = default_export_path(source, fmt) if out is None else out
    if out.suffix != _SUFFIX[fmt]:
        raise UsageProblem("--out", f"{str(out)!r}: a {fmt} export is written to a {_SUFFIX[fmt]} file")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{_SUFFIX[fmt]}")
    example = next(_batches(p.splits.val, 8))
    try:
        run = (_export_onnx if fmt == "onnx" else _export_torch)(inference, example, tmp)
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
