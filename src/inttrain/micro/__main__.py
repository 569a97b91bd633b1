"""Device CLI (argparse only, NumPy only).

python -m inttrain.micro train MODEL.json DATA.npz --epochs 5 --batch-size 32 --lr-shift 6 --out DIR
python -m inttrain.micro eval MODEL_DIR DATA.npz
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


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m inttrain.micro", description="Integer-only training (NumPy only).")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    t = sub.add_parser("train", help="train a model description on DATA.npz (x int8, x_exp, y)")
    t.add_argument("model", help="MODEL.json (a layer description) or a saved model directory to continue")
    t.add_argument("data", help="DATA.npz with x (int8 codes), x_exp (scale exponent), y (labels)")
    t.add_argument("--epochs", type=int, default=5)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--lr-shift", type=int, default=6, help="learning rate 2**-LR_SHIFT (on the summed batch gradient)")
    t.add_argument("--momentum-shift", type=int, default=None, help="momentum beta = 1 - 2**-M (off by default)")
    t.add_argument("--seed", type=int, default=0, help="data shuffling seed")
    t.add_argument("--val", default=None, help="optional validation DATA.npz evaluated after each epoch")
    t.add_argument("--out", required=True, help="output directory (model.json + weights.safetensors)")
    t.add_argument("--force", action="store_true", help="replace an existing --out (atomically, after training)")
    e = sub.add_parser("eval", help="accuracy of a saved model on DATA.npz")
    e.add_argument("model_dir")
    e.add_argument("data")
    e.add_argument("--batch-size", type=int, default=256)
    g = sub.add_parser("codegen", help="generate C99 training code (no malloc, no float) for a model")
    g.add_argument("model", help="MODEL.json (a layer description) or a saved model directory")
    g.add_argument("--out", required=True, help="output directory for model.c/.h and the runtime")
    _codegen_args(g)
    c = sub.add_parser("codegen-check", help="compile the generated C and compare N training steps with micro")
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
    p.add_argument("--lr-shift", type=int, default=6, help="learning rate 2**-LR_SHIFT (settable at run time)")
    p.add_argument("--momentum-shift", type=int, default=None, help="momentum beta = 1 - 2**-M (adds int32 buffers)")
    p.add_argument("--low-ram", action="store_true",
                   help="recompute forward dot products instead of buffering int32 accumulators (2x forward MACs)")


def _train(args) -> None:
    from pathlib import Path

    from .errors import MicroFormatError
    from .io import read_json
    from .model import Sequential, evaluate, load_data, load_model, save_model, train_epoch
    from .optim import SGD

    if args.epochs < 0 or args.batch_size < 1:
        raise MicroFormatError(f"--epochs {args.epochs} / --batch-size {args.batch_size}: "
                               "epochs must be >= 0 and the batch size >= 1")
    if Path(args.out).exists() and not args.force:     # judged before training, not after an hour of it
        raise MicroFormatError(f"--out {args.out}: already exists; allowed: a new path, or --force to replace it")
    src = Path(args.model)
    model = load_model(src) if src.is_dir() else Sequential.from_description(read_json(src), str(src))
    n_cls = model.desc["num_classes"]
    x, x_exp, y = load_data(args.data, n_cls)
    val = load_data(args.val, n_cls) if args.val else None
    opt = SGD(model.params(), args.lr_shift, args.momentum_shift, model.desc["rounding"]["update"])
    model.check_batch(args.batch_size)
    print(f"train: {len(x)} samples, {sum(p.acc.size for p in model.params())} weights, "
          f"{model.desc['weight_bits']}-bit weight accumulators, lr 2^-{args.lr_shift}", flush=True)
    history = []
    for ep in range(args.epochs):
        t0 = time.perf_counter()
        loss, acc = train_epoch(model, opt, x, x_exp, y, args.batch_size, seed=args.seed + ep,
                                log=lambda s: print(s, flush=True), log_every=50)
        dt = time.perf_counter() - t0
        line = f"epoch {ep + 1}/{args.epochs} loss {loss:.4f} train_acc {acc:.4f}"
        row = {"epoch": ep + 1, "loss": loss, "train_acc": acc, "seconds": dt}
        if val is not None:
            row["val_acc"] = evaluate(model, *val)
            line += f" val_acc {row['val_acc']:.4f}"
        history.append(row)
        print(f"{line} time {dt:.2f}s peak_mem {_peak_mib():.1f} MiB", flush=True)
    out = save_model(model, args.out, {"history": history})
    print(f"saved {out}", flush=True)


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
    cmds = {"train": _train, "eval": _eval, "codegen": _codegen, "codegen-check": _codegen_check}
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
