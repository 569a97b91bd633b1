"""``inttrain compare``: the same model, seed, data order and budget under several recipes.

Each recipe trains in its own process (``inttrain train`` into OUT/<recipe>),
so peak RSS (``resource.getrusage``) is that recipe's alone and no state leaks
between runs; each run's lines (one per epoch) are echoed while it trains. Results go to compare.csv,
compare.md (the table, also printed) and compare.png (bars with their values, accuracy curves).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer

from .errors import UsageProblem

__all__ = ["run_compare", "format_markdown"]

COLUMNS = ("recipe", "val_accuracy", "gap_to_fp32", "seconds_per_epoch", "speed_vs_fp32", "time_per_step_ms", "peak_rss_mb")


def _rows(summaries: dict[str, dict[str, Any] | None]) -> list[dict[str, Any]]:
    base = summaries.get("fp32") or {}
    rows = []
    for recipe, s in summaries.items():
        if s is None:
            rows.append({"recipe": recipe, **{c: None for c in COLUMNS[1:]}})
            continue
        acc, spe = s.get("val_accuracy"), s.get("seconds_per_epoch")
        rows.append({
            "recipe": recipe,
            "val_accuracy": acc,
            "gap_to_fp32": acc - base["val_accuracy"] if acc is not None and base.get("val_accuracy") is not None else None,
            "seconds_per_epoch": spe,
            "speed_vs_fp32": base["seconds_per_epoch"] / spe if spe and base.get("seconds_per_epoch") else None,
            "time_per_step_ms": s["time_per_step"] * 1e3 if s.get("time_per_step") is not None else None,
            "peak_rss_mb": s.get("peak_rss_mb"),
        })
    return rows


def _fmt(col: str, v: Any) -> str:
    if v is None:
        return "-"
    return {
        "val_accuracy": "{:.4f}", "gap_to_fp32": "{:+.4f}", "seconds_per_epoch": "{:.2f}",
        "speed_vs_fp32": "{:.2f}x", "time_per_step_ms": "{:.2f}", "peak_rss_mb": "{:.0f}",
    }.get(col, "{}").format(v)


def format_markdown(rows: list[dict[str, Any]], title: str) -> str:
    header = ("recipe", "val acc", "gap to fp32", "s/epoch", "speed vs fp32", "ms/step", "peak RSS MiB")
    lines = [f"# {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c, r[c]) for c in COLUMNS) + " |" for r in rows]
    lines += ["", "speed vs fp32 = fp32 seconds per epoch / recipe seconds per epoch (>1 is faster); "
              "gap = accuracy - fp32 accuracy; failed runs show '-'."]
    return "\n".join(lines) + "\n"


def _plot(rows: list[dict[str, Any]], path: Path, out: Path) -> None:
    """Bars of final val accuracy and seconds per epoch with their values written on them, and each recipe's
    val accuracy per epoch (final value at the line's end)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from inttrain.trainer.run_folder import read_metrics

    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(13, 4))
    names = [r["recipe"] for r in rows]
    bars = a1.bar(names, [r["val_accuracy"] or 0 for r in rows])
    a1.bar_label(bars, labels=[_fmt("val_accuracy", r["val_accuracy"]) for r in rows], fontsize=8)
    a1.set(title="final val accuracy", ylim=(0, 1.1))
    bars = a2.bar(names, [r["seconds_per_epoch"] or 0 for r in rows])
    a2.bar_label(bars, labels=[
        "-" if r["seconds_per_epoch"] is None else f"{r['seconds_per_epoch']:.2f} s"
        + ("" if r["speed_vs_fp32"] is None else f"\n{r['speed_vs_fp32']:.2f}x fp32") for r in rows], fontsize=8)
    a2.set(title="seconds / epoch")
    a2.margins(y=0.2)
    for name in names:
        pts = [(r["epoch"], r["val_accuracy"]) for r in read_metrics(out / name)
               if r.get("kind") == "epoch" and isinstance(r.get("val_accuracy"), (int, float))]
        if pts:
            (line,) = a3.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, label=name)
            a3.annotate(f"{pts[-1][1]:.4f}", pts[-1], textcoords="offset points", xytext=(4, 0), fontsize=8,
                        color=line.get_color(), va="center")
    a3.set(title="val accuracy per epoch", xlabel="epoch")
    a3.margins(x=0.15)
    if a3.lines:
        a3.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _train_one(cmd: list[str], recipe: str) -> tuple[int, str]:
    """Run one ``inttrain train``, echoing its lines (epochs, done) as they come; (exit code, last stderr line)."""
    import os
    import tempfile

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # the child's lines as they are written, not at its exit
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip():
                typer.echo(f"  {recipe}: {line.rstrip()}")
        code = proc.wait()
        err.seek(0)
        last = (err.read().strip().splitlines() or ["(no message)"])[-1]
    return code, last


def run_compare(recipes: list[str], train_args: list[str], out: Path, title: str) -> int:
    """Train each recipe into ``out/<recipe>`` (progress echoed); write the tables; exit code 1 if any run failed."""
    import time

    from .run import check_out

    check_out(out)
    out.mkdir(parents=True)
    summaries: dict[str, dict[str, Any] | None] = {}
    for i, recipe in enumerate(recipes, 1):
        typer.echo(f"== [{i}/{len(recipes)}] {recipe}")
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "inttrain", "train", *train_args, "--recipe", recipe, "--out", str(out / recipe)]
        code, last = _train_one(cmd, recipe)
        if code != 0:
            typer.echo(f"  {recipe} failed (exit {code}): {last}", err=True)
            summaries[recipe] = None
            continue
        summaries[recipe] = json.loads((out / recipe / "summary.json").read_text())
        typer.echo(f"  {recipe}: val_acc {_fmt('val_accuracy', summaries[recipe]['val_accuracy'])} "
                   f"({time.perf_counter() - t0:.0f} s)")
    rows = _rows(summaries)
    with open(out / "compare.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    md = format_markdown(rows, title)
    (out / "compare.md").write_text(md)
    _plot(rows, out / "compare.png", out)
    typer.echo(md)
    typer.echo(f"wrote {out / 'compare.csv'}, {out / 'compare.md'}, {out / 'compare.png'}")
    return 1 if any(s is None for s in summaries.values()) else 0


def parse_recipes(text: str) -> list[str]:
    names = [r.strip() for r in text.split(",") if r.strip()]
    if not names:
        raise UsageProblem("--recipes", f"{text!r} names no recipe; e.g. fp32,int8")
    if len(set(names)) != len(names):
        raise UsageProblem("--recipes", f"{text!r} names a recipe twice")
    return names


