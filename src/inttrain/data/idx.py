"""The idx file format of MNIST / Fashion-MNIST (``train-images-idx3-ubyte[.gz]`` and friends).

Header: two zero bytes, a type byte (0x08 = uint8), a dimension count, then one
big-endian uint32 per dimension; the data follows. Every field is checked
against the file's real length, so a truncated download fails here with the
file name instead of as a reshape error later.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from .arrays import RawArrays
from .errors import DataError
from .limits import FLOAT_IMAGE_BYTES, Limits

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


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_idx(path: Path, ndim: int, image_size: int | None = None, limits: Limits | None = None) -> np.ndarray:
    """A uint8 idx array of ``ndim`` dims (3: images, 1: labels), validated.

    The header is read first; the declared size is judged against ``limits`` and then exactly that
    many bytes (+1, to detect trailing data) are read, so a gzip member that expands to gigabytes
    stops after what its header declared.
    """
    limits = limits or Limits()
    header = 4 + 4 * ndim
    try:
        with _open(path) as f:
            head = f.read(header)
            if len(head) < 4:
                raise DataError(f"{path.name}: header: {len(head)} bytes; an idx file starts with a 4-byte magic number")
            zero, dtype, dims = struct.unpack(">HBB", head[:4])
            expected_magic = (_UBYTE << 8) | ndim
            if zero != 0 or dtype != _UBYTE or dims != ndim:
                raise DataError(
                    f"{path.name}: magic: 0x{int.from_bytes(head[:4], 'big'):08x}; expected 0x{expected_magic:08x} "
                    f"(uint8, {ndim} dims)"
                )
            if len(head) < header:
                raise DataError(f"{path.name}: header: truncated ({len(head)} bytes, {header} needed for {ndim} dims)")
            shape = struct.unpack(f">{ndim}I", head[4:header])
            if image_size is not None and shape[1:] != (image_size, image_size):
                raise DataError(f"{path.name}: dims: images are {shape[1]}x{shape[2]}; expected {image_size}x{image_size}")
            count = int(np.prod(shape, dtype=object))
            limits.check_bytes(path.name, f"dims {list(shape)}", count * (1 + FLOAT_IMAGE_BYTES))
            data = f.read(count + 1)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DataError(f"{path.name}: file: cannot read ({type(e).__name__}: {e}); allowed: an idx file, "
                        "plain or gzipped") from None
    if len(data) != count:
        got = f"more than {header + count}" if len(data) > count else str(header + len(data))  # read stops at +1
        raise DataError(
            f"{path.name}: length: {got} bytes; dims {list(shape)} need "
            f"{header + count} ({'truncated' if len(data) < count else 'trailing bytes'})"
        )
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)


def load_idx_arrays(folder: Path, dataset: str, image_size: int = 28, limits: Limits | None = None) -> RawArrays:
    """Train (+ test, if both test files exist) arrays from the idx files in ``folder``."""
    found = find_idx_files(folder)
    for role in ("x_train", "y_train"):
        if role not in found:
            raise DataError(f"{folder}: {IDX_FILES[role]}[.gz]: file not found ({dataset} idx files expected here)")
    if ("x_test" in found) != ("y_test" in found):
        missing = "x_test" if "x_test" not in found else "y_test"
        raise DataError(f"{folder}: {IDX_FILES[missing]}[.gz]: file not found (test images and labels go together)")
    x = read_idx(found["x_train"], 3, image_size, limits)
    y = read_idx(found["y_train"], 1, limits=limits).astype(np.int64)
    x_test = read_idx(found["x_test"], 3, image_size, limits) if "x_test" in found else None
    y_test = read_idx(found["y_test"], 1, limits=limits).astype(np.int64) if "y_test" in found else None
    return RawArrays(f"{dataset} idx ({folder})", x, y, x_test, y_test, num_classes=10)
