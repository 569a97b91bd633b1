"""``inttrain train --probe-every N``: the numerics probe (:func:`inttrain.nn.probe.probe_gemms`) every N steps.

:class:`ProbeLog` is called by the run folder after every training step; every ``every``-th step it probes
the model as it stands after that step's update on one fixed batch (the first ``batch_size`` training
examples, unaugmented: across rows only the weights change, not the data) and appends one row per layer and
GEMM to ``probe.csv``. The probe works on a copy of the model, so a probed run trains exactly as an
unprobed one (same losses, same checkpoints).
"""

from __future__ import annotations

import csv
import math
import time
from pathlib import Path

from torch import Tensor, nn

__all__ = ["PROBE_FIELDS", "ProbeLog", "read_probe", "truncate_probe"]

PROBE_FIELDS = ("step", "layer", "kind", "gemm", "integer", "bits", "sqnr_db")
PROBE_FILE = "probe.csv"


class ProbeLog:
    """Probe ``model`` on ``(x, y)`` every ``every`` steps into ``folder/probe.csv``."""

    def __init__(self, model: nn.Module, x: Tensor, y: Tensor, every: int, folder: Path) -> None:
        if every < 1:
            raise ValueError(f"probe every {every} steps: must be >= 1")
        self.model, self.x, self.y, self.every = model, x, y, every
        self.path = Path(folder) / PROBE_FILE
        self.seconds = 0.0

    def __call__(self, step: int) -> None:
        if step % self.every:
            return
        from inttrain.nn.probe import probe_gemms

        t0 = time.perf_counter()
        rows = probe_gemms(self.model, self.x, self.y)
        new = not self.path.is_file()
        with open(self.path, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(PROBE_FIELDS)
            w.writerows([[step, r.layer, r.kind, r.gemm, int(r.integer), r.bits, f"{r.sqnr_db:.4f}"] for r in rows])
        self.seconds += time.perf_counter() - t0


def read_probe(folder: str | Path) -> list[dict]:
    """Rows of ``probe.csv`` (step int, sqnr_db float; ``inf`` when exact); no file: no rows."""
    path = Path(folder) / PROBE_FILE
    if not path.is_file():
        return []
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            try:
                rows.append({**r, "step": int(r["step"]), "integer": r["integer"] == "1", "sqnr_db": float(r["sqnr_db"])})
            except (TypeError, ValueError, KeyError):
                continue  # a line cut short by a kill
    return [r for r in rows if not math.isnan(r["sqnr_db"])]


def truncate_probe(folder: str | Path, step: int) -> None:
    """Keep the rows of steps <= ``step`` (a resume from a checkpoint at ``step`` redoes the rest)."""
    path = Path(folder) / PROBE_FILE
    if not path.is_file():
        return
    rows = [r for r in read_probe(folder) if r["step"] <= step]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PROBE_FIELDS)
        w.writerows([[r["step"], r["layer"], r["kind"], r["gemm"], int(r["integer"]), r["bits"], f"{r['sqnr_db']:.4f}"]
                     for r in rows])
