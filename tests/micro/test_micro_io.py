import json
import zipfile

import numpy as np
import pytest

from inttrain.micro import MicroFormatError, Sequential, load_data, load_model, save_model
from inttrain.micro.io import read_npz, read_safetensors, write_safetensors

DESC = {"input_shape": [1, 6, 6], "layers": [
    {"type": "conv2d", "in_channels": 1, "out_channels": 2, "kernel_size": 3, "padding": 1},
    {"type": "relu"}, {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"},
    {"type": "linear", "in_features": 18, "out_features": 3}]}


def _tensors():
    rng = np.random.default_rng(0)
    return {"a": rng.integers(-127, 128, size=(3, 4)).astype(np.int8),
            "b": rng.integers(-32767, 32768, size=(5,)).astype(np.int16),
            "c": np.arange(6, dtype=np.float32).reshape(2, 3), "empty": np.zeros((0, 2), dtype=np.int32)}


def test_round_trip_and_safetensors_compat(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    t = _tensors()
    write_safetensors(tmp_path / "ours.safetensors", t, {"format": "x"})
    back, meta = read_safetensors(tmp_path / "ours.safetensors")
    assert meta == {"format": "x"}
    for k in t:
        assert back[k].dtype == t[k].dtype and np.array_equal(back[k], t[k])
    theirs = st.load_file(str(tmp_path / "ours.safetensors"))              # the reference reads ours
    assert all(np.array_equal(theirs[k], t[k]) for k in t)
    st.save_file(t, str(tmp_path / "theirs.safetensors"), metadata={"m": "1"})  # we read theirs
    back, meta = read_safetensors(tmp_path / "theirs.safetensors")
    assert meta == {"m": "1"} and all(np.array_equal(back[k], t[k]) for k in t)


def _raw(header: dict, data: bytes, n: int | None = None) -> bytes:
    h = json.dumps(header).encode()
    return (len(h) if n is None else n).to_bytes(8, "little") + h + data


@pytest.mark.parametrize("blob", [
    b"",                                                                      # empty
    b"\x05\x00",                                                              # truncated length
    (2**63).to_bytes(8, "little") + b"{}",                                    # lying huge header length
    (100).to_bytes(8, "little") + b"{}",                                      # header longer than file
    _raw({}, b"")[:-1] + b"x",                                                # not JSON
    b"\x02\x00\x00\x00\x00\x00\x00\x00[]",                                    # not an object
    _raw({"a": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]}}, b"\x01\x02"),       # data out of bounds
    _raw({"a": {"dtype": "I8", "shape": [3], "data_offsets": [0, 4]}}, b"\x01\x02\x03\x04"),  # shape vs offsets
    _raw({"a": {"dtype": "I8", "shape": [2**40, 2**40], "data_offsets": [0, 4]}}, b"1234"),  # lying shape
    _raw({"a": {"dtype": "Q9", "shape": [4], "data_offsets": [0, 4]}}, b"1234"),            # bad dtype
    _raw({"a": {"dtype": "I8", "shape": [-4], "data_offsets": [0, 4]}}, b"1234"),           # negative dim
    _raw({"a": {"dtype": "I8", "shape": [4], "data_offsets": [4, 0]}}, b"1234"),            # reversed offsets
    _raw({"a": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]},
          "b": {"dtype": "I8", "shape": [2], "data_offsets": [2, 4]}}, b"1234"),             # overlap
    _raw({"a": {"dtype": "I8", "shape": [4]}}, b"1234"),                                    # missing key
    _raw({"__metadata__": {"a": 1}}, b""),                                                  # bad metadata
])
def test_corrupt_safetensors_one_clear_error(tmp_path, blob):
    f = tmp_path / "bad.safetensors"
    f.write_bytes(blob)
    with pytest.raises(MicroFormatError):
        read_safetensors(f)


def test_truncated_file_every_length(tmp_path):
    write_safetensors(tmp_path / "ok.safetensors", _tensors())
    full = (tmp_path / "ok.safetensors").read_bytes()
    for cut in range(0, len(full), 7):
        (tmp_path / "t.safetensors").write_bytes(full[:cut])
        with pytest.raises(MicroFormatError):
            read_safetensors(tmp_path / "t.safetensors")


def test_model_save_load_and_validation(tmp_path):
    m = Sequential.from_description(DESC)
    save_model(m, tmp_path / "m")
    m2 = load_model(tmp_path / "m")
    assert m2.desc == m.desc
    for (n1, p1), (n2, p2) in zip(m.named_params(), m2.named_params()):
        assert n1 == n2 and p1.exp == p2.exp and np.array_equal(p1.acc, p2.acc)

    def corrupt(edit_json=None, tensors=None):
        d = tmp_path / "m"
        doc = json.loads((d / "model.json").read_text())
        if edit_json:
            edit_json(doc)
        save_model(m, d)
        (d / "model.json").write_text(json.dumps(doc))
        if tensors is not None:
            write_safetensors(d / "weights.safetensors", tensors)
        with pytest.raises(MicroFormatError):
            load_model(d)
        save_model(m, d)

    good = {n: p.acc for n, p in m.named_params()}
    corrupt(lambda d: d["params"]["layers.0.weight"].update(exp=10**6))            # insane exponent
    corrupt(lambda d: d["params"]["layers.0.weight"].update(bits=32))              # bit width out of range
    corrupt(lambda d: d.update(weight_bits=4))
    corrupt(lambda d: d["layers"][0].update(kernel_size=99))
    corrupt(lambda d: d["layers"][4].update(in_features=19))                       # shapes do not chain
    corrupt(lambda d: d["layers"].append({"type": "softmax"}))
    corrupt(lambda d: d["params"].pop("layers.4.weight"))
    corrupt(tensors={**good, "layers.0.weight": np.full(good["layers.0.weight"].shape, -32768, np.int16)})  # codes
    corrupt(tensors={**good, "layers.0.weight": good["layers.0.weight"].astype(np.int32)})                 # dtype
    corrupt(tensors={**good, "layers.4.weight": good["layers.4.weight"][:, :5]})                           # shape
    corrupt(tensors={k: v for k, v in good.items() if k != "layers.4.weight"})
    (tmp_path / "m" / "model.json").write_text("{not json")
    with pytest.raises(MicroFormatError):
        load_model(tmp_path / "m")
    with pytest.raises(MicroFormatError):
        load_model(tmp_path / "nowhere")


def test_data_validation(tmp_path):
    x = np.zeros((4, 3), dtype=np.int8)
    y = np.array([0, 1, 2, 1])
    np.savez(tmp_path / "ok.npz", x=x, x_exp=np.int64(-7), y=y)
    xx, e, yy = load_data(tmp_path / "ok.npz", 3)
    assert e == -7 and np.array_equal(yy, y)
    bad = {
        "float_x": dict(x=x.astype(np.float32), x_exp=np.int64(-7), y=y),
        "minus128": dict(x=np.full((4, 3), -128, np.int8), x_exp=np.int64(-7), y=y),
        "exp": dict(x=x, x_exp=np.int64(1000), y=y),
        "labels": dict(x=x, x_exp=np.int64(0), y=np.array([0, 1, 2, 3])),
        "length": dict(x=x, x_exp=np.int64(0), y=y[:3]),
        "missing": dict(x=x, y=y),
        "objects": dict(x=x, x_exp=np.int64(0), y=np.array([0, 1, 2, None], dtype=object)),
    }
    for name, arrs in bad.items():
        np.savez(tmp_path / f"{name}.npz", **arrs)
        with pytest.raises(MicroFormatError):
            load_data(tmp_path / f"{name}.npz", 3)
    full = (tmp_path / "ok.npz").read_bytes()
    (tmp_path / "trunc.npz").write_bytes(full[: len(full) // 2])
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 this is not a zip")
    for name in ("trunc", "junk", "absent"):
        with pytest.raises(MicroFormatError):
            load_data(tmp_path / f"{name}.npz", 3)


def test_npz_lying_array_header_is_rejected_before_allocation(tmp_path):
    # a .npy member whose header claims 2**40 elements but stores 8 bytes
    hdr = "{'descr': '|i1', 'fortran_order': False, 'shape': (1099511627776,), }"
    hdr += " " * (-(10 + len(hdr) + 1) % 64) + "\n"
    npy = b"\x93NUMPY\x01\x00" + len(hdr).to_bytes(2, "little") + hdr.encode() + b"\x00" * 8
    with zipfile.ZipFile(tmp_path / "lie.npz", "w") as z:
        z.writestr("x.npy", npy)
    with pytest.raises(MicroFormatError, match="claims more data"):
        read_npz(tmp_path / "lie.npz")


def test_description_rejects_unknown_keys_and_wrong_num_classes(tmp_path):
    with pytest.raises(MicroFormatError, match="unknown keys"):
        Sequential.from_description({**DESC, "params": {}})
    with pytest.raises(MicroFormatError, match="num_classes"):
        Sequential.from_description({**DESC, "num_classes": 4})
    assert Sequential.from_description({**DESC, "num_classes": 3}).desc["num_classes"] == 3
    for bad in ({**DESC, "input_shape": [0]}, {**DESC, "layers": []}, {**DESC, "seed": -1},
                {**DESC, "rounding": {"forward": "up"}}, [1, 2], {**DESC, "format": "other/9"}):
        with pytest.raises(MicroFormatError):
            Sequential.from_description(bad)
