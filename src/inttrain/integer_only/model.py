"""Sequential model built from micro's model description, and the integer training step / loops.

The description format, its validation and the weight initialization are :mod:`inttrain.micro`'s
(so both engines start from the *same* integer weights); this module only moves the codes into
torch tensors (``torch.from_numpy``) and runs the arithmetic with torch integer ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import micro
from ..micro.augment import augment_batch
from ..micro.layers import SequentialCore
from ..micro.model import check_batch_layers
from .layers import AvgPool2d, BatchNorm, Conv2d, Flatten, Layer, Linear, MaxPool2d, Param, ReLU, Residual
from .loss import display_loss, softmax_cross_entropy_grad
from .ops import IntTensor


class Sequential(SequentialCore):
    """The torch engine's model: micro's :class:`~inttrain.micro.layers.SequentialCore` over torch layers."""

    @classmethod
    def from_micro(cls, model: "micro.Sequential", device: torch.device | str | None = None) -> "Sequential":
        """The torch twin of a micro model, with a copy of its integer master weights."""
        d = model.desc
        return cls(_layers_from_micro(d["layers"], model.layers, d["rounding"], device), dict(d))

    @classmethod
    def from_description(cls, desc: dict, device: torch.device | str | None = None) -> "Sequential":
        """Validate ``desc`` and initialize exactly as ``inttrain.micro.Sequential.from_description``."""
        return cls.from_micro(micro.Sequential.from_description(desc), device)

    def to_micro(self) -> "micro.Sequential":
        """A micro model holding a copy of these master weights (e.g. for ``micro.save_model``)."""
        m = micro.Sequential.from_description(self.desc)
        for (_, mp), (_, p) in zip(m.named_params(), self.named_params()):
            mp.acc, mp.exp, mp.exp0 = p.acc.cpu().numpy().copy(), p.exp, p.exp0
        return m

    def check_batch(self, batch_size: int) -> None:
        """Weight-gradient and batch-statistics reductions must stay int32-safe (§8); micro's check."""
        check_batch_layers(self.desc["layers"], tuple(self.desc["input_shape"]), batch_size)

    def save(self, out_dir, extra: dict | None = None):
        """Save in micro's format (docs §9): ``out_dir/model.json`` + ``out_dir/weights.safetensors``.

        The files are written by micro's writer from a copy of these codes, so they are byte for byte
        what ``inttrain.micro.save_model`` writes for the same weights (loadable by ``micro.load_model``,
        by :meth:`load`, and by the ``safetensors`` package).
        """
        return micro.save_model(self.to_micro(), out_dir, extra)

    @classmethod
    def load(cls, model_dir, device: torch.device | str | None = None) -> "Sequential":
        """Load (and validate, with micro's checks) a model saved by :meth:`save` or ``micro.save_model``."""
        return cls.from_micro(micro.load_model(model_dir), device)


def _layers_from_micro(specs: list[dict], mlayers: list, r: dict, device) -> list[Layer]:
    """The torch twin of each micro layer (validated ``specs``), its Params copied to ``device``."""
    f, b = r["forward"], r["backward"]

    def p(mp) -> Param:
        return Param.from_micro(mp, device)

    twin = {
        "linear": lambda s, m: Linear(p(m.weight), f, b),
        "conv2d": lambda s, m: Conv2d(p(m.weight), s["stride"], s["padding"], f, b, s.get("out_bits", 8)),
        "maxpool2d": lambda s, m: MaxPool2d(s["kernel_size"]),
        "avgpool2d": lambda s, m: AvgPool2d(s["kernel_size"], False, f, b),
        "globalavgpool2d": lambda s, m: AvgPool2d(0, True, f, b),
        "relu": lambda s, m: ReLU(),
        "flatten": lambda s, m: Flatten(),
        "batchnorm": lambda s, m: BatchNorm(p(m.gamma), p(m.beta), f, b, m.gain_shift),
        "residual": lambda s, m: Residual(_layers_from_micro(s["layers"], m.block, r, device),
                                          _layers_from_micro(s["shortcut"], m.shortcut, r, device), f, b),
    }
    out = [twin[s["type"]](s, m) for s, m in zip(specs, mlayers)]
    for t, m in zip(out, mlayers):
        t.err_bits = m.err_bits
    return out


@dataclass
class StepResult:
    logits: IntTensor       # int8 logits of the batch
    error: IntTensor        # dL/dlogits: int8 at exponent -7 (int16 at -15 for a model of 16-bit errors)
    p_q7: torch.Tensor      # integer softmax in Q7 (Q15 with 16-bit errors)


def train_step(model: Sequential, opt, x: IntTensor, y: torch.Tensor) -> StepResult:
    """One integer-only SGD step: forward, softmax-CE gradient, backward, update. No float tensors."""
    logits = model.forward(x)
    err, p = softmax_cross_entropy_grad(logits, y, model.err_bits)
    model.backward(err)
    opt.step()
    return StepResult(logits, err, p)


def _as_tensor(a, device=None) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
    return t.to(device) if device is not None else t


def _device(model: Sequential) -> torch.device:
    ps = model.params()
    return ps[0].acc.device if ps else torch.device("cpu")


def train_epoch(model: Sequential, opt, x, x_exp: int, y, batch_size: int, seed: int = 0,
                log=None, log_every: int = 0, schedule=None, global_step: int = 0,
                augment: str | None = None) -> tuple[float, float]:
    """One pass in micro's order (``numpy.random.default_rng(seed).permutation``); (display loss, accuracy).

    ``schedule`` (:class:`inttrain.micro.optim.Schedule`): sets ``opt.multiplier`` before each step from the
    global step ``global_step + i``, as micro's ``train_epoch``; ``augment="crop-flip"``: micro's crop and flip
    (:func:`inttrain.micro.augment.augment_batch`, the same draws), so the engines stay bit-exact."""
    if tuple(x.shape[1:]) != tuple(model.desc["input_shape"]):
        raise ValueError(f"x has sample shape {tuple(x.shape[1:])}, model wants {tuple(model.desc['input_shape'])}")
    model.check_batch(batch_size)
    dev = _device(model)
    xt, yt = _as_tensor(x, dev), _as_tensor(y, dev).to(torch.int64)
    if xt.dtype != torch.int8:
        raise TypeError(f"x must be int8 codes, got {xt.dtype}")
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(xt))).to(dev)
    losses, correct = [], 0
    for step, start in enumerate(range(0, len(xt), batch_size)):
        idx = order[start:start + batch_size]
        yb = yt[idx]
        if schedule is not None:
            opt.multiplier = schedule.multiplier(global_step + step)
        xb = xt[idx]
        if augment not in (None, "none"):  # micro's draws on the batch's codes (a small host round trip)
            xb = torch.from_numpy(augment_batch(xb.cpu().numpy(), augment, seed, step)).to(dev)
        r = train_step(model, opt, IntTensor(xb, int(x_exp)), yb)
        losses.append(display_loss(r.logits, yb))
        correct += int((r.logits.q.argmax(dim=1) == yb).sum())
        if log and log_every and (step + 1) % log_every == 0:
            log(f"  step {step + 1} loss {np.mean(losses[-log_every:]):.4f}")
    return float(np.mean(losses)), correct / max(1, len(xt))


def predict(model: Sequential, x, x_exp: int, batch_size: int = 256) -> torch.Tensor:
    xt = _as_tensor(x, _device(model))
    out = [model.forward(IntTensor(xt[i:i + batch_size], int(x_exp))).q.argmax(dim=1)
           for i in range(0, len(xt), batch_size)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)


def evaluate(model: Sequential, x, x_exp: int, y, batch_size: int = 256) -> float:
    if len(x) == 0:
        return 0.0
    pred = predict(model, x, x_exp, batch_size).cpu()
    return float((pred == _as_tensor(y).to(torch.int64).cpu()).sum()) / len(x)
