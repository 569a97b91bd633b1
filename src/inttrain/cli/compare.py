"""``inttrain compare``: the same model, seed, data order and budget under several recipes.

Each recipe trains in its own process (``inttrain train`` into OUT/<recipe>),
so peak RSS (``resource.getrusage``) is that recipe's alone and no state leaks
between runs. Results go to compare.csv, compare.md and compare.png.
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


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.5))
    names = [r["recipe"] for r in rows]
    a1.bar(names, [r["val_accuracy"] or 0 for r in rows])
    a1.set(title="val accuracy", ylim=(0, 1))
    a2.bar(names, [r["seconds_per_epoch"] or 0 for r in rows])
    a2.set(title="seconds / epoch")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_compare(recipes: list[str], train_args: list[str], out: Path, title: str) -> int:
    """Train each recipe into ``out/<recipe>``; write the tables; exit code 1 if any run failed."""
    from .run import check_out

    check_out(out)
    out.mkdir(parents=True)
    summaries: dict[str, dict[str, Any] | None] = {}
    for recipe in recipes:
        typer.echo(f"== {recipe}")
        cmd = [sys.executable, "-m", "inttrain", "train", *train_args, "--recipe", recipe, "--out", str(out / recipe)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
            typer.echo(f"  {recipe} failed (exit {proc.returncode}): {last}", err=True)
            summaries[recipe] = None
            continue
        summaries[recipe] = json.loads((out / recipe / "summary.json").read_text())
        typer.echo(f"  val_acc {_fmt('val_accuracy', summaries[recipe]['val_accuracy'])}")
    rows = _rows(summaries)
    with open(out / "compare.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    md = format_markdown(rows, title)
    (out / "compare.md").write_text(md)
    _plot(rows, out / "compare.png")
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


