"""Issue 15 for ``python -m inttrain.micro``: model descriptions of the wrong JSON types or of absurd sizes,
empty files and ``--out`` onto an existing path each get one ``error:`` line and exit 2 (``--debug``: the
traceback), before any weight is drawn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inttrain.micro import MicroFormatError, Sequential, save_model
from inttrain.micro.__main__ import main
from inttrain.micro.model import check_memory, layer_sizes, validate_description
from inttrain.spec.errors import InttrainError, ModelFormatError

MLP = {"input_shape": [4], "layers": [{"type": "linear", "in_features": 4, "out_features": 3}]}


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def _data(path: Path, n: int = 8) -> Path:
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.integers(-127, 128, (n, 4)).astype(np.int8), x_exp=np.int64(-7), y=rng.integers(0, 3, n))
    return path


def test_micro_errors_are_the_family() -> None:
    assert issubclass(MicroFormatError, ModelFormatError) and issubclass(MicroFormatError, InttrainError)


@pytest.mark.parametrize(("patch", "expected"), [
    ({"input_shape": "4"}, "input_shape must be [features] or [C, H, W] of positive integers"),
    ({"input_shape": [4.0]}, "input_shape must be [features] or [C, H, W]"),
    ({"layers": {"type": "linear"}}, "layers must be a list of 1..64 layer objects"),
    ({"layers": ["linear"]}, "layer 0: must be an object"),
    ({"layers": [{"type": "linear", "in_features": "4", "out_features": 3}]}, "'in_features' must be an integer"),
    ({"layers": [{"type": "linear", "in_features": True, "out_features": 3}]}, "'in_features' must be an integer"),
    ({"layers": [{"type": ["linear"], "in_features": 4, "out_features": 3}]}, "unknown layer type ['linear']"),
    ({"rounding": "rne"}, "rounding must be an object mapping forward/backward/update to one of"),
    ({"rounding": {"forward": ["rne"]}}, "rounding must map forward/backward/update to one of"),
    ({"weight_bits": "16"}, "weight_bits must be 8 or 16, got '16'"),
    ({"seed": -1}, "'seed' must be an integer in [0, 4294967295], got -1"),
    ({"num_classes": "3"}, "num_classes '3' but the layers output 3"),
])
def test_description_fields_of_the_wrong_type(tmp_path: Path, capsys: pytest.CaptureFixture[str], patch: dict,
                                              expected: str) -> None:
    (tmp_path / "m.json").write_text(json.dumps({**MLP, **patch}))
    assert main(["train", str(tmp_path / "m.json"), str(_data(tmp_path / "d.npz")), "--out", str(tmp_path / "o")]) == 2
    err = _err(capsys)
    assert err.startswith(f"error: {tmp_path / 'm.json'}: ") and expected in err, err
    assert not (tmp_path / "o").exists()


def test_description_demanding_gigabytes_is_refused_before_drawing_weights(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    huge = {"input_shape": [60_000], "layers": [
        {"type": "linear", "in_features": 60_000, "out_features": 130_000},
        {"type": "linear", "in_features": 130_000, "out_features": 10}]}
    params, acts, _, wide = layer_sizes(huge["layers"], (60_000,))
    assert params == 60_000 * 130_000 + 130_000 + 130_000 * 10 + 10 and acts == 130_010 and wide == 0
    with pytest.raises(MicroFormatError, match=r"7,801,430,010 parameters .* need 94.5 GiB; allowed: at most 1 GiB"):
        check_memory(huge, 1, "m.json", limit=1 << 30)
    (tmp_path / "m.json").write_text(json.dumps(huge))
    assert main(["train", str(tmp_path / "m.json"), str(_data(tmp_path / "d.npz")), "--out", str(tmp_path / "o")]) == 2
    err = _err(capsys)
    assert "7,801,430,010 parameters and 130,010 activations per example at batch 1 need 94.5 GiB" in err


def test_batch_whose_activations_do_not_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conv = {"input_shape": [1, 1024, 1024], "layers": [
        {"type": "conv2d", "in_channels": 1, "out_channels": 64, "kernel_size": 3, "padding": 1},
        {"type": "globalavgpool2d"}, {"type": "flatten"}, {"type": "linear", "in_features": 64, "out_features": 2}]}
    with pytest.raises(MicroFormatError, match="globalavgpool2d expects"):
        validate_description(conv)  # H * W past the int32-safe pooling window: refused by the description rules
    model = Sequential.from_description(MLP)
    with pytest.raises(MicroFormatError, match=r"--batch-size 10000000000: .* allowed: at most"):
        check_memory(model.desc, 10**10, "--batch-size 10000000000")


def test_unknown_weight_view_is_refused() -> None:
    with pytest.raises(MicroFormatError, match=r"m.json: weight_view must be one of \['fixed', 'tensor'\], got 'row'"):
        validate_description({**MLP, "weight_view": "row"}, "m.json")
    assert validate_description({**MLP, "weight_view": "tensor"})["weight_view"] == "tensor"
    assert "weight_view" not in validate_description({**MLP, "weight_view": "fixed"})



def test_memory_need_counts_16_bit_codes_and_errors_as_two_bytes() -> None:
    """A convolution handing its batch norm 16-bit codes keeps one more byte per output element, and so does every
    activation's error under 16-bit errors: 90 parameters x 13 bytes + (16 input + 32 conv + 32 norm + 32 flatten +
    2 linear elements) x 5 bytes + 32 wide codes = 1772 bytes for one example; 114 more with 16-bit errors."""
    desc = validate_description({"input_shape": [1, 4, 4], "layers": [
        {"type": "conv2d", "in_channels": 1, "out_channels": 2, "kernel_size": 3, "padding": 1, "out_bits": 16},
        {"type": "batchnorm", "num_features": 2}, {"type": "flatten"},
        {"type": "linear", "in_features": 32, "out_features": 2}]})
    assert layer_sizes(desc["layers"], (1, 4, 4)) == (90, 98, (2,), 32)
    check_memory(desc, 1, "m.json", limit=1772)
    with pytest.raises(MicroFormatError, match="need 1.65e-06 GiB"):
        check_memory(desc, 1, "m.json", limit=1771)
    check_memory({**desc, "error_bits": 16}, 1, "m.json", limit=1886)
    with pytest.raises(MicroFormatError, match="m.json: 90 parameters and 98 activations per example at batch 1"):
        check_memory({**desc, "error_bits": 16}, 1, "m.json", limit=1885)


def test_empty_and_garbage_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.json").write_text(json.dumps(MLP))
    (tmp_path / "empty.npz").write_bytes(b"")
    assert main(["train", str(tmp_path / "m.json"), str(tmp_path / "empty.npz"), "--out", str(tmp_path / "o")]) == 2
    assert "empty.npz: not a valid .npz" in _err(capsys)
    (tmp_path / "e.json").write_bytes(b"")
    assert main(["train", str(tmp_path / "e.json"), str(_data(tmp_path / "d.npz")), "--out", str(tmp_path / "o")]) == 2
    assert "e.json: not valid JSON" in _err(capsys)
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["train", str(tmp_path / "deep.json"), str(tmp_path / "d.npz"), "--out", str(tmp_path / "o")]) == 2
    assert "deep.json: not valid JSON" in _err(capsys)


def test_out_onto_an_existing_path_needs_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.json").write_text(json.dumps(MLP))
    data = _data(tmp_path / "d.npz")
    out = tmp_path / "out"
    save_model(Sequential.from_description(MLP), out, {"note": "old"})
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    args = ["train", str(tmp_path / "m.json"), str(data), "--epochs", "1", "--out", str(out)]
    assert main(args) == 2
    assert _err(capsys) == (f"error: --out {out}: already exists; allowed: a new path, --force to replace it, "
                            "or --resume to continue the run saved there")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main([*args, "--force"]) == 0
    assert json.loads((out / "model.json").read_text())["info"]["history"][0]["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npz", "m.json", "out"]  # no temp folders left


def test_killed_save_leftovers_are_cleaned_and_the_old_model_kept(tmp_path: Path) -> None:
    model = Sequential.from_description(MLP)
    out = save_model(model, tmp_path / "m")
    stale = tmp_path / ".m.tmp-killed"
    stale.mkdir()
    (stale / "weights.safetensors").write_bytes(b"half")
    save_model(model, out)
    assert not stale.exists() and sorted(p.name for p in out.iterdir()) == ["model.json", "weights.safetensors"]


def test_debug_flag_shows_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text(json.dumps({**MLP, "rounding": "rne"}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "inttrain.micro", "train", str(tmp_path / "m.json"), "x.npz", "--out", "o"]
    plain = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    debug = subprocess.run([*cmd, "--debug"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert plain.returncode == debug.returncode == 2
    assert plain.stderr.count("\n") == 1 and "Traceback" not in plain.stderr
    assert "Traceback" in debug.stderr and debug.stderr.strip().splitlines()[-1] == plain.stderr.strip()
