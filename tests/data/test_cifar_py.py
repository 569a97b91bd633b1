"""CIFAR-10 python version: official-format pickles load; anything naming another global is refused unexecuted."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest

from inttrain.data import DataError, load_dataset
from inttrain.data.safe_pickle import NumpyOnlyUnpickler


def _py_batch(path: Path, labels: list[int], seed: int = 0) -> np.ndarray:
    """A batch in the official layout: dict of bytes keys; data uint8 (N, 3072) as RGB planes."""
    rng = np.random.default_rng(seed)
    planes = rng.integers(0, 256, (len(labels), 3, 32, 32), dtype=np.uint8)
    batch = {
        b"batch_label": b"training batch 1 of 5",
        b"labels": labels,
        b"data": planes.reshape(len(labels), 3072),
        b"filenames": [f"img_{i}.png".encode() for i in range(len(labels))],
    }
    # Protocol 4: arrays go through numpy's _reconstruct/ndarray/dtype globals, as in the official files.
    path.write_bytes(pickle.dumps(batch, protocol=4))
    return planes


def test_python_version_loads(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    planes = _py_batch(folder / "data_batch_1", list(range(10)))
    _py_batch(folder / "data_batch_2", [1, 2, 3], seed=1)
    _py_batch(folder / "test_batch", [4, 5], seed=2)
    (folder / "batches.meta").write_bytes(b"not read")
    s = load_dataset("cifar10", tmp_path)  # the parent of cifar-10-batches-py works too
    assert (len(s.train), len(s.val), s.in_channels, s.image_size) == (13, 2, 3, 32)
    assert s.train.tensors[1].tolist() == [*range(10), 1, 2, 3]
    assert s.val.tensors[1].tolist() == [4, 5] and s.val_source == "test split"
    green = s.train.tensors[0][0, 1].numpy() * s.std[1] + s.mean[1]
    np.testing.assert_allclose(green, planes[0, 1] / 255.0, atol=1e-5)


def test_numpy1_global_names_resolve() -> None:
    # The official files were pickled by numpy 1: numpy.core.multiarray._reconstruct.
    from numpy._core.multiarray import _reconstruct

    assert NumpyOnlyUnpickler(io.BytesIO(b"")).find_class("numpy.core.multiarray", "_reconstruct") is _reconstruct


class _Exec:
    def __reduce__(self):  # what a malicious file does: call a builtin on load
        return (eval, ("__import__('pathlib').Path('pwned').touch()",))


@pytest.mark.parametrize(
    ("payload", "refused"),
    [
        (b"cos\nsystem\n(S'touch pwned'\ntR.", "os.system"),  # protocol 0, hand-written
        (pickle.dumps({b"data": _Exec()}, protocol=4), "builtins.eval"),
    ],
)
def test_malicious_pickle_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payload: bytes, refused: str) -> None:
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "data_batch_1").write_bytes(payload)
    with pytest.raises(DataError) as exc:
        load_dataset("cifar10", tmp_path)
    assert str(exc.value).startswith(f"data_batch_1: pickle: refused global '{refused}'; only numpy array data")
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ([1, 2], "data_batch_1: pickle: holds a list; expected the batch dict"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, r"data_batch_1: labels\[1\]: label 10 out of range"),
        ({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, r"data_batch_1: data: uint8 \(2, 100\); expected a uint8 array \(N, 3072\)"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, "data_batch_1: labels: 1 labels for 2 images"),
        ({b"labels": [0]}, "data_batch_1: keys: found"),
    ],
)
def test_bad_batches(tmp_path: Path, obj: object, expected: str) -> None:
    (tmp_path / "data_batch_1").write_bytes(pickle.dumps(obj, protocol=4))
    with pytest.raises(DataError, match=expected):
        load_dataset("cifar10", tmp_path)


def test_truncated_pickle(tmp_path: Path) -> None:
    _py_batch(tmp_path / "data_batch_1", [0, 1])
    p = tmp_path / "data_batch_1"
    p.write_bytes(p.read_bytes()[:-50])
    with pytest.raises(DataError, match="data_batch_1: pickle: not a readable pickle"):
        load_dataset("cifar10", tmp_path)
