"""``inttrain plot RUN_DIR [RUN_DIR ...]``: loss, accuracy and lr curves from metrics.jsonl to RUN_DIR/plots/*.png;
several runs overlaid in one set of plots (one line per run, final values written on the plot).

matplotlib is imported here only (with the Agg backend: no display needed),
so the rest of the CLI starts without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import UsageProblem

__all__ = ["plot_run", "plot_runs", "load_rows"]


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


def _saver(plt: Any, out: Path, written: list[Path]) -> Any:
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

    return save


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(run_dir: Path) -> list[Path]:
    """Write loss.png, accuracy.png and lr.png (and dfq_bits.png for a per-sample DFQ run); returns their paths."""
    plt = _pyplot()
    rows = load_rows(run_dir)
    steps = [r for r in rows if r["kind"] == "step" and r.get("loss") is not None]
    epochs = [r for r in rows if r["kind"] == "epoch"]
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    written: list[Path] = []
    save = _saver(plt, out, written)

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
    dfq = [(r["step"], d) for r in rows if r["kind"] == "step" and (d := _dfq_shares(r.get("dfq_bits")))]
    if dfq:
        save(_dfq_figure(plt, dfq, run_dir.name), "dfq_bits.png")
    return written


def _dfq_shares(value: Any) -> dict[str, dict[int, float]] | None:
    """A row's ``dfq_bits`` ({layer: {bits: share}}, per-sample DFQ) if well formed, else None."""
    import math

    if not isinstance(value, dict) or not value:
        return None
    out: dict[str, dict[int, float]] = {}
    for layer, shares in value.items():
        if not isinstance(shares, dict) or not shares:
            return None
        try:
            out[str(layer)] = {int(b): float(v) for b, v in shares.items()}
        except (TypeError, ValueError):
            return None
        if not all(math.isfinite(v) and 0 <= v <= 1 for v in out[str(layer)].values()):
            return None
    return out


def _dfq_figure(plt: Any, dfq: list[tuple[int, dict[str, dict[int, float]]]], title: str) -> Any:
    """Left: per layer, the share of samples at each width over the logged steps; right: mean bits per layer."""
    layers = list(dict.fromkeys(name for _, d in dfq for name in d))
    widths = sorted({b for _, d in dfq for s in d.values() for b in s})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    bottom = [0.0] * len(layers)
    for b in widths:
        share = [sum(d.get(n, {}).get(b, 0.0) for _, d in dfq) / len(dfq) for n in layers]
        left.bar(range(len(layers)), share, bottom=bottom, label=f"{b}-bit")
        for i, v in enumerate(share):
            if v >= 0.08:
                left.text(i, bottom[i] + v / 2, f"{v:.0%}", ha="center", va="center", fontsize=7)
        bottom = [a + v for a, v in zip(bottom, share)]
    left.set_xticks(range(len(layers)), layers, rotation=60, ha="right", fontsize=7)
    left.set(ylabel="share of samples (mean over logged steps)", title=f"{title}: DFQ chosen bits per layer")
    left.legend(fontsize=7)
    for n in layers:
        pts = [(step, sum(b * v for b, v in d[n].items()) / max(sum(d[n].values()), 1e-12)) for step, d in dfq if n in d]
        right.plot([p[0] for p in pts], [p[1] for p in pts], lw=1, label=n)
    right.set(xlabel="step", ylabel="mean forward bits", title="per-layer mean bits")
    if len(layers) <= 12:
        right.legend(fontsize=6)
    return fig


def _overlay_out(run_dirs: list[Path], out: Path | None) -> Path:
    import os

    if out is None:
        parent = Path(os.path.commonpath([str(p.resolve()) for p in run_dirs]))
        out = parent / "plots"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageProblem("--out", f"{str(out)!r}: cannot create the plot folder ({e.strerror or e})") from None
    return out


def _labels(run_dirs: list[Path]) -> list[str]:
    names = [p.name or str(p) for p in run_dirs]
    return names if len(set(names)) == len(names) else [str(p) for p in run_dirs]


def plot_runs(run_dirs: list[Path], out: Path | None = None) -> list[Path]:
    """One run: :func:`plot_run`.  Several: loss.png, accuracy.png and lr.png with one line per run (labelled by
    folder name, each final value written at its line's end) in ``out`` (default: ``plots/`` in the runs'
    common parent folder); returns the paths."""
    if len(run_dirs) == 1 and out is None:
        return plot_run(run_dirs[0])
    all_rows = [load_rows(d) for d in run_dirs]  # every run checked before anything is written
    out = _overlay_out(run_dirs, out)
    plt = _pyplot()
    written: list[Path] = []
    save = _saver(plt, out, written)
    labels = _labels(run_dirs)

    def curves(name: str, ylabel: str, pick: Any, fmt: str) -> None:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, rows in zip(labels, all_rows):
            pts = pick(rows)
            if not pts:
                continue
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if len(pts) < 30 else "-", lw=1,
                              ms=3, label=label)
            ax.annotate(fmt.format(pts[-1][1]), pts[-1], textcoords="offset points", xytext=(4, 0),
                        fontsize=8, color=line.get_color(), va="center")
        ax.margins(x=0.12)  # room for the final values
        ax.set(xlabel="step", ylabel=ylabel, title=f"{ylabel}: {len(run_dirs)} runs")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        save(fig, name)

    def epoch_values(key: str) -> Any:
        return lambda rows: [(r["step"], r[key]) for r in rows if r["kind"] == "epoch" and r.get(key) is not None]

    curves("loss.png", "train loss (epoch mean)", epoch_values("loss"), "{:.3f}")
    curves("val_loss.png", "val loss", epoch_values("val_loss"), "{:.3f}")
    curves("accuracy.png", "val accuracy", epoch_values("val_accuracy"), "{:.4f}")
    curves("lr.png", "learning rate",
           lambda rows: [(r["step"], r["lr"]) for r in rows if r["kind"] == "step" and r.get("lr") is not None], "{:.3g}")
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
