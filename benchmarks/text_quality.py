"""Transformer quality (issue 16, item 5): a character-level gpt-small on Python's own standard library.

    python benchmarks/text_quality.py --list                  # jobs and their state
    python benchmarks/text_quality.py                         # a worker: claims pending jobs one by one (one per core)
    python benchmarks/text_quality.py --only int8:1           # one job
    python benchmarks/text_quality.py --report                # md + json + png from the finished rows

Real text that every machine has offline: a fixed list of the standard library's source files (read from
``sysconfig.get_paths()["stdlib"]`` of the running Python; a missing file is an error that names it),
split **by file** into training files and held-out validation files, so validation text is code the model has
never seen a line of.  Characters: the training files' set plus one id for characters seen only in
validation (``inttrain.data.text``'s rule); windows of ``--seq-len`` + 1 characters.

Variants ``fp32``, ``bf16``, ``int8`` and ``int8-dataflow``, ``--seeds`` (2) paired seeds each: a seed fixes the
initial weights and the batch order, the same for every variant.  Every job trains in its own run folder
``OUT/runs/VARIANT-sSEED`` through the CLI's machinery (``inttrain.cli.run``), checkpoints after every epoch,
resumes after a kill, and appends one JSON row to ``OUT/results.jsonl`` when it finishes (the job machinery of
``accuracy_full.py``).  ``--report`` writes ``text_quality.md`` (final validation loss per variant: mean, seeds,
paired gap to fp32 in percent), ``text_quality.json`` and ``text_quality.png`` (validation-loss curves).

Defaults: d_model 128, 4 layers, 4 heads, context 128, batch 32, 5 epochs (1,650 steps over 1.36 M training
characters; ~1 s per step on one busy Zen 5 core, so ~30 min per job, 8 jobs).  Training: AdamW, cosine lr with
warm-up, weight decay (the trainer's ``lr_schedule`` / ``warmup_epochs`` /
``weight_decay`` keywords; a trainer without them trains with a constant lr and the row says so).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import accuracy_full as jobs_lib  # noqa: E402 - the job machinery (also puts src/ on the path if needed)

import torch  # noqa: E402

#: Training and validation files, relative to the stdlib folder: modules present from Python 3.8 to 3.13.
TRAIN_FILES = (
    "inspect.py", "typing.py", "pydoc.py", "tarfile.py", "doctest.py", "argparse.py", "subprocess.py", "difflib.py",
    "enum.py", "pickle.py", "ast.py", "dataclasses.py", "threading.py", "shutil.py", "configparser.py",
    "statistics.py", "functools.py",
)
VAL_FILES = ("tempfile.py", "random.py", "fractions.py", "contextlib.py", "tokenize.py")

VARIANTS: dict[str, dict[str, Any]] = {
    "fp32": {"recipe": "fp32"},
    "bf16": {"recipe": "bf16"},
    "int8": {"recipe": "int8"},
    "int8-dataflow": {"recipe": "int8", "dataflow": True},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"], help="Folder of the files. [this Python's]")
    p.add_argument("--max-chars", type=int, help="Use only the first N characters of each split (smoke runs).")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3, help="Peak lr (AdamW). [0.001]")
    p.add_argument("--lr-schedule", default="cosine")
    p.add_argument("--warmup-epochs", type=float, default=0.25)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seeds", type=int, default=2)
    jobs_lib.add_job_args(p, "benchmarks/results/text_quality", list(VARIANTS))
    return jobs_lib.finish_job_args(p, p.parse_args(argv), list(VARIANTS), headline="final_val_loss")


def knob_values(args: argparse.Namespace) -> dict[str, Any]:
    return {"weight_decay": args.weight_decay, "lr_schedule": args.lr_schedule, "warmup_epochs": args.warmup_epochs}


def settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"files": [*TRAIN_FILES, "|", *VAL_FILES], "max_chars": args.max_chars, "seq_len": args.seq_len,
            "d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads, "epochs": args.epochs,
            "batch_size": args.batch_size, "lr": args.lr, "optimizer": "adamw", **knob_values(args)}


def read_corpus(stdlib: Path, names: tuple[str, ...]) -> tuple[str, list[dict[str, Any]]]:
    """The files joined (each followed by a blank line), and their name, size and sha256."""
    missing = [n for n in names if not (stdlib / n).is_file()]
    if missing:
        raise SystemExit(f"error: {stdlib}: missing {', '.join(missing)}; this benchmark reads a fixed list of "
                         "standard-library files (pass --stdlib FOLDER of a Python that has them)")
    parts, info = [], []
    for n in names:
        raw = (stdlib / n).read_bytes()
        parts.append(raw.decode("utf-8"))
        info.append({"file": n, "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()[:16]})
    return "\n\n".join(parts) + "\n\n", info


def load_splits(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """DatasetSplits of the training / validation files (``inttrain.data.text``'s vocabulary and windows)."""
    from inttrain.data import DatasetSplits
    from inttrain.data.text import UNKNOWN, encode, windows

    stdlib = Path(args.stdlib)
    train_text, train_info = read_corpus(stdlib, TRAIN_FILES)
    val_text, val_info = read_corpus(stdlib, VAL_FILES)
    if args.max_chars:
        train_text, val_text = train_text[:args.max_chars], val_text[:args.max_chars]
    chars = sorted(set(train_text) - {UNKNOWN}) + [UNKNOWN]
    stoi = {c: i for i, c in enumerate(chars)}
    splits = DatasetSplits(
        name="text", train=windows(encode(train_text, stoi), args.seq_len), val=windows(encode(val_text, stoi), args.seq_len),
        num_classes=len(chars), in_channels=1, image_size=args.seq_len, source=str(stdlib),
        val_source=f"{len(VAL_FILES)} held-out files ({len(val_text)} characters)", task="lm", vocab="".join(chars))
    corpus = {"python": sys.version.split()[0], "train_files": train_info, "val_files": val_info,
              "train_chars": len(train_text), "val_chars": len(val_text), "vocab": len(chars),
              "val_unknown_chars": sum(c not in stoi for c in val_text)}
    return splits, corpus


def run_config(args: argparse.Namespace, variant: str, seed: int, knob_fields: dict[str, Any]) -> Any:
    from inttrain.cli.config import RunConfig

    return RunConfig(model="gpt-small", dataset="text", data_dir=None, epochs=args.epochs, batch_size=args.batch_size,
                     lr=args.lr, optimizer="adamw", seed=seed, threads=args.threads, log_every=25,
                     seq_len=args.seq_len, d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                     compile={"auto": None, "on": True, "off": False}[args.compile], **VARIANTS[variant], **knob_fields)


def run_job(args: argparse.Namespace, variant: str, seed: int, splits: Any, corpus: dict[str, Any]) -> int:
    name = jobs_lib.job_name(variant, seed)
    knob_fields, knob_args, missing = jobs_lib.trainer_knobs(knob_values(args))
    cfg = run_config(args, variant, seed, knob_fields)
    folder = args.runs / name
    code, resumed, started = jobs_lib.train_in_folder(folder, cfg, splits, knob_args, name)
    if code != 0:
        return code
    summary = json.loads((folder / "summary.json").read_text())
    epochs = [r for r in jobs_lib._metrics(folder) if r["kind"] == "epoch"]
    jobs_lib.append_row(args.out, {
        "variant": variant, "seed": seed, "settings": settings(args), "status": "done", "corpus": corpus,
        "config": dataclasses.asdict(cfg), "knobs_missing": missing,
        "final_val_loss": summary["val_loss"], "final_val_perplexity": summary["val_perplexity"],
        "best_val_loss": min((r["val_loss"] for r in epochs if r["val_loss"] is not None), default=None),
        "val_losses": [r["val_loss"] for r in epochs], "train_losses": [r["loss"] for r in epochs],
        "epoch_steps": [r["step"] for r in epochs], "steps": summary["steps"], "skipped_steps": summary["skipped_steps"],
        "seconds_per_epoch": summary["seconds_per_epoch"], "resumed": resumed,
        "seconds_last_leg": round(time.time() - started, 1), "cpu": jobs_lib.cpu_model(), "threads": args.threads,
        "torch": torch.__version__, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    return 0


# ----------------------------------------------------------------------------------------------- report


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant: final val loss by seed, mean, and the paired gap to fp32 in percent of fp32's loss."""
    by = {(r["variant"], r["seed"]): r for r in rows if r.get("status") == "done"}
    fp32 = {s: r["final_val_loss"] for (v, s), r in by.items() if v == "fp32"}
    out = []
    for v in VARIANTS:
        mine = sorted((r for (vv, _), r in by.items() if vv == v), key=lambda r: r["seed"])
        if not mine:
            continue
        losses = {r["seed"]: r["final_val_loss"] for r in mine}
        gaps = {s: 100 * (x / fp32[s] - 1) for s, x in losses.items() if s in fp32 and v != "fp32"}
        out.append({"variant": v, "seeds": sorted(losses), "losses": losses,
                    "mean": statistics.mean(losses.values()),
                    "std": statistics.stdev(losses.values()) if len(losses) > 1 else math.nan,
                    "gaps_pct": gaps, "gap_pct_mean": statistics.mean(gaps.values()) if gaps else math.nan,
                    "curves": [(r["epoch_steps"], r["val_losses"]) for r in mine],
                    "seconds_per_epoch": statistics.mean(r["seconds_per_epoch"] for r in mine)})
    return out


def format_report(summary: list[dict[str, Any]], rows: list[dict[str, Any]], st: dict[str, Any]) -> str:
    f = jobs_lib._f
    head = ("variant", "seeds", "final val loss (mean ± sd)", "per seed", "paired gap to fp32 (mean)", "per seed gap",
            "s/epoch")
    lines = ["# gpt-small on Python standard-library source: validation loss", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summary:
        per = " / ".join(f"{s['losses'][k]:.4f}" for k in s["seeds"])
        gaps = " / ".join(f"{s['gaps_pct'][k]:+.2f}%" for k in s["seeds"] if k in s["gaps_pct"]) or "-"
        lines.append(f"| {s['variant']} | {len(s['seeds'])} | {s['mean']:.4f} ± {f(s['std'], '.4f')} | {per} | "
                     f"{f(s['gap_pct_mean'], '+.2f')}{'%' if s['gaps_pct'] else ''} | {gaps} | "
                     f"{f(s['seconds_per_epoch'], '.0f')} |")
    done = [r for r in rows if r.get("status") == "done"]
    c = done[0]["corpus"] if done else {}
    missing = sorted({k for r in done for k in r.get("knobs_missing", [])})
    lines += [
        "",
        f"Data: {len(c.get('train_files', []))} training files ({c.get('train_chars', '?')} characters) and "
        f"{len(c.get('val_files', []))} held-out files ({c.get('val_chars', '?')} characters) of the Python "
        f"{c.get('python', '?')} standard library (benchmarks/text_quality.py lists them; sizes and sha256 in "
        f"text_quality.json), vocabulary {c.get('vocab', '?')} characters.",
        f"Model: gpt-small, d_model {st['d_model']}, {st['n_layers']} layers, {st['n_heads']} heads, context "
        f"{st['seq_len']}. Training: {st['epochs']} epochs, batch {st['batch_size']}, AdamW peak lr {st['lr']}, "
        f"{st['lr_schedule']} schedule with {st['warmup_epochs']} warm-up epochs, weight decay {st['weight_decay']}.",
        "Loss: mean cross-entropy per character (nats) on all validation windows after the last epoch. Gap: "
        "(variant / fp32 - 1) at the same seed (same initial weights and batch order), in percent.",
        f"CPU: {', '.join(sorted({r.get('cpu', '?') for r in done})) or '-'}; "
        f"{done[0].get('threads', '?') if done else '?'} thread(s) per job; torch {done[0].get('torch', '?') if done else '?'}.",
    ]
    if missing:
        lines.append(f"**The trainer these rows ran on lacked {', '.join(missing)}: not the intended settings.**")
    return "\n".join(lines) + "\n"


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, s in enumerate(summary):
        for j, (steps, losses) in enumerate(s["curves"]):
            ax.plot(steps, losses, color=f"C{i}", ls="-" if j == 0 else "--", marker="o", ms=3,
                    label=f"{s['variant']} seed {s['seeds'][j]}")
    ax.set(xlabel="step", ylabel="validation loss (nats / char)", title="gpt-small, stdlib source, held-out files")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(args: argparse.Namespace) -> str:
    rows = jobs_lib.read_rows(args.out)
    if not rows:
        raise SystemExit(f"error: {args.out / 'results.jsonl'}: no finished jobs yet")
    st = rows[-1]["settings"]
    rows = list({(r["variant"], r["seed"]): r for r in rows if r["settings"] == st}.values())
    summary = summarize(rows)
    text = format_report(summary, rows, st)
    (args.out / "text_quality.md").write_text(text)
    plot(summary, args.out / "text_quality.png")
    corpus = next((r["corpus"] for r in rows if "corpus" in r), None)
    (args.out / "text_quality.json").write_text(
        json.dumps(jobs_lib._clean({"settings": st, "corpus": corpus, "summary": summary}), indent=1) + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    jobs = [args.only] if args.only else [(v, s) for s in range(args.seeds) for v in args.variants]
    return jobs_lib.dispatch(args, jobs, settings(args), lambda: load_splits(args),
                             lambda job, data: run_job(args, *job, *data), report)


if __name__ == "__main__":
    sys.exit(main())
