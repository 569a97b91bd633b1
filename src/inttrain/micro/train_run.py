"""The device CLI's ``train``: settings, every check before the first step, and the epoch loop with an atomic
checkpoint after each epoch (docs/integer-training.md §10)."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .augment import check_augment
from .checkpoint import load_run, save_run
from .errors import MicroFormatError
from .io import read_json
from .model import (EpochState, Sequential, check_input, evaluate, load_data, load_model, run_epoch,
                    validate_description)
from .optim import FRAC_BITS_MAX, SGD, Schedule, default_bn_lr_bits, saturation

_RANGES = {"epochs": (0, 1 << 20), "batch_size": (1, 1 << 24), "lr_bits": (0, 14), "bn_lr_bits": (0, 14),
           "lr_shift": (0, 62),
           "momentum_shift": (1, 16), "decay_shift": (1, 30), "l2_shift": (0, 30), "frac_bits": (1, FRAC_BITS_MAX), "step_every": (1, 1 << 20), "seed": (0, 2**32 - 1)}


def _fingerprint(x: np.ndarray, y: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(y).tobytes(), zlib.crc32(np.ascontiguousarray(x).tobytes()))


def _check_settings(s: dict) -> None:
    for key, (lo, hi) in _RANGES.items():
        v = s.get(key)
        if v is not None and not lo <= v <= hi:
            raise MicroFormatError(f"--{key.replace('_', '-')} {v}: allowed: {lo}..{hi}")
    if not (s["warmup_epochs"] >= 0 and math.isfinite(s["warmup_epochs"])):
        raise MicroFormatError(f"--warmup-epochs {s['warmup_epochs']}: allowed: a number >= 0")
    if s.get("nesterov") and s["momentum_shift"] is None:
        raise MicroFormatError("--nesterov: needs --momentum-shift M (Nesterov momentum is a form of momentum)")
    if s["keep_best"] and not s["val"]:
        raise MicroFormatError("--keep-best: needs --val VAL.npz (the best epoch is judged on validation accuracy)")


def _step_rule(s: dict, has_bn: bool) -> str:
    """The step rule as the training banner states it (the batch-norm step only for a model with batch norms)."""
    if s["lr_mode"] != "norm":
        return f"lr 2^-{s['lr_shift']}"
    bn = f", 2^{s['bn_lr_bits']} for batch-norm gamma/beta" if has_bn and s.get("bn_lr_bits") is not None else ""
    return f"largest step 2^{s['lr_bits']} codes{bn}"


def _new_run(args, defaults: dict, rounding_opts: tuple) -> tuple[Sequential, dict, Path]:
    if not args.model or not args.data:
        raise MicroFormatError("train: needs MODEL and DATA (or --resume DIR to continue a run)")
    if not args.out:
        raise MicroFormatError("train: --out DIR is required (where the model and its checkpoints go)")
    s = {k: (getattr(args, k) if getattr(args, k) is not None else v) for k, v in defaults.items()}
    s.update(data=str(Path(args.data).resolve()), val=str(Path(args.val).resolve()) if args.val else None,
             keep_best=bool(args.keep_best))
    if s["step_every"] is None:
        s["step_every"] = max(1, s["epochs"] // 3)
    if s["bn_lr_bits"] is None:         # recorded as a number: runs saved before the option resume with lr_bits
        s["bn_lr_bits"] = default_bn_lr_bits(s["lr_bits"])
    _check_settings(s)
    out = Path(args.out)
    if out.exists() and not args.force:     # judged before training, not after an hour of it
        raise MicroFormatError(f"--out {args.out}: already exists; allowed: a new path, --force to replace it, "
                               "or --resume to continue the run saved there")
    rounding = {o.split("_")[0]: getattr(args, o) for o in rounding_opts if getattr(args, o) is not None}
    src = Path(args.model)
    if src.is_dir():
        model = load_model(src, rounding)
    else:
        desc = read_json(src)
        validate_description(desc, str(src))
        if rounding:
            desc = {**desc, "rounding": {**(desc.get("rounding") or {}), **rounding}}
        model = Sequential.from_description(desc, str(src))
    state = {"settings": s, "epoch": 0, "position": EpochState().to_dict(), "epoch_seconds": 0.0,
             "global_step": 0, "history": [], "best": None}
    return model, state, out


def _resume(args, defaults: dict, rounding_opts: tuple) -> tuple[Sequential, dict, Path]:
    extra = [k for k in (*defaults, *rounding_opts) if getattr(args, k) is not None]
    extra += [k for k in ("model", "data", "out", "val", "keep_best") if getattr(args, k)]
    extra += ["force"] if args.force else []
    if extra:
        names = ", ".join(k if k in ("model", "data") else "--" + k.replace("_", "-") for k in extra)
        raise MicroFormatError(f"--resume {args.resume}: continues with the run's recorded settings, so {names} "
                               "cannot be given; allowed with --resume: --max-seconds, --log-every")
    model, state = load_run(args.resume)
    return model, state, Path(args.resume)


def _sat_text(model: Sequential) -> tuple[str, int, dict]:
    sat = saturation(model.params())
    total, size = sum(a for a, _ in sat), sum(n for _, n in sat)
    per = {name: (a, n) for (name, _), (a, n) in zip(model.named_params(), sat) if a}
    text = f"sat {total}/{size}"
    if per:
        text += " (" + ", ".join(f"{k} {a}/{n}" for k, (a, n) in per.items()) + ")"
    return text, total, {k: a for k, (a, _) in per.items()}


def _clock(sec: float) -> str:
    sec = int(round(sec))
    return f"{sec // 3600}h{sec // 60 % 60:02d}m{sec % 60:02d}s" if sec >= 3600 else f"{sec // 60}m{sec % 60:02d}s"


def _copy(model: Sequential) -> Sequential:
    """A model with a copy of ``model``'s master codes and exponents (no momentum)."""
    m = Sequential.from_description(model.desc)
    for mp, p in zip(m.params(), model.params()):
        mp.acc, mp.exp = p.acc.copy(), p.exp
    return m


def _checked_data(model: Sequential, state: dict, resumed: bool) -> tuple:
    """(x, x_exp, y, val or None, augment) of a run, each judged against the model (and, resumed, the
    checkpoint's data fingerprint) before any training."""
    s = state["settings"]
    n_cls = model.desc["num_classes"]
    x, x_exp, y = load_data(s["data"], n_cls)
    val = load_data(s["val"], n_cls) if s["val"] else None
    check_input(model, x, s["data"])
    if val is not None:
        check_input(model, val[0], s["val"])
    model.check_batch(s["batch_size"])
    augment = s.get("augment")                               # runs saved before --augment existed have none
    check_augment(augment, model.desc["input_shape"])
    fp = _fingerprint(x, y)
    if resumed and state.get("data_crc32") not in (None, fp):
        raise MicroFormatError(f"{s['data']}: its contents changed since the checkpoint (crc32 {fp} != "
                               f"{state['data_crc32']}); a resumed run needs the same data")
    state["data_crc32"] = fp
    return x, x_exp, y, val, augment


@contextlib.contextmanager
def stop_on_signals() -> Iterator[list[int]]:
    """While training, SIGTERM / SIGINT end the run at the next step with a mid-epoch checkpoint (resumed bit for
    bit, as after ``--max-seconds``) instead of killing it and losing the epoch so far.  Yields the list the
    handler appends each caught signal to; the previous handlers come back afterwards."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():    # handlers can only be set there
        yield caught
        return
    previous = {sig: signal.signal(sig, lambda signum, _frame: caught.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield caught
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_train(args, defaults: dict, rounding_opts: tuple, peak_mib, signals: list[int] | None = None) -> int:
    """``python -m inttrain.micro train``: checks everything, then trains, checkpointing OUT after each epoch.
    Returns 0, or 128 + the signal when one in ``signals`` (see :func:`stop_on_signals`) stopped it early."""
    if args.log_every is not None and args.log_every < 0:
        raise MicroFormatError(f"--log-every {args.log_every}: allowed: >= 0")
    if args.max_seconds is not None and not args.max_seconds >= 0:
        raise MicroFormatError(f"--max-seconds {args.max_seconds}: allowed: >= 0")
    model, state, out = (_resume if args.resume else _new_run)(args, defaults, rounding_opts)
    s = state["settings"]
    x, x_exp, y, val, augment = _checked_data(model, state, bool(args.resume))
    opt = SGD(model.params(), s["lr_shift"], s["momentum_shift"], model.desc["rounding"]["update"],
              lr_mode=s["lr_mode"], lr_bits=s["lr_bits"], adapt_exp=s["adapt_exp"], decay_shift=s["decay_shift"],
              bn_lr_bits=s.get("bn_lr_bits"),                 # runs saved before --bn-lr-bits: lr_bits for all
              l2_shift=s.get("l2_shift"),                     # and before --l2-shift: none
              frac_bits=s.get("frac_bits"),                   # and before --frac-bits: none
              nesterov=bool(s.get("nesterov")))               # and before --nesterov: plain momentum
    spe = -(-len(x) // s["batch_size"])                      # steps per epoch
    epochs = s["epochs"]
    sched = Schedule(s["schedule"], max(1, epochs * spe), int(round(s["warmup_epochs"] * spe)), s["step_every"] * spe)
    best = None
    if args.resume and s["keep_best"] and state["best"] is not None:
        best = load_model(out)                               # the folder's model files are the best epoch's
    rule = _step_rule(s, any(p.role == "norm" for p in model.params()))
    print(f"train: {len(x)} samples, {sum(p.acc.size for p in model.params())} weights, "
          f"{model.desc['weight_bits']}-bit weight accumulators, {s['lr_mode']} rule ({rule}), {s['schedule']} "
          f"schedule, {spe} steps/epoch, rounding {'/'.join(model.desc['rounding'].values())}"
          + (f", {'Nesterov ' if s.get('nesterov') else ''}momentum 1 - 2^-{s['momentum_shift']}"
             if s["momentum_shift"] is not None else "")
          + (f", L2 2^-{s['l2_shift']}" if s.get("l2_shift") is not None else "")
          + (f", {s['frac_bits']} fraction bits below each master code" if s.get("frac_bits") else "")
          + (f", {model.err_bits}-bit errors" if model.err_bits != 8 else "")
          + (", int8 weight views at each tensor's own shift" if model.desc.get("weight_view") == "tensor" else "")
          + (f", augment {augment}" if augment not in (None, "none") else "")
          + (f"; resuming at epoch {state['epoch'] + 1} step {state['position']['step']}" if args.resume else ""),
          flush=True)
    t_start = time.perf_counter()
    steps_here = 0
    signals = [] if signals is None else signals
    limit = math.inf if args.max_seconds is None else args.max_seconds
    stop = lambda: bool(signals) or time.perf_counter() - t_start >= limit  # noqa: E731
    info = lambda: {"history": state["history"], "train": s, **(  # noqa: E731
        {"best_epoch": state["best"]["epoch"], "best_val_acc": state["best"]["val_acc"]} if state["best"] else {})}
    while state["epoch"] < epochs:
        ep = state["epoch"]
        t0 = time.perf_counter()
        pos = EpochState(**state["position"])
        step0 = pos.step
        pos = run_epoch(model, opt, x, x_exp, y, s["batch_size"], s["seed"] + ep, pos,
                        log=lambda line: print(line, flush=True), log_every=args.log_every, schedule=sched,
                        global_step=ep * spe, stop=stop, augment=augment)
        steps_here += pos.step - step0
        state["epoch_seconds"] += time.perf_counter() - t0
        state["global_step"] = ep * spe + pos.step
        if not pos.done:                         # --max-seconds or a signal: checkpoint mid-epoch and stop
            state["position"] = pos.to_dict()
            save_run(out, model, state, best if s["keep_best"] else None, info())
            why = signal.Signals(signals[0]).name if signals else "--max-seconds"
            print(f"stopped after {time.perf_counter() - t_start:.1f}s ({why}) at epoch {ep + 1} step "
                  f"{pos.step}/{spe}; continue with: python -m inttrain.micro train --resume {out}", flush=True)
            return 128 + signals[0] if signals else 0
        sat, sat_total, sat_layers = _sat_text(model)
        row = {"epoch": ep + 1, "loss": pos.loss, "train_acc": pos.accuracy, "seconds": state["epoch_seconds"],
               "saturated": sat_total, "saturated_layers": sat_layers, "lr_multiplier": opt.multiplier}
        line = f"epoch {ep + 1}/{epochs} loss {pos.loss:.4f} train_acc {pos.accuracy:.4f}"
        if val is not None:
            row["val_acc"] = evaluate(model, *val)
            line += f" val_acc {row['val_acc']:.4f}"
            if state["best"] is None or row["val_acc"] > state["best"]["val_acc"]:
                state["best"] = {"epoch": ep + 1, "val_acc": row["val_acc"]}
                if s["keep_best"]:
                    best = _copy(model)
        state["history"].append(row)
        state.update(epoch=ep + 1, position=EpochState().to_dict(), epoch_seconds=0.0)
        save_run(out, model, state, best if s["keep_best"] else None, info())
        left = (epochs * spe - state["global_step"]) * (time.perf_counter() - t_start) / max(1, steps_here)
        print(f"{line} {sat} lr x{opt.multiplier}/256 time {row['seconds']:.2f}s eta {_clock(left)} "
              f"peak_mem {peak_mib():.1f} MiB", flush=True)
    b = state["best"]
    kept = f" (best epoch {b['epoch']}, val_acc {b['val_acc']:.4f})" if s["keep_best"] and b else ""
    if epochs == 0 or state["global_step"] == 0:
        save_run(out, model, state, None, info())
    print(f"saved {out}{kept}", flush=True)
    return 0
