"""``inttrain export SRC --out DIR``: a trained integer-only torch model -> the micro engine's model files.

The integer-only recipe (:mod:`inttrain.recipes.integer_only`, engine :mod:`inttrain.integer_only`) trains
integer master codes with one power-of-two exponent per tensor, exactly the numbers the NumPy engine
:mod:`inttrain.micro` runs on. Export writes them in micro's format (docs/integer-training.md §9:
``DIR/model.json`` = layer description + ``params`` formats, ``DIR/weights.safetensors`` = master codes),
then reads the files back with micro's NumPy-only loader and checks every code and exponent.

``SRC`` is one of

* an integer-only checkpoint ``NAME.safetensors`` (+ ``NAME.state.pt`` next to it), written by
  :func:`save_checkpoint` with the trainer's atomic checkpoint pair (:mod:`inttrain.trainer.checkpoint`);
* a run folder holding ``checkpoints/best.safetensors`` or ``checkpoints/last.safetensors`` of that kind;
* a model folder with ``model.json`` + ``weights.safetensors`` (``integer_only.Sequential.save`` or
  ``python -m inttrain.micro train --out``), re-validated and re-written.

The reverse direction is :func:`import_micro` (micro model folder -> :class:`inttrain.integer_only.Sequential`).
Every problem with a file is one ``ValueError`` (``MicroFormatError`` / ``CheckpointError``) naming the file,
which the CLI prints as one ``error: ...`` line with exit status 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["CHECKPOINT_FORMAT", "save_checkpoint", "load_checkpoint_model", "resolve_source", "to_micro",
           "export_model", "import_micro", "run_export"]

CHECKPOINT_FORMAT = "inttrain.integer_only/1"
_MOM = "momentum/"
_FRAC = "remainder/"          # the optimizer's int16 remainders below one code (SGD(frac_bits=))


def save_checkpoint(model, run_dir: str | Path, name: str = "last", opt=None, extra: dict | None = None) -> Path:
    """Write ``run_dir/checkpoints/NAME.safetensors`` (master codes, momentum buffers, remainders) +
    ``NAME.state.pt``.

    The state holds the model description, each parameter's bit width and exponent, the optimizer's
    settings and ``config = {"recipe": "integer-only"}`` (plain containers: ``torch.load(weights_only=True)``).
    """
    from inttrain.trainer.checkpoint import save_checkpoint as _save

    weights, params = {}, {}
    for n, p in model.named_params():
        weights[n] = p.acc
        params[n] = {"bits": int(p.bits), "exp": int(p.exp)}
        if p.mom is not None:
            weights[_MOM + n] = p.mom
        if p.frac is not None:
            weights[_FRAC + n] = p.frac
    state = {"config": {"recipe": "integer-only"},
             "integer_only": {"format": CHECKPOINT_FORMAT, "description": json.dumps(model.desc), "params": params}}
    if opt is not None:
        state["integer_only"]["optimizer"] = {"lr_shift": int(opt.lr_shift), "rounding": str(opt.rounding),
                                              "momentum_shift": None if opt.momentum_shift is None else int(opt.momentum_shift),
                                              "nesterov": bool(opt.nesterov)}
    if extra:
        state["extra"] = extra
    w, _ = _save(Path(run_dir) / "checkpoints", name, weights, state)
    return w


def resolve_source(path: str | Path) -> tuple[str, Path]:
    """("micro", folder) for a model.json folder, ("checkpoint", weights file) for a checkpoint or run folder."""
    from inttrain.micro import MicroFormatError

    p = Path(path)
    if p.is_dir():
        if (p / "model.json").is_file():
            return "micro", p
        for name in ("best", "last"):
            c = p / "checkpoints" / f"{name}.safetensors"
            if c.is_file():
                return "checkpoint", c
        raise MicroFormatError(f"{p}: neither a model folder (model.json + weights.safetensors) nor a run folder "
                               "with checkpoints/best.safetensors or checkpoints/last.safetensors")
    if p.suffix == ".safetensors" and p.is_file():
        return "checkpoint", p
    if p.is_file():
        raise MicroFormatError(f"{p}: not a checkpoint this command reads ({p.suffix or 'no suffix'}); allowed: a run "
                               "folder, a model folder or the NAME.safetensors of a checkpoint pair (not its .state.pt)")
    raise MicroFormatError(f"{p}: not found; expected a run folder, a model folder or a .safetensors checkpoint")


def load_checkpoint_model(weights_path: str | Path):
    """(micro model, state) of an integer-only checkpoint, every field validated (one ``ValueError``)."""
    from inttrain import micro
    from inttrain.micro import MicroFormatError
    from inttrain.micro.model import set_params, validate_description
    from inttrain.trainer.checkpoint import load_checkpoint

    w_path = Path(weights_path)
    s_path = w_path.with_name(w_path.name.removesuffix(".safetensors") + ".state.pt")
    weights, state = load_checkpoint(w_path)               # CheckpointError (a ValueError) on a bad pair
    io = state.get("integer_only")
    if not isinstance(io, dict) or io.get("format") != CHECKPOINT_FORMAT:
        recipe = (state.get("config") or {}).get("recipe") if isinstance(state.get("config"), dict) else None
        raise MicroFormatError(f"{s_path}: not an integer-only checkpoint (recipe {recipe!r}); only models trained with "
                               "the integer-only recipe hold integer codes to export")
    desc = io.get("description")
    if not isinstance(desc, str):
        raise MicroFormatError(f"{s_path}: integer_only.description must be the model description as a JSON string")
    try:
        desc = json.loads(desc)
    except (json.JSONDecodeError, RecursionError) as e:
        raise MicroFormatError(f"{s_path}: integer_only.description is not valid JSON ({e})") from None
    if not isinstance(desc, dict):
        raise MicroFormatError(f"{s_path}: integer_only.description must be a JSON object")
    validate_description(desc, f"{s_path} (integer_only.description)")
    model = micro.Sequential.from_description(desc)
    tensors, moms, fracs = {}, {}, {}
    for k, t in weights.items():
        if t.dtype.is_floating_point or t.dtype.is_complex:
            raise MicroFormatError(f"{w_path}: tensor {k!r} is {t.dtype}; integer-only codes are integers")
        if k.startswith(_FRAC):
            fracs[k.removeprefix(_FRAC)] = t.numpy()
        else:
            (moms if k.startswith(_MOM) else tensors)[k.removeprefix(_MOM)] = t.numpy()
    set_params(model, io.get("params"), tensors, f"{s_path} (integer_only.params)", str(w_path))
    named = dict(model.named_params())
    for k, v in moms.items():
        if k not in named or v.dtype != np.int32 or v.shape != named[k].acc.shape:
            raise MicroFormatError(f"{w_path}: momentum buffer {k!r} ({v.dtype} {v.shape}) matches no parameter")
        if v.size and int(v.min()) < -(2**31 - 1):
            raise MicroFormatError(f"{w_path}: momentum buffer {k!r} holds -2**31 (momentum saturates at ±(2**31 - 1))")
        named[k].mom = v.copy()
    for k, v in fracs.items():
        if k not in named or v.dtype != np.int16 or v.shape != named[k].acc.shape:
            raise MicroFormatError(f"{w_path}: remainder {k!r} ({v.dtype} {v.shape}) matches no parameter")
        named[k].frac = v.copy()
    return model, state


def to_micro(src: str | Path):
    """The validated micro model of ``src`` (checkpoint, run folder or model folder)."""
    from inttrain import micro

    kind, path = resolve_source(src)
    return micro.load_model(path) if kind == "micro" else load_checkpoint_model(path)[0]


def import_micro(model_dir: str | Path, device=None):
    """Micro model folder -> :class:`inttrain.integer_only.Sequential` (validated by micro's loader)."""
    from inttrain import integer_only as T

    return T.Sequential.load(model_dir, device)


def export_model(src: str | Path, out_dir: str | Path) -> dict:
    """Write ``src``'s integer model in micro's format to ``out_dir`` and verify the written files.

    Returns a summary: ``{"out", "params", "weights", "layers"}``. The files are read back with
    :func:`inttrain.micro.load_model` (NumPy only); every code, exponent and bit width must be equal.
    """
    from inttrain import micro

    model = to_micro(src)
    out = micro.save_model(model, out_dir, {"exported_from": str(src)})
    back = micro.load_model(out)
    for (n, a), (_, b) in zip(model.named_params(), back.named_params()):
        if a.exp != b.exp or a.bits != b.bits or not np.array_equal(a.acc, b.acc):   # pragma: no cover - defensive
            raise RuntimeError(f"export verification failed for {n}")
    return {"out": out, "params": len(model.named_params()), "weights": sum(p.acc.size for p in model.params()),
            "layers": [s["type"] for s in model.desc["layers"]]}


def check_export_out(out: Path, force: bool, src: Path | None = None) -> None:
    """``--out`` must be new unless ``force``; a file, or the source itself, is never replaced by a model folder."""
    from .errors import UsageProblem

    if src is not None and out.exists() and src.exists() and out.resolve() in (src.resolve(), *src.resolve().parents):
        raise UsageProblem("--out", f"{str(out)!r} is (or holds) the source {str(src)!r}; allowed: another folder")
    if out.exists() and not force:
        raise UsageProblem("--out", f"{str(out)!r} already exists; allowed: a new path, or --force to replace "
                                    "it (the old model stays until the new one is complete)")
    if out.exists() and not out.is_dir():
        raise UsageProblem("--out", f"{str(out)!r} is a file; allowed: a folder path (the model is model.json + "
                                    "weights.safetensors)")


def run_export(src: Path, out: Path, data: Path | None = None, echo=print, force: bool = False) -> dict:
    """The ``inttrain export`` command: export, then (with ``data``) compare torch and micro predictions."""
    check_export_out(out, force, src)
    summary = export_model(src, out)
    echo(f"exported {summary['params']} tensors ({summary['weights']} integer weights; "
         f"{' '.join(summary['layers'])}) to {summary['out']}/model.json + weights.safetensors")
    if data is not None:
        from inttrain import integer_only as T
        from inttrain import micro
        from inttrain.micro.model import predict

        mm = micro.load_model(summary["out"])
        x, x_exp, y = micro.load_data(data, mm.desc["num_classes"])
        tm = T.Sequential.from_micro(to_micro(src))        # the torch model as trained, not re-read
        pm, pt = predict(mm, x, x_exp), T.predict(tm, x, x_exp).numpy()
        if not np.array_equal(pm, pt):
            raise RuntimeError(f"micro and torch predictions differ on {int((pm != pt).sum())} of {len(x)} samples")
        acc = float((pm == y).mean()) if len(y) else 0.0
        summary["accuracy"] = acc
        echo(f"check: micro and torch predict identically on {len(x)} samples of {data}; accuracy {acc:.4f}")
    return summary
