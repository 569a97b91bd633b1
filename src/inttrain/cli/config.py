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

__all__ = ["RunConfig", "opt", "train_options", "load_yaml_config", "parse_sets", "resolve_config", "config_from_dict"]


def opt(default: Any, help: str, *, flags: tuple[str, ...] = (), default_text: str | None = None,
        cli: bool = True) -> Any:
    """A :class:`RunConfig` field: its default and help, and how ``inttrain train`` offers it.

    ``flags``: the option names (default ``--field-name``; booleans get ``--x/--no-x``); ``default_text``:
    what the help says for the default when the value alone would not explain it; ``cli=False``: a key for
    ``--config`` and ``--set`` only.  The CLI option, the YAML key and the ``--set`` key come from this one
    declaration (:func:`train_options`).
    """
    return dataclasses.field(default=default, metadata={"help": help, "flags": flags, "default_text": default_text,
                                                        "cli": cli})


@dataclass
class RunConfig:
    """Everything that determines a training run (written to ``RUN_DIR/config.yaml``)."""

    model: str = opt("small-cnn", "mlp, lenet5, small-cnn, resnet20, resnet32, resnet56, vgg-small, mobilenetv2, "
                                  "gpt-small (with --dataset text).")
    dataset: str = opt("digits", "digits, synthetic, npz, mnist, fashion-mnist, cifar10, folder, text.")
    data_dir: str | None = opt(None, "Data file or folder (mnist: idx files; cifar10: cifar-10-batches-bin or -py; "
                                     "folder: one sub-folder per class; npz; text: a UTF-8 file).",
                               flags=("--data-dir", "--data-path"))
    recipe: str = opt("fp32", "fp32, bf16, or an inttrain recipe such as int8.")
    bits: int | None = opt(None, "Override the integer recipe's bit width.")
    weight_grad_rounding: str | None = opt(None, "int8, wageubn: rounding of the output gradient in the weight-gradient GEMM "
                                                 "only: nearest or stochastic (default: the recipe's, stochastic for int8).",
                                           default_text="recipe's")
    grad_rounding: str | None = opt(None, "Rounding of the output gradient in the input-gradient GEMM (and in the "
                                          "weight-gradient GEMM where the recipe sets none for it): nearest or "
                                          "stochastic (default: the recipe's, nearest for int8).",
                                    default_text="recipe's")
    first_last_float: bool | None = opt(None, "Keep the model's first and last Linear/Conv2d in float32 (int8, "
                                              "dorefa; default: the recipe's, off for int8, on for dorefa).",
                                        default_text="recipe's")
    bf16_activations: bool | None = opt(None, "int8: keep the activations between layers in bfloat16 (the forward "
                                              "runs under bf16 autocast; the three GEMMs stay int8).",
                                        default_text="recipe's")
    per_sample_grad: bool | None = opt(None, "int8, wageubn: one scale per sample for the output gradient in the "
                                             "input-gradient GEMM (int8: on by default; false: one per tensor).",
                                       default_text="recipe's")
    activation_range: str | None = opt(None, "dorefa: clip (the paper: a layer's input clipped to [0, 1]) or max "
                                             "(divided by its per-tensor maximum first, multiplied back after).",
                                       default_text="recipe's")
    norm_bits: int | None = opt(None, "wageubn: width of the quantized batch norm's normalized input, gamma, beta "
                                      "and output (the paper: 8).", default_text="recipe's")
    weight_grad_bits: int | None = opt(None, "wageubn: width of the weight gradient G its quantized SGD steps with "
                                             "(the paper: 8).", default_text="recipe's")
    range_bn: bool | None = opt(None, "sbm: Range BN in place of every BatchNorm2d (the paper), or with "
                                      "--no-range-bn the model's own batch norm.", default_text="recipe's")
    epochs: int = opt(5, "Number of epochs.")
    batch_size: int = opt(32, "Batch size.")
    lr: float = opt(0.05, "Learning rate.")
    optimizer: str = opt("sgd", "sgd, adam or adamw.")
    # Optimizer and lr knobs (inttrain.trainer.train): momentum/nesterov are sgd's (and wageubn's).
    weight_decay: float = opt(0.0, "Weight decay (L2 for sgd/adam, decoupled for adamw).", default_text="0")
    momentum: float = opt(0.9, "SGD momentum (sgd and wageubn only).")
    nesterov: bool = opt(False, "Nesterov momentum (sgd only).")
    lr_schedule: str = opt("constant", "constant, step (x0.1 at 50% and 75% of the steps), cosine (to 0) or onecycle "
                                       "(torch OneCycleLR, max lr = --lr).")
    warmup_epochs: float = opt(0.0, "Linear lr warm-up from 0 over this many epochs (fractions allowed).",
                               default_text="0")
    clip_grad_norm: float | None = opt(None, "Clip the global gradient L2 norm to this before every step.",
                                       default_text="off")
    train_limit: int | None = opt(None, "Train on the first N training samples only.", default_text="all")
    seed: int = opt(0, "Seed for init, data split and order.")
    threads: int | None = opt(None, "CPU threads.", default_text="torch's choice")
    max_steps: int | None = opt(None, "Stop after this many steps (resumable), after a final validation.")
    log_every: int = opt(10, "Steps between metrics rows.")
    max_consecutive_skips: int = opt(10, "Stop after this many non-finite steps in a row.", cli=False)
    augment: str = opt("none", "Image augmentation: none or crop-flip (pad 4, random crop, flip).")
    dataflow: bool = opt(False, "Integer recipes: int8 activations flow between layers and are saved in int8 for "
                                "backward (~4x less activation memory; docs/dataflow.md).")
    # None (auto): integer recipes (dataflow included) without --nproc, unless INTTRAIN_COMPILE=0
    # (inttrain.trainer.compiled.auto_compile).
    compile: bool | None = opt(None, "torch.compile the training step (one graph, integer kernels as nodes; "
                                     "first-step compile time is logged; eager fallback with a message).",
                               default_text="on for integer recipes without --nproc; off with "
                                            "INTTRAIN_COMPILE=0")
    val_fraction: float | None = opt(None, "Held out when the data has no test split (None: 0.2; text: 0.1).",
                                     cli=False)
    # Text / gpt-small only: context length and model size (None: gpt-small's benchmark defaults).
    seq_len: int = opt(64, "Text dataset: characters of context per sequence.")
    d_model: int | None = opt(None, "gpt-small: model width.", cli=False)
    n_layers: int | None = opt(None, "gpt-small: layers.", cli=False)
    n_heads: int | None = opt(None, "gpt-small: attention heads.", cli=False)
    # Precision schedule (issue 5; integer recipes; see inttrain.schedules).
    schedule: str = opt("none", "Precision schedule: none, constant, steps, cpt, pfq, dfq (FracTrain learned "
                                "per-layer gates) or fractrain (PFQ + DFQ) (options via --set schedule_min_bits=3 "
                                "schedule_max_bits=8 schedule_cycles=32 schedule_grad_bits=8 "
                                "schedule_steps=0:4/8,100:6 schedule_dfq_bits=4,6,8 schedule_target_cost=0.5 "
                                "schedule_cost_weight=5 ...). Fewer bits are not faster on CPU; see the gbitops "
                                "column.")
    schedule_min_bits: int = opt(3, "cpt: b_min; constant: forward bits.", cli=False)
    schedule_max_bits: int = opt(8, "cpt: b_max.", cli=False)
    schedule_cycles: int = opt(32, "cpt: cycles over the run's total steps.", cli=False)
    schedule_grad_bits: int = opt(8, "Gradient bits (cpt, constant).", cli=False)
    schedule_steps: str | None = opt(None, "steps: \"0:4/8,100:6,200:8\" = step:forward[/grad] milestones.",
                                     cli=False)
    schedule_window: int = opt(50, "pfq: steps per loss window.", cli=False)
    schedule_threshold: float = opt(0.05, "pfq: initial loss-change threshold (halved at every stage).", cli=False)
    # dfq / fractrain (FracTrain's learned per-layer gates; inttrain.recipes.fractrain_dfq):
    schedule_dfq_bits: str = opt("4,6,8", "dfq: the gate's bit options.", cli=False)
    schedule_target_cost: float = opt(0.5, "dfq: target forward BitOPs relative to static 8-bit.", cli=False)
    schedule_cost_weight: float = opt(5.0, "dfq: weight of the squared cost regulariser.", cli=False)
    schedule_dfq_per_sample: bool = opt(True, "dfq: each sample's gate picks its bits (false: one choice per batch).",
                                        cli=False)
    # Data parallel (issue 8): batch_size stays the global batch: each of the nproc ranks trains on
    # batch_size / nproc rows.
    nproc: int = opt(1, "Data-parallel processes on this machine (gloo, 127.0.0.1); --batch-size is the global "
                        "batch, split evenly. Under torchrun the world size comes from its environment.")
    comm: str = opt("fp32", "Gradient all-reduce with --nproc > 1: fp32 or int8 (inttrain.distributed hook).")
    dist_timeout: float = opt(300.0, "Seconds a rank waits for its peers (rendezvous and every collective) before "
                                     "failing.", default_text="300")
    sync_bn: bool = opt(False, "Data parallel: BatchNorm statistics over the global batch (plain BatchNorm layers; "
                               "Range/8-bit BN cannot be synced).")
    max_restarts: int = opt(0, "With --nproc: after a rank fails, restart all ranks up to this many times, resuming "
                               "from checkpoints/last (like torchrun --max-restarts).")
    save_every: int | None = opt(None, "Also save checkpoints/last every this many steps (resume and restart "
                                       "points).", default_text="end of each epoch only")
    dclr: bool = opt(True, "unified-int8: deviation-counteractive per-layer learning-rate scaling (Zhu et al. 2020, "
                           "Eq. 10).")
    probe_every: int | None = opt(None, "Integer recipes: every N steps, the SQNR (dB) of each integer layer's forward, "
                                        "grad-input and grad-weight GEMM against float64 on one fixed batch, to "
                                        "RUN_DIR/probe.csv (`inttrain plot` draws probe.png).", default_text="off")
    # Limits judged before reading data or building the model (inttrain.data.limits; README "Reliability").
    max_memory_gb: float | None = opt(None, "Data + model + activations; None: 80% of physical memory.", cli=False)
    max_classes: int = opt(10_000, "Most classes a dataset may declare.", cli=False)
    max_image_side: int = opt(8192, "Longest image side a dataset may declare.", cli=False)


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


def _default_text(f: dataclasses.Field) -> str | None:
    if f.metadata["default_text"] is not None:
        return f.metadata["default_text"]
    if isinstance(f.default, bool):
        return "on" if f.default else "off"
    return None if f.default is None else str(f.default)


def train_options() -> list[Any]:
    """``inspect.Parameter`` objects for every CLI field of :class:`RunConfig` (typer options, default None:
    a flag not given leaves the config's layers below it in force)."""
    import inspect
    from typing import Annotated, Optional

    import typer

    params = []
    for f in fields(RunConfig):
        if not f.metadata.get("cli"):
            continue
        typ, _ = _base_type(f.name)
        dashed = f.name.replace("_", "-")
        flags = f.metadata["flags"] or ((f"--{dashed}/--no-{dashed}",) if typ is bool else (f"--{dashed}",))
        shown = _default_text(f)
        # "\\[" : "[...]" unescaped would be rich markup and vanish from the help.
        help_ = f.metadata["help"] + ("" if shown is None else f" \\[default: {shown}]")
        option = typer.Option(*flags, help=help_)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[Optional[typ], option]))  # noqa: UP045 - typer
    return params
