"""NumPy-only file formats: a minimal safetensors reader/writer and a validated .npz reader.

safetensors layout: 8-byte little-endian unsigned header length N, N bytes of UTF-8 JSON
{name: {"dtype": "I8", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the raw little-endian tensor bytes; offsets are relative to the end of the header. Everything
read is validated before any allocation that depends on it: every failure is one MicroFormatError.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from pathlib import Path

import numpy as np

from .errors import MicroFormatError

DTYPES = {"I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "U8": np.uint8,
          "F32": np.float32, "F64": np.float64}
NAMES = {np.dtype(v).str.lstrip("<|"): k for k, v in DTYPES.items()}
MAX_HEADER = 16 << 20          # no model of this engine needs a bigger JSON header
MAX_NDIM = 8
MAX_DATA_BYTES = 2 << 30       # cap on one data array read from .npz


def _code(dtype: np.dtype) -> str:
    key = np.dtype(dtype).str.lstrip("<|")
    if key not in NAMES:
        raise ValueError(f"dtype {dtype} is not supported by this safetensors writer")
    return NAMES[key]


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> None:
    """Write tensors (sorted by name, contiguous little-endian) in the safetensors format."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs, offset = [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _code(arr.dtype), "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)                       # pad so the data starts 8-byte aligned
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read and validate a safetensors file -> (tensors, metadata)."""
    where = str(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise MicroFormatError(f"{where}: truncated (no 8-byte header length)")
            n = int.from_bytes(head, "little")
            if n > size - 8 or n > MAX_HEADER:
                raise MicroFormatError(f"{where}: header length {n} exceeds the file ({size} bytes) or the {MAX_HEADER}-byte cap")
            raw = f.read(n)
            data_len = size - 8 - n
            data = f.read(data_len)
    except OSError as e:
        raise MicroFormatError(f"{where}: cannot read ({e.strerror or e})") from None
    if len(raw) != n or len(data) != data_len:
        raise MicroFormatError(f"{where}: file changed size while reading")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise MicroFormatError(f"{where}: header is not valid UTF-8 JSON ({e})") from None
    if not isinstance(header, dict):
        raise MicroFormatError(f"{where}: header is not a JSON object")
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise MicroFormatError(f"{where}: __metadata__ must map strings to strings")
    out: dict[str, np.ndarray] = {}
    spans = []
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise MicroFormatError(f"{where}: tensor {name!r}: entry must have exactly dtype, shape, data_offsets")
        dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dt not in DTYPES:
            raise MicroFormatError(f"{where}: tensor {name!r}: unsupported dtype {dt!r}")
        if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(_is_int(d) and d >= 0 for d in shape):
            raise MicroFormatError(f"{where}: tensor {name!r}: bad shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs)
                or not 0 <= offs[0] <= offs[1] <= data_len):
            raise MicroFormatError(f"{where}: tensor {name!r}: data_offsets {offs!r} out of bounds (data is {data_len} bytes)")
        itemsize = np.dtype(DTYPES[dt]).itemsize
        count = 1
        for d in shape:
            count *= d                                   # Python int: no overflow
        if count * itemsize != offs[1] - offs[0]:
            raise MicroFormatError(f"{where}: tensor {name!r}: shape {shape} x {dt} needs {count * itemsize} bytes, offsets give {offs[1] - offs[0]}")
        spans.append((offs[0], offs[1], name))
        arr = np.frombuffer(data, dtype=np.dtype(DTYPES[dt]).newbyteorder("<"), count=count, offset=offs[0])
        out[name] = arr.astype(DTYPES[dt]).reshape(shape)
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise MicroFormatError(f"{where}: tensors {n0!r} and {n1!r} overlap")
    end = 0
    for b, e, name in spans:                             # the data must be indexed entirely, without holes
        if b != end:
            raise MicroFormatError(f"{where}: bytes {end}..{b} of the data belong to no tensor (before {name!r})")
        end = e
    if end != data_len:
        raise MicroFormatError(f"{where}: the last {data_len - end} bytes of the data belong to no tensor")
    return out, meta


def read_json(path: str | os.PathLike, max_bytes: int = 1 << 20) -> dict:
    """A JSON object from a file of at most ``max_bytes``."""
    where = str(path)
    try:
        if os.path.getsize(path) > max_bytes:
            raise MicroFormatError(f"{where}: larger than {max_bytes} bytes")
        with open(path, "rb") as f:
            obj = json.loads(f.read().decode("utf-8"))
    except OSError as e:
        raise MicroFormatError(f"{where}: cannot read ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise MicroFormatError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise MicroFormatError(f"{where}: must hold a JSON object")
    return obj


def read_npz(path: str | os.PathLike, max_bytes: int = MAX_DATA_BYTES) -> dict[str, np.ndarray]:
    """Arrays of an .npz, headers checked against the archive before ``np.load(allow_pickle=False)``.

    Each member's .npy header must describe a non-object array whose byte size is at most the
    member's uncompressed size in the zip directory and at most ``max_bytes``.
    """
    where = str(path)
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if info.file_size > max_bytes:
                    raise MicroFormatError(f"{where}: member {info.filename!r} is {info.file_size} bytes (cap {max_bytes})")
                with z.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                    if reader is None:
                        raise MicroFormatError(f"{where}: member {info.filename!r}: unsupported .npy version {version}")
                    shape, _, dtype = reader(f)
                    if dtype.hasobject:
                        raise MicroFormatError(f"{where}: member {info.filename!r} holds Python objects")
                    count = 1
                    for d in shape:
                        count *= int(d)
                    if count * dtype.itemsize > info.file_size:
                        raise MicroFormatError(f"{where}: member {info.filename!r} header claims more data than stored")
            with np.load(path, allow_pickle=False) as npz:
                return {k: npz[k] for k in npz.files}
    except MicroFormatError:
        raise
    except FileNotFoundError:
        raise MicroFormatError(f"{where}: no such file") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, zlib.error,
            NotImplementedError) as e:  # zlib/NotImplemented: corrupt or unsupported compression of a member
        raise MicroFormatError(f"{where}: not a valid .npz ({type(e).__name__}: {e})") from None
