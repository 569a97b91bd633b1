"""``python -m inttrain.micro convert``: uint8 images to DATA.npz with the documented rule (docs §9).

Rule: pixel p (uint8, 0..255) -> code min(p >> 1, 127) at x_exp = -7, i.e. value ~ p / 256 in [0, 0.5)
(0..127 codes: the int8 range without -128). Images become (N, C, H, W): (N, H, W) gets C = 1, (N, H, W, C)
with C in {1, 3, 4} and H, W > 4 is read as channels-last and transposed; ``--flatten`` writes (N, C*H*W).

Inputs: an .npz with a uint8 image array ``x`` (or ``images``) and integer labels ``y`` (or ``labels``);
MNIST idx files (an idx3-ubyte image file and an idx1-ubyte label file, optionally .gz); a folder with one
sub-folder of PNG files per class (labels: the sub-folders' sorted names -> 0, 1, ...; stored as ``classes``).
PNGs are read with Pillow when it is installed (it is not a dependency of the device engine).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from .errors import MicroFormatError
from .io import read_npz

RULE = ("Convert uint8 images to DATA.npz: code = min(pixel >> 1, 127) at x_exp = -7 (value ~ pixel / 256); "
        "images become (N, C, H, W) ((N, H, W) gets C = 1; (N, H, W, C) with C in 1/3/4 is transposed).")
X_EXP = -7
MAX_IDX_DIMS = 4


def pixels_to_codes(img: np.ndarray) -> np.ndarray:
    """The documented rule on a uint8 array: min(p >> 1, 127) as int8 (p >> 1 <= 127 always)."""
    return (np.asarray(img, dtype=np.uint8) >> 1).astype(np.int8)


def to_nchw(x: np.ndarray, where: str) -> np.ndarray:
    if x.ndim == 3:
        return x[:, None]
    if x.ndim == 4:
        if x.shape[3] in (1, 3, 4) and x.shape[1] > 4 and x.shape[2] > 4:
            return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        return x
    raise MicroFormatError(f"{where}: images must be (N, H, W), (N, H, W, C) or (N, C, H, W), got shape {x.shape}")


def _from_npz(path: str) -> tuple[np.ndarray, np.ndarray, dict]:
    arrs = read_npz(path)
    xk = next((k for k in ("x", "images") if k in arrs), None)
    yk = next((k for k in ("y", "labels") if k in arrs), None)
    if xk is None or yk is None:
        raise MicroFormatError(f"{path}: needs an image array 'x' (or 'images') and labels 'y' (or 'labels'); "
                               f"has {sorted(arrs)}")
    if arrs[xk].dtype != np.uint8:
        raise MicroFormatError(f"{path}: {xk!r} must be uint8 pixels (0..255), got {arrs[xk].dtype}; DATA.npz files "
                               "(int8 codes) need no conversion")
    return arrs[xk], arrs[yk], {}


def _read_idx(path: str) -> np.ndarray:
    """An idx file (MNIST format): 0x00 0x00 type ndim, big-endian int32 dims, data; uint8 data only."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            head = f.read(4)
            if len(head) != 4 or head[:2] != b"\0\0" or head[2] != 0x08 or not 1 <= head[3] <= MAX_IDX_DIMS:
                raise MicroFormatError(f"{path}: not an idx file of unsigned bytes (magic {head.hex()}, want 000008nn)")
            dims = np.frombuffer(f.read(4 * head[3]), dtype=">u4")
            if len(dims) != head[3]:
                raise MicroFormatError(f"{path}: truncated idx header")
            count = int(np.prod(dims, dtype=np.int64))
            data = f.read(count + 1)
    except OSError as e:
        raise MicroFormatError(f"{path}: cannot read ({e.strerror or e})") from None
    if len(data) != count:
        raise MicroFormatError(f"{path}: holds {len(data)} data bytes, the header's shape {tuple(dims)} needs {count}")
    return np.frombuffer(data, dtype=np.uint8).reshape(tuple(int(d) for d in dims))


def _from_pngs(folder: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    try:
        from PIL import Image
    except ImportError:
        raise MicroFormatError(f"{folder}: reading PNG files needs Pillow (pip install pillow); or convert the "
                               "images to a uint8 .npz elsewhere and run convert on that") from None
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir())
    if not classes:
        raise MicroFormatError(f"{folder}: needs one sub-folder of PNG files per class (e.g. {folder}/0/a.png)")
    imgs, labels, shape = [], [], None
    for label, name in enumerate(classes):
        for f in sorted((folder / name).glob("*.png")):
            with Image.open(f) as im:
                mode = im.mode if im.mode in ("L", "RGB", "RGBA") else ("RGBA" if "A" in im.getbands() else "RGB")
                a = np.asarray(im.convert(mode), dtype=np.uint8)
            if shape is None:
                shape = a.shape
            if a.shape != shape:
                raise MicroFormatError(f"{f}: shape {a.shape} differs from the first image's {shape}; all images "
                                       "must have one size and mode")
            imgs.append(a)
            labels.append(label)
    if not imgs:
        raise MicroFormatError(f"{folder}: its class folders hold no .png files")
    return np.stack(imgs), np.array(labels, dtype=np.int64), {"classes": np.array(classes)}


def convert(source: str, labels: str | None, out: str, flatten: bool = False, force: bool = False) -> str:
    """Write ``out`` (DATA.npz: x int8 codes, x_exp = -7, y int64) from ``source``; returns a one-line summary."""
    src = Path(source)
    if Path(out).exists() and not force:
        raise MicroFormatError(f"--out {out}: already exists; allowed: a new path, or --force to replace it")
    if src.is_dir():
        if labels:
            raise MicroFormatError(f"{labels}: a PNG folder takes its labels from the class folder names")
        x, y, extra = _from_pngs(src)
        kind = "png folder"
    elif str(src).endswith(".npz"):
        if labels:
            raise MicroFormatError(f"{labels}: an .npz source holds its labels ('y')")
        x, y, extra = _from_npz(str(src))
        kind = "npz"
    else:
        if not labels:
            raise MicroFormatError(f"{source}: an idx image file needs its idx1-ubyte label file as LABELS "
                                   "(or give an .npz, or a folder of class folders of PNGs)")
        x, y, extra = _read_idx(str(src)), _read_idx(labels), {}
        kind = "idx"
    if y.ndim != 1 or y.dtype.kind not in "iu" or len(y) != len(x):
        raise MicroFormatError(f"{labels or source}: labels must be integers of shape ({len(x)},), got {y.dtype} {y.shape}")
    if len(y) and int(y.min()) < 0:
        raise MicroFormatError(f"{labels or source}: labels must be >= 0")
    codes = to_nchw(pixels_to_codes(x), source)
    if flatten:
        codes = codes.reshape(len(codes), -1)
    tmp = f"{out}.tmp.npz"
    np.savez(tmp, x=codes, x_exp=np.int64(X_EXP), y=y.astype(np.int64), **extra)
    os.replace(tmp, out)
    ncls = int(y.max()) + 1 if len(y) else 0
    return (f"convert: {kind} {source} -> {out}: x int8 {tuple(codes.shape)} at x_exp {X_EXP}, y {len(y)} labels in "
            f"[0, {ncls}); rule: code = min(pixel >> 1, 127)")
