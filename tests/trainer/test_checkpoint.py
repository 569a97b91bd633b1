"""Checkpoint pairs: atomic, verified, and the previous one survives a crash at any point of a save."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from inttrain.trainer import CheckpointError, checkpoint_paths, load_checkpoint, save_checkpoint
from inttrain.trainer import checkpoint as ckpt


def _save(folder: Path, step: int) -> None:
    save_checkpoint(folder, "last", {"w": torch.full((3,), float(step))}, {"step": step, "rng": torch.arange(4)})


def test_roundtrip_weights_only(tmp_path: Path) -> None:
    _save(tmp_path, 1)
    w, s = load_checkpoint(*checkpoint_paths(tmp_path, "last"))
    assert torch.equal(w["w"], torch.ones(3)) and s["step"] == 1 and torch.equal(s["rng"], torch.arange(4))
    torch.load(tmp_path / "last.state.pt", weights_only=True)  # plain data only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.safetensors", "last.state.pt"]


@pytest.mark.parametrize("crash_at", [1, 2])  # the weights rename, the state rename
def test_crash_during_save_keeps_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_at: int) -> None:
    _save(tmp_path, 1)
    calls = {"n": 0}
    real = os.replace

    def replace(a: str, b: str) -> None:
        calls["n"] += 1
        if calls["n"] == crash_at:
            raise KeyboardInterrupt  # the process dies here
        real(a, b)

    monkeypatch.setattr(ckpt.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 2)
    monkeypatch.setattr(ckpt.os, "replace", real)
    w, s = load_checkpoint(*checkpoint_paths(tmp_path, "last"))
    assert s["step"] == 1 and torch.equal(w["w"], torch.ones(3))
    _save(tmp_path, 3)  # the next save cleans up
    w, s = load_checkpoint(*checkpoint_paths(tmp_path, "last"))
    assert s["step"] == 3 and torch.equal(w["w"], torch.full((3,), 3.0))
    assert not [p for p in tmp_path.iterdir() if "prev" in p.name]


def test_mismatched_pair_is_rejected(tmp_path: Path) -> None:
    _save(tmp_path / "a", 1)
    _save(tmp_path / "b", 2)
    w_a, _ = checkpoint_paths(tmp_path / "a", "last")
    _, s_b = checkpoint_paths(tmp_path / "b", "last")
    with pytest.raises(CheckpointError, match=r"last\.safetensors: weights sha256 .* does not match the last\.state\.pt record"):
        load_checkpoint(w_a, s_b)


_KILL_SCRIPT = """
import os, signal, sys, torch
from inttrain.trainer import save_checkpoint
from inttrain.trainer import checkpoint as ckpt
folder, kill_at = sys.argv[1], int(sys.argv[2])
save_checkpoint(folder, "last", {"w": torch.full((3,), 1.0)}, {"step": 1})
calls = [0]
real = os.replace
def replace(a, b):
    calls[0] += 1
    if calls[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)  # the process dies between writing and renaming
    real(a, b)
ckpt.os.replace = replace
save_checkpoint(folder, "last", {"w": torch.full((3,), 2.0)}, {"step": 2})
"""


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGKILL"), reason="needs SIGKILL")
@pytest.mark.parametrize("kill_at", [1, 2])
def test_process_killed_during_save_leaves_previous_checkpoint_loadable(tmp_path: Path, kill_at: int) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _KILL_SCRIPT, str(tmp_path), str(kill_at)], capture_output=True, timeout=120)
    assert r.returncode == -9, r.stderr.decode()
    w, s = load_checkpoint(*checkpoint_paths(tmp_path, "last"))
    assert s["step"] == 1 and torch.equal(w["w"], torch.ones(3))
