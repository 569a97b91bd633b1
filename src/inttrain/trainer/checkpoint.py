"""Checkpoints as an atomic pair: ``NAME.safetensors`` (weights) + ``NAME.state.pt`` (everything else).

The state file holds only plain containers, numbers, strings and tensors so it
loads with ``torch.load(..., weights_only=True)``: a checkpoint is data, never
code. Both files are written to temporary names in the same folder, fsynced,
then renamed with ``os.replace`` -- weights first, state last. The state
records the sha256 of its weights, so a mismatched pair is detected on load
instead of silently resuming from weights of a different step. Before the
weights are replaced, the old ones are hard-linked to ``NAME.prev.safetensors``
(removed after the state rename); a crash between the two renames therefore
still leaves the previous checkpoint loadable: the loader falls back to the
``.prev`` weights when they are the ones the state records.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["CheckpointError", "checkpoint_paths", "save_checkpoint", "load_checkpoint", "FORMAT_VERSION"]

FORMAT_VERSION = 1


from inttrain.spec.errors import CheckpointError  # noqa: E402 - re-exported: the trainer's name for it


def checkpoint_paths(folder: str | Path, name: str) -> tuple[Path, Path]:
    """(weights, state) paths of checkpoint ``name`` in ``folder``."""
    folder = Path(folder)
    return folder / f"{name}.safetensors", folder / f"{name}.state.pt"


def _atomic_write(path: Path, write: Callable[[str], None]) -> Path:
    """Write via ``write(tmp_path)`` to a fsynced temp file next to ``path``; return the temp path."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:  # fsync: the rename must never point at unwritten blocks
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(folder: Path) -> None:
    # Makes the renames themselves durable; not supported everywhere (e.g. Windows).
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(folder: str | Path, name: str, weights: dict[str, Tensor], state: dict[str, Any]) -> tuple[Path, Path]:
    """Atomically write checkpoint ``name``; the previous one stays loadable until the final rename."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    w_path, s_path = checkpoint_paths(folder, name)
    for p in (w_path, s_path):  # temp files of a save that was killed: never read, removed here
        for stale in folder.glob(f".{p.name}.*.tmp"):
            stale.unlink(missing_ok=True)
    # safetensors refuses shared / non-contiguous storage: give it private contiguous copies.
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in weights.items()}
    w_tmp = _atomic_write(w_path, lambda p: save_file(tensors, p))
    try:
        payload = {**state, "format_version": FORMAT_VERSION, "weights_sha256": _sha256(w_tmp)}
        s_tmp = _atomic_write(s_path, lambda p: torch.save(payload, p))
    except BaseException:
        w_tmp.unlink(missing_ok=True)
        raise
    prev = _prev_path(w_path)
    prev.unlink(missing_ok=True)
    if w_path.exists():
        try:
            os.link(w_path, prev)
        except OSError:  # no hard links here (some network/FUSE file systems): copy instead
            import shutil

            shutil.copyfile(w_path, prev)
    os.replace(w_tmp, w_path)
    _fsync_dir(folder)
    os.replace(s_tmp, s_path)  # last: until here the old state still names the .prev weights
    _fsync_dir(folder)
    prev.unlink(missing_ok=True)
    return w_path, s_path


def _prev_path(weights_path: Path) -> Path:
    return weights_path.with_name(weights_path.name.removesuffix(".safetensors") + ".prev.safetensors")


def load_checkpoint(weights_path: str | Path, state_path: str | Path | None = None) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Load and verify a checkpoint pair; raises :class:`CheckpointError` naming the bad file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    w_path = Path(weights_path)
    s_path = Path(state_path) if state_path is not None else w_path.with_name(w_path.name.removesuffix(".safetensors") + ".state.pt")
    for p in (w_path, s_path):
        if not p.is_file():
            raise CheckpointError(f"{p}: checkpoint file not found")
    try:
        state = torch.load(s_path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, pickle of a non-allowed type, ...
        raise CheckpointError(f"{s_path}: not a readable checkpoint state file ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{s_path}: not an inttrain checkpoint state (format_version {FORMAT_VERSION} expected)")
    digest = _sha256(w_path)
    prev = _prev_path(w_path)
    if digest != state.get("weights_sha256") and prev.is_file() and _sha256(prev) == state.get("weights_sha256"):
        # Interrupted between the two renames of a save: the state is the previous
        # checkpoint's, and so are the .prev weights.
        w_path, digest = prev, state["weights_sha256"]
    if digest != state.get("weights_sha256"):
        raise CheckpointError(
            f"{w_path}: weights sha256 {digest[:12]}... does not match the {s_path.name} record "
            f"{str(state.get('weights_sha256'))[:12]}... (truncated, corrupt or from another checkpoint)"
        )
    try:
        weights = load_file(w_path)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{w_path}: not a readable safetensors file ({e})") from None
    return weights, state
