"""Device CLI (argparse only, NumPy only).

python -m inttrain.micro train MODEL.json DATA.npz --epochs 10 --val VAL.npz --keep-best --out DIR
python -m inttrain.micro train --resume DIR [--max-seconds S]
python -m inttrain.micro eval MODEL_DIR DATA.npz
python -m inttrain.micro convert SOURCE [LABELS] --out DATA.npz
python -m inttrain.micro codegen MODEL --out DIR [--batch-size 32] [--lr-shift 6]
python -m inttrain.micro codegen-check MODEL DATA.npz --steps N [--batch-size B] [--lr-shift S]

Errors (bad files, bad arguments) print one line ``error: ...`` to stderr and exit with status 2;
``--debug`` (anywhere on the line) adds the traceback.
"""

from __future__ import annotations

import argparse
import resource
import shlex
import sys
import time
import traceback

from inttrain.spec.errors import InttrainError


def _peak_mib() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss     # KiB on Linux, bytes on macOS
    return kb / (1024 * 1024) if sys.platform == "darwin" else kb / 1024


class _Parser(argparse.ArgumentParser):
    def error(self, message):          # one line + exit 2, like every other error
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


class _Help(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples' line breaks and appends each option's default (unless the help states it)."""

    def _get_help_string(self, action):
        h = action.help or ""
        if "(default" in h or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return h
        return h + " (default: %(default)s)"


#: ``train`` defaults (chosen from the runs in docs/integer-training.md §7 "Choosing the defaults"). The
#: options are parsed with None so that ``--resume`` can tell which ones were given.
TRAIN_DEFAULTS = {"epochs": 10, "batch_size": 32, "lr_mode": "norm", "lr_bits": 10, "bn_lr_bits": None, "lr_shift": 8,
                  "momentum_shift": None, "nesterov": False, "decay_shift": None, "l2_shift": None, "frac_bits": None, "schedule": "cosine", "warmup_epochs": 0.25,
                  "step_every": None, "adapt_exp": True, "seed": 0, "augment": "none"}
ROUNDING_OPTS = ("forward_rounding", "backward_rounding", "update_rounding")
_EXAMPLES = {
    "train": "example:\n  python -m inttrain.micro train lenet5.json mnist_train.npz --val mnist_val.npz --epochs 15 "
             "--keep-best --out run\n  python -m inttrain.micro train --resume run            # continue a stopped "
             "or killed run",
    "eval": "example:\n  python -m inttrain.micro eval run mnist_val.npz",
    "convert": "examples:\n  python -m inttrain.micro convert images.npz --out data.npz             # uint8 x (N,H,W[,C]) + y\n"
               "  python -m inttrain.micro convert train-images-idx3-ubyte train-labels-idx1-ubyte --out data.npz\n"
               "  python -m inttrain.micro convert pngs/ --out data.npz                  # pngs/<class>/*.png",
    "codegen": "example:\n  python -m inttrain.micro codegen lenet5.json --out gen --batch-size 32 --lr-shift 8",
    "codegen-check": "example:\n  python -m inttrain.micro codegen-check lenet5.json data.npz --steps 20 --lr-shift 8",
}


def _default(key: str) -> str:
    return f"(default: {TRAIN_DEFAULTS[key]})"


def _rounding_args(t: argparse.ArgumentParser) -> None:
    """train's --forward/--backward/--update-rounding, with the description defaults they override."""
    from .model import DEFAULT_ROUNDING
    from .ops import ROUNDING_MODES

    defaults = ", ".join(f"{k} {v}" for k, v in DEFAULT_ROUNDING.items())
    for o in ROUNDING_OPTS:
        t.add_argument("--" + o.replace("_", "-"), choices=ROUNDING_MODES,
                       help=f"{o.split('_')[0]} shift rounding (default: the model's; descriptions default to {defaults})")


def _step_args(t: argparse.ArgumentParser) -> None:
    """train's step rule, schedule, momentum and decay options."""
    from .optim import LR_MODES, SCHEDULES

    t.add_argument("--lr-mode", choices=LR_MODES, help="norm: each tensor's largest step is 2**LR_BITS master codes "
                   "(scale-free, no sweep); shift: lr 2**-LR_SHIFT on the summed batch gradient (the C code "
                   f"generator's rule) {_default('lr_mode')}")
    t.add_argument("--lr-bits", type=int, help=f"norm mode: largest step 2**LR_BITS codes (0..14) {_default('lr_bits')}")
    t.add_argument("--bn-lr-bits", type=int, help="norm mode: largest step of batch-norm gamma / beta, 0..14 "
                   "(default: LR_BITS - 1)")
    t.add_argument("--lr-shift", type=int, help=f"shift mode: learning rate 2**-LR_SHIFT {_default('lr_shift')}")
    t.add_argument("--schedule", choices=SCHEDULES, help="step-size multiplier (integer Q8): const, step (halve every "
                   f"--step-every epochs) or cosine to 0 {_default('schedule')}")
    t.add_argument("--warmup-epochs", type=float, help=f"linear warm-up length in epochs {_default('warmup_epochs')}")
    t.add_argument("--step-every", type=int, help="step schedule: epochs between halvings (default: epochs // 3, >= 1)")
    t.add_argument("--momentum-shift", type=int, help="momentum beta = 1 - 2**-M, 1..16 (default: off)")
    t.add_argument("--nesterov", action="store_const", const=True, default=None, help="Nesterov momentum: each step "
                   "is the gradient step plus beta times the new momentum, as torch SGD(nesterov=True) (needs "
                   "--momentum-shift; default: off)")
    t.add_argument("--decay-shift", type=int, help="weight decay W -= W * 2**-D per step, 1..30 (default: off)")
    t.add_argument("--l2-shift", type=int, help="L2 weight decay: 2**-L * W added to the summed-batch gradient before "
                   "the step rule, as torch SGD's weight_decay x the batch size (L = 4: 5e-4 at batch 128), 0..30 "
                   "(default: off)")
    t.add_argument("--frac-bits", type=int, help="an int16 remainder of F (1..15) bits below each master code: steps "
                   "below one code add up instead of being rounded to whole codes one by one (default: off)")
    t.add_argument("--no-adapt-exp", dest="adapt_exp", action="store_const", const=False, default=None,
                   help="keep weight exponents fixed (default: a tensor reaching half its code range is halved and "
                        "its exponent raised, so no master weight sits at the integer limit)")


def build_parser() -> argparse.ArgumentParser:
    from .augment import AUGMENTS
    from .convert import RULE

    p = _Parser(prog="python -m inttrain.micro", description="Integer-only training (NumPy only).",
                formatter_class=_Help, epilog="\n".join(v.split("\n", 1)[1] for v in _EXAMPLES.values()).join(
                    ("examples:\n", "")))
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    t = sub.add_parser("train", help="train a model description on DATA.npz (x int8, x_exp, y)", formatter_class=_Help,
                       description="Train with integer arithmetic only; OUT is rewritten atomically after every epoch "
                                   "(saved model + checkpoint), so a stopped or killed run continues with --resume.",
                       epilog=_EXAMPLES["train"])
    t.add_argument("model", nargs="?", help="MODEL.json (a layer description) or a saved model directory to start from")
    t.add_argument("data", nargs="?", help="DATA.npz with x (int8 codes), x_exp (scale exponent), y (labels)")
    t.add_argument("--out", help="output directory: model.json + weights.safetensors + checkpoint (required unless --resume)")
    t.add_argument("--resume", metavar="DIR", help="continue the run saved in DIR bit for bit (settings and data "
                   "paths come from its checkpoint; only --max-seconds / --log-every may be given)")
    t.add_argument("--epochs", type=int, help=f"epochs to train {_default('epochs')}")
    t.add_argument("--batch-size", type=int, help=f"batch size {_default('batch_size')}")
    _step_args(t)
    _rounding_args(t)
    t.add_argument("--seed", type=int, help=f"data shuffling seed (epoch e uses SEED + e) {_default('seed')}")
    t.add_argument("--augment", choices=AUGMENTS, help="crop-flip: each training image randomly cropped from its "
                   f"4-pixel zero-padded copy and mirrored with probability 1/2 (image models) {_default('augment')}")
    t.add_argument("--val", default=None, help="validation DATA.npz evaluated after each epoch (default: none)")
    t.add_argument("--keep-best", action="store_true", default=None,
                   help="save the epoch with the best validation accuracy (needs --val); model.json info says which")
    t.add_argument("--max-seconds", type=float, default=None,
                   help="stop (with a checkpoint) once this much time has passed; continue with --resume (default: none)")
    t.add_argument("--log-every", type=int, default=50, help="steps between progress lines (0: none)")
    t.add_argument("--force", action="store_true", help="replace an existing --out (at the end of the first epoch)")
    e = sub.add_parser("eval", help="accuracy of a saved model on DATA.npz", formatter_class=_Help, epilog=_EXAMPLES["eval"])
    e.add_argument("model_dir", help="a saved model directory (train --out)")
    e.add_argument("data", help="DATA.npz with x (int8 codes), x_exp, y")
    e.add_argument("--batch-size", type=int, default=256, help="evaluation batch size")
    v = sub.add_parser("convert", help="uint8 images (npz, MNIST idx, PNG folder) to DATA.npz", formatter_class=_Help,
                       description=RULE, epilog=_EXAMPLES["convert"])
    v.add_argument("source", help="an .npz with uint8 x (or images) and y (or labels); an idx3-ubyte image file "
                   "(then LABELS is the idx1-ubyte label file); or a folder of class folders of PNGs")
    v.add_argument("labels", nargs="?", help="the idx1-ubyte label file (MNIST idx input only)")
    v.add_argument("--out", required=True, help="the DATA.npz to write")
    v.add_argument("--flatten", action="store_true", help="write x as (N, C*H*W) for linear-first models")
    v.add_argument("--force", action="store_true", help="replace an existing --out")
    g = sub.add_parser("codegen", help="generate C99 training code (no malloc, no float) for a model",
                       formatter_class=_Help, epilog=_EXAMPLES["codegen"])
    g.add_argument("model", help="MODEL.json (a layer description) or a saved model directory")
    g.add_argument("--out", required=True, help="output directory for model.c/.h and the runtime")
    _codegen_args(g)
    c = sub.add_parser("codegen-check", help="compile the generated C and compare N training steps with micro",
                       formatter_class=_Help, epilog=_EXAMPLES["codegen-check"])
    c.add_argument("model", help="MODEL.json (a layer description) or a saved model directory")
    c.add_argument("data", help="DATA.npz with x (int8 codes), x_exp (scale exponent), y (labels)")
    c.add_argument("--steps", type=int, required=True, help="training steps to run in C and in micro")
    c.add_argument("--seed", type=int, default=0, help="data shuffling seed (the order train uses)")
    c.add_argument("--keep", default=None, help="write the generated sources and the harness here")
    c.add_argument("--cc", default=None, help="C compiler (default: cc, gcc or clang on PATH), e.g. a cross compiler")
    c.add_argument("--cflags", default="", help="extra compiler flags, e.g. '-static' for a cross build")
    c.add_argument("--runner", default="", help="command that runs the compiled program, e.g. 'qemu-aarch64'")
    _codegen_args(c)
    return p


def _codegen_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-size", type=int, default=32, help="largest batch; sizes the static buffers")
    p.add_argument("--lr-shift", type=int, default=6, help="learning rate 2**-LR_SHIFT (settable at run time; the C "
                   "code implements the shift rule only)")
    p.add_argument("--momentum-shift", type=int, default=None, help="momentum beta = 1 - 2**-M (adds int32 buffers)")
    p.add_argument("--low-ram", action="store_true",
                   help="recompute forward dot products instead of buffering int32 accumulators (2x forward MACs)")


def _train(args) -> int:
    from .train_run import run_train, stop_on_signals

    with stop_on_signals() as caught:
        return run_train(args, TRAIN_DEFAULTS, ROUNDING_OPTS, _peak_mib, caught)


def _eval(args) -> None:
    from .model import evaluate, load_data, load_model

    from .errors import MicroFormatError
    from .model import check_memory

    if args.batch_size < 1:
        raise MicroFormatError(f"--batch-size {args.batch_size}: allowed: >= 1")
    model = load_model(args.model_dir)
    check_memory(model.desc, args.batch_size, f"--batch-size {args.batch_size}")
    x, x_exp, y = load_data(args.data, model.desc["num_classes"])
    t0 = time.perf_counter()
    acc = evaluate(model, x, x_exp, y, args.batch_size)
    print(f"eval: {len(x)} samples accuracy {acc:.4f} time {time.perf_counter() - t0:.2f}s peak_mem {_peak_mib():.1f} MiB")


def _convert(args) -> None:
    from .convert import convert

    print(convert(args.source, args.labels, args.out, flatten=args.flatten, force=args.force))


def _load_any(path: str):
    """A saved model directory or a layer description file -> Sequential."""
    from pathlib import Path

    from .io import read_json
    from .model import Sequential, load_model

    return load_model(path) if Path(path).is_dir() else Sequential.from_description(read_json(path))


def _codegen(args) -> int:
    from .codegen import generate

    gen = generate(_load_any(args.model), args.batch_size, args.lr_shift, args.momentum_shift, source=args.model,
                   low_ram=args.low_ram)
    out = gen.write(args.out)
    print(f"codegen: wrote {', '.join(sorted(gen.files))} to {out}; static RAM {gen.buffer_bytes + gen.param_bytes} "
          f"bytes (buffers {gen.buffer_bytes}, master codes {gen.param_bytes}), initial codes {gen.init_bytes} bytes")
    return 0


def _codegen_check(args) -> int:
    from pathlib import Path

    from .codegen import run_check
    from .model import load_data

    model = _load_any(args.model)                     # validates before anything is generated
    x, x_exp, y = load_data(args.data, model.desc["num_classes"])
    if len(x) == 0:
        raise ValueError(f"{args.data}: holds no samples; need at least one")
    r = run_check(lambda: _load_any(args.model), x, x_exp, y, args.steps, args.batch_size, args.lr_shift,
                  args.momentum_shift, args.seed, args.keep, cc=args.cc, source=args.model, low_ram=args.low_ram,
                  cflags=shlex.split(args.cflags), runner=shlex.split(args.runner))
    z = r.sizes
    if "text" in z:
        print(f"code size: {z['text'] - z['init']} bytes of code and constants + {z['init']} bytes of initial codes "
              f"(.text {z['text']}, .data {z['data']}, .bss {z['bss']}; objects of {Path(r.cc).name} -O2)")
    print(f"static RAM: {z['buffers'] + z['params']} bytes (buffers {z['buffers']}, master codes {z['params']})")
    print(f"-m32: {r.m32}")
    if not r.ok:
        print(f"codegen-check: MISMATCH: {r.message}", file=sys.stderr)
        return 1
    print(f"codegen-check: OK: {r.message}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from .codegen.check import ToolchainError

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv                  # accepted anywhere on the line, like `inttrain --debug`
    args = build_parser().parse_args([a for a in argv if a != "--debug"])
    cmds = {"train": _train, "eval": _eval, "convert": _convert, "codegen": _codegen, "codegen-check": _codegen_check}
    try:
        return cmds[args.cmd](args) or 0
    except (InttrainError, ValueError, OSError, EOFError, MemoryError, ToolchainError) as e:
        if debug:
            traceback.print_exc()
        what = "out of memory: " if isinstance(e, MemoryError) else ""
        print(f"error: {what}{' '.join(str(e).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
