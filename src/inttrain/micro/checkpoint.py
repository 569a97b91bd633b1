"""Training checkpoints of the device CLI: everything a run needs to continue bit for bit (docs §10).

A run folder ``OUT`` holds the saved model (``model.json`` + ``weights.safetensors``: the last or, with
``--keep-best``, the best epoch's weights) and the checkpoint of the latest state: ``checkpoint.json``
(format, settings, epoch and position inside it, global step, history, best epoch, the parameter formats) and
``checkpoint.safetensors`` (master codes, the int32 momentum buffers as ``momentum/NAME`` and the int16
remainders below one code, ``--frac-bits``, as ``remainder/NAME``). The whole
folder is rewritten atomically (:func:`inttrain.micro.model.write_dir_atomic`) after every epoch and when a
run stops early, so a killed run leaves the previous epoch's complete folder.

The data order of epoch ``e`` is ``default_rng(seed + e).permutation``, so (epoch, steps done in it) is the
whole shuffle state; the schedule is a function of the global step; the optimizer's state is the momentum
buffers, the remainders and the (possibly adapted) weight exponents. Nothing else carries over between steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .errors import MicroFormatError
from .io import read_json, read_safetensors, write_safetensors
from .model import FORMAT, Sequential, model_doc, set_params, write_dir_atomic, write_model_files

CHECKPOINT_FORMAT = "inttrain.micro.checkpoint/1"
MOM = "momentum/"
FRAC = "remainder/"


def save_run(out_dir: str | Path, current: Sequential, state: dict, saved: Sequential | None = None,
             saved_info: dict | None = None) -> Path:
    """Write OUT atomically: the checkpoint of ``current`` with ``state`` and the saved model ``saved``
    (``current`` when None) with ``saved_info`` in its ``model.json``."""
    def write(tmp: Path) -> None:
        named = current.named_params()
        tensors = {n: p.acc for n, p in named}
        tensors.update({MOM + n: p.mom for n, p in named if p.mom is not None})
        tensors.update({FRAC + n: p.frac for n, p in named if p.frac is not None})
        write_safetensors(tmp / "checkpoint.safetensors", tensors, {"format": FORMAT})
        doc = {"format": CHECKPOINT_FORMAT, **state, "model": model_doc(current)}
        (tmp / "checkpoint.json").write_text(json.dumps(doc, indent=1))
        write_model_files(saved if saved is not None else current, tmp, saved_info)
    return write_dir_atomic(out_dir, write)


def load_run(run_dir: str | Path) -> tuple[Sequential, dict]:
    """The model (master codes, exponents, momentum buffers, remainders) and the state dict of ``run_dir``'s checkpoint."""
    d = Path(run_dir)
    where = str(d / "checkpoint.json")
    if not (d / "checkpoint.json").is_file():
        raise MicroFormatError(f"--resume {run_dir}: no checkpoint.json there (not a folder written by "
                               "`train --out`, or a run from before checkpoints)")
    doc = read_json(d / "checkpoint.json", max_bytes=64 << 20)
    if doc.get("format") != CHECKPOINT_FORMAT:
        raise MicroFormatError(f"{where}: format {doc.get('format')!r} is not {CHECKPOINT_FORMAT!r}")
    mdoc = doc.pop("model", None)
    if not isinstance(mdoc, dict):
        raise MicroFormatError(f"{where}: 'model' must be an object")
    mdoc = dict(mdoc)
    params_doc = mdoc.pop("params", None)
    mdoc.pop("info", None)
    model = Sequential.from_description(mdoc, where)
    tensors, _ = read_safetensors(d / "checkpoint.safetensors")
    mom = {k[len(MOM):]: tensors.pop(k) for k in list(tensors) if k.startswith(MOM)}
    frac = {k[len(FRAC):]: tensors.pop(k) for k in list(tensors) if k.startswith(FRAC)}
    set_params(model, params_doc, tensors, where, str(d / "checkpoint.safetensors"))
    named = dict(model.named_params())
    for name, v in mom.items():
        if name not in named or v.dtype != np.int32 or v.shape != named[name].acc.shape:
            raise MicroFormatError(f"{d / 'checkpoint.safetensors'}: momentum {name!r} does not match a parameter "
                                   "(int32, the parameter's shape)")
        named[name].mom = v.copy()
    for name, v in frac.items():
        if name not in named or v.dtype != np.int16 or v.shape != named[name].acc.shape:
            raise MicroFormatError(f"{d / 'checkpoint.safetensors'}: remainder {name!r} does not match a parameter "
                                   "(int16, the parameter's shape)")
        named[name].frac = v.copy()
    for key in ("settings", "epoch", "position", "global_step", "history"):
        if key not in doc:
            raise MicroFormatError(f"{where}: missing {key!r}")
    return model, doc
