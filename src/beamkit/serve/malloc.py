"""Giving the C allocator's free memory back to the system once a server has gone idle (glibc only).

A decoding step frees and allocates key/value buffers of a few MB to tens of MB, each a little larger than the
last (the cache grows by one position a step and is gathered by parent row). glibc's ``malloc`` keeps the freed
ones in its heaps, where most are too small for the next buffer: on a 93 MB GPT-2 decoding 256 beam rows, as
much memory as the key/value cache itself stays resident, unused, until ``malloc_trim`` releases it.
:func:`trim` calls it; ``beamkit serve`` does once its engine has been idle for :data:`IDLE_TRIM_S`
(:class:`IdleTrim`), so a server between bursts holds about what it held before the first one. Trimming while
busy would cost time (the pages are faulted in again), so a server under steady load never trims.

Elsewhere than on glibc (macOS, musl) nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import platform
import sys
from collections.abc import Callable
from typing import Any

IDLE_TRIM_S = 1.0  # seconds of idleness after which a server returns its free heap memory


def _glibc() -> Any:
    """glibc's C library, or None elsewhere."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def trim() -> bool:
    """Return the free memory of glibc's heaps to the system (``malloc_trim(0)``); True when some was, False
    when none was or off glibc."""
    libc = _glibc()
    return bool(libc.malloc_trim(ctypes.c_size_t(0))) if libc is not None else False


class IdleTrim:
    """Calls :func:`trim` (in a worker thread) once ``idle()`` has held for ``delay`` seconds after the last
    :meth:`poke`; ``poke`` is called on the event loop whenever a request ends."""

    def __init__(self, idle: Callable[[], bool], delay: float = IDLE_TRIM_S):
        self.idle, self.delay = idle, delay
        self.trims = 0  # how many times it trimmed
        self._handle: asyncio.TimerHandle | None = None

    def poke(self) -> None:
        """A request ended: (re)arm the timer."""
        if self._handle is not None:
            self._handle.cancel()
        self._handle = asyncio.get_running_loop().call_later(self.delay, self._check)

    def _check(self) -> None:
        self._handle = None
        if self.idle():
            self.trims += 1
            asyncio.get_running_loop().run_in_executor(None, trim)
