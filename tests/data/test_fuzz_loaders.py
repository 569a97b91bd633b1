"""Fuzz (issue 15): generated malformed files fed to every loader and to the config parser.

Each must either load or raise a member of the :class:`InttrainError` family -- never another exception --
and the whole run must allocate little (tracemalloc peak; NumPy reports its buffers to it). The corpus is
generated here from valid files by truncation, byte flips, rewritten headers and random bytes; nothing
binary is committed.
"""

from __future__ import annotations

import gzip
import io
import struct
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inttrain.data import Limits, load_dataset
from inttrain.spec.errors import InttrainError

LIMITS = Limits(memory_bytes=64 << 20)  # hostile sizes show up as LimitError long before 64 MiB
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
                database=None)
PEAK = 300 << 20


def refused_or_loaded(call) -> None:
    """``call()`` succeeds or raises an InttrainError (anything else fails the test), allocating < PEAK."""
    tracemalloc.start()
    try:
        call()
    except InttrainError:
        pass  # refused in one line: fine
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < PEAK, f"allocated {peak / 2**20:.0f} MiB"


def _load(name: str, path: Path, **kw) -> None:
    refused_or_loaded(lambda: load_dataset(name, path, limits=LIMITS, **kw))


def mutate(data: bytes, draw) -> bytes:
    """One of: truncate, flip bytes, splice random bytes, or keep."""
    kind = draw(st.sampled_from(["truncate", "flip", "splice", "keep"]))
    if kind == "truncate" and data:
        return data[: draw(st.integers(0, len(data) - 1))]
    if kind == "flip" and data:
        b = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(b) - 1))
            b[i] = draw(st.integers(0, 255))
        return bytes(b)
    if kind == "splice":
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.binary(max_size=64)) + data[at:]
    return data


def _header(shape: tuple, descr: str) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


SHAPES = st.lists(st.sampled_from([0, 1, 3, 8, 28, 2**31 - 1, 2**40, 10**6]), min_size=0, max_size=5).map(tuple)
DESCRS = st.sampled_from(["|u1", "<f4", ">f8", "<i8", "<u8", "|b1", "|O", "<c8", "|V12", "<U3"])


@st.composite
def npz_files(draw) -> bytes:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 12))
    arrays = {"x": rng.integers(0, 255, (n, 4, 4), dtype=np.uint8), "y": rng.integers(0, 3, n)}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))) as z:
        for key, a in arrays.items():
            body = io.BytesIO()
            np.lib.format.write_array(body, a)
            raw = body.getvalue()
            if draw(st.booleans()):  # a lying header in front of the real data
                raw = _header(draw(SHAPES), draw(DESCRS)) + raw[128:]
            z.writestr(f"{key}.npy", raw)
    return mutate(buf.getvalue(), draw)


@given(data=npz_files())
@FUZZ
def test_npz_loader(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "f.npz"
    p.write_bytes(data)
    _load("npz", p)


@st.composite
def idx_files(draw) -> dict[str, bytes]:
    n = draw(st.integers(0, 5))
    images = struct.pack(">HBB", 0, 8, 3) + struct.pack(">3I", n, 28, 28) + bytes(n * 784)
    labels = struct.pack(">HBB", 0, 8, 1) + struct.pack(">I", n) + bytes(n)
    if draw(st.booleans()):  # rewrite the dims
        dims = draw(st.lists(st.sampled_from([0, 1, 28, 60000, 2**32 - 1]), min_size=3, max_size=3))
        images = images[:4] + struct.pack(">3I", *dims) + images[16:]
    files = {}
    for name, data in (("train-images-idx3-ubyte", images), ("train-labels-idx1-ubyte", labels)):
        if draw(st.booleans()):  # gzipped: mutate the plain bytes or the compressed stream
            files[name + ".gz"] = mutate(gzip.compress(mutate(data, draw)), draw)
        else:
            files[name] = mutate(data, draw)
    return files


@given(files=idx_files())
@FUZZ
def test_idx_loader(tmp_path: Path, files: dict[str, bytes]) -> None:
    d = tmp_path / "mnist"
    d.mkdir(exist_ok=True)
    for p in d.iterdir():
        p.unlink()
    for name, data in files.items():
        (d / name).write_bytes(data)
    _load("mnist", d)


def _png(width: int, height: int, pixels: bytes) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(pixels))
            + chunk(b"IEND", b""))


@st.composite
def png_files(draw) -> bytes:
    side = draw(st.sampled_from([1, 4, 9000, 100_000, 2**31 - 1]))
    good = side <= 4
    pixels = bytes((side + 1) * side) if good else bytes(16)
    return mutate(_png(side, side, pixels), draw)


@given(a=png_files(), b=png_files())
@FUZZ
def test_folder_loader(tmp_path: Path, a: bytes, b: bytes) -> None:
    root = tmp_path / "imgs"
    for cls, data in (("a", a), ("b", b)):
        (root / cls).mkdir(parents=True, exist_ok=True)
        (root / cls / "0.png").write_bytes(data)
        (root / cls / "1.png").write_bytes(data)
    _load("folder", root, val_fraction=0.5)


@given(data=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass"))))
@FUZZ
def test_text_loader(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "t.txt"
    p.write_bytes(data)
    _load("text", p, seq_len=8)


# ----------------------------------------------------------------------------- config parser

KEYS = st.sampled_from(["batch_size", "epochs", "lr", "model", "seed", "val_fraction", "seq_len", "dataflow",
                        "max_memory_gb", "bogus", "d_model"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=20))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                      max_leaves=10)


@st.composite
def yaml_texts(draw) -> bytes:
    import yaml

    kind = draw(st.sampled_from(["mapping", "raw", "deep", "alias"]))
    if kind == "mapping":
        text = yaml.safe_dump(draw(st.dictionaries(KEYS, VALUES, max_size=5)))
    elif kind == "deep":
        text = "a: " + "[" * draw(st.integers(1, 3000)) + "]" * draw(st.integers(0, 3000))
    elif kind == "alias":
        text = "a: &x [1, 2]\nb: [*x, *x, *x]\n"
    else:
        text = draw(st.text(max_size=200))
    return mutate(text.encode("utf-8", "surrogatepass"), draw)


@given(data=yaml_texts())
@FUZZ
def test_config_parser(tmp_path: Path, data: bytes) -> None:
    from inttrain.cli.config import RunConfig, load_yaml_config

    import dataclasses

    p = tmp_path / "c.yaml"
    p.write_bytes(data)
    # whatever parses is typed: the dataclass takes it
    refused_or_loaded(lambda: dataclasses.replace(RunConfig(), **load_yaml_config(p)))


@given(items=st.lists(st.tuples(KEYS, st.text(max_size=30)).map(lambda kv: f"{kv[0]}={kv[1]}") | st.text(max_size=30),
                      max_size=4))
@FUZZ
def test_set_parser(items: list[str]) -> None:
    from inttrain.cli.config import parse_sets

    refused_or_loaded(lambda: parse_sets(items))


# ----------------------------------------------------------------------------- micro engine and checkpoints


@given(data=npz_files())
@FUZZ
def test_micro_npz_reader(tmp_path: Path, data: bytes) -> None:
    from inttrain.micro import load_data

    p = tmp_path / "d.npz"
    p.write_bytes(data)
    refused_or_loaded(lambda: load_data(p, 3))


MICRO_BASE = {"input_shape": [1, 6, 6], "weight_bits": 8, "rounding": {"forward": "rne"}, "seed": 1, "layers": [
    {"type": "conv2d", "in_channels": 1, "out_channels": 2, "kernel_size": 3, "padding": 1},
    {"type": "batchnorm", "num_features": 2}, {"type": "relu"}, {"type": "maxpool2d", "kernel_size": 2},
    {"type": "residual", "layers": [{"type": "relu"}], "shortcut": []},
    {"type": "flatten"}, {"type": "linear", "in_features": 18, "out_features": 3}]}
TOP_KEYS = st.sampled_from(["input_shape", "layers", "rounding", "weight_bits", "seed", "format", "num_classes", "x"])
LAYER_KEYS = st.sampled_from(["type", "in_features", "out_features", "kernel_size", "in_channels", "out_channels",
                              "shortcut", "layers", "padding", "stride", "num_features"])
EDITS = st.one_of(st.tuples(st.just(-1), TOP_KEYS, VALUES), st.tuples(st.integers(0, 6), LAYER_KEYS, VALUES))


@given(edits=st.lists(EDITS, min_size=1, max_size=3))
@settings(FUZZ, max_examples=300)
def test_micro_descriptions(edits) -> None:
    """A valid description with one to three fields replaced by values of any JSON type."""
    import copy

    from inttrain.micro.model import validate_description

    desc = copy.deepcopy(MICRO_BASE)
    for where, key, value in sorted(edits, key=lambda e: -e[0]):  # layers first: "layers" itself may be replaced
        target = desc if where < 0 else desc["layers"][where]
        target[key] = value
    refused_or_loaded(lambda: validate_description(desc))


@given(data=st.data())
@FUZZ
def test_checkpoint_loader(tmp_path: Path, data) -> None:
    import torch

    from inttrain.trainer import load_checkpoint, save_checkpoint

    w, s = save_checkpoint(tmp_path / "ck", "last", {"w": torch.arange(6.0)}, {"train_state": {"step": 1}})
    target = data.draw(st.sampled_from([w, s]))
    target.write_bytes(mutate(target.read_bytes(), data.draw))
    refused_or_loaded(lambda: load_checkpoint(w))


@st.composite
def cifar_py_batches(draw) -> bytes:
    import pickle

    n = draw(st.integers(1, 4))
    batch = {b"data": np.zeros((n, 3072), np.uint8), b"labels": list(range(n))}
    if draw(st.booleans()):
        batch[draw(st.sampled_from([b"data", b"labels", "data"]))] = draw(VALUES)
    return mutate(pickle.dumps(batch, protocol=draw(st.integers(2, 5))), draw)


@given(train=cifar_py_batches(), test=cifar_py_batches())
@FUZZ
def test_cifar_python_batches(tmp_path: Path, train: bytes, test: bytes) -> None:
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir(exist_ok=True)
    (d / "data_batch_1").write_bytes(train)
    (d / "test_batch").write_bytes(test)
    _load("cifar10", tmp_path)
