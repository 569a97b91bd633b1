"""The resolved run configuration: defaults < ``--config`` YAML < ``--set key=value`` < flags.

Every value is typed by its :class:`RunConfig` field, and unknown keys are
rejected (naming the allowed ones) rather than ignored, because a misspelt
key silently falling back to a default is the worst kind of config bug.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .errors import UsageProblem

__all__ = ["RunConfig", "load_yaml_config", "parse_sets", "resolve_config", "config_from_dict"]


@dataclass
class RunConfig:
    """Everything that determines a training run (written to ``RUN_DIR/config.yaml``)."""

    model: str = "small-cnn"
    dataset: str = "digits"
    data_dir: str | None = None
    recipe: str = "fp32"
    bits: int | None = None  # overrides the integer recipe's bit width
    epochs: int = 5
    batch_size: int = 32
    lr: float = 0.05
    optimizer: str = "sgd"
    seed: int = 0
    threads: int | None = None
    max_steps: int | None = None  # stop (resumably) after this many steps
    log_every: int = 10  # steps between metrics rows
    max_consecutive_skips: int = 10
    augment: str = "none"  # image batches: "crop-flip" (pad 4, random crop, horizontal flip; the CIFAR standard)
    dataflow: bool = False  # integer recipes: int8 activations between layers (inttrain.prepare_(..., dataflow=True))
    val_fraction: float | None = None  # held out when the data has no test split (None: 0.2; text: 0.1)
    # Text / gpt-small only: context length and model size (None: gpt-small's benchmark defaults).
    seq_len: int = 64
    d_model: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    # Precision schedule (issue 5; integer recipes): none, constant, steps, cpt, pfq, dfq or fractrain (see inttrain.schedules).
    schedule: str = "none"
    schedule_min_bits: int = 3  # cpt: b_min; constant: forward bits
    schedule_max_bits: int = 8  # cpt: b_max
    schedule_cycles: int = 32  # cpt: cycles over the run's total steps
    schedule_grad_bits: int = 8  # gradient bits (cpt, constant)
    schedule_steps: str | None = None  # steps: "0:4/8,100:6,200:8" = step:forward[/grad] milestones
    schedule_window: int = 50  # pfq: steps per loss window
    schedule_threshold: float = 0.05  # pfq: initial loss-change threshold (halved at every stage)
    # dfq / fractrain (FracTrain's learned per-layer gates; inttrain.recipes.fractrain_dfq):
    schedule_dfq_bits: str = "4,6,8"  # the gate's bit options
    schedule_target_cost: float = 0.5  # target forward BitOPs relative to static 8-bit
    schedule_cost_weight: float = 5.0  # weight of the squared cost regulariser
    # Data parallel (issue 8): processes (ranks), their gradient communication and collective timeout.
    # batch_size stays the global batch: each of the nproc ranks trains on batch_size / nproc rows.
    nproc: int = 1
    comm: str = "fp32"  # fp32 all-reduce or the int8 hook (inttrain.distributed)
    dist_timeout: float = 300.0  # seconds a collective (or the rendezvous) may wait for a peer
    sync_bn: bool = False  # data parallel: BatchNorm statistics over the global batch (plain BatchNorm only)
    max_restarts: int = 0  # --nproc: restart all ranks up to this many times after a failure (resume from last)
    save_every: int | None = None  # also save checkpoints/last every this many steps (restart/resume points)
    # unified-int8: deviation-counteractive per-layer LR scaling (Zhu et al. CVPR 2020, Eq. 10); false: plain lr.
    dclr: bool = True


_HINTS = typing.get_type_hints(RunConfig)
FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(RunConfig))


def _base_type(name: str) -> tuple[type, bool]:
    """(scalar type, optional?) of field ``name``."""
    hint = _HINTS[name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], True
    return hint, False


def coerce(name: str, value: Any, where: str) -> Any:
    """``value`` converted to field ``name``'s type, or UsageProblem naming key, value and type."""
    if name not in FIELD_NAMES:
        raise UsageProblem(where, f"unknown key {name!r}; allowed: {', '.join(FIELD_NAMES)}")
    typ, optional = _base_type(name)
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "~", "")):
        if optional:
            return None
        # A required string field may legitimately be the word "none" (augment, schedule).
        if not (typ is str and isinstance(value, str) and value.strip().lower() == "none"):
            raise UsageProblem(where, f"{name}={value!r}: a value is required ({typ.__name__})")
        return value.strip()
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            word = str(value).strip().lower()
            if word in ("true", "yes", "on", "1"):
                return True
            if word in ("false", "no", "off", "0"):
                return False
            raise ValueError
        if typ is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value) if not isinstance(value, str) else int(value.strip())
        if typ is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if typ is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        pass
    else:
        return value
    kind = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[typ]
    raise UsageProblem(where, f"{name}={value!r}: must be {kind}" + (" or none" if optional else ""))


def config_from_dict(data: dict[str, Any], where: str) -> dict[str, Any]:
    return {k: coerce(str(k), v, where) for k, v in data.items()}


def load_yaml_config(path: Path) -> dict[str, Any]:
    """Typed values of a YAML mapping file (``yaml.safe_load``: no object tags)."""
    import yaml

    where = f"--config {path}"
    try:
        text = path.read_text()
    except OSError as e:
        raise UsageProblem("--config", f"{str(path)!r}: cannot read ({e.strerror or e})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UsageProblem(where, f"not valid YAML ({str(e).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageProblem(where, f"top level is a {type(data).__name__}; expected a mapping of key: value")
    return config_from_dict(data, where)


def parse_sets(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageProblem("--set", f"{item!r}: expected key=value; keys: {', '.join(FIELD_NAMES)}")
        out[key.strip()] = coerce(key.strip(), value, "--set")
    return out


def resolve_config(config_file: Path | None, sets: list[str], flags: dict[str, Any]) -> RunConfig:
    """Merge the layers; ``flags`` holds only options given on the command line (None = not given)."""
    merged: dict[str, Any] = {}
    if config_file is not None:
        merged.update(load_yaml_config(config_file))
    merged.update(parse_sets(sets))
    merged.update({k: v for k, v in flags.items() if v is not None})
    if merged.get("data_dir") is not None:
        merged["data_dir"] = str(merged["data_dir"])
    return dataclasses.replace(RunConfig(), **merged)


def config_dict(cfg: RunConfig) -> dict[str, Any]:
    return asdict(cfg)
