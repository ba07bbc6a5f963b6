"""The compiler of the CTC search: numba's ``njit`` when numba is installed, else the same functions run as
plain Python (identical results, much slower; a warning says so once)."""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
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
_noted = False  # the note was printed (once per process)
_asked: set[int] = set()  # the frame loops asked whether they are cold (each search's own, once)

#: the line printed on standard error before the first compilation of the search (see :func:`note_if_cold`)
COLD_NOTE = "beamkit: compiling the CTC search once (about 20-60 s); later runs reuse the compiled code"


def njit(fn: F) -> F:
    """Compile ``fn`` in numba's nopython mode (cached on disk), or return it unchanged without numba."""
    return _compile(fn)


def njit_inline(fn: F) -> F:
    """:func:`njit`, with ``fn``'s body inlined into the compiled functions that call it (numba's
    ``inline="always"``): a small helper called per prefix that takes the search's tables as one record would
    otherwise receive a copy of the record at each call."""
    return _compile(fn, inline="always")


def _compile(fn: F, **flags: Any) -> F:
    if not COMPILED:
        return fn
    assert _numba is not None
    try:
        dispatcher = _numba.njit(cache=True, nogil=True, **flags)(fn)
    except RuntimeError:  # no writable place for numba's cache (a read-only install, no home): compile each run
        return _numba.njit(nogil=True, **flags)(fn)  # type: ignore[no-any-return]
    _tie_cache_to_sources(dispatcher)
    return dispatcher  # type: ignore[no-any-return]


SOURCES = Path(__file__).resolve().parent  # the package of the CTC search


@functools.cache
def sources_stamp(root: Path = SOURCES) -> str:
    """A digest of every module of the CTC search (the ``.py`` files under ``root``, names and contents)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _tie_cache_to_sources(dispatcher: Any) -> None:
    """Make numba's on-disk cache of ``dispatcher`` current only for these sources of the whole search: numba
    checks the function's own file alone, and a compiled function holds the code of the helpers it calls from
    other modules, which an upgrade may change while its own file stays the same."""
    try:
        index = dispatcher._cache._cache_file  # numba's IndexDataCacheFile
        index._source_stamp = (index._source_stamp, sources_stamp())
    except Exception:  # noqa: BLE001 - a numba without this layout: its own check stands
        pass


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


def is_cold(dispatcher: Any) -> bool:
    """Whether calling the compiled function ``dispatcher`` will compile it: it has no compiled code in this
    process and numba's on-disk cache holds none that is current (no index file, or one written for another
    version of the source). Unknown (numba's cache laid out otherwise): False, so nothing untrue is said."""
    if not COMPILED or getattr(dispatcher, "signatures", None):
        return False
    try:
        index = dispatcher._cache._cache_file  # numba's IndexDataCacheFile
        return not os.path.exists(index._index_path) or not index._load_index()
    except Exception:  # noqa: BLE001 - a numba without this layout: say nothing rather than guess
        return False


def note_if_cold(dispatcher: Any) -> None:
    """Print :data:`COLD_NOTE` on standard error, once per process, when ``dispatcher`` (a search's frame loop)
    is about to be compiled: the first decode after an install waits for it and would otherwise be silent.
    ``BEAMKIT_COMPILE_NOTE=0`` in the environment keeps it quiet."""
    global _noted
    if _noted or id(dispatcher) in _asked:
        return
    # each loop asked once: code that is not cold now (compiled, or in numba's cache) never is again in this
    # process, and asking numba costs about 0.1 ms, a tenth of a short utterance's search
    _asked.add(id(dispatcher))
    if os.environ.get("BEAMKIT_COMPILE_NOTE") != "0" and is_cold(dispatcher):
        _noted = True
        print(COLD_NOTE, file=sys.stderr, flush=True)
