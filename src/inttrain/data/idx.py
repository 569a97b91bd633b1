"""The idx file format of MNIST / Fashion-MNIST (``train-images-idx3-ubyte[.gz]`` and friends).

Header: two zero bytes, a type byte (0x08 = uint8), a dimension count, then one
big-endian uint32 per dimension; the data follows. Every field is checked
against the file's real length, so a truncated download fails here with the
file name instead of as a reshape error later.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from .arrays import RawArrays
from .errors import DataError

__all__ = ["IDX_FILES", "find_idx_files", "read_idx", "load_idx_arrays"]

# role -> base name (".gz" optional)
IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
_UBYTE = 0x08


def find_idx_files(folder: Path) -> dict[str, Path]:
    """The idx files present in ``folder`` (plain or gzipped), by role."""
    found = {}
    for role, base in IDX_FILES.items():
        for name in (base, base + ".gz"):
            if (folder / name).is_file():
                found[role] = folder / name
                break
    return found


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"{path.name}: file: cannot read ({e})") from None


def read_idx(path: Path, ndim: int, image_size: int | None = None) -> np.ndarray:
    """A uint8 idx array of ``ndim`` dims (3: images, 1: labels), validated."""
    data = _read_bytes(path)
    if len(data) < 4:
        raise DataError(f"{path.name}: header: {len(data)} bytes; an idx file starts with a 4-byte magic number")
    zero, dtype, dims = struct.unpack(">HBB", data[:4])
    expected_magic = (_UBYTE << 8) | ndim
    if zero != 0 or dtype != _UBYTE or dims != ndim:
        raise DataError(
            f"{path.name}: magic: 0x{int.from_bytes(data[:4], 'big'):08x}; expected 0x{expected_magic:08x} "
            f"(uint8, {ndim} dims)"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path.name}: header: truncated ({len(data)} bytes, {header} needed for {ndim} dims)")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    if image_size is not None and shape[1:] != (image_size, image_size):
        raise DataError(f"{path.name}: dims: images are {shape[1]}x{shape[2]}; expected {image_size}x{image_size}")
    want = header + int(np.prod(shape))
    if len(data) != want:
        raise DataError(
            f"{path.name}: length: {len(data)} bytes; dims {list(shape)} need {want} "
            f"({'truncated' if len(data) < want else 'trailing bytes'})"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def load_idx_arrays(folder: Path, dataset: str, image_size: int = 28) -> RawArrays:
    """Train (+ test, if both test files exist) arrays from the idx files in ``folder``."""
    found = find_idx_files(folder)
    for role in ("x_train", "y_train"):
        if role not in found:
            raise DataError(f"{folder}: {IDX_FILES[role]}[.gz]: file not found ({dataset} idx files expected here)")
    if ("x_test" in found) != ("y_test" in found):
        missing = "x_test" if "x_test" not in found else "y_test"
        raise DataError(f"{folder}: {IDX_FILES[missing]}[.gz]: file not found (test images and labels go together)")
    x = read_idx(found["x_train"], 3, image_size)
    y = read_idx(found["y_train"], 1).astype(np.int64)
    x_test = read_idx(found["x_test"], 3, image_size) if "x_test" in found else None
    y_test = read_idx(found["y_test"], 1).astype(np.int64) if "y_test" in found else None
    return RawArrays(f"{dataset} idx ({folder})", x, y, x_test, y_test, num_classes=10)
