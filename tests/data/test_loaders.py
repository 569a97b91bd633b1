"""Official file formats: MNIST idx (plain and .gz), CIFAR-10 binary batches, image folders.

Fixtures are tiny files written here in the official layouts.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from inttrain.data import DataError, load_dataset


def _idx(path: Path, arr: np.ndarray, gz: bool = False) -> None:
    header = struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    if gz:
        with gzip.open(path.with_name(path.name + ".gz"), "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def _mnist_folder(root: Path, n: int = 30, gz: bool = False, test: bool = True) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    y = np.arange(n) % 10
    _idx(root / "train-images-idx3-ubyte", x, gz)
    _idx(root / "train-labels-idx1-ubyte", y, gz)
    if test:
        _idx(root / "t10k-images-idx3-ubyte", x[:10], gz)
        _idx(root / "t10k-labels-idx1-ubyte", y[:10], gz)
    return x, y


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_idx_folder(tmp_path: Path, gz: bool, name: str) -> None:
    x, y = _mnist_folder(tmp_path, gz=gz)
    s = load_dataset(name, tmp_path)
    assert (len(s.train), len(s.val), s.num_classes, s.in_channels, s.image_size) == (30, 10, 10, 1, 28)
    assert s.val_source == "test split"
    assert s.train.tensors[1].tolist() == y.tolist()
    # Standardised with train statistics: pixel order preserved.
    img = s.train.tensors[0][3, 0].numpy() * s.std[0] + s.mean[0]
    np.testing.assert_allclose(img, x[3] / 255.0, atol=1e-5)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b"\x00\x00\x08\x01" + b[4:], r"train-images-idx3-ubyte: magic: 0x00000801; expected 0x00000803"),
        (lambda b: b[:-5], r"train-images-idx3-ubyte: length: .* \(truncated\)"),
        (lambda b: b + b"xx", r"train-images-idx3-ubyte: length: .* \(trailing bytes\)"),
        (lambda b: b[:10], r"train-images-idx3-ubyte: header: truncated"),
        (lambda b: b[:8] + struct.pack(">II", 27, 28) + b[16:], r"dims: images are 27x28; expected 28x28"),
    ],
)
def test_idx_validation(tmp_path: Path, damage, message: str) -> None:
    _mnist_folder(tmp_path)
    p = tmp_path / "train-images-idx3-ubyte"
    p.write_bytes(damage(p.read_bytes()))
    with pytest.raises(DataError, match=message):
        load_dataset("mnist", tmp_path)


def test_idx_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no mnist data; expected train-images-idx3-ubyte\[\.gz\]"):
        load_dataset("mnist", tmp_path)
    _mnist_folder(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\[\.gz\]: file not found"):
        load_dataset("mnist", tmp_path)
    (tmp_path / "train-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte\[\.gz\]: file not found"):
        load_dataset("mnist", tmp_path)


def _cifar_batch(path: Path, labels: list[int], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    planes = rng.integers(0, 256, (len(labels), 3, 32, 32), dtype=np.uint8)
    records = np.concatenate([np.array(labels, np.uint8)[:, None], planes.reshape(len(labels), -1)], axis=1)
    path.write_bytes(records.tobytes())
    return planes


def test_cifar_binary(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    planes = _cifar_batch(folder / "data_batch_1.bin", list(range(10)))
    _cifar_batch(folder / "data_batch_2.bin", [1, 2, 3], seed=1)
    _cifar_batch(folder / "test_batch.bin", [4, 5], seed=2)
    s = load_dataset("cifar10", tmp_path)  # the parent of cifar-10-batches-bin works too
    assert (len(s.train), len(s.val), s.in_channels, s.image_size) == (13, 2, 3, 32)
    assert s.train.tensors[1].tolist() == [*range(10), 1, 2, 3]
    red = s.train.tensors[0][0, 0].numpy() * s.std[0] + s.mean[0]
    np.testing.assert_allclose(red, planes[0, 0] / 255.0, atol=1e-5)


def test_cifar_binary_validation(tmp_path: Path) -> None:
    _cifar_batch(tmp_path / "data_batch_1.bin", [0, 1])
    p = tmp_path / "data_batch_1.bin"
    p.write_bytes(p.read_bytes()[:-1])
    with pytest.raises(DataError, match=r"data_batch_1\.bin: length: 6145 bytes is not a positive multiple of the 3073-byte record"):
        load_dataset("cifar10", tmp_path)
    _cifar_batch(p, [0, 12])
    with pytest.raises(DataError, match=r"data_batch_1\.bin: record 1: label 12 out of range \[0, 10\)"):
        load_dataset("cifar10", tmp_path)


def _png_folder(root: Path, classes: dict[str, int], size: int = 6, mode: str = "L") -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, count in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            shape = (size, size) if mode == "L" else (size, size, 3)
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(root / name / f"{i}.png")


def test_image_folder(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    _png_folder(tmp_path, {"cat": 4, "dog": 6})
    s = load_dataset("folder", tmp_path)
    assert (s.num_classes, s.in_channels, s.image_size, len(s.train) + len(s.val)) == (2, 1, 6, 10)
    rgb = tmp_path / "rgb"
    _png_folder(rgb / "train", {"a": 3, "b": 3}, mode="RGB")
    _png_folder(rgb / "val", {"a": 1, "b": 1}, mode="RGB")
    s = load_dataset("folder", rgb)
    assert (len(s.train), len(s.val), s.in_channels, s.val_source) == (6, 2, 3, "test split")


def test_image_folder_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("PIL")
    from PIL import Image

    _png_folder(tmp_path, {"a": 2, "b": 2})
    Image.fromarray(np.zeros((5, 5), np.uint8)).save(tmp_path / "b" / "odd.png")
    with pytest.raises(DataError, match=r"odd\.png: image: size 5x5; expected 6x6"):
        load_dataset("folder", tmp_path)
    (tmp_path / "b" / "bad.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"bad\.png: image: cannot read"):
        load_dataset("folder", tmp_path)
    monkeypatch.setitem(__import__("sys").modules, "PIL", None)
    with pytest.raises(DataError, match=r"pip install pillow"):
        load_dataset("folder", tmp_path)
