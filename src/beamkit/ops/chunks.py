"""How large numpy tables are walked: rows in chunks sized to stay in cache, and the size from which the
threshold selection and the chunked log-softmax take over."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

EXP_CHUNK = (
    1 << 18
)  # elements of a numpy [rows, V] table exponentiated at a time: the rows and their buffer stay in cache
TOP_CHUNK = 1 << 20  # elements of a numpy table whose group maxima are taken at a time (no exp buffer beside them)
LARGE_TABLE = 1 << 20  # rows * V from which the threshold selection and the chunked log-softmax are used


def chunk_rows(v: int, chunk: int | None = None) -> int:
    """Rows of a ``[rows, v]`` numpy table per chunk of ``chunk`` elements (default ``EXP_CHUNK``), at least one."""
    return max(1, (EXP_CHUNK if chunk is None else chunk) // max(1, v))


def row_chunks(x: np.ndarray) -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
    """``(rows, part, buf)`` for each chunk of rows of a ``[rows, V]`` numpy table: the rows' slice, their view
    ``part`` and a scratch array of its shape, one buffer reused by every chunk (so it stays in cache)."""
    n, v = x.shape
    step = chunk_rows(v)
    buf = np.empty((min(step, n), v), dtype=x.dtype)  # shape: (step, V)
    for lo in range(0, n, step):
        rows = slice(lo, lo + step)
        part = x[rows]
        yield rows, part, buf[: part.shape[0]]
