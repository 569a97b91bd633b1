"""The ``inttrain`` command: ``demo``, ``env``, ``train``, ``resume``, ``eval``, ``recipes``, ``plot``, ``compare``.

Errors users can fix (bad names, bad data, missing files) print one
``error: ...`` line and exit with code 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .checks import check_positive as _check_positive
from .checks import check_recipe as _check_recipe

__all__ = ["app", "main"]

# -h as well as --help, on every command.  Options resolved from the run config (typer default None) write
# "\\[default: ...]" in their help: an unescaped "[...]" is rich markup and would vanish.
_CONTEXT = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    name="inttrain",
    help="Train neural networks in integer arithmetic.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings=_CONTEXT,
)


def _print_version(value: bool) -> None:
    if value:
        from inttrain import __version__

        typer.echo(f"inttrain {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks on errors (any position).")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Train neural networks in integer arithmetic.

    Example: inttrain train --model small-cnn --dataset digits --recipe int8 --epochs 1
    """


@app.command()
def demo(
    epochs: Annotated[int, typer.Option(help="Epochs per recipe.")] = 4,
    batch_size: Annotated[int, typer.Option(help="Batch size.")] = 32,
    lr: Annotated[float, typer.Option(help="Learning rate (SGD, momentum 0.9).")] = 0.05,
    seed: Annotated[int, typer.Option(help="Seed for init, data split and order.")] = 0,
    recipes: Annotated[str, typer.Option(help="Comma-separated recipes to compare.")] = "fp32,int8",
    threads: Annotated[
        int, typer.Option(help="CPU threads. 1 by default: the tiny model gains nothing from more, and "
                          "spinning thread pools make timings erratic on busy machines.")
    ] = 1,
    layer_check: Annotated[
        int, typer.Option(help="Also time one Linear layer of this size in fp32/bf16/int8 (0: skip).")
    ] = 2048,
) -> None:
    """Train a small CNN on the built-in digits data in fp32 and int8 and compare.

    Example: inttrain demo --epochs 1 --layer-check 512
    """
    from .demo import format_layer_times, format_table, run_demo, time_linear_layer

    _check_positive(epochs=epochs, batch_size=batch_size, lr=lr, threads=threads)
    if seed < 0:  # NumPy's generators (data split and order) take none
        raise _usage("--seed", f"{seed} must be >= 0")
    _set_threads(threads)
    names = [r.strip() for r in recipes.split(",") if r.strip()]
    if not names:
        raise _usage("--recipes", f"{recipes!r} names no recipe; e.g. fp32,int8")
    for name in names:
        _check_recipe(name, field="--recipes")
    rows = run_demo(names, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed)
    typer.echo("")
    typer.echo(format_table(rows))
    if layer_check > 0:
        typer.echo("")
        typer.echo(format_layer_times(time_linear_layer(layer_check), layer_check))


@app.command()
def env() -> None:
    """Print torch version, CPU int8 features, CUDA and the active kernel paths.

    Example: inttrain env
    """
    from .env import collect_env, format_env

    typer.echo(format_env(collect_env()))


def train_cmd(
    out: Annotated[Optional[Path], typer.Option(help="Run folder \\[default: runs/<model>-<recipe>-<timestamp>].")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="YAML file of run settings (flags override it).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="key=value override of a config key (repeatable).")] = None,
    **flags: object,
) -> None:
    """Train one model with one recipe into a run folder (config, metrics, log, checkpoints).

    Example: inttrain train --model small-cnn --dataset digits --recipe int8 --epochs 1 --out runs/digits-int8
    """
    from .config import resolve_config
    from .run import start_run

    cfg = resolve_config(config, list(set_ or []), flags)
    code = start_run(cfg, out)
    if code:
        raise typer.Exit(code)


def _with_run_config_options(command: Any) -> Any:
    """``command``'s signature with one option per CLI field of RunConfig (the only place they are declared)."""
    import inspect

    from .config import train_options

    # eval_str: this module's annotations are strings (``from __future__ import annotations``).
    own = inspect.signature(command, eval_str=True).parameters.values()
    fixed = [p.replace(kind=p.KEYWORD_ONLY) for p in own if p.kind is not p.VAR_KEYWORD]
    options = train_options()
    command.__signature__ = inspect.Signature([*options, *fixed])
    command.__annotations__ = {**{p.name: p.annotation for p in options}, **command.__annotations__}
    return command


app.command("train")(_with_run_config_options(train_cmd))


@app.command("resume")
def resume_cmd(
    run_dir: Annotated[Path, typer.Argument(help="Run folder written by `inttrain train`.")],
    epochs: Annotated[Optional[int], typer.Option(help="New total number of epochs.")] = None,
    max_steps: Annotated[Optional[int], typer.Option(help="Stop again after this many steps in total.")] = None,
    threads: Annotated[Optional[int], typer.Option(help="CPU threads.")] = None,
    nproc: Annotated[Optional[int], typer.Option(help="Data-parallel processes for this leg (any that divides the global batch). \\[default: the run's]")] = None,
    comm: Annotated[Optional[str], typer.Option(help="fp32 or int8 gradient all-reduce for this leg. \\[default: the run's]")] = None,
) -> None:
    """Continue a run from its last checkpoint, bit-identically.

    Example: inttrain resume runs/digits-int8 --epochs 3
    """
    from .run import resume_run

    _check_positive(**{k: v for k, v in dict(epochs=epochs, max_steps=max_steps, threads=threads, nproc=nproc).items() if v is not None})
    code = resume_run(run_dir, epochs, max_steps, threads, nproc, comm)
    if code:
        raise typer.Exit(code)


@app.command("eval")
def eval_cmd(
    checkpoint: Annotated[Path, typer.Argument(metavar="CKPT_OR_RUN_DIR", help="Run folder (best, else last) or .safetensors file.")],
    dataset: Annotated[Optional[str], typer.Option(help="Evaluate on another dataset (default: the run's).")] = None,
    data_dir: Annotated[Optional[Path], typer.Option(help="Data for --dataset.")] = None,
    threads: Annotated[Optional[int], typer.Option(help="CPU threads.")] = None,
) -> None:
    """Print the validation accuracy of a checkpoint.

    Example: inttrain eval runs/digits-int8
    """
    from .evaluate import run_eval

    run_eval(checkpoint, dataset, data_dir, threads)


@app.command("cost")
def cost_cmd(
    model: Annotated[str, typer.Option(help="Model name.")] = "small-cnn",
    recipe: Annotated[str, typer.Option(help="Integer recipe, e.g. int8.")] = "int8",
    batch_size: Annotated[int, typer.Option(help="Batch size of the dummy batch.")] = 32,
    dataset: Annotated[str, typer.Option(help="Dataset whose input shape and classes to use.")] = "digits",
    data_dir: Annotated[Optional[Path], typer.Option(help="Data file or folder for --dataset.")] = None,
    bits: Annotated[Optional[int], typer.Option(help="Override the recipe's bit width.")] = None,
    forward_bits: Annotated[Optional[int], typer.Option(help="Forward-GEMM bits (as a precision schedule would set).")] = None,
    grad_bits: Annotated[Optional[int], typer.Option(help="Output-gradient bits of the backward GEMMs.")] = None,
    seq_len: Annotated[int, typer.Option(help="Text dataset: sequence length.")] = 64,
) -> None:
    """Per-layer BitOPs / energy / saved-activation table of one forward+backward on a dummy batch (no training).
    BitOPs is the hardware-independent measure; on this CPU fewer than 8 bits are not faster (int8 kernels).

    Example: inttrain cost --model resnet20 --dataset synthetic --recipe int8 --batch-size 8
    """
    from .cost_cmd import cost_config, run_cost

    cfg = cost_config(model=model, recipe=recipe, batch_size=batch_size, dataset=dataset,
                      data_dir=None if data_dir is None else str(data_dir), bits=bits, seq_len=seq_len)
    run_cost(cfg, forward_bits, grad_bits)


@app.command("export")
def export_cmd(
    source: Annotated[Path, typer.Argument(metavar="RUN_OR_CKPT", help="Run folder or .safetensors checkpoint (micro: also a model folder with model.json).")],
    format: Annotated[str, typer.Option("--format", help="onnx: int8 QDQ ONNX model (ONNX Runtime); torch: torch.export program (.pt2); micro: integer-only model for the NumPy micro engine.")] = "micro",
    out: Annotated[Optional[Path], typer.Option(help="Output: a .onnx / .pt2 file, or the micro model folder. \\[default: RUN/export/model.onnx, model.pt2 or micro]")] = None,
    data: Annotated[Optional[Path], typer.Option(help="micro only: DATA.npz (x int8, x_exp, y) to check that micro and torch predict identically.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out (atomically).")] = False,
) -> None:
    """Export a trained run for inference and check it: top-1 agreement with the trained model on the run's validation data.

    Example: inttrain export runs/digits-int8 --format onnx
    """
    from .errors import check_choice
    from .export_inference import EXPORT_FORMATS, default_export_path, run_export_inference

    check_choice("--format", format, EXPORT_FORMATS)
    if format == "micro":
        from .export import run_export

        run_export(source, out if out is not None else default_export_path(source, "micro"), data, echo=typer.echo,
                   force=force)
        return
    if data is not None:
        raise _usage("--data", f"{str(data)!r}: only --format micro takes a DATA.npz; onnx and torch exports are "
                     "checked on the run's own validation data")
    run_export_inference(source, format, out, echo=typer.echo)


recipes_app = typer.Typer(help="List the recipes, or show one: paper, bits per GEMM, what is integer and float, "
                          "defaults.\n\nExample: inttrain recipes show int8", invoke_without_command=True,
                          context_settings=_CONTEXT)
app.add_typer(recipes_app, name="recipes")


@recipes_app.callback()
def recipes_list(ctx: typer.Context) -> None:
    """List the recipe names this build can run.

    Example: inttrain recipes show int8
    """
    from .recipes_cmd import recipe_list

    if ctx.invoked_subcommand is None:
        typer.echo("\n".join(recipe_list()))


@recipes_app.command("show")
def recipes_show(name: Annotated[str, typer.Argument(help="Recipe name (see `inttrain recipes`), including integer-only.")]) -> None:
    """The recipe's paper, bits per GEMM, what runs in integer and what in float, and its config defaults.

    Example: inttrain recipes show unified-int8
    """
    from .recipes_cmd import describe_recipe

    typer.echo(describe_recipe(name))


@app.command("plot")
def plot_cmd(
    run_dirs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR", help="Run folder(s); several are overlaid.")],
    out: Annotated[Optional[Path], typer.Option(help="Folder of the overlaid plots \\[default: plots/ in the runs' common parent].")] = None,
) -> None:
    """Loss, accuracy and lr curves to RUN_DIR/plots/*.png; several runs overlaid, one line per run.

    Example: inttrain plot runs/digits-int8 runs/digits-fp32 --out runs/plots
    """
    from .plot import plot_runs

    for path in plot_runs(run_dirs, out):
        typer.echo(str(path))


@app.command("compare")
def compare_cmd(
    recipes: Annotated[str, typer.Option(help="Comma-separated recipes, e.g. fp32,int8,bf16.")] = "fp32,int8",
    model: Annotated[str, typer.Option(help="Model name.")] = "small-cnn",
    dataset: Annotated[str, typer.Option(help="Dataset name.")] = "digits",
    data_dir: Annotated[Optional[Path], typer.Option(help="Data file or folder.")] = None,
    epochs: Annotated[int, typer.Option(help="Epochs per recipe.")] = 5,
    batch_size: Annotated[int, typer.Option(help="Batch size.")] = 32,
    lr: Annotated[float, typer.Option(help="Learning rate.")] = 0.05,
    optimizer: Annotated[str, typer.Option(help="sgd, adam or adamw.")] = "sgd",
    seed: Annotated[int, typer.Option(help="Seed (same for every recipe).")] = 0,
    threads: Annotated[int, typer.Option(help="CPU threads per run (1: stable timings).")] = 1,
    max_steps: Annotated[Optional[int], typer.Option(help="Step budget per recipe.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Folder \\[default: runs/compare-<model>-<dataset>-<timestamp>].")] = None,
) -> None:
    """Train the same model under several recipes and tabulate accuracy, speed and memory.

    Example: inttrain compare --recipes fp32,int8 --model mlp --dataset synthetic --epochs 1
    """
    import time

    from .compare import parse_recipes, run_compare
    from .config import RunConfig
    from .run import validate_config

    names = parse_recipes(recipes)
    for name in names:
        _check_recipe(name, field="--recipes")
    base = dict(model=model, dataset=dataset, data_dir=str(data_dir) if data_dir else None, epochs=epochs,
                batch_size=batch_size, lr=lr, optimizer=optimizer, seed=seed, threads=threads, max_steps=max_steps)
    for name in names:
        validate_config(RunConfig(**base, recipe=name))  # every error before the first run starts
    args = [f"--{k.replace('_', '-')}={v}" for k, v in base.items() if v is not None]
    out = out or Path("runs") / f"compare-{model}-{dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
    code = run_compare(names, args, out, f"{model} on {dataset}: {', '.join(names)} (seed {seed}, {epochs} epochs)")
    if code:
        raise typer.Exit(code)


# ----------------------------------------------------------------------------- helpers


def _usage(field: str, message: str) -> Exception:
    from .errors import UsageProblem

    return UsageProblem(field, message)


def _check_choice(field: str, value: str, allowed: tuple[str, ...]) -> None:
    from .errors import check_choice

    check_choice(field, value, allowed)


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the process exit code."""
    import os

    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None:  # this process is the application: keep freed buffers mapped (see keep_freed_memory)
        from inttrain.kernels.workspace import keep_freed_memory

        keep_freed_memory()
    code = _main(args)
    if code and "RANK" in os.environ and "WORLD_SIZE" in os.environ and argv is None:
        # A failed rank exits at once: waiting on a process group whose peers may be gone can hang.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _rank_prefix() -> str:
    import os

    return f"rank {os.environ['RANK']}: " if "RANK" in os.environ and "WORLD_SIZE" in os.environ else ""


def _one_line(text: object) -> str:
    """Messages may quote file contents: newlines and runs of blanks become one space."""
    return " ".join(str(text).split())


def _main(args: list[str]) -> int:
    from inttrain.spec.errors import InttrainError

    # --debug is accepted anywhere on the line, not only before the command.
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=args, prog_name="inttrain", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except typer.Abort as e:
        if isinstance(e.__context__, EOFError):  # click turns EOFError into Abort: a file ended early, no Ctrl-C
            if debug:
                traceback.print_exception(e.__context__)
            typer.echo(f"error: {_rank_prefix()}input: unexpected end of file ({_one_line(e.__context__) or 'no data'}); "
                       "an empty or truncated file was given where data was expected", err=True)
            return 2
        typer.echo(f"error: {_rank_prefix()}aborted", err=True)
        return 130
    except Exception as e:
        if debug:
            traceback.print_exc()
        if isinstance(e, InttrainError):  # every refused input: one line, exit 2
            typer.echo(f"error: {_rank_prefix()}{_one_line(e)}", err=True)
            return e.exit_code
        if isinstance(e, MemoryError):  # a size no limit caught: still one line, and say which knob helps
            typer.echo(f"error: {_rank_prefix()}out of memory: {_one_line(e) or 'an allocation failed'}; lower the batch "
                       "size, model size or data size (see the README's reliability section for the limits)", err=True)
            return 2
        if isinstance(e, typer.TyperException):  # typer's own usage errors (unknown option, ...)
            typer.echo(f"error: {_rank_prefix()}{e.format_message()}", err=True)
            return int(getattr(e, "exit_code", 2))
        from inttrain.trainer import NonFiniteLossError

        if isinstance(e, NonFiniteLossError):
            typer.echo(f"error: {_rank_prefix()}training diverged: {e}", err=True)
            return 1
        if isinstance(e, ValueError):  # inttrain's own validation (e.g. a recipe prepare_ rejects)
            typer.echo(f"error: {_rank_prefix()}{_one_line(e)}", err=True)
            return 2
        typer.echo(
            f"error: {_rank_prefix()}unexpected {type(e).__name__}: {e}" + ("" if debug else " (rerun with --debug for the traceback)"),
            err=True,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
