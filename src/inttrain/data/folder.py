"""An image folder: one sub-folder per class (``cat/001.png``, ``dog/002.jpg``, ...).

Class ids follow the sorted sub-folder names. With ``train/`` and ``val/`` (or
``test/``) sub-folders those are the two splits; otherwise a seeded fraction is
held out. Images must all be the same square size; they load as grayscale
when every image is, RGB otherwise. Needs Pillow (imported only here).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from .arrays import RawArrays
from inttrain.spec.errors import InttrainError

from .errors import DataError
from .limits import FLOAT_IMAGE_BYTES, Limits

__all__ = ["load_folder_arrays", "IMAGE_SUFFIXES"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise DataError("folder: Pillow: not installed; the folder dataset reads images with it (pip install pillow)") from None
    return Image


def _scan(root: Path, classes: list[str] | None = None) -> tuple[list[str], list[tuple[Path, int]]]:
    found = sorted(p.name for p in root.iterdir() if p.is_dir())
    classes = classes or found
    if not classes:
        raise DataError(f"{root}: classes: no sub-folders; expected one sub-folder of images per class")
    extra = sorted(set(found) - set(classes))
    if extra:
        raise DataError(f"{root}: classes: {extra} not among the training classes {classes}")
    items = []
    for label, name in enumerate(classes):
        files = sorted(p for p in (root / name).glob("*") if p.suffix.lower() in IMAGE_SUFFIXES) if (root / name).is_dir() else []
        items += [(p, label) for p in files]
    if not items:
        raise DataError(f"{root}: images: none found (suffixes {', '.join(IMAGE_SUFFIXES)})")
    return classes, items


class _CappedFile(io.BufferedReader):
    """A file whose ``read(n)`` never asks for more than is left in it.

    Pillow skips the rest of a PNG chunk with ``fp.read(declared_length)``, and Python allocates the full
    ``n`` before reading: a 60-byte PNG declaring a 300 MB chunk made a 300 MB allocation. Capping ``n`` at
    the bytes left bounds every read by the file's real size.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(io.FileIO(path))
        self._size = os.fstat(self.fileno()).st_size

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0:
            n = self._size
        return super().read(min(n, max(0, self._size - self.tell())))


def _load(items: list[tuple[Path, int]], mode: str | None, limits: Limits) -> tuple[np.ndarray, np.ndarray, str]:
    image = _pil()
    pics = []
    pixels = 0
    for path, _ in items:
        try:
            # open() reads only the header: the declared size is judged before any pixel is decoded.
            with _CappedFile(path) as f, image.open(f) as im:
                limits.check_image(str(path), *im.size)
                pixels += im.size[0] * im.size[1]
                limits.check_bytes(str(path), f"{len(pics) + 1} images of up to {im.size[0]}x{im.size[1]} pixels",
                                   pixels * 3 * (1 + FLOAT_IMAGE_BYTES))
                pics.append(im.copy())
        except (OSError, image.DecompressionBombError, ValueError, SyntaxError, EOFError) as e:
            if isinstance(e, InttrainError):  # our own refusal (DataError, LimitError): already worded
                raise
            raise DataError(f"{path}: image: cannot read ({type(e).__name__}: {e}); allowed: an image Pillow reads "
                            f"(suffixes {', '.join(IMAGE_SUFFIXES)})") from None
    if mode is None:
        mode = "L" if all(p.mode in ("L", "1", "I", "I;16") for p in pics) else "RGB"
    size = pics[0].size
    arrays = []
    for (path, _), p in zip(items, pics):
        if p.size != size:
            raise DataError(f"{path}: image: size {p.size[0]}x{p.size[1]}; expected {size[0]}x{size[1]} like {items[0][0].name}")
        arrays.append(np.asarray(p.convert(mode), dtype=np.uint8))
    return np.stack(arrays), np.array([label for _, label in items], dtype=np.int64), mode


def load_folder_arrays(data_dir: str | Path | None, limits: Limits | None = None) -> RawArrays:
    if data_dir is None:
        raise DataError("folder: data_dir: required; point it at a folder with one sub-folder of images per class")
    root = Path(data_dir)
    limits = limits or Limits()
    if not root.is_dir():
        raise DataError(f"{root}: data_dir: not a folder")
    val_dir = next((root / n for n in ("val", "test") if (root / n).is_dir()), None)
    if (root / "train").is_dir() and val_dir is not None:
        classes, train_items = _scan(root / "train")
        _, val_items = _scan(val_dir, classes)
        x, y, mode = _load(train_items, None, limits)
        x_val, y_val, _ = _load(val_items, mode, limits)
        return RawArrays(f"folder {root}", x, y, x_val, y_val, num_classes=len(classes))
    classes, items = _scan(root)
    x, y, _ = _load(items, None, limits)
    return RawArrays(f"folder {root}", x, y, num_classes=len(classes))
