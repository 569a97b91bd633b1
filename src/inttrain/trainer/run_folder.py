"""A run folder: config.yaml, metrics.csv/.jsonl, train.log, checkpoints/{last,best} (and tb/ with tensorboard).

:class:`RunFolder` is the :class:`~inttrain.trainer.loop.TrainHooks` the CLI
plugs into ``train()``. Metrics are appended and flushed row by row so a
killed run keeps everything up to its last step; on resume, rows newer than
the checkpoint are dropped so the files read as one uninterrupted run.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor

from .checkpoint import checkpoint_paths, save_checkpoint
from .loop import EpochStats, TrainHooks, TrainState
from .tensorboard import TENSORBOARD_MISSING, TensorBoardScalars

__all__ = ["RunFolder", "METRIC_FIELDS", "read_metrics", "write_yaml_atomic"]

# val_loss / val_perplexity were appended last so readers of older files keep their column order.
# forward_bits / grad_bits / gbitops (precision schedules, issue 5) likewise: bits in force at the row's step
# and cumulative training GBitOPs (10^9 MACs x bits x bits, see inttrain.cost); empty for float recipes.
METRIC_FIELDS = ("kind", "step", "epoch", "loss", "val_accuracy", "lr", "time_per_step", "val_loss", "val_perplexity",
                 "forward_bits", "grad_bits", "gbitops")


def write_yaml_atomic(path: Path, data: dict[str, Any]) -> None:
    import yaml

    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, path)


def read_metrics(folder: str | Path) -> list[dict[str, Any]]:
    """Rows of ``metrics.jsonl`` (missing file: no rows); lines that are not rows are skipped."""
    path = Path(folder) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_bytes().decode("utf-8", "replace").splitlines():
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue  # a line cut short by a kill (or damaged): not a row; resume rewrites the file without it
        if isinstance(row, dict) and isinstance(row.get("step"), int) and isinstance(row.get("epoch"), int):
            rows.append(row)
    return rows


def _finite_or_none(v: float | None) -> float | None:
    # JSON has no NaN; an absent value is clearer than a non-standard token.
    return None if v is None or not math.isfinite(v) else v


class RunFolder(TrainHooks):
    """Writes a run's files; ``stop`` (set from a signal handler) asks the loop to stop."""

    def __init__(self, root: Path, config: dict[str, Any], log_every: int = 10, echo: Callable[[str], Any] = print) -> None:
        self.root, self.config, self.log_every, self.echo = Path(root), config, max(1, log_every), echo
        self.checkpoints = self.root / "checkpoints"
        self.stop = False
        self._step_times: list[float] = []
        self.tb: TensorBoardScalars | None = None
        #: Called for every row; returns values of the schedule/cost columns (forward_bits, grad_bits, gbitops).
        self.extra: Callable[[], dict[str, Any]] | None = None
        #: What the model was trained on (classes, input shape, normalisation): saved with every checkpoint
        #: so ``inttrain eval --data-dir OTHER`` standardises other data exactly as training did.
        self.data_info: dict[str, Any] | None = None
        #: Called with the step number after every taken step (``--probe-every``: :class:`inttrain.trainer.probe.ProbeLog`).
        self.probe: Callable[[int], None] | None = None

    # ------------------------------------------------------------------ files
    def create(self) -> None:
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        write_yaml_atomic(self.root / "config.yaml", self.config)
        with open(self.root / "metrics.csv", "w", newline="") as f:
            csv.writer(f).writerow(METRIC_FIELDS)
        (self.root / "metrics.jsonl").write_text("")

    def truncate_after(self, step: int, epoch: int) -> None:
        """Keep only metrics a checkpoint at (``step``, completed ``epoch``) has seen."""
        rows = [
            r for r in read_metrics(self.root)
            if r["step"] <= step and not (r["kind"] == "epoch" and r["epoch"] > epoch)
        ]
        with open(self.root / "metrics.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        with open(self.root / "metrics.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(METRIC_FIELDS)
            w.writerows([["" if r.get(k) is None else r[k] for k in METRIC_FIELDS] for r in rows])
        from .probe import truncate_probe

        truncate_probe(self.root, step)

    def open_tensorboard(self, purge_step: int | None = None) -> None:
        """Start mirroring rows to ``tb/`` (if tensorboard is installed); ``purge_step`` on resume."""
        self.tb = TensorBoardScalars(self.root / "tb", purge_step)
        if self.tb.writer is None:
            self.log(TENSORBOARD_MISSING)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()

    def log(self, line: str) -> None:
        self.echo(line)
        with open(self.root / "train.log", "a") as f:
            f.write(line + "\n")

    def _row(self, row: dict[str, Any]) -> None:
        row = {**row, **{"forward_bits": None, "grad_bits": None, "gbitops": None},
               **(self.extra() if self.extra is not None else {})}
        with open(self.root / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        with open(self.root / "metrics.csv", "a", newline="") as f:
            csv.writer(f).writerow(["" if row.get(k) is None else row[k] for k in METRIC_FIELDS])
        if self.tb is not None:
            self.tb.row(row)

    # ------------------------------------------------------------------ hooks
    def on_step(self, state: TrainState, loss: float | None, lr: float, seconds: float) -> None:
        self._step_times.append(seconds)
        if self.probe is not None and loss is not None:
            self.probe(state.step)
        if state.step % self.log_every == 0 or loss is None:
            times, self._step_times = self._step_times, []
            self._row({
                "kind": "step" if loss is not None else "skipped",
                "step": state.step,
                "epoch": state.epoch + 1,
                "loss": loss,
                "val_accuracy": None,
                "lr": lr,
                "time_per_step": sum(times) / len(times),
                "val_loss": None,
                "val_perplexity": None,
            })

    def on_epoch(self, state: TrainState, stats: EpochStats, lr: float) -> None:
        self._row({
            "kind": "epoch",
            "step": state.step,
            "epoch": stats.epoch,
            "loss": _finite_or_none(stats.train_loss),
            "val_accuracy": stats.val_accuracy,
            "lr": lr,
            "time_per_step": _finite_or_none(stats.time_per_step),
            "val_loss": _finite_or_none(stats.val_loss),
            "val_perplexity": _finite_or_none(stats.val_perplexity),
        })

    def save(self, name: str, snapshot: Callable[[], tuple[dict[str, Tensor], dict[str, Any]]]) -> None:
        weights, state = snapshot()
        extra = {"data": self.data_info} if self.data_info is not None else {}
        save_checkpoint(self.checkpoints, name, weights, {**state, "config": self.config, **extra})

    def should_stop(self) -> bool:
        return self.stop

    def checkpoint(self, name: str) -> tuple[Path, Path]:
        return checkpoint_paths(self.checkpoints, name)
