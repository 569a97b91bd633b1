"""``inttrain plot RUN_DIR``: loss, accuracy and lr curves from metrics.jsonl to RUN_DIR/plots/*.png.

matplotlib is imported here only (with the Agg backend: no display needed),
so the rest of the CLI starts without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import UsageProblem

__all__ = ["plot_run", "load_rows"]


_NUMBERS = ("loss", "val_accuracy", "lr", "val_loss")


def _valid_row(row: Any) -> bool:
    import math

    def num(v: Any) -> bool:
        return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))

    return (isinstance(row, dict) and row.get("kind") in ("step", "skipped", "epoch")
            and all(isinstance(row.get(k), int) and not isinstance(row.get(k), bool) for k in ("step", "epoch"))
            and all(num(row.get(k)) for k in _NUMBERS))


def load_rows(run_dir: Path) -> list[dict[str, Any]]:
    import json

    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UsageProblem("RUN_DIR", f"{str(run_dir)!r}: no metrics.jsonl; expected a run folder made by `inttrain train`")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageProblem("RUN_DIR", f"{path}: byte {e.start}: not UTF-8; allowed: the JSON lines `inttrain train` "
                                      "writes") from None
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines = lines[:-1]  # a last line without its newline was cut short by a kill: not a row yet
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            raise UsageProblem("RUN_DIR", f"{path}: line {i}: not JSON ({getattr(e, 'msg', e)}); allowed: one JSON "
                                          "object per line as `inttrain train` writes") from None
        if not _valid_row(row):
            raise UsageProblem("RUN_DIR", f"{path}: line {i}: not a metrics row; allowed: an object with kind "
                                          "'step'/'skipped'/'epoch', an integer step and epoch, and numbers or null")
        rows.append(row)
    if not rows:
        raise UsageProblem("RUN_DIR", f"{path}: no rows yet (nothing to plot)")
    return rows


def plot_run(run_dir: Path) -> list[Path]:
    """Write loss.png, accuracy.png and lr.png; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = load_rows(run_dir)
    steps = [r for r in rows if r["kind"] == "step" and r.get("loss") is not None]
    epochs = [r for r in rows if r["kind"] == "epoch"]
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    written = []

    def save(fig: Any, name: str) -> None:
        import os

        fig.tight_layout()
        tmp = out / f".{name}.tmp"  # atomic: a killed plot never leaves a truncated png
        try:
            fig.savefig(tmp, dpi=100, format="png")
            os.replace(tmp, out / name)
        finally:
            tmp.unlink(missing_ok=True)
            plt.close(fig)
        written.append(out / name)

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], lw=1, label="train loss (step)")
    ax.plot([r["step"] for r in epochs if r.get("loss") is not None],
            [r["loss"] for r in epochs if r.get("loss") is not None], "o-", label="train loss (epoch mean)")
    val = [r for r in epochs if r.get("val_loss") is not None]  # absent in runs from before the column existed
    ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "s--", label="val loss")
    ax.set(xlabel="step", ylabel="loss", title=f"{run_dir.name}: loss")
    ax.legend()
    save(fig, "loss.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["epoch"] for r in epochs], [r.get("val_accuracy") for r in epochs], "o-")
    ax.set(xlabel="epoch", ylabel="val accuracy", title=f"{run_dir.name}: accuracy")
    save(fig, "accuracy.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["step"] for r in rows if r.get("lr") is not None], [r["lr"] for r in rows if r.get("lr") is not None])
    ax.set(xlabel="step", ylabel="learning rate", title=f"{run_dir.name}: lr")
    save(fig, "lr.png")
    probe = probe_figure(run_dir)
    if probe is not None:
        save(probe, "probe.png")
    return written


def probe_figure(run_dir: Path) -> Any:
    """``--probe-every``'s SQNR per GEMM over steps (one line per layer) and per layer at the last probe; None
    without probe rows. Exact GEMMs (``inf`` dB) are drawn at the top of the axis."""
    import math

    import matplotlib.pyplot as plt

    from inttrain.nn.probe import PROBE_GEMMS
    from inttrain.trainer.probe import read_probe

    rows = read_probe(run_dir)
    if not rows:
        return None
    finite = [r["sqnr_db"] for r in rows if math.isfinite(r["sqnr_db"])]
    top = max(finite, default=100.0) + 5
    value = lambda r: min(r["sqnr_db"], top)  # noqa: E731
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    colors = plt.get_cmap("viridis")
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    for ax, gemm in zip(axes, PROBE_GEMMS):
        for i, layer in enumerate(layers):
            mine = [r for r in rows if r["layer"] == layer and r["gemm"] == gemm]
            if mine:
                ax.plot([r["step"] for r in mine], [value(r) for r in mine], lw=1,
                        color=colors(i / max(len(layers) - 1, 1)), label=layer)
        ax.set(xlabel="step", ylabel="SQNR (dB)", title=f"{gemm} (dark: first layer, light: last)")
        ax.grid(alpha=0.3)
    last = max(r["step"] for r in rows)
    ax = axes[3]
    for gemm in PROBE_GEMMS:
        mine = {r["layer"]: value(r) for r in rows if r["step"] == last and r["gemm"] == gemm}
        ax.plot([i for i, layer in enumerate(layers) if layer in mine], [mine[layer] for layer in layers if layer in mine],
                "o-", ms=3, label=gemm)
    ax.set(xlabel="layer (model order)", ylabel="SQNR (dB)", title=f"step {last}, per layer")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"{run_dir.name}: SQNR of the integer GEMMs against float64", fontsize=9)
    return fig
