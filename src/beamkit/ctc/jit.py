"""The compiler of the CTC search: numba's ``njit`` when numba is installed, else the same functions run as
plain Python (identical results, much slower; a warning says so once)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from beamkit.extras import install_hint

F = TypeVar("F", bound=Callable[..., Any])

_numba: Any
try:  # numba is in the ``ctc`` extra
    import numba as _numba
except ImportError:  # pragma: no cover - exercised where numba is absent
    _numba = None

#: whether the CTC search runs compiled (numba importable and ``BEAMKIT_NO_JIT`` not set)
COMPILED = _numba is not None and not os.environ.get("BEAMKIT_NO_JIT")
_warned = False


def njit(fn: F) -> F:
    """Compile ``fn`` in numba's nopython mode (cached on disk), or return it unchanged without numba."""
    if not COMPILED:
        return fn
    assert _numba is not None
    try:
        return _numba.njit(cache=True, nogil=True)(fn)  # type: ignore[no-any-return,return-value]
    except RuntimeError:  # no writable place for numba's cache (a read-only install, no home): compile each run
        return _numba.njit(nogil=True)(fn)  # type: ignore[no-any-return,return-value]


def records(n: int, dtype: np.dtype) -> np.ndarray:
    """An uninitialised array of ``n`` records; interpreted, a record array, so that the same code can read
    and write ``array[i].field`` as compiled code does."""
    out = np.empty(n, dtype=dtype)
    return out if COMPILED else out.view(np.recarray)


def warn_if_interpreted() -> None:
    """Warn once per process when the search runs as plain Python because numba is missing."""
    global _warned
    if not COMPILED and not _warned:
        _warned = True
        warnings.warn(
            "the CTC search runs as plain Python, 100x slower: numba is not installed "
            f"({install_hint('ctc')}) or BEAMKIT_NO_JIT is set",
            RuntimeWarning,
            stacklevel=3,
        )
