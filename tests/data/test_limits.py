"""Unit checks of :mod:`inttrain.data.limits` and the header-first reads it drives (issue 15)."""

from __future__ import annotations

import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

from inttrain.data import LimitError, Limits, load_dataset
from inttrain.data.text import _min_length
from inttrain.spec.errors import InttrainError


def test_limits_from_config_and_messages() -> None:
    lim = Limits.from_config(max_memory_gb=0.5, max_classes=7, max_image_side=64)
    assert (lim.memory_bytes, lim.max_classes, lim.max_image_side) == (1 << 29, 7, 64)
    assert Limits().memory_bytes > 0 and issubclass(LimitError, InttrainError)
    lim.check_bytes("f", "x", 1 << 29)  # at the limit: allowed
    with pytest.raises(LimitError, match=r"^f: x would need 0.5 GiB, more than the memory limit of 0.5 GiB"):
        lim.check_bytes("f", "x", (1 << 29) + 1)
    with pytest.raises(LimitError, match=r"^y: 8 classes \(o\) exceed the limit of 7; allowed: labels in"):
        lim.check_classes("y", 8, "o")
    with pytest.raises(LimitError, match=r"^p: image of 65x3 pixels; allowed: at most 64x64"):
        lim.check_image("p", 65, 3)


def test_min_text_length_closed_form_equals_the_search() -> None:
    def search(seq_len: int, f: float) -> int:
        n = seq_len + 1
        while not (int(round(n * f)) >= seq_len + 1 and n - int(round(n * f)) >= seq_len + 1):
            n += 1
        return n

    for seq_len in (1, 7, 64, 513):
        for f in (0.01, 0.1, 0.25, 0.5, 0.9, 0.99):
            assert _min_length(seq_len, f) == search(seq_len, f)
    assert _min_length(10**9, 0.1) == 10_000_000_006  # instant; the search took minutes


def _png_with_chunk_length(path: Path, idat_length: int) -> None:
    """A 1x1 gray PNG whose IDAT chunk declares ``idat_length`` bytes but holds ~10."""
    def chunk(kind: bytes, data: bytes, length: int | None = None) -> bytes:
        n = len(data) if length is None else length
        return struct.pack(">I", n) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0\0"), idat_length)
                     + chunk(b"IEND", b""))


def test_png_chunk_declaring_300mb_reads_only_the_file(tmp_path: Path) -> None:
    """Pillow skips a chunk with fp.read(declared length): the capped file keeps that to the real size."""
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        _png_with_chunk_length(tmp_path / cls / "0.png", 300 << 20)
        _png_with_chunk_length(tmp_path / cls / "1.png", 300 << 20)
    tracemalloc.start()
    try:
        load_dataset("folder", tmp_path, val_fraction=0.5)
    except InttrainError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 50 << 20, f"{peak / 2**20:.0f} MiB"


def test_npz_limits_count_the_float_copy(tmp_path: Path) -> None:
    """x of 1 MiB uint8 becomes 8 MiB after loading: a 5 MiB budget refuses it from the headers."""
    np.savez(tmp_path / "d.npz", x=np.zeros((1024, 32, 32), np.uint8), y=np.zeros(1024, np.int64))
    with pytest.raises(LimitError, match=r"d.npz: loading and converting its arrays would need 0.0088 GiB"):
        load_dataset("npz", tmp_path / "d.npz", limits=Limits(memory_bytes=5 << 20))
    assert load_dataset("npz", tmp_path / "d.npz", limits=Limits(memory_bytes=16 << 20)).num_classes == 1


def test_pickle_opcode_declaring_300mb_is_refused_from_the_opcodes(tmp_path: Path) -> None:
    """A CIFAR python batch whose BINUNICODE opcode declares 300 MB in a 30-byte file: refused, not allocated."""
    from inttrain.data import DataError

    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    (d / "data_batch_1").write_bytes(b"\x80\x03}q\x00X" + struct.pack("<I", 300 << 20) + b"data" + b".")
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=r"data_batch_1: pickle: not a readable pickle \(ValueError: expected "
                                            r"314572800 bytes in a unicodestring4, but only 5 remain\)"):
            load_dataset("cifar10", tmp_path)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 50 << 20, f"{peak / 2**20:.0f} MiB"
