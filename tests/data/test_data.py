"""Dataset loading (offline) and every validation rule's error message."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from inttrain.data import DATASET_NAMES, DataError, load_dataset


def _write(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def _mnist_like(n: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8), rng.integers(0, 10, size=n)


def test_digits_offline_shapes() -> None:
    s = load_dataset("digits")
    assert (s.name, s.num_classes, s.in_channels, s.image_size) == ("digits", 10, 1, 8)
    assert len(s.train) + len(s.val) == 1797
    assert len(s.val) == round(1797 * 0.2)
    x, y = s.train.tensors
    assert x.shape == (len(s.train), 1, 8, 8) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and int(y.min()) == 0 and int(y.max()) == 9
    # Standardised with training statistics.
    assert abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1) < 1e-2


def test_split_is_seeded() -> None:
    a, b, c = load_dataset("digits", seed=1), load_dataset("digits", seed=1), load_dataset("digits", seed=2)
    assert torch.equal(a.val.tensors[1], b.val.tensors[1])
    assert not torch.equal(a.val.tensors[1], c.val.tensors[1])


def test_synthetic_seeded() -> None:
    a, b = load_dataset("synthetic", seed=3), load_dataset("synthetic", seed=3)
    assert torch.equal(a.train.tensors[0], b.train.tensors[0])
    assert a.num_classes == 10 and a.train.tensors[0].shape[1:] == (1, 8, 8)


def test_npz_xy_uint8_nhwc(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(50, 32, 32, 3), dtype=np.uint8)
    y = np.arange(50) % 10
    s = load_dataset("npz", _write(tmp_path / "c.npz", x=x, y=y), val_fraction=0.2)
    assert (s.in_channels, s.image_size, s.num_classes) == (3, 32, 10)
    assert s.train.tensors[0].shape == (40, 3, 32, 32) and len(s.val) == 10


def test_npz_float_nchw_with_test_split(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    p = _write(
        tmp_path / "f.npz",
        x_train=rng.normal(size=(30, 1, 8, 8)).astype(np.float32), y_train=np.arange(30) % 3,
        x_test=rng.normal(size=(6, 1, 8, 8)).astype(np.float32), y_test=np.arange(6) % 3,
    )
    s = load_dataset("npz", p)
    assert len(s.train) == 30 and len(s.val) == 6 and s.num_classes == 3
    assert s.val_source == "test split"


def test_mnist_and_cifar_aliases(tmp_path: Path) -> None:
    x, y = _mnist_like()
    _write(tmp_path / "mnist.npz", x_train=x, y_train=y, x_test=x[:8], y_test=y[:8])
    s = load_dataset("mnist", tmp_path)  # a folder holding mnist.npz works too
    assert (s.in_channels, s.image_size, s.num_classes) == (1, 28, 10)
    with pytest.raises(DataError, match=r"mnist\.npz: x_train: .*expected 3 channel\(s\) of 32x32"):
        load_dataset("cifar10", tmp_path / "mnist.npz")


def test_unknown_dataset_lists_names() -> None:
    with pytest.raises(ValueError) as exc:
        load_dataset("imagenet")
    assert "imagenet" in str(exc.value) and all(n in str(exc.value) for n in DATASET_NAMES)


def test_data_error_is_value_error() -> None:
    assert issubclass(DataError, ValueError)


@pytest.mark.parametrize(
    ("arrays", "pattern"),
    [
        # label range vs class count, with file, array and index
        ({"x": "ok", "y": np.array([0, 1, 2, -1, 3, 4, 5, 6, 7, 8])}, r"bad\.npz: y_train\[3\]: label -1 out of range \[0, 9\)"),
        ({"x_train": "ok", "y_train": np.arange(10) % 5, "x_test": "ok", "y_test": np.array([0, 1, 7, 0, 0, 0, 0, 0, 0, 0])},
         r"bad\.npz: y_test\[2\]: label 7 out of range \[0, 5\) \(num_classes=5 inferred"),
        ({"x": "ok", "y": np.arange(10), "num_classes": np.array(4)}, r"bad\.npz: y_train\[4\]: label 4 out of range \[0, 4\) \(num_classes=4\)"),
        # NaN, with the sample index
        ({"x": "nan5", "y": np.arange(10)}, r"bad\.npz: x_train\[5\]: contains NaN or Inf"),
        # empty set
        ({"x": np.zeros((0, 8, 8), np.float32), "y": np.zeros(0, np.int64)}, r"bad\.npz: x_train: empty: 0 samples"),
        # dtypes
        ({"x": np.zeros((10, 8, 8), np.int32), "y": np.arange(10)}, r"x_train: dtype int32 not supported"),
        ({"x": "ok", "y": np.arange(10).astype(np.float32)}, r"y_train: dtype float32: labels must be integers"),
        # shapes
        ({"x": np.zeros((10, 64), np.float32), "y": np.arange(10)}, r"x_train: shape \(10, 64\) has 2 dims"),
        ({"x": np.zeros((10, 8, 6), np.float32), "y": np.arange(10)}, r"images must be square.*8x6"),
        ({"x": np.zeros((10, 5, 8, 8), np.float32), "y": np.arange(10)}, r"5 channels in NCHW layout"),
        ({"x": "ok", "y": np.arange(9)}, r"y_train: 9 labels for 10 images"),
        ({"x": "ok", "y": np.arange(10).reshape(10, 1)}, r"y_train: shape \(10, 1\): labels must be 1-D"),
        ({"x_train": "ok", "y_train": np.arange(10), "x_test": np.zeros((2, 4, 4), np.float32), "y_test": np.arange(2)},
         r"x_test: shape \(2, 4, 4\) .* does not match"),
        # keys
        ({"images": "ok", "labels": np.arange(10)}, r"bad\.npz: arrays: found \['images', 'labels'\]; expected x,y"),
    ],
)
def test_validation_errors(tmp_path: Path, arrays: dict, pattern: str) -> None:
    ok = np.random.default_rng(0).normal(size=(10, 8, 8)).astype(np.float32)
    nan5 = ok.copy()
    nan5[5, 3, 3] = np.nan
    resolved = {k: {"ok": ok, "nan5": nan5}[v] if isinstance(v, str) else v for k, v in arrays.items()}
    with pytest.raises(DataError, match=pattern):
        load_dataset("npz", _write(tmp_path / "bad.npz", **resolved))


def test_missing_file_and_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.npz: data_dir: file not found"):
        load_dataset("npz", tmp_path / "nope.npz")
    with pytest.raises(DataError, match=r"mnist: data_dir: required"):
        load_dataset("mnist")


def test_not_an_npz(tmp_path: Path) -> None:
    p = tmp_path / "junk.npz"
    p.write_text("hello")
    with pytest.raises(DataError, match=r"junk\.npz: file: not a readable \.npz"):
        load_dataset("npz", p)
    np.save(tmp_path / "arr.npy", np.zeros(3))
    with pytest.raises(DataError, match=r"single \.npy array"):
        load_dataset("npz", tmp_path / "arr.npy")


def test_pickled_arrays_refused(tmp_path: Path) -> None:
    p = _write(tmp_path / "obj.npz", x=np.array([object()] * 3, dtype=object), y=np.arange(3))
    with pytest.raises(DataError, match=r"obj\.npz: x: holds Python objects \(dtype object\); allowed: numeric arrays"):
        load_dataset("npz", p)


def test_val_fraction_rules(tmp_path: Path) -> None:
    p = _write(tmp_path / "t.npz", x=np.zeros((3, 8, 8), np.float32), y=np.arange(3))
    with pytest.raises(DataError, match=r"val_fraction=0.1 of 3 samples leaves an empty val split"):
        load_dataset("npz", p, val_fraction=0.1)
    with pytest.raises(DataError, match=r"val_fraction: 1.5 must be strictly between 0 and 1"):
        load_dataset("npz", p, val_fraction=1.5)
