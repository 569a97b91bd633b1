"""``inttrain export``: integer-only torch checkpoint / run folder / model folder -> micro files, and back."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from inttrain import integer_only as T
from inttrain import micro as M
from inttrain.cli.app import main
from inttrain.cli.export import export_model, import_micro, load_checkpoint_model, save_checkpoint
from inttrain.micro.io import read_safetensors, write_safetensors

CNN = {"input_shape": [1, 8, 8], "layers": [
    {"type": "conv2d", "in_channels": 1, "out_channels": 4, "kernel_size": 3, "padding": 1}, {"type": "relu"},
    {"type": "avgpool2d", "kernel_size": 2}, {"type": "flatten"},
    {"type": "linear", "in_features": 64, "out_features": 10}]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A torch integer-only CNN trained 30 steps with momentum and remainders, its checkpoint run folder and test
    data."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.minimum(d.data * 8, 127).astype(np.int8).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    tm = T.Sequential.from_description(CNN)
    opt = T.SGD(tm.params(), 7, momentum_shift=2, frac_bits=10)
    T.train_epoch(tm, opt, x[:960], -7, y[:960], 32)
    root = tmp_path_factory.mktemp("export")
    run = root / "run"
    save_checkpoint(tm, run, "last", opt)
    np.savez(root / "test.npz", x=x[1400:], x_exp=np.int64(-7), y=y[1400:])
    return tm, run, root / "test.npz"


def _same(tm, mm):
    for (n, tp), (m, mp) in zip(tm.named_params(), mm.named_params()):
        assert n == m and tp.exp == mp.exp and tp.bits == mp.bits
        assert np.array_equal(tp.acc.numpy(), mp.acc) and mp.acc.dtype == np.int16


def test_export_run_folder_cli_round_trip(trained, tmp_path, capsys):
    tm, run, data = trained
    assert main(["export", str(run), "--out", str(tmp_path / "m"), "--data", str(data)]) == 0
    out = capsys.readouterr().out
    assert "exported 2 tensors" in out and "predict identically on 397 samples" in out
    mm = M.load_model(tmp_path / "m")                                  # NumPy-only loader
    _same(tm, mm)
    x, xe, y = M.load_data(data)
    assert np.array_equal(M.model.predict(mm, x, xe), T.predict(tm, x, xe).numpy())
    back = import_micro(tmp_path / "m")                                # reverse: micro -> torch
    _same(back, mm)
    assert torch.equal(T.predict(back, x, xe), T.predict(tm, x, xe))
    # the micro CLI evaluates the exported folder
    from inttrain.micro.__main__ import main as micro_main

    assert micro_main(["eval", str(tmp_path / "m"), str(data)]) == 0
    assert f"accuracy {M.evaluate(mm, x, xe, y):.4f}" in capsys.readouterr().out


def test_export_checkpoint_file_and_model_folder(trained, tmp_path):
    tm, run, _ = trained
    export_model(run / "checkpoints" / "last.safetensors", tmp_path / "a")
    tm.save(tmp_path / "saved")                                        # integer_only's own micro-format save
    export_model(tmp_path / "saved", tmp_path / "b")
    for d in ("a", "b"):
        _same(tm, M.load_model(tmp_path / d))
    assert (tmp_path / "a" / "weights.safetensors").read_bytes() == (tmp_path / "b" / "weights.safetensors").read_bytes()
    mm, state = load_checkpoint_model(run / "checkpoints" / "last.safetensors")
    assert state["integer_only"]["optimizer"] == {"lr_shift": 7, "rounding": "pstoch", "momentum_shift": 2,
                                                  "nesterov": False}
    for tp, mp in zip(tm.params(), mm.params()):        # momentum buffers and remainders travel in the checkpoint
        assert np.array_equal(tp.mom.numpy(), mp.mom)
        assert mp.frac.dtype == np.int16 and mp.frac.any() and np.array_equal(tp.frac.numpy(), mp.frac)


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def _st_raw(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    return len(h).to_bytes(8, "little") + h + data


@pytest.mark.parametrize("case", ["header_size", "lying_shape", "lying_offsets", "hole", "codes", "codes_-32768",
                                  "exp_nan", "exp_inf", "exp_float", "exp_huge", "bits_32", "bits_4", "dtype",
                                  "weight_bits", "missing"])
def test_corrupt_model_folder_one_clear_error(trained, tmp_path, capsys, case):
    tm, _, _ = trained
    d = tmp_path / "m"
    tm.save(d)
    st = d / "weights.safetensors"
    doc = json.loads((d / "model.json").read_text())
    tensors, _ = read_safetensors(st)
    w0 = "layers.0.weight"
    if case == "header_size":
        raw = st.read_bytes()
        st.write_bytes((len(raw) * 3).to_bytes(8, "little") + raw[8:])
    elif case in ("lying_shape", "lying_offsets", "hole"):
        a = tensors[w0]
        hdr = {w0: {"dtype": "I16", "shape": list(a.shape), "data_offsets": [0, a.nbytes]}}
        data = a.tobytes()
        if case == "lying_shape":
            hdr[w0]["shape"] = [4, 1, 3, 4]
        elif case == "lying_offsets":
            hdr[w0]["data_offsets"] = [2, a.nbytes + 2]
        else:
            data += b"\0\0"
        b = tensors["layers.4.weight"]
        hdr["layers.4.weight"] = {"dtype": "I16", "shape": list(b.shape), "data_offsets": [len(data), len(data) + b.nbytes]}
        st.write_bytes(_st_raw(hdr, data + b.tobytes()))
    elif case in ("codes", "codes_-32768", "dtype"):
        bad = dict(tensors)
        bad[w0] = tensors[w0].copy()
        if case == "dtype":
            bad[w0] = bad[w0].astype(np.int32)
        else:
            bad[w0].flat[0] = -32768 if case == "codes_-32768" else 0
            if case == "codes":
                doc["weight_bits"] = 8          # int16 codes under an 8-bit description: out of range / wrong dtype
        write_safetensors(st, bad)
    elif case.startswith("exp_"):
        doc["params"][w0]["exp"] = {"exp_nan": math.nan, "exp_inf": math.inf, "exp_float": -7.5, "exp_huge": 10**9}[case]
    elif case.startswith("bits_"):
        doc["params"][w0]["bits"] = int(case[5:])
    elif case == "weight_bits":
        doc["weight_bits"] = 32
    elif case == "missing":
        del doc["params"]["layers.4.weight"]
    (d / "model.json").write_text(json.dumps(doc))
    assert main(["export", str(d), "--out", str(tmp_path / "o")]) == 2
    err = _err(capsys)
    assert str(d) in err
    assert not (tmp_path / "o" / "model.json").exists()


@pytest.mark.parametrize("case", ["not_integer", "bits", "exp_nan", "codes", "float_tensor", "momentum", "description",
                                  "sha", "missing_state"])
def test_corrupt_checkpoint_one_clear_error(trained, tmp_path, capsys, case):
    from inttrain.trainer.checkpoint import load_checkpoint
    from inttrain.trainer.checkpoint import save_checkpoint as save_pair

    tm, run, _ = trained
    weights, state = load_checkpoint(run / "checkpoints" / "last.safetensors")
    state = {k: v for k, v in state.items() if k not in ("format_version", "weights_sha256")}
    io = state["integer_only"] = json.loads(json.dumps(state["integer_only"]))
    w0 = "layers.0.weight"
    if case == "not_integer":
        state = {"config": {"recipe": "int8"}}
    elif case == "bits":
        io["params"][w0]["bits"] = 12
    elif case == "exp_nan":
        io["params"][w0]["exp"] = math.nan
    elif case == "codes":
        weights[w0] = weights[w0].clone()
        weights[w0].view(-1)[0] = -32768
    elif case == "float_tensor":
        weights[w0] = weights[w0].float()
    elif case == "momentum":
        weights["momentum/layers.0.weight"] = torch.zeros(3, dtype=torch.int32)
    elif case == "description":
        io["description"] = json.dumps({**CNN, "layers": CNN["layers"][:3]})
    w, s = save_pair(tmp_path / "ck", "last", weights, state)
    if case == "sha":
        raw = bytearray(w.read_bytes())
        raw[-1] ^= 1
        w.write_bytes(bytes(raw))
    elif case == "missing_state":
        s.unlink()
    assert main(["export", str(tmp_path / "ck" / "last.safetensors"), "--out", str(tmp_path / "o")]) == 2
    err = _err(capsys)
    assert "last" in err
    if case == "not_integer":
        assert "not an integer-only checkpoint" in err


def test_export_source_not_found(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]) == 2
    assert "not found" in _err(capsys)
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2
    assert "neither a model folder" in _err(capsys)
