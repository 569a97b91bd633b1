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
    # Optimizer and lr knobs (inttrain.trainer.train): momentum/nesterov are sgd's (and wageubn's, without nesterov).
    weight_decay: float = 0.0
    momentum: float = 0.9
    nesterov: bool = False
    lr_schedule: str = "constant"  # constant, step (x0.1 at 50% and 75%), cosine (to 0) or onecycle (max lr = lr)
    warmup_epochs: float = 0.0  # linear warm-up from 0 over this many epochs (fractions allowed)
    clip_grad_norm: float | None = None  # clip the global gradient L2 norm to this before every step
    train_limit: int | None = None  # train on the first N training samples only
    seed: int = 0
    threads: int | None = None
    max_steps: int | None = None  # stop (resumably) after this many steps
    log_every: int = 10  # steps between metrics rows
    max_consecutive_skips: int = 10
    augment: str = "none"  # image batches: "crop-flip" (pad 4, random crop, horizontal flip; the CIFAR standard)
    dataflow: bool = False  # integer recipes: int8 activations between layers (inttrain.prepare_(..., dataflow=True))
    # torch.compile the training step; None (auto): integer recipes without dataflow or --nproc, unless
    # INTTRAIN_COMPILE=0 (inttrain.trainer.compiled.auto_compile).
    compile: bool | None = None
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
    schedule_dfq_per_sample: bool = True  # each sample's gate picks its bits (false: one choice per batch)
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
    # Numerics probe (issue 16): every this many steps, per integer layer and GEMM the SQNR of the integer result
    # against float64 on one fixed batch, appended to RUN_DIR/probe.csv (inttrain.trainer.probe).
    probe_every: int | None = None
    # Limits judged before reading data or building the model (inttrain.data.limits; README "Reliability").
    max_memory_gb: float | None = None  # data + model + activations; None: 80% of physical memory
    max_classes: int = 10_000
    max_image_side: int = 8192


#: Largest value each numeric key takes: far above real work, far below what exhausts memory or time.
#: (Lower bounds, bit widths and cross-field rules live in ``run.validate_config`` and the recipes, with their
#: own messages.)
UPPER: dict[str, float] = {
    "epochs": 10**6, "batch_size": 1 << 24, "lr": 1e6, "weight_decay": 1e6,
    "warmup_epochs": 10**6, "clip_grad_norm": 1e12, "train_limit": 1 << 40, "threads": 4096, "max_steps": 10**12,
    "log_every": 10**9, "max_consecutive_skips": 10**9, "val_fraction": 1.0, "seq_len": 1 << 20, "d_model": 1 << 16,
    "n_layers": 1024, "n_heads": 1024, "schedule_cycles": 10**6, "schedule_window": 10**9, "schedule_threshold": 1e6, "schedule_target_cost": 1e3,
    "schedule_cost_weight": 1e6, "nproc": 1024, "dist_timeout": 1e7, "max_restarts": 1000, "save_every": 10**12, "probe_every": 10**12,
    "max_memory_gb": 1 << 20, "max_classes": 1 << 24, "max_image_side": 1 << 16, "seed": 2**63 - 1,
}
#: Config files are a screenful of keys: anything far larger or deeper is not a config.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 8


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
        shown = name if len(name) <= 60 else name[:60] + "..."
        raise UsageProblem(where, f"unknown key {shown!r}; allowed: {', '.join(FIELD_NAMES)}")
    typ, optional = _base_type(name)
    original = value  # messages quote what the user wrote (1e+23), not its conversion
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
            value = int(value) if not isinstance(value, str) else int(value.strip())
        elif typ is float:
            if isinstance(value, bool) or isinstance(value, (dict, list)):
                raise ValueError
            value = float(value)
        elif typ is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            value = str(value)
    except (TypeError, ValueError, OverflowError):
        pass
    else:
        return _check_range(name, value, where, original)
    kind = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[typ]
    raise UsageProblem(where, f"{name}={value!r}: must be {kind}" + (" or none" if optional else ""))


def _check_range(name: str, value: Any, where: str, original: Any = None) -> Any:
    """Finite, and at most the key's :data:`UPPER` bound (a batch of 1e23 is refused here, not by malloc)."""
    import math

    if isinstance(value, str) and len(value) > 4096:
        raise UsageProblem(where, f"{name}: a string of {len(value)} characters; allowed: at most 4096")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageProblem(where, f"{name}={value!r}: must be a finite number")
    hi = UPPER.get(name)
    if hi is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and value > hi:
        raise UsageProblem(where, f"{name}={value if original is None else original!r}: too large; "
                                  f"allowed: at most {hi:,}")
    if name == "seed" and value < -(2**63):
        raise UsageProblem(where, f"{name}={value!r}: too small; allowed: a 64-bit integer")
    return value


def config_from_dict(data: dict[str, Any], where: str) -> dict[str, Any]:
    return {k: coerce(str(k), v, where) for k, v in data.items()}


def _check_yaml_shape(text: str, where: str) -> None:
    """Refuse aliases (billion laughs) and deep nesting from the event stream, before anything is built."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise UsageProblem(where, "uses a YAML anchor/alias (&name / *name); allowed: plain key: value pairs")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_CONFIG_DEPTH:
                raise UsageProblem(where, f"nested more than {MAX_CONFIG_DEPTH} levels deep; allowed: a flat mapping "
                                          "of key: value")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def load_yaml_config(path: Path) -> dict[str, Any]:
    """Typed values of a YAML mapping file (``yaml.safe_load``: no object tags; no aliases; <= 1 MiB, <= 8 deep)."""
    import yaml

    where = f"--config {path}"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # bounded: a config pointed at /dev/zero stops here
    except OSError as e:
        raise UsageProblem("--config", f"{str(path)!r}: cannot read ({e.strerror or e})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise UsageProblem(where, f"larger than {MAX_CONFIG_BYTES} bytes; allowed: a config file of key: value lines")
    try:
        text = raw.decode("utf-8")
        _check_yaml_shape(text, where)
        data = yaml.safe_load(text)
    except UnicodeDecodeError as e:
        raise UsageProblem(where, f"byte {e.start}: not UTF-8 text; allowed: a UTF-8 YAML file") from None
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
    if flags.get("data_dir") is not None:
        flags = {**flags, "data_dir": str(flags["data_dir"])}
    # Flags are typed by typer already; the same range checks apply to them as to the file.
    merged.update({k: coerce(k, v, "--" + k.replace("_", "-")) for k, v in flags.items() if v is not None})
    if merged.get("data_dir") is not None:
        merged["data_dir"] = str(merged["data_dir"])
    return dataclasses.replace(RunConfig(), **merged)


def config_dict(cfg: RunConfig) -> dict[str, Any]:
    return asdict(cfg)
