"""Sequential model, its JSON layer description, data loading and the train/eval loops."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .augment import augment_batch
from .errors import MicroFormatError
from .io import read_json, read_npz, read_safetensors, write_safetensors
from .layers import (BN_MAX_COUNT, MAX_GAIN_SHIFT, MAX_K, MAX_POOL_WINDOW, AvgPool2d, BatchNorm, Conv2d, Flatten, Layer, Linear, MaxPool2d, ReLU, Residual,
                     WEIGHT_VIEWS, SequentialCore)
from .loss import display_loss, softmax_cross_entropy_grad
from .ops import ROUNDING_MODES, IntTensor, qmax

FORMAT = "inttrain.micro/1"
MAX_EXP = 64                       # |scale exponent| bound for weights and data
MAX_DIM = 1 << 16
MAX_LAYERS = 64
MAX_DEPTH = 4                      # residual nesting
# backward hstoch: rne sends every error below half a step to 0 and the net stops fitting what it has nearly
# learned; NITI's pseudo-stochastic rounding blows up deeper nets (docs §7, "Choosing the defaults")
DEFAULT_ROUNDING = {"forward": "rne", "backward": "hstoch", "update": "pstoch"}


def _int(d: dict, key: str, lo: int, hi: int, where: str, default: int | None = None) -> int:
    v = d.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise MicroFormatError(f"{where}: {key!r} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _conv_spec(spec: dict, cur: tuple, w: str, nxt) -> tuple[dict, tuple]:
    """A validated conv2d spec on input shape ``cur`` and its output shape; ``nxt``: the next layer's spec."""
    ci = _int(spec, "in_channels", 1, 4096, w)
    co = _int(spec, "out_channels", 1, 4096, w)
    k = _int(spec, "kernel_size", 1, 15, w)
    st = _int(spec, "stride", 1, 15, w, 1)
    p = _int(spec, "padding", 0, 15, w, 0)
    if len(cur) != 3 or cur[0] != ci:
        raise MicroFormatError(f"{w}: conv2d expects input ({ci}, H, W), gets {cur}")
    if ci * k * k > MAX_K or co * (-(-k // st)) ** 2 > MAX_K:
        raise MicroFormatError(f"{w}: reduction too long for int32 accumulators")
    oh, ow = (cur[1] + 2 * p - k) // st + 1, (cur[2] + 2 * p - k) // st + 1
    if oh < 1 or ow < 1:
        raise MicroFormatError(f"{w}: output would be empty for input {cur}")
    s = {"type": "conv2d", "in_channels": ci, "out_channels": co, "kernel_size": k, "stride": st, "padding": p}
    out_bits = spec.get("out_bits", 8)
    if out_bits not in (8, 16) or isinstance(out_bits, bool):
        raise MicroFormatError(f"{w}: out_bits must be 8 or 16, got {out_bits!r}")
    if out_bits == 16:                               # written only when set: older descriptions stay as they were
        if not (isinstance(nxt, dict) and nxt.get("type") == "batchnorm"):
            raise MicroFormatError(f"{w}: out_bits 16 needs a batchnorm as the next layer (only it takes 16-bit codes)")
        s["out_bits"] = 16
    return s, (co, oh, ow)


def _validate_layers(layers: list, cur: tuple, where: str, depth: int) -> tuple[list, tuple]:
    """Validate a list of layer specs from input shape ``cur``; returns (normalized specs, output shape)."""
    norm = []
    for i, spec in enumerate(layers):
        w = f"{where}: layer {i}"
        if not isinstance(spec, dict):
            raise MicroFormatError(f"{w}: must be an object")
        kind = spec.get("type")
        if kind == "linear":
            fi = _int(spec, "in_features", 1, MAX_K, w)
            fo = _int(spec, "out_features", 1, MAX_K, w)
            if cur != (fi,):
                raise MicroFormatError(f"{w}: linear expects input ({fi},), gets {cur}")
            s = {"type": kind, "in_features": fi, "out_features": fo}
            cur = (fo,)
        elif kind == "conv2d":
            s, cur = _conv_spec(spec, cur, w, layers[i + 1] if i + 1 < len(layers) else None)
        elif kind == "maxpool2d":
            k = _int(spec, "kernel_size", 1, 15, w, 2)
            if len(cur) != 3 or cur[1] < k or cur[2] < k:
                raise MicroFormatError(f"{w}: maxpool2d expects (C, H, W) with H, W >= {k}, gets {cur}")
            s = {"type": kind, "kernel_size": k}
            cur = (cur[0], cur[1] // k, cur[2] // k)
        elif kind == "avgpool2d":
            k = _int(spec, "kernel_size", 1, 15, w, 2)
            if len(cur) != 3 or cur[1] < k or cur[2] < k:
                raise MicroFormatError(f"{w}: avgpool2d expects (C, H, W) with H, W >= {k}, gets {cur}")
            s = {"type": kind, "kernel_size": k}
            cur = (cur[0], cur[1] // k, cur[2] // k)
        elif kind == "globalavgpool2d":
            if len(cur) != 3 or cur[1] * cur[2] > MAX_POOL_WINDOW:
                raise MicroFormatError(f"{w}: globalavgpool2d expects (C, H, W) with H * W <= {MAX_POOL_WINDOW}, gets {cur}")
            s = {"type": kind}
            cur = (cur[0], 1, 1)
        elif kind == "relu":
            s = {"type": kind}
        elif kind == "flatten":
            s = {"type": kind}
            cur = (int(np.prod(cur)),)
        elif kind == "batchnorm":
            c = _int(spec, "num_features", 1, MAX_DIM, w)
            if cur[0] != c:
                raise MicroFormatError(f"{w}: batchnorm with {c} features gets input {cur}")
            s = {"type": kind, "num_features": c}
            gain = _int(spec, "gain_shift", 0, MAX_GAIN_SHIFT, w, 0)
            if gain:                                 # written only when set: older descriptions stay as they were
                s["gain_shift"] = gain
        elif kind == "residual":
            if depth >= MAX_DEPTH:
                raise MicroFormatError(f"{w}: residuals nested deeper than {MAX_DEPTH}")
            block, short = spec.get("layers"), spec.get("shortcut", [])
            if not isinstance(block, list) or not 1 <= len(block) <= MAX_LAYERS:
                raise MicroFormatError(f"{w}: residual needs 'layers', a list of 1..{MAX_LAYERS} layer objects")
            if not isinstance(short, list) or len(short) > MAX_LAYERS:
                raise MicroFormatError(f"{w}: residual 'shortcut' must be a list of layer objects")
            nb, ob = _validate_layers(block, cur, f"{w} (residual block)", depth + 1)
            ns, os_ = _validate_layers(short, cur, f"{w} (residual shortcut)", depth + 1)
            if ob != os_:
                raise MicroFormatError(f"{w}: residual block outputs {ob} but the shortcut outputs {os_}")
            s = {"type": kind, "layers": nb, "shortcut": ns}
            cur = ob
        else:
            raise MicroFormatError(f"{w}: unknown layer type {kind!r}")
        extra = set(spec) - set(s) - ({"out_bits"} if kind == "conv2d" else set())   # out_bits 8: the default, dropped
        if extra:
            raise MicroFormatError(f"{w}: unknown keys {sorted(extra)}")
        norm.append(s)
    return norm, cur


def validate_description(desc: dict, where: str = "model description") -> dict:
    """Check a layer description and return it normalized (defaults filled in)."""
    if not isinstance(desc, dict):
        raise MicroFormatError(f"{where}: must be a JSON object")
    if desc.get("format", FORMAT) != FORMAT:
        raise MicroFormatError(f"{where}: format {desc.get('format')!r} is not {FORMAT!r}")
    shape = desc.get("input_shape")
    if (not isinstance(shape, list) or len(shape) not in (1, 3)
            or not all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= MAX_DIM for d in shape)):
        raise MicroFormatError(f"{where}: input_shape must be [features] or [C, H, W] of positive integers <= {MAX_DIM}")
    bits = desc.get("weight_bits", 16)
    if bits not in (8, 16) or isinstance(bits, bool):
        raise MicroFormatError(f"{where}: weight_bits must be 8 or 16, got {bits!r}")
    given = desc.get("rounding") or {}
    if not isinstance(given, dict):
        raise MicroFormatError(f"{where}: rounding must be an object mapping forward/backward/update to one of "
                               f"{ROUNDING_MODES}, got {type(given).__name__}")
    rounding = {**DEFAULT_ROUNDING, **given}
    if set(rounding) != set(DEFAULT_ROUNDING) or not all(isinstance(v, str) and v in ROUNDING_MODES
                                                         for v in rounding.values()):
        raise MicroFormatError(f"{where}: rounding must map forward/backward/update to one of {ROUNDING_MODES}")
    seed = _int(desc, "seed", 0, 2**32 - 1, where, 0)
    error_bits = desc.get("error_bits", 8)
    if error_bits not in (8, 16) or isinstance(error_bits, bool):
        raise MicroFormatError(f"{where}: error_bits must be 8 or 16, got {error_bits!r}")
    weight_view = desc.get("weight_view", "fixed")
    if weight_view not in WEIGHT_VIEWS:
        raise MicroFormatError(f"{where}: weight_view must be one of {list(WEIGHT_VIEWS)}, got {weight_view!r}")
    unknown = set(desc) - {"format", "input_shape", "weight_bits", "rounding", "seed", "layers", "num_classes",
                           "error_bits", "weight_view"}
    if unknown:
        raise MicroFormatError(f"{where}: unknown keys {sorted(unknown)} (a saved model is loaded as a directory)")
    layers = desc.get("layers")
    if not isinstance(layers, list) or not 1 <= len(layers) <= MAX_LAYERS:
        raise MicroFormatError(f"{where}: layers must be a list of 1..{MAX_LAYERS} layer objects")
    norm, cur = _validate_layers(layers, tuple(shape), where, depth=0)
    if len(cur) != 1:
        raise MicroFormatError(f"{where}: the last layer must output class scores (got shape {cur}); add flatten/linear")
    if "num_classes" in desc and desc["num_classes"] != cur[0]:
        raise MicroFormatError(f"{where}: num_classes {desc['num_classes']!r} but the layers output {cur[0]}")
    out = {"format": FORMAT, "input_shape": list(shape), "num_classes": cur[0], "weight_bits": bits,
           "rounding": rounding, "seed": seed, "layers": norm}
    if error_bits == 16:                             # written only when set: older descriptions stay as they were
        out["error_bits"] = 16
    if weight_view != "fixed":
        out["weight_view"] = weight_view
    check_memory(out, 1, where)  # before a single weight is drawn
    return out


def build_layers(specs: list[dict], bits: int, r: dict, rng: np.random.Generator, error_bits: int = 8) -> list[Layer]:
    """Layers of validated specs; weights are drawn from ``rng`` layer by layer (residual: block, then shortcut).
    ``error_bits``: the width of the errors every layer hands back (8, or 16: docs §7)."""
    layers: list[Layer] = []
    for s in specs:
        t = s["type"]
        if t == "linear":
            layers.append(Linear(s["in_features"], s["out_features"], bits, rng, r["forward"], r["backward"]))
        elif t == "conv2d":
            layers.append(Conv2d(s["in_channels"], s["out_channels"], s["kernel_size"], s["stride"], s["padding"],
                                 bits, rng, r["forward"], r["backward"], s.get("out_bits", 8)))
        elif t == "maxpool2d":
            layers.append(MaxPool2d(s["kernel_size"]))
        elif t == "avgpool2d":
            layers.append(AvgPool2d(s["kernel_size"], False, r["forward"], r["backward"]))
        elif t == "globalavgpool2d":
            layers.append(AvgPool2d(0, True, r["forward"], r["backward"]))
        elif t == "relu":
            layers.append(ReLU())
        elif t == "batchnorm":
            layers.append(BatchNorm(s["num_features"], bits, r["forward"], r["backward"], s.get("gain_shift", 0)))
        elif t == "residual":
            block = build_layers(s["layers"], bits, r, rng, error_bits)
            layers.append(Residual(block, build_layers(s["shortcut"], bits, r, rng, error_bits), r["forward"],
                                   r["backward"]))
        else:
            layers.append(Flatten())
        layers[-1].err_bits = error_bits
    return layers


def memory_limit_bytes() -> int:
    """80% of physical memory (16 GiB where the OS does not say): what a description may ask for."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.8)
    except (ValueError, OSError, AttributeError):
        return 16 << 30


#: Bytes per parameter (int32 master + int32 momentum + int8 codes + int32 gradient) and per activation
#: element kept for backward (int8 codes + int32 accumulator of its gradient), per example.
PARAM_BYTES, ACT_BYTES = 13, 5


def layer_sizes(specs: list[dict], shape: tuple) -> tuple[int, int, tuple, int]:
    """(parameters, activation elements per example, output shape, how many of those elements are 16-bit codes:
    the outputs of convolutions with ``out_bits`` 16) of validated ``specs`` on ``shape``."""
    params = acts = wide = 0
    for s in specs:
        t = s["type"]
        if t == "linear":
            params += s["in_features"] * s["out_features"] + s["out_features"]
            shape = (s["out_features"],)
        elif t == "conv2d":
            kk, st, p = s["kernel_size"], s["stride"], s["padding"]
            params += s["out_channels"] * (s["in_channels"] * kk * kk + 1)
            shape = (s["out_channels"], (shape[1] + 2 * p - kk) // st + 1, (shape[2] + 2 * p - kk) // st + 1)
            if s.get("out_bits", 8) == 16:
                wide += int(np.prod(shape, dtype=object))
        elif t in ("maxpool2d", "avgpool2d"):
            shape = (shape[0], shape[1] // s["kernel_size"], shape[2] // s["kernel_size"])
        elif t == "globalavgpool2d":
            shape = (shape[0], 1, 1)
        elif t == "flatten":
            shape = (int(np.prod(shape, dtype=object)),)
        elif t == "batchnorm":
            params += 2 * s["num_features"]
        elif t == "residual":
            p1, a1, out, w1 = layer_sizes(s["layers"], shape)
            p2, a2, _, w2 = layer_sizes(s["shortcut"], shape)
            params, acts, shape, wide = params + p1 + p2, acts + a1 + a2, out, wide + w1 + w2
            continue
        acts += int(np.prod(shape, dtype=object))
    return params, acts, shape, wide


def check_memory(desc: dict, batch_size: int, where: str, limit: int | None = None) -> None:
    """MicroFormatError if the model's parameters and a batch's activations would not fit ``limit`` bytes."""
    limit = memory_limit_bytes() if limit is None else limit
    params, acts, _, wide = layer_sizes(desc["layers"], tuple(desc["input_shape"]))
    per_act = ACT_BYTES + (desc.get("error_bits", 8) == 16)         # a 16-bit error code: one byte more
    act_bytes = (acts + int(np.prod(desc["input_shape"], dtype=object))) * per_act + wide    # a 16-bit code: one more
    need = params * PARAM_BYTES + act_bytes * batch_size
    if need > limit:
        raise MicroFormatError(f"{where}: {params:,} parameters and {acts:,} activations per example at batch "
                               f"{batch_size} need {need / 2**30:.3g} GiB; allowed: at most {limit / 2**30:.3g} GiB "
                               "(80% of physical memory): shrink the layers, the input or the batch")


def check_batch_layers(specs: list[dict], shape: tuple, batch_size: int) -> tuple:
    """Raise ValueError if a weight-gradient / batch-statistics reduction would break int32 (§8); returns the output shape."""
    for s in specs:
        t = s["type"]
        k, lim = 0, MAX_K
        if t == "linear":
            shape, k = (s["out_features"],), batch_size
        elif t == "conv2d":
            kk, st, p = s["kernel_size"], s["stride"], s["padding"]
            shape = (s["out_channels"], (shape[1] + 2 * p - kk) // st + 1, (shape[2] + 2 * p - kk) // st + 1)
            k = batch_size * shape[1] * shape[2]
        elif t in ("maxpool2d", "avgpool2d"):
            kk = s["kernel_size"]
            shape = (shape[0], shape[1] // kk, shape[2] // kk)
        elif t == "globalavgpool2d":
            shape = (shape[0], 1, 1)
        elif t == "flatten":
            shape = (int(np.prod(shape)),)
        elif t == "batchnorm":
            k, lim = batch_size * int(np.prod(shape[1:])), BN_MAX_COUNT
        elif t == "residual":
            check_batch_layers(s["shortcut"], shape, batch_size)
            shape = check_batch_layers(s["layers"], shape, batch_size)
        if k > lim:
            what = "batch-statistics" if t == "batchnorm" else "weight-gradient"
            raise ValueError(f"batch size {batch_size} makes a {what} reduction of {k} > {lim} ({t})")
    return shape


def max_batch(desc: dict, limit: int | None = None) -> int:
    """The largest batch size ``check_batch`` accepts for a validated description (int32 reductions, memory)."""
    lo, hi = 1, 1
    while hi < (1 << 40) and _batch_ok(desc, hi * 2, limit):
        hi *= 2
    hi *= 2                                           # ok(lo) (validated descriptions accept batch 1), not ok(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _batch_ok(desc, mid, limit) else (lo, mid)
    return lo


def _batch_ok(desc: dict, batch_size: int, limit: int | None) -> bool:
    try:
        check_batch_layers(desc["layers"], tuple(desc["input_shape"]), batch_size)
        check_memory(desc, batch_size, "", limit)
    except ValueError:
        return False
    return True


class Sequential(SequentialCore):
    """The NumPy engine's model: :class:`~inttrain.micro.layers.SequentialCore` built from a description."""

    @classmethod
    def from_description(cls, desc: dict, where: str = "model description") -> "Sequential":
        d = validate_description(desc, where)
        rng = np.random.default_rng(d["seed"])
        layers = build_layers(d["layers"], d["weight_bits"], d["rounding"], rng, d.get("error_bits", 8))
        return cls(layers, d)

    def check_batch(self, batch_size: int) -> None:
        """Weight-gradient reductions run over batch (x output pixels): keep them int32-safe; and a batch's
        activations must fit in memory. The error names the largest batch the model allows."""
        try:
            check_batch_layers(self.desc["layers"], tuple(self.desc["input_shape"]), batch_size)
            check_memory(self.desc, batch_size, f"--batch-size {batch_size}")
        except ValueError as e:
            raise type(e)(f"{e}; the largest batch this model allows is {max_batch(self.desc)}") from None


def check_input(model: Sequential, x: np.ndarray, where: str = "data") -> None:
    """MicroFormatError unless the samples of ``x`` have the model's input shape (with a hint for the usual
    mistakes: a missing channel axis, images for a linear-first model)."""
    got, want = tuple(x.shape[1:]), tuple(model.desc["input_shape"])
    if got == want:
        return
    hint = ""
    if len(want) == 3 and got == want[1:] and want[0] == 1:
        hint = "; add the channel axis (x[:, None]) or write the data with `python -m inttrain.micro convert`"
    elif len(want) == 1 and int(np.prod(got)) == want[0]:
        hint = "; flatten the samples (x.reshape(len(x), -1)) or use `convert --flatten`"
    raise MicroFormatError(f"{where}: x has sample shape {got}, model wants {want}{hint}")


def _check_input(model: Sequential, x: np.ndarray, x_exp: int) -> None:
    check_input(model, x)


def train_epoch(model: Sequential, opt, x: np.ndarray, x_exp: int, y: np.ndarray, batch_size: int,
                seed: int = 0, log=None, log_every: int = 0, schedule=None, global_step: int = 0,
                augment: str | None = None) -> tuple[float, float]:
    """One pass over shuffled data; returns (mean display loss, training accuracy).

    ``schedule`` (an :class:`inttrain.micro.optim.Schedule`): sets ``opt.multiplier`` before each step from the
    global step ``global_step + i``; ``augment``: ``"crop-flip"`` or None (:mod:`inttrain.micro.augment`)."""
    r = run_epoch(model, opt, x, x_exp, y, batch_size, seed, log=log, log_every=log_every, schedule=schedule,
                  global_step=global_step, augment=augment)
    return r.loss, r.accuracy


class EpochState:
    """Progress through one epoch: steps done and the running display-loss sum / correct count (so an epoch
    stopped and resumed mid-way reports the same numbers as an uninterrupted one)."""

    def __init__(self, step: int = 0, loss_sum: float = 0.0, correct: int = 0, seen: int = 0, done: bool = False):
        self.step, self.loss_sum, self.correct, self.seen, self.done = step, loss_sum, correct, seen, done

    def to_dict(self) -> dict:
        return {"step": self.step, "loss_sum": self.loss_sum, "correct": self.correct, "seen": self.seen}

    @property
    def loss(self) -> float:
        return self.loss_sum / max(1, self.step)

    @property
    def accuracy(self) -> float:
        return self.correct / max(1, self.seen)


def run_epoch(model: Sequential, opt, x: np.ndarray, x_exp: int, y: np.ndarray, batch_size: int, seed: int,
              state: EpochState | None = None, log=None, log_every: int = 0, schedule=None, global_step: int = 0,
              stop=None, augment: str | None = None) -> EpochState:
    """The steps of one epoch (order ``default_rng(seed).permutation``) from ``state.step`` on.

    ``global_step``: the run's step count at this epoch's first step (for ``schedule``); ``stop()``: checked
    after every step, True ends the epoch early (``state.done`` stays False and ``state.step`` says where to
    continue).  ``augment``: ``"crop-flip"`` augments each batch (:mod:`inttrain.micro.augment`; draws from
    ``(seed, step)``, so a resumed epoch sees the same images)."""
    _check_input(model, x, x_exp)
    model.check_batch(batch_size)
    st = state if state is not None else EpochState()
    order = np.random.default_rng(seed).permutation(len(x))
    starts = range(0, len(x), batch_size)
    recent: list[float] = []
    for step in range(st.step, len(starts)):
        idx = order[starts[step]:starts[step] + batch_size]
        if schedule is not None:
            opt.multiplier = schedule.multiplier(global_step + step)
        logits = model.forward(IntTensor(augment_batch(x[idx], augment, seed, step), x_exp))
        err, _ = softmax_cross_entropy_grad(logits, y[idx], bits=model.err_bits)
        model.backward(err)
        opt.step()
        loss = display_loss(logits, y[idx])
        st.loss_sum += loss
        st.correct += int((logits.q.argmax(axis=1) == y[idx]).sum())
        st.seen += len(idx)
        st.step = step + 1
        recent.append(loss)
        if log and log_every and st.step % log_every == 0:
            log(f"  step {st.step} loss {np.mean(recent[-log_every:]):.4f}")
        if stop is not None and st.step < len(starts) and stop():
            return st
    st.done = True
    return st


def predict(model: Sequential, x: np.ndarray, x_exp: int, batch_size: int = 256) -> np.ndarray:
    _check_input(model, x, x_exp)
    out = [model.forward(IntTensor(x[i:i + batch_size], x_exp)).q.argmax(axis=1) for i in range(0, len(x), batch_size)]
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def evaluate(model: Sequential, x: np.ndarray, x_exp: int, y: np.ndarray, batch_size: int = 256) -> float:
    return float((predict(model, x, x_exp, batch_size) == y).mean()) if len(x) else 0.0


def load_data(path: str | os.PathLike, num_classes: int | None = None) -> tuple[np.ndarray, int, np.ndarray]:
    """DATA.npz with x (int8 codes in [-127, 127], shape (N, ...)), x_exp (integer scalar), y (N,) labels."""
    arrs = read_npz(path)
    where = str(path)
    for key in ("x", "x_exp", "y"):
        if key not in arrs:
            raise MicroFormatError(f"{where}: missing array {key!r} (need x, x_exp, y)")
    x, xe, y = arrs["x"], arrs["x_exp"], arrs["y"]
    if x.dtype != np.int8 or x.ndim < 2:
        raise MicroFormatError(f"{where}: x must be int8 codes of shape (N, ...), got {x.dtype} {x.shape}")
    if x.size and int(x.min()) < -127:
        raise MicroFormatError(f"{where}: x holds -128; codes are symmetric [-127, 127]")
    if xe.shape != () or xe.dtype.kind not in "iu" or not -MAX_EXP <= int(xe) <= MAX_EXP:
        raise MicroFormatError(f"{where}: x_exp must be an integer scalar in [-{MAX_EXP}, {MAX_EXP}]")
    if y.ndim != 1 or y.dtype.kind not in "iu" or len(y) != len(x):
        raise MicroFormatError(f"{where}: y must be integer labels of shape ({len(x)},)")
    if num_classes is not None and len(y) and not (0 <= int(y.min()) and int(y.max()) < num_classes):
        raise MicroFormatError(f"{where}: labels must be in [0, {num_classes})")
    return x, int(xe), y.astype(np.int64)


def write_dir_atomic(out_dir: str | os.PathLike, write) -> Path:
    """Fill a fresh folder with ``write(tmp_path)`` and rename it into place as ``out_dir``.

    The folder is written complete under a temporary name next to OUT_DIR, then renamed into place
    (an existing OUT_DIR is moved aside first and removed after): a killed save leaves the old folder
    or the new one, never a mix. Leftover ``.OUT_DIR.tmp-*`` folders of killed saves are removed here.
    """
    import shutil
    import tempfile

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        write(tmp)
        old = None
        if out.exists():
            old = out.parent / f"{tmp.name}-old"
            os.replace(out, old)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
    return out


def model_doc(model: Sequential, extra: dict | None = None) -> dict:
    """The ``model.json`` document of ``model``: its description, parameter formats and ``info`` (``extra``)."""
    doc = dict(model.desc)
    doc["params"] = {n: {"bits": p.bits, "exp": p.exp, "shape": list(p.acc.shape)} for n, p in model.named_params()}
    if extra:
        doc["info"] = extra
    return doc


def write_model_files(model: Sequential, folder: Path, extra: dict | None = None) -> None:
    """``folder/model.json`` and ``folder/weights.safetensors`` of ``model`` (no atomicity of their own)."""
    write_safetensors(folder / "weights.safetensors", {n: p.acc for n, p in model.named_params()}, {"format": FORMAT})
    (folder / "model.json").write_text(json.dumps(model_doc(model, extra), indent=1))


def save_model(model: Sequential, out_dir: str | os.PathLike, extra: dict | None = None) -> Path:
    """OUT_DIR/model.json (description + parameter formats) and OUT_DIR/weights.safetensors, written
    atomically (:func:`write_dir_atomic`)."""
    return write_dir_atomic(out_dir, lambda tmp: write_model_files(model, tmp, extra))


def load_model(model_dir: str | os.PathLike, rounding: dict | None = None, error_bits: int | None = None) -> Sequential:
    """Load and validate a saved model: description, parameter formats, shapes, dtypes, code ranges.

    ``rounding``: rounding modes to use instead of the saved ones (keys forward / backward / update);
    ``error_bits``: the backward's error width instead of the saved one (8 or 16)."""
    d = Path(model_dir)
    doc = read_json(d / "model.json")
    params_doc = doc.pop("params", None)
    doc.pop("info", None)
    validate_description(doc, str(d / "model.json"))            # errors name the file
    if rounding:
        doc["rounding"] = {**doc.get("rounding", {}), **rounding}
    if error_bits is not None:
        doc["error_bits"] = error_bits
    model = Sequential.from_description(doc)
    tensors, _ = read_safetensors(d / "weights.safetensors")
    return set_params(model, params_doc, tensors, str(d / "model.json"), str(d / "weights.safetensors"))


def set_params(model: Sequential, params_doc, tensors: dict, json_where: str, tensors_where: str) -> Sequential:
    """Put validated master codes into ``model``: ``params_doc`` ``{name: {"bits", "exp", "shape"}}`` and
    ``tensors`` ``{name: codes}`` must name exactly the model's parameters, with its bit width, an integer
    exponent in [-MAX_EXP, MAX_EXP], its dtype and shape and codes in the symmetric range (one MicroFormatError)."""
    named = dict(model.named_params())
    if not isinstance(params_doc, dict) or set(params_doc) != set(named):
        raise MicroFormatError(f"{json_where}: params must describe exactly {sorted(named)}")
    if set(tensors) != set(named):
        raise MicroFormatError(f"{tensors_where}: tensors {sorted(tensors)} do not match the model's {sorted(named)}")
    for name, p in named.items():
        info = params_doc[name]
        if not isinstance(info, dict):
            raise MicroFormatError(f"{json_where}: params[{name!r}] must be an object")
        bits = info.get("bits")
        if bits != p.bits or isinstance(bits, bool):
            raise MicroFormatError(f"{json_where}: {name}: bits {bits!r} != weight_bits {p.bits}")
        exp = _int(info, "exp", -MAX_EXP, MAX_EXP, f"{json_where}: {name}")
        t = tensors[name]
        want = np.int16 if p.bits == 16 else np.int8
        if not isinstance(t, np.ndarray) or t.dtype != want or t.shape != p.acc.shape:
            raise MicroFormatError(f"{tensors_where}: {name}: {getattr(t, 'dtype', type(t).__name__)} "
                                   f"{getattr(t, 'shape', '')}, expected {np.dtype(want)} {p.acc.shape}")
        m = qmax(p.bits)
        if t.size and (int(t.min()) < -m or int(t.max()) > m):
            raise MicroFormatError(f"{tensors_where}: {name}: codes outside [-{m}, {m}]")
        p.acc, p.exp = t.copy(), exp
    return model
