"""``inttrain train`` / ``inttrain resume``: validate everything, then create the run folder and train.

All checks that can fail (names, numbers, bit width, data files, model/data
fit, recipe application, output folder) run before the folder is created, so
a rejected command leaves nothing half-written behind.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer

from .config import RunConfig, config_from_dict
from .checks import check_positive as _check_positive
from .errors import UsageProblem, check_choice

__all__ = ["Prepared", "prepare_run", "run_training", "default_out", "resume_run", "model_overrides"]

#: Models that read token ids, and the datasets that provide them.
LM_MODELS = ("gpt-small",)
LM_DATASETS = ("text",)


@dataclasses.dataclass
class Prepared:
    """A validated run: data loaded, model built with its recipe applied."""

    cfg: RunConfig
    splits: Any
    model: Any
    recipe_config: Any
    scheduler: Any = None  # inttrain.schedules.PrecisionScheduler (--schedule), already applied to the model


_ROUNDINGS = {"nearest": "NEAREST_EVEN", "stochastic": "STOCHASTIC"}


def recipe_config_for(recipe: str, bits: int | None, weight_grad_rounding: str | None = None,
                      grad_rounding: str | None = None, first_last_float: bool | None = None,
                      bf16_activations: bool | None = None, activation_range: str | None = None,
                      norm_bits: int | None = None, weight_grad_bits: int | None = None,
                      range_bn: bool | None = None, per_sample_grad: bool | None = None) -> Any:
    """The config ``prepare_`` gets: None (use the name), or the recipe's config with ``bits`` (and the
    gradient roundings, the first/last-layer policy, bfloat16 activations, the activation range, the quantized batch
    norm's and weight gradient's widths, Range BN, per-sample gradient scales) set."""
    import inttrain

    switches = {"first_last_float": first_last_float, "bf16_activations": bf16_activations,
                "activation_range": activation_range, "norm_bits": norm_bits, "weight_grad_bits": weight_grad_bits,
                "range_bn": range_bn, "per_sample_grad": per_sample_grad}
    if bits is None and weight_grad_rounding is None and grad_rounding is None and all(
            v is None for v in switches.values()):
        return None
    cfg = inttrain.get_config(recipe)
    for name, value in switches.items():
        if value is None:
            continue
        try:
            cfg = getattr(cfg, f"with_{name}")(value)
        except ValueError as e:
            flag = "--" + ("no-" if value is False else "") + name.replace("_", "-")
            raise UsageProblem(flag, str(e)) from None
    for flag, value, setter in (("--grad-rounding", grad_rounding, "with_grad_rounding"),
                                ("--weight-grad-rounding", weight_grad_rounding, "with_weight_grad_rounding")):
        if value is not None:
            cfg = _set_rounding(cfg, flag, value, setter)
    if bits is None:
        return cfg
    if not cfg.converts_layers():
        raise UsageProblem("--bits", f"{bits}: recipe {recipe!r} has no bit width; use an integer recipe such as int8")
    try:
        return cfg.with_bits(bits)
    except ValueError as e:  # no bit width, or the library's range check (UnsupportedFormatError)
        raise UsageProblem("--bits", f"{bits}: {e}" if "has no bits" in str(e) else str(e)) from None


def _set_rounding(cfg: Any, flag: str, value: str, setter: str) -> Any:
    from inttrain.spec import Rounding

    if value not in _ROUNDINGS:
        raise UsageProblem(flag, f"{value!r}: expected nearest or stochastic")
    try:
        return getattr(cfg, setter)(Rounding[_ROUNDINGS[value]])
    except ValueError as e:
        raise UsageProblem(flag, f"{value}: {e}") from None


def validate_config(cfg: RunConfig) -> Any:
    """Names and numbers; returns the recipe config for ``prepare_`` (None: use the name)."""
    from inttrain.data import DATASET_NAMES
    from inttrain.models import MODEL_NAMES
    from inttrain.trainer import OPTIMIZER_NAMES
    from inttrain.trainer.augment import AUGMENTATIONS

    from .checks import check_recipe

    check_choice("--model", cfg.model, MODEL_NAMES)
    check_choice("--dataset", cfg.dataset, DATASET_NAMES)
    check_choice("--optimizer", cfg.optimizer, OPTIMIZER_NAMES)
    from inttrain.schedules.lr import LR_SCHEDULES

    check_choice("--lr-schedule", cfg.lr_schedule, LR_SCHEDULES)
    check_choice("--augment", cfg.augment, AUGMENTATIONS)
    from inttrain.schedules import SCHEDULE_NAMES

    check_choice("--schedule", cfg.schedule, SCHEDULE_NAMES)
    check_recipe(cfg.recipe, field="--recipe")
    _check_optimizer_knobs(cfg)
    _check_positive(epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr, threads=cfg.threads,
                    max_steps=cfg.max_steps, log_every=cfg.log_every, max_consecutive_skips=cfg.max_consecutive_skips,
                    seq_len=cfg.seq_len, clip_grad_norm=cfg.clip_grad_norm, train_limit=cfg.train_limit)
    for key in ("d_model", "n_layers", "n_heads"):  # config-only keys: name them as --set takes them
        value = getattr(cfg, key)
        if value is not None and value < 1:
            raise UsageProblem(f"--set {key}", f"{value} must be > 0")
    check_choice("--comm", cfg.comm, ("fp32", "int8"))
    _check_positive(nproc=cfg.nproc, dist_timeout=cfg.dist_timeout, save_every=cfg.save_every,
                    probe_every=cfg.probe_every)
    import inttrain

    if cfg.probe_every is not None and not inttrain.get_config(cfg.recipe).converts_layers():
        raise UsageProblem("--probe-every", f"{cfg.probe_every}: recipe {cfg.recipe!r} has no integer layers to probe; "
                                            "use an integer recipe such as int8")
    if cfg.max_restarts < 0:
        raise UsageProblem("--max-restarts", f"{cfg.max_restarts} must be >= 0")
    if cfg.seed < 0:  # NumPy's generators (data split and order) take none
        raise UsageProblem("--seed", f"{cfg.seed} must be >= 0")
    if cfg.batch_size % cfg.nproc:
        raise UsageProblem("--batch-size", f"{cfg.batch_size} is the global batch and must be divisible by "
                                           f"--nproc {cfg.nproc}")
    if cfg.val_fraction is not None and not 0 < cfg.val_fraction < 1:
        raise UsageProblem("--set val_fraction", f"{cfg.val_fraction} must be strictly between 0 and 1")
    # Token ids and images are not interchangeable: the language model and the text data go together.
    if (cfg.model in LM_MODELS) != (cfg.dataset in LM_DATASETS):
        if cfg.model in LM_MODELS:
            raise UsageProblem("--dataset", f"{cfg.dataset!r}: model {cfg.model!r} is a language model and needs "
                                            "--dataset text (a UTF-8 text file as --data-dir)")
        raise UsageProblem("--model", f"{cfg.model!r}: dataset 'text' is token sequences; use --model gpt-small")
    if cfg.data_dir is not None and not Path(cfg.data_dir).exists():
        where = {"npz": "an .npz file", "text": "a UTF-8 text file"}.get(
            cfg.dataset, f"a file or folder with the {cfg.dataset} data")
        raise UsageProblem("--data-dir", f"{cfg.data_dir!r} does not exist; expected {where}")
    return recipe_config_for(cfg.recipe, cfg.bits, cfg.weight_grad_rounding, cfg.grad_rounding,
                             cfg.first_last_float, cfg.bf16_activations, cfg.activation_range, cfg.norm_bits,
                             cfg.weight_grad_bits, cfg.range_bn, cfg.per_sample_grad)


def _check_optimizer_knobs(cfg: RunConfig) -> None:
    """--optimizer / --momentum / --weight-decay / --nesterov / --warmup-epochs: ranges, and only where they apply."""
    import inttrain
    from inttrain.optim import check_optimizer_options

    recipe = inttrain.get_config(cfg.recipe)
    if recipe.optimizers is not None and cfg.optimizer not in recipe.optimizers:
        raise UsageProblem("--optimizer", f"{cfg.optimizer!r}: recipe {cfg.recipe!r} trains with {recipe.update_rule}; "
                                          f"allowed: {', '.join(recipe.optimizers)}")

    if not cfg.weight_decay >= 0:
        raise UsageProblem("--weight-decay", f"{cfg.weight_decay} must be >= 0")
    if not 0 <= cfg.momentum < 1:
        raise UsageProblem("--momentum", f"{cfg.momentum}: allowed 0 <= momentum < 1")
    if not cfg.warmup_epochs >= 0:
        raise UsageProblem("--warmup-epochs", f"{cfg.warmup_epochs} must be >= 0")
    try:
        check_optimizer_options(cfg.optimizer, cfg.momentum, cfg.weight_decay, cfg.nesterov)
        if cfg.nesterov:  # the recipe's own optimizer may have none (it says so)
            import torch

            recipe.optimizer_for(torch.nn.Linear(1, 1), cfg.optimizer, cfg.lr, momentum=cfg.momentum, nesterov=True)
    except ValueError as e:
        raise UsageProblem("--nesterov" if cfg.nesterov else "--momentum", str(e)) from None


def limit_train(splits: Any, n: int | None) -> Any:
    """``splits`` with only the first ``n`` training samples (all of them when ``n`` is None or larger)."""
    import dataclasses

    from torch.utils.data import Subset, TensorDataset

    if n is None or n >= len(splits.train):
        return splits
    train = splits.train
    # A TensorDataset stays one (the trainer gathers its batches with one index per tensor).
    limited = TensorDataset(*(t[:n] for t in train.tensors)) if isinstance(train, TensorDataset) else Subset(train, range(n))
    return dataclasses.replace(splits, train=limited)


def model_overrides(cfg: RunConfig) -> dict[str, int]:
    """Constructor arguments from the config (gpt-small's size; unset ones keep the model's defaults)."""
    if cfg.model not in LM_MODELS:
        return {}
    return {k: v for k, v in dict(d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads).items() if v is not None}


def data_info(splits: Any) -> dict[str, Any]:
    """Plain numbers (loadable with weights_only) describing what the model was trained on."""
    return {"task": splits.task, "num_classes": int(splits.num_classes), "in_channels": int(splits.in_channels),
            "image_size": int(splits.image_size), "mean": [float(m) for m in splits.mean],
            "std": [float(v) for v in splits.std]}


def check_state_keys(state: dict, s_path: Path) -> None:
    """A resumable state names its config and position; say which key is missing instead of a KeyError."""
    from inttrain.trainer import CheckpointError

    ts = state.get("train_state")
    missing = [k for k in ("config", "train_state") if k not in state]
    if not missing and isinstance(ts, dict):
        missing = [f"train_state.{k}" for k in ("step", "epoch", "position") if not isinstance(ts.get(k), int)]
    if missing or not isinstance(state.get("config"), dict) or not isinstance(ts, dict):
        raise CheckpointError(f"{s_path}: missing or malformed {', '.join(missing) or 'config/train_state'}; allowed: "
                              "a state file written by `inttrain train` (resume from another checkpoint or retrain)")


def run_limits(cfg: RunConfig) -> Any:
    from inttrain.data import Limits

    return Limits.from_config(cfg.max_memory_gb, cfg.max_classes, cfg.max_image_side)


def check_model_memory(cfg: RunConfig, splits: Any, limits: Any) -> None:
    """LimitError if the model (built on ``meta``: no storage) and a batch would not fit ``limits``."""
    from inttrain.models import build_model

    from .estimate import estimate_training_memory

    lm = splits.task == "lm"
    shape = (splits.image_size,) if lm else (splits.in_channels, splits.image_size, splits.image_size)
    try:
        est = estimate_training_memory(
            lambda: build_model(cfg.model, splits.num_classes, splits.in_channels, splits.image_size,
                                **model_overrides(cfg)), shape, lm)
    except ValueError:
        return  # the real build below reports why the model does not fit the data
    limits.check_bytes(
        f"--model {cfg.model} --batch-size {cfg.batch_size}",
        f"{est.params:,} parameters and {est.activations_per_example:,} activations per example "
        f"(training, batch {cfg.batch_size})", est.bytes(cfg.batch_size))


def prepare_run(cfg: RunConfig, echo: Any = typer.echo, splits: Any = None) -> Prepared:
    """Validate ``cfg``, load the data (unless ``splits`` is given) and build the prepared model (UsageProblem on any problem)."""
    import torch

    from inttrain.data import DataError, load_dataset
    from inttrain.models import build_model
    from inttrain.trainer import apply_recipe

    recipe_config = validate_config(cfg)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    limits = run_limits(cfg)
    try:
        if splits is None:
            splits = load_dataset(cfg.dataset, cfg.data_dir, cfg.val_fraction, seed=cfg.seed, seq_len=cfg.seq_len,
                                  limits=limits)
    except DataError as e:
        raise UsageProblem(f"--dataset {cfg.dataset}", str(e)) from e
    available = len(splits.train)
    splits = limit_train(splits, cfg.train_limit)
    check_model_memory(cfg, splits, limits)
    shape = (
        f"vocabulary {splits.num_classes}, sequences of {splits.image_size}" if splits.task == "lm"
        else f"{splits.num_classes} classes, {splits.in_channels}x{splits.image_size}x{splits.image_size}"
    )
    echo(
        f"{cfg.model} on {cfg.dataset}: {len(splits.train)} train"
        + (f" (--train-limit: first {len(splits.train)} of {available})" if len(splits.train) < available else "")
        + f" / {len(splits.val)} val ({splits.val_source}), "
        f"{shape}; recipe {cfg.recipe}" + (f" ({cfg.bits} bits)" if cfg.bits is not None else "")
    )
    torch.manual_seed(cfg.seed)
    try:
        model = build_model(cfg.model, splits.num_classes, splits.in_channels, splits.image_size, **model_overrides(cfg))
    except ValueError as e:
        raise UsageProblem("--model", f"{cfg.model!r} does not fit dataset {cfg.dataset!r}: {e}") from e
    try:
        apply_recipe(model, recipe_config if recipe_config is not None else cfg.recipe, dataflow=cfg.dataflow)
    except ValueError as e:
        raise UsageProblem("--recipe" if cfg.bits is None else "--bits", f"{cfg.recipe!r}: {e}") from e
    from .schedule import build_schedule, make_scheduler

    schedule = build_schedule(cfg, len(splits.train))
    scheduler = None
    if schedule is not None:
        try:
            scheduler = make_scheduler(model, schedule)
        except ValueError as e:  # a width or layout a layer cannot run
            raise UsageProblem("--schedule", f"{cfg.schedule}: {e}") from None
    return Prepared(cfg, splits, model, recipe_config, scheduler)


def default_out(cfg: RunConfig) -> Path:
    return Path("runs") / f"{cfg.model}-{cfg.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_out(out: Path) -> None:
    """``out`` must be new (or an empty folder) and creatable."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageProblem("--out", f"{str(out)!r} already exists and is not empty; pick a new folder "
                                    f"(or continue a run with `inttrain resume {out}`)")
    parent = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    import os

    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise UsageProblem("--out", f"{str(out)!r}: cannot create a folder under {str(parent)!r} (not writable)")


def run_training(p: Prepared, folder: Any, resume_from: Any = None, dp: Any = None,
                 train_args: dict[str, Any] | None = None) -> int:
    """Train with ``folder`` as hooks; returns the exit code (128+signal if stopped by one).

    ``dp``: this rank's :class:`inttrain.distributed.data_parallel.DataParallel`; ranks other than 0
    pass a :class:`SilentFolder` (no files, no output). ``train_args``: further ``train()`` keywords
    (benchmarks set trainer options the run config does not name).
    """
    from inttrain.trainer import train

    from .signals import exit_code_for, stop_on_signals

    cfg = p.cfg
    got: list[int] = []

    def on_stop(signum: int) -> None:
        got.append(signum)
        folder.stop = True

    from inttrain.cost import BitOpsCounter
    from inttrain.schedules import model_bits, prepared_layers

    counter = BitOpsCounter(p.model) if prepared_layers(p.model) else None

    def extra() -> dict[str, Any]:
        if counter is None:
            return {}
        bits = p.scheduler.bits if p.scheduler is not None else model_bits(p.model)
        dist = getattr(p.scheduler, "bit_distribution", None)  # DFQ: per-layer shares of the chosen widths
        return {"forward_bits": bits[0], "grad_bits": bits[1], "gbitops": round(counter.bitops / 1e9, 6),
                **({"dfq_bits": dist()} if dist is not None else {})}

    folder.extra = extra
    folder.data_info = data_info(p.splits)
    if cfg.probe_every is not None and not isinstance(folder, SilentFolder):
        from inttrain.trainer.probe import ProbeLog

        x, y = p.splits.train[:cfg.batch_size]  # one fixed, unaugmented batch: rows differ by the weights only
        folder.probe = ProbeLog(p.model, x, y, cfg.probe_every, folder.root)
    # Resume: TensorBoard drops what the interrupted leg logged after its checkpoint.
    folder.open_tensorboard(None if resume_from is None else int(resume_from[1]["train_state"]["step"]) + 1)
    use_compile = _use_compile(cfg, p, dp)
    try:
        with stop_on_signals(on_stop):
            result = train(
                p.model, p.splits, cfg.recipe, epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                optimizer=cfg.optimizer, seed=cfg.seed, log=folder.log, max_consecutive_skips=cfg.max_consecutive_skips,
                recipe_config=p.recipe_config, prepared=True, max_steps=cfg.max_steps, hooks=folder,
                resume_from=resume_from, augment=cfg.augment, precision_scheduler=p.scheduler, cost_counter=counter,
                data_parallel=dp, save_every=cfg.save_every, dclr=cfg.dclr, compile=use_compile,
                **({"progress": False} if isinstance(folder, SilentFolder) else {}),
                # the run config's knobs; a caller's train_args (the accuracy benchmark) take precedence
                **{"weight_decay": cfg.weight_decay, "momentum": cfg.momentum, "nesterov": cfg.nesterov,
                   "lr_schedule": cfg.lr_schedule, "warmup_epochs": cfg.warmup_epochs,
                   "clip_grad_norm": cfg.clip_grad_norm, **(train_args or {})},
            )
    finally:
        folder.close()
        if counter is not None:
            counter.detach()
    if isinstance(folder, SilentFolder):
        return exit_code_for(got[0]) if got else 0
    write_summary(folder.root, cfg, result)
    if got:
        folder.log(f"interrupted by signal {got[0]}: saved {folder.checkpoint('last')[0]}; "
                   f"continue with `inttrain resume {folder.root}`")
        return exit_code_for(got[0])
    quality = f"val_acc {result.val_accuracy:.4f}"
    if p.splits.task == "lm":
        quality = f"val_loss {result.val_loss:.4f}, val_ppl {result.val_perplexity:.2f}, {quality}"
    folder.log(
        f"done: {quality}, {result.time_per_step * 1e3:.2f} ms/step (median), "
        f"{result.steps} steps, {result.skipped_steps} skipped"
        + (f"; stopped early ({result.stopped}), continue with `inttrain resume {folder.root}`" if result.stopped else "")
    )
    return 0


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MiB)."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1024 ** 2 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def write_summary(root: Path, cfg: RunConfig, result: Any) -> None:
    """``summary.json``: the numbers `inttrain compare` tabulates (one process per run: honest peak RSS)."""
    import json
    import math
    import statistics

    def num(v: float) -> float | None:
        return v if isinstance(v, (int, float)) and math.isfinite(v) else None

    epoch_seconds = [e.seconds for e in result.epochs]
    summary = {
        "recipe": cfg.recipe,
        "bits": cfg.bits,
        "val_accuracy": num(result.val_accuracy),
        "best_val_accuracy": num(max(result.val_accuracies, default=math.nan)),
        "val_loss": num(result.val_loss),
        "val_perplexity": num(result.val_perplexity),
        "epochs": len(result.epochs),
        "steps": result.steps,
        "skipped_steps": result.skipped_steps,
        "time_per_step": num(result.time_per_step),
        "seconds_per_epoch": num(statistics.mean(epoch_seconds)) if epoch_seconds else None,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "stopped": result.stopped,
    }
    import os

    tmp = root / ".summary.json.tmp"  # atomic: `inttrain compare` never reads half a summary
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, root / "summary.json")


class SilentFolder:
    """The run-folder hooks of ranks other than 0: they train in lock step but write and print nothing."""

    def __init__(self) -> None:
        self.stop = False
        self.extra = None
        self.root = None

    def on_step(self, *a: Any) -> None: ...
    def on_epoch(self, *a: Any) -> None: ...
    def save(self, *a: Any) -> None: ...
    def log(self, line: str) -> None: ...
    def open_tensorboard(self, *a: Any) -> None: ...
    def close(self) -> None: ...

    def should_stop(self) -> bool:
        return self.stop


def _silent(*a: Any, **k: Any) -> None:
    return None


def _rank_env() -> tuple[int, int, int] | None:
    from inttrain.distributed.data_parallel import env_rank

    return env_rank()


def _rank_threads(cfg: RunConfig) -> None:
    """Ranks share the CPU: without --threads each gets cores / local ranks (at least 1)."""
    import os

    import torch

    if cfg.threads is None:
        per = os.environ.get("INTTRAIN_THREADS_PER_RANK")
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
        torch.set_num_threads(int(per) if per else max(1, (os.cpu_count() or 1) // max(1, local)))


def _setup_ranks(cfg: RunConfig, setup: Any) -> tuple[Any, Any]:
    """Init the process group from env, run ``setup()`` on every rank, agree that all succeeded.

    Returns (setup's result, DataParallel). A rank whose setup failed re-raises its own error; the
    others raise naming it, so no rank waits in a collective for a peer that is gone.
    """
    import torch
    import torch.distributed as dist

    from inttrain.distributed.data_parallel import DataParallel, init_from_env

    rank, world = init_from_env(cfg.dist_timeout)
    error: BaseException | None = None
    result = None
    try:
        result = setup(rank)
    except Exception as e:  # noqa: BLE001 - re-raised below, after the ranks agreed
        error = e
    flags = torch.zeros(world)
    flags[rank] = 1.0 if error is not None else 0.0
    dist.all_reduce(flags)
    if error is not None:
        raise error
    failed = [r for r in range(world) if flags[r] > 0]
    if failed:
        raise RuntimeError(f"setup failed on rank {failed[0]} (see its error)")
    return result, DataParallel(comm=cfg.comm, seed=cfg.seed, sync_bn=cfg.sync_bn)


def _finish_ranks() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _launch(args: list[str], cfg: RunConfig) -> int:
    import os

    from inttrain.distributed.launch import launch_local

    per = None if cfg.threads is not None else max(1, (os.cpu_count() or 1) // cfg.nproc)
    return launch_local(args, cfg.nproc, cfg.dist_timeout, echo=lambda m: typer.echo(m, err=True), threads_per_rank=per,
                        max_restarts=cfg.max_restarts)


def _create_folder(out: Path, cfg: RunConfig) -> Any:
    """Create the run folder (after every check passed), or UsageProblem naming --out."""
    from inttrain.trainer.run_folder import RunFolder

    folder = RunFolder(out, asdict(cfg), cfg.log_every, echo=typer.echo)
    try:
        folder.create()
    except OSError as e:
        raise UsageProblem("--out", f"{str(out)!r}: cannot write ({e.strerror or e})") from None
    return folder


def _remove_if_no_checkpoint(out: Path) -> None:
    """A run that failed before its first checkpoint leaves nothing that looks like a result.

    ``check_out`` made sure ``out`` was new or empty, so everything in it is this command's.
    """
    import shutil

    from inttrain.trainer.checkpoint import checkpoint_paths

    if not any(checkpoint_paths(out / "checkpoints", n)[1].is_file() for n in ("last", "best")):
        shutil.rmtree(out, ignore_errors=True)


def _elastic_restart(out: Path, cfg: RunConfig) -> str:
    """On a restarted attempt (TORCHELASTIC_RESTART_COUNT > 0): "resume" if ``out`` is this run's folder
    with ``checkpoints/last``, "restart" if it is this run's folder without one (start over in it), else "".

    "This run's folder" means its config.yaml equals ``cfg`` (apart from the keys a resume may change), so
    a restart never takes over somebody else's folder.
    """
    import os

    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) <= 0 or not (out / "config.yaml").is_file():
        return ""
    import yaml

    try:
        saved = yaml.safe_load((out / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return ""
    volatile = ("nproc", "max_steps", "epochs", "threads", "comm", "max_restarts")
    mine = {k: v for k, v in asdict(cfg).items() if k not in volatile}
    if {k: v for k, v in saved.items() if k not in volatile} != mine:
        return ""
    from inttrain.trainer.checkpoint import checkpoint_paths

    w, st = checkpoint_paths(out / "checkpoints", "last")
    return "resume" if w.is_file() and st.is_file() else "restart"


def start_run(cfg: RunConfig, out: Path | None) -> int:
    out = out if out is not None else default_out(cfg)
    env = _rank_env()
    if env is not None:
        cfg = dataclasses.replace(cfg, nproc=env[1])  # torchrun decides the world size
    validate_config(cfg)  # cheap name/number checks first, so their errors win
    if env is None and cfg.nproc > 1:
        # Launch N ranks of this same command; they read the resolved config from a temporary file.
        import tempfile

        from inttrain.trainer.run_folder import write_yaml_atomic

        check_out(out)
        with tempfile.TemporaryDirectory(prefix="inttrain-launch-") as tmp:
            cfg_file = Path(tmp) / "config.yaml"
            write_yaml_atomic(cfg_file, asdict(cfg))
            return _launch(["train", "--config", str(cfg_file), "--out", str(out)], cfg)
    if env is None:
        check_out(out)
        p = prepare_run(cfg)
        folder = _create_folder(out, cfg)
        typer.echo(f"run folder: {out}")
        try:
            return run_training(p, folder)
        except Exception:
            _remove_if_no_checkpoint(out)
            raise

    restart = _elastic_restart(out, cfg)
    if restart == "resume":  # a restarted rank (torchrun --max-restarts / --max-restarts): continue from last
        return resume_run(out, cfg.epochs, cfg.max_steps, cfg.threads, comm=cfg.comm)
    _rank_threads(cfg)

    def setup(rank: int) -> tuple[Prepared, Any]:
        if rank != 0:
            return prepare_run(cfg, echo=_silent), SilentFolder()
        if restart != "restart":
            check_out(out)
        p = prepare_run(cfg)
        folder = _create_folder(out, cfg)
        typer.echo(f"run folder: {out} ({env[1]} processes, {cfg.comm} gradient all-reduce, "
                   f"global batch {cfg.batch_size} = {env[1]} x {cfg.batch_size // env[1]})")
        return p, folder

    try:
        (p, folder), dp = _setup_ranks(cfg, setup)
        return run_training(p, folder, dp=dp)
    finally:
        _finish_ranks()


def resume_run(run_dir: Path, epochs: int | None, max_steps: int | None, threads: int | None,
               nproc: int | None = None, comm: str | None = None) -> int:
    """Continue ``run_dir`` from ``checkpoints/last`` bit-identically.

    ``nproc``/``comm``: processes and gradient communication of this leg (default: the saved
    run's). Checkpoints do not depend on the process count (``batch_size`` is the global batch),
    so a run may resume with any ``nproc`` dividing it.
    """
    from inttrain.trainer import CheckpointError, load_checkpoint
    from inttrain.trainer.run_folder import RunFolder, write_yaml_atomic

    if not run_dir.is_dir():
        raise UsageProblem("RUN_DIR", f"{str(run_dir)!r} is not a folder; expected a run folder made by `inttrain train`")
    env = _rank_env()
    folder = RunFolder(run_dir, {}, echo=typer.echo)
    w_path, s_path = folder.checkpoint("last")
    try:
        weights, state = load_checkpoint(w_path, s_path)
    except CheckpointError as e:
        raise UsageProblem("RUN_DIR", str(e)) from None
    check_state_keys(state, s_path)
    saved = config_from_dict(dict(state.get("config", {})), f"{s_path} config")
    if "dclr" not in saved and "layer_hooks" not in state:
        saved["dclr"] = False  # written before the trainer applied DCLR: the run trained without it
    # max_steps of the first leg is what stopped it; a resume runs to the end unless told otherwise.
    saved["max_steps"] = max_steps
    if epochs is not None:
        saved["epochs"] = epochs
    if threads is not None:
        saved["threads"] = threads
    if nproc is not None:
        saved["nproc"] = nproc
    if comm is not None:
        saved["comm"] = comm
    if env is not None:
        saved["nproc"] = env[1]
    cfg = dataclasses.replace(RunConfig(), **saved)
    validate_config(cfg)
    if env is None and cfg.nproc > 1:
        args = ["resume", str(run_dir), "--nproc", str(cfg.nproc), "--comm", cfg.comm]
        for flag, value in (("--epochs", epochs), ("--max-steps", max_steps), ("--threads", threads)):
            if value is not None:
                args += [flag, str(value)]
        return _launch(args, cfg)
    ts = state["train_state"]

    def setup(rank: int) -> tuple[Prepared, Any]:
        if rank != 0:
            return prepare_run(cfg, echo=_silent), SilentFolder()
        p = prepare_run(cfg)
        folder.config, folder.log_every = asdict(cfg), cfg.log_every
        folder.truncate_after(int(ts["step"]), int(ts["epoch"]))
        write_yaml_atomic(run_dir / "config.yaml", folder.config)
        folder.log(f"resuming {run_dir} at step {ts['step']} (epoch {ts['epoch'] + 1}, batch {ts['position']})"
                   + (f" on {cfg.nproc} processes ({cfg.comm})" if env is not None else ""))
        return p, folder

    try:
        if env is None:
            p, dp = setup(0), None
            p, folder_ = p
        else:
            _rank_threads(cfg)
            (p, folder_), dp = _setup_ranks(cfg, setup)
        return run_training(p, folder_, resume_from=(weights, state), dp=dp)
    except RuntimeError as e:  # load_state_dict: keys/shapes do not match the configured model
        if "state_dict" in str(e):
            raise UsageProblem("RUN_DIR", f"{w_path}: does not fit model {cfg.model!r}: {str(e).splitlines()[0]}") from None
        raise
    finally:
        if env is not None:
            _finish_ranks()


def _use_compile(cfg: RunConfig, p: Any, dp: Any) -> bool:
    """``--compile/--no-compile``, or the measured-fastest default (inttrain.trainer.compiled.auto_compile)."""
    if cfg.compile is not None:
        return cfg.compile
    if cfg.schedule in ("dfq", "fractrain"):  # gate choices per step: graph breaks and recompiles, no gain measured
        return False
    from inttrain.api import get_config
    from inttrain.trainer.compiled import auto_compile

    recipe = get_config(p.recipe_config if p.recipe_config is not None else cfg.recipe)
    return auto_compile(recipe.converts_layers(), dp is not None, recipe.compiles())[0]
