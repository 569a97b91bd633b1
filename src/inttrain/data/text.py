"""A local UTF-8 text file as a character-level language-modelling dataset (``text``).

The last ``val_fraction`` of the file is the validation split (a contiguous
tail, not a random sample: random windows would overlap the training text and
leak it). The vocabulary is the sorted set of characters of the *training*
part plus one id for characters seen only in validation, so the model's size
never depends on the validation text. Both parts are cut into windows of
``seq_len + 1`` characters that overlap by one: inputs are the first
``seq_len`` characters, targets the last ``seq_len`` (the next character at
every position).
"""

from __future__ import annotations

import stat
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from .errors import DataError
from .limits import TEXT_BYTES_PER_CHAR, Limits
from .splits import DatasetSplits

__all__ = ["UNKNOWN", "encode", "load_text_splits", "read_text", "windows"]

#: Stands for every validation character absent from the training text (last id of the vocabulary).
UNKNOWN = "\ufffd"


def read_text(data_dir: str | Path | None, limits: Limits | None = None) -> tuple[Path, str]:
    """(path, contents) of the UTF-8 text file ``data_dir``; DataError naming the file otherwise."""
    if data_dir is None:
        raise DataError("text: data_dir: required; point --data-dir (or --data-path) at a UTF-8 text file")
    path = Path(data_dir)
    if path.is_dir():
        raise DataError(f"{path}: data_dir: is a folder; the text dataset needs one UTF-8 text file")
    limits = limits or Limits()
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # a FIFO or /dev/zero never ends: refuse before reading
            raise DataError(f"{path}: data_dir: not a regular file; allowed: a UTF-8 text file (no pipes or devices)")
        limits.check_bytes(str(path), f"a text dataset of {info.st_size} bytes", info.st_size * TEXT_BYTES_PER_CHAR)
        with open(path, "rb") as f:
            raw = f.read(info.st_size + 1)  # bounded even if the file grows while we read
    except OSError as e:
        raise DataError(f"{path}: file: cannot read ({e.strerror or e})") from None
    if len(raw) > info.st_size:
        raise DataError(f"{path}: file: grew while being read; allowed: a file that stays as it is")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: byte {e.start}: not valid UTF-8 ({e.reason}); the text dataset reads UTF-8 files") from None
    if not text:
        raise DataError(f"{path}: text: file is empty; it needs characters to train on")
    return path, text


def _min_length(seq_len: int, val_fraction: float) -> int:
    """Smallest file length whose train and validation parts each hold one window.

    Solved in closed form, then nudged over the rounding: a loop from seq_len upwards would take
    minutes for seq_len = 10^9.
    """
    need = seq_len + 1
    # round(n * f) >= need  <=>  n >= (need - 0.5) / f (ties aside); both parts grow with n, so start at the
    # larger lower bound: at most a few steps remain.
    n = max(need, int((need - 0.5) / val_fraction) - 2, int((need - 0.5) / (1 - val_fraction)) - 2)
    while not (int(round(n * val_fraction)) >= need and n - int(round(n * val_fraction)) >= need):
        n += 1
    return n


def encode(text: str, stoi: dict[str, int]) -> torch.Tensor:
    """Character ids of ``text`` (int64); characters not in ``stoi`` get the UNKNOWN id."""
    unknown = stoi[UNKNOWN]
    return torch.tensor([stoi.get(c, unknown) for c in text], dtype=torch.int64)


def windows(ids: torch.Tensor, seq_len: int) -> TensorDataset:
    """(inputs, next-character targets), both [N, seq_len], from windows of seq_len+1 ids that overlap by one."""
    w = ids.unfold(0, seq_len + 1, seq_len)
    return TensorDataset(w[:, :-1].contiguous(), w[:, 1:].contiguous())


def load_text_splits(data_dir: str | Path | None, seq_len: int = 64, val_fraction: float = 0.1,
                     limits: Limits | None = None) -> DatasetSplits:
    """Validated train/val splits of the text file ``data_dir`` (see the module docstring)."""
    if seq_len < 1:
        raise DataError(f"text: seq_len: {seq_len} must be >= 1")
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"text: val_fraction: {val_fraction} must be strictly between 0 and 1")
    path, text = read_text(data_dir, limits)
    n_val = int(round(len(text) * val_fraction))
    n_train = len(text) - n_val
    if min(n_val, n_train) < seq_len + 1:
        raise DataError(
            f"{path}: text: {len(text)} characters is too short; with seq_len={seq_len} and "
            f"val_fraction={val_fraction:g} the training part ({n_train}) and the validation part at the end "
            f"({n_val}) must each hold at least seq_len+1={seq_len + 1} characters, so the file needs at least "
            f"{_min_length(seq_len, val_fraction)}"
        )
    train_text, val_text = text[:n_train], text[n_train:]
    chars = sorted(set(train_text) - {UNKNOWN}) + [UNKNOWN]
    stoi = {c: i for i, c in enumerate(chars)}
    return DatasetSplits(
        name="text",
        train=windows(encode(train_text, stoi), seq_len),
        val=windows(encode(val_text, stoi), seq_len),
        num_classes=len(chars),  # the vocabulary size
        in_channels=1,
        image_size=seq_len,  # the context length, as the model registry reads it for gpt-small
        source=str(path),
        val_source=f"last {val_fraction:g} of the file ({n_val} characters)",
        task="lm",
        vocab="".join(chars),
    )
