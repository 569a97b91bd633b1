"""Load pickles that may only contain plain data and numpy arrays.

``pickle.load`` runs whatever callable a file names (``os.system`` included),
so a downloaded pickle is code. :class:`NumpyOnlyUnpickler` resolves only the
three globals a pickled ``numpy.ndarray`` needs and refuses everything else;
dicts, lists, bytes, strings and numbers need no global at all. Both numpy 1
(``numpy.core``) and numpy 2 (``numpy._core``) spellings of the array
reconstructor are accepted, since the official files predate numpy 2.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from pathlib import Path
from typing import Any

import numpy as np

from inttrain.spec.errors import InttrainError

from .errors import DataError

__all__ = ["ALLOWED_GLOBALS", "NumpyOnlyUnpickler", "load_restricted_pickle"]


def _reconstruct() -> Any:
    # numpy 2 keeps a deprecated numpy.core alias that warns on import; use the real module first.
    try:
        from numpy._core.multiarray import _reconstruct as fn
    except ImportError:  # numpy 1
        from numpy.core.multiarray import _reconstruct as fn  # type: ignore[no-redef]
    return fn


#: (module, name) -> what it resolves to; everything else is refused.
ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct(),
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct(),
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle names a global outside :data:`ALLOWED_GLOBALS`."""

    def __init__(self, qualname: str) -> None:
        super().__init__(qualname)
        self.qualname = qualname


class NumpyOnlyUnpickler(pickle.Unpickler):
    """An unpickler whose ``find_class`` only knows the numpy array reconstruction globals."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise RefusedGlobal(f"{module}.{name}") from None


def _read_regular(path: Path) -> bytes:
    """The bytes of a regular file within the memory limit (never a pipe or device that does not end)."""
    import stat

    from .limits import Limits

    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        raise DataError(f"{path.name}: file: not a regular file; allowed: a pickle file")
    Limits().check_bytes(path.name, f"a pickle of {info.st_size} bytes", 3 * info.st_size)
    with open(path, "rb") as f:
        return f.read(info.st_size)


def load_restricted_pickle(path: Path, encoding: str = "bytes") -> Any:
    """The object in pickle ``path``; DataError naming the file (and the refused global, if that is why).

    ``encoding="bytes"``: the CIFAR files were written by Python 2, whose ``str``
    must stay bytes (the array buffers are such strings).
    """
    allowed = ", ".join(sorted({f"{m}.{n}" for m, n in ALLOWED_GLOBALS}))
    try:
        raw = _read_regular(path)
        # Opcodes carry byte counts that the C unpickler allocates before reading (a 100-byte file declaring a
        # 300 MB string allocated 300 MB): walk the opcodes first; a count past the end of the data fails here.
        for _ in pickletools.genops(io.BytesIO(raw)):
            pass
        return NumpyOnlyUnpickler(io.BytesIO(raw), encoding=encoding).load()
    except RefusedGlobal as e:
        raise DataError(
            f"{path.name}: pickle: refused global {e.qualname!r}; only numpy array data may be loaded "
            f"(allowed: {allowed}), so this file is not an official batch and was not executed"
        ) from None
    except OSError as e:
        raise DataError(f"{path.name}: file: cannot read ({e.strerror or e})") from None
    except InttrainError:
        raise
    except Exception as e:  # truncated or garbage: UnpicklingError, EOFError, ValueError, ...
        raise DataError(f"{path.name}: pickle: not a readable pickle ({type(e).__name__}: {e})") from None
