"""Optional TensorBoard output: the metrics rows as scalars in ``RUN_DIR/tb``.

Written only when ``torch.utils.tensorboard`` imports (it needs the
``tensorboard`` package, the optional extra ``inttrain[tensorboard]``); without
it the run is otherwise unchanged (metrics.csv/jsonl already hold every number)
and the run folder logs :data:`TENSORBOARD_MISSING` once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["summary_writer_class", "TensorBoardScalars", "TENSORBOARD_MISSING"]

TENSORBOARD_MISSING = ("tensorboard: not installed (optional extra), so no tb/ curves; metrics.csv and metrics.jsonl "
                       "hold every number. Add it with: pip install 'inttrain[tensorboard]'")

# Metric columns that are coordinates or labels, not curves.
_NOT_SCALARS = ("kind", "step", "epoch")


def summary_writer_class() -> type | None:
    """``torch.utils.tensorboard.SummaryWriter``, or None when tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch raises ImportError naming the missing tensorboard package
        return None
    return SummaryWriter


class TensorBoardScalars:
    """Mirrors metrics rows into a SummaryWriter; a no-op when none is available."""

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        writer_cls = summary_writer_class()
        # purge_step: on resume, drop events the interrupted leg wrote after its checkpoint,
        # so the curves read as one run (like the metrics files).
        self.writer: Any = None if writer_cls is None else writer_cls(str(log_dir), purge_step=purge_step)

    def row(self, row: dict[str, Any]) -> None:
        if self.writer is None:
            return
        for key, value in row.items():
            if key not in _NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"{row['kind']}/{key}", value, row["step"])
        self.writer.flush()  # a killed run keeps its curves up to the last row, like the metrics files

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
